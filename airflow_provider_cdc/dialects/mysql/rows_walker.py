"""The compiled binlog rows walker: rows events decoded in C (``_rows.c``), staged in columns.

Why: a rows event concatenates row images without per-row lengths, so finding where a row
ends means decoding every column of it; mysql-replication does that in Python, a few
microseconds per value, and then capture made a dict and a ChangeEvent per row and typed the
dicts again to stage them: ~20k row changes a second, a thirtieth of ``mariadb-binlog``.
Here a rows event of a captured table is handed whole to the C walker (its row-image bytes
and the table map's column types and metadata), which returns each column's canonical values
in Arrow buffers and each event's op, image numbers and key (:class:`RowsRun`). The read loop
keeps the runs as they are (:class:`EventBuffer`); a segment's runs become one
:class:`~airflow_provider_cdc.core.event_batch.EventBatch` with typed images (:func:`build_batch`),
without a Python object per row.

The pure-Python reader (mysql-replication plus types.binlog_converter) stays: it decodes a
table the walker does not cover (a column type or character set below, FLOAT/DOUBLE key
columns, unnamed columns), an event it refuses (it raises ValueError: the event is decoded
the pure-Python way), every event when the extension is not built, and it is the reference
the walker is tested against on every type (tests/integration/test_mysql_rows_walker.py).
Which one runs: the dialect option ``rows_decoder`` (the connection extra of that name; a
setting of one source, never a process-wide environment variable): ``auto`` (default: compiled where it
can), ``compiled`` (an error when the extension is not built), ``python``.

Covered (binlog_row_metadata=FULL, binlog_row_image=FULL, MariaDB's and MySQL 5.6+'s temporal
formats): TINYINT..BIGINT signed and unsigned, YEAR, FLOAT, DOUBLE, DECIMAL, BIT, CHAR,
VARCHAR, BINARY, VARBINARY, TINYBLOB..LONGBLOB, TINYTEXT..LONGTEXT (utf8mb3/utf8mb4 or
binary), MariaDB's JSON (LONGTEXT), ENUM, SET, DATE, TIME, DATETIME, TIMESTAMP. Not covered
(pure-Python): MySQL's binary JSON, GEOMETRY, other character sets, the pre-5.6 temporal
formats.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ...core import arrow_types as at
from ...core.errors import ConfigurationError, SourceError
from ...core.event_batch import (
    SEGMENT_SCHEMA,
    EventBatch,
    ImagePart,
    encode_positions,
    events_to_batch,
    origin_array,
)
from ...core.events import LogEvent, Op
from ...core.schema import MULTISET, Column, TableName, TableSchema

try:
    from . import _rows
except ImportError:  # not built (no compiler at install): the pure-Python reader
    _rows = None

log = logging.getLogger(__name__)

ENV_VAR = "connection extra rows_decoder"
MODES = ("auto", "compiled", "python")

# the walker's column codes (_rows.c)
K_INT, K_YEAR, K_FLOAT, K_DOUBLE, K_DECIMAL, K_BIT, K_STR, K_ENUM, K_SET = 1, 2, 3, 4, 5, 6, 7, 8, 9
K_DATE, K_DATETIME2, K_TIMESTAMP2, K_TIME2 = 10, 11, 12, 13
_FIXED = {K_INT, K_YEAR, K_BIT, K_FLOAT, K_DOUBLE}

# mysql-replication FIELD_TYPE codes
_TINY, _SHORT, _LONG, _FLOAT, _DOUBLE, _LONGLONG, _INT24, _DATE, _YEAR = 1, 2, 3, 4, 5, 8, 9, 10, 13
_VARCHAR, _BIT, _TIMESTAMP2, _DATETIME2, _TIME2 = 15, 16, 17, 18, 19
_NEWDECIMAL, _ENUM, _SET, _BLOB, _STRING = 246, 247, 248, 252, 254
_INT_WIDTH = {_TINY: 1, _SHORT: 2, _INT24: 3, _LONG: 4, _LONGLONG: 8}
# logical types as catalog.logical_type gives them (signed, unsigned)
_INT_LOGICAL = {
    1: ("int16", "int16"),
    2: ("int16", "int32"),
    3: ("int32", "int32"),
    4: ("int32", "int64"),
    8: ("int64", "uint64"),
}
_TEXT_CHARSETS = frozenset({"utf8mb4", "utf8mb3", "utf8"})
_OPS = at.string_array([Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value])
_WRITE, _UPDATE, _DELETE = 0, 1, 2


def available() -> bool:
    """Whether the extension was built (setup.py, at install)."""
    return _rows is not None


def decoder_mode(option: object = None) -> str:
    """The rows decoder to use: the dialect option ``rows_decoder`` (connection extra), else
    ``auto``; ``compiled`` without the extension is an error naming the fix."""
    raw = "" if option is None else option
    mode = str(raw).strip().lower() or "auto"
    if mode not in MODES:
        raise ConfigurationError(
            f"rows_decoder ({ENV_VAR}) must be 'auto', 'compiled' or 'python', got {raw!r}"
        )
    if mode == "compiled" and _rows is None:
        raise ConfigurationError(
            f"rows_decoder ({ENV_VAR}) is 'compiled' but the compiled binlog rows walker was not built "
            "at install: "
            "install gcc and the Python headers (python3-dev) and reinstall the package (make setup), "
            "or use 'auto'"
        )
    if mode == "auto":
        mode = "compiled" if _rows is not None else "python"
    return mode


def column_spec(col) -> tuple[tuple, str] | str:
    """A mysql-replication column (FULL row metadata) -> (its walker spec, its logical type),
    or why the walker does not decode it."""
    ft = col.type
    if not col.name:
        return "a column without a name in the table map (binlog_row_metadata is not FULL)"
    charset = (col.character_set_name or "").lower()
    unsigned = bool(getattr(col, "unsigned", False))
    if ft in _INT_WIDTH:
        w = _INT_WIDTH[ft]
        return (K_INT, w, int(unsigned), 0, None), _INT_LOGICAL[w][unsigned]
    if ft == _YEAR:
        return (K_YEAR, 0, 0, 0, None), "int16"
    if ft == _FLOAT:
        return (K_FLOAT, 0, 0, 0, None), "float32"
    if ft == _DOUBLE:
        return (K_DOUBLE, 0, 0, 0, None), "float64"
    if ft == _NEWDECIMAL:
        return (
            K_DECIMAL,
            int(col.precision),
            int(col.decimals),
            0,
            None,
        ), f"decimal({col.precision},{col.decimals})"
    if ft == _BIT:
        return (K_BIT, int(col.bits), 0, 0, None), "uint64" if col.bits == 64 else "int64"
    if ft in (_VARCHAR, _STRING, _BLOB):
        if charset != "binary" and charset not in _TEXT_CHARSETS:
            return f"character set {col.character_set_name!r}"
        binary = charset == "binary"
        if ft == _BLOB:
            length_bytes, pad = int(col.length_size), 0
        else:
            length_bytes = 2 if col.max_length > 255 else 1
            pad = int(col.max_length) if binary and ft == _STRING else 0
        return (K_STR, length_bytes, pad, int(binary), None), "binary" if binary else "string"
    if ft in (_ENUM, _SET):
        names = col.enum_values if ft == _ENUM else col.set_values
        if names is None:
            return "an ENUM or SET without its values in the table map"
        return (
            (K_ENUM if ft == _ENUM else K_SET),
            int(col.size),
            0,
            0,
            tuple(str(n).encode() for n in names),
        ), "string"
    if ft == _DATE:
        return (K_DATE, 0, 0, 0, None), "date"
    if ft == _DATETIME2:
        return (K_DATETIME2, int(col.fsp), 0, 0, None), "timestamp"
    if ft == _TIMESTAMP2:
        return (K_TIMESTAMP2, int(col.fsp), 0, 0, None), "timestamptz"
    if ft == _TIME2:
        return (K_TIME2, int(col.fsp), 0, 0, None), "time"
    return f"column type {ft}"


class TableWalker:
    """What the walker needs of one table map: the columns' specs, the key's column numbers
    and the schema its images are typed with."""

    __slots__ = ("table_id", "names", "spec", "key_idx", "logicals", "schema")

    def __init__(
        self,
        table: TableName,
        names: Sequence[str],
        spec: tuple,
        key_idx: tuple,
        logicals: Sequence[str],
        key_names: Sequence[str],
    ) -> None:
        self.table_id = table.id
        self.names = tuple(names)
        self.spec = spec
        self.key_idx = key_idx
        self.logicals = tuple(logicals)
        self.schema = TableSchema(
            table,
            tuple(Column(n, t) for n, t in zip(names, logicals, strict=True)),
            tuple(key_names),
            {} if key_names else {MULTISET: "true"},  # no key: a multiset, keyed by the whole row
        )

    @classmethod
    def of(cls, table: TableName, columns: Sequence, key_names: Sequence[str]) -> TableWalker | str:
        """The walker of a table map's columns, or why the walker does not decode it."""
        specs, logicals, names = [], [], []
        for c in columns:
            got = column_spec(c)
            if isinstance(got, str):
                return f"column {c.name!r}: {got}"
            specs.append(got[0])
            logicals.append(got[1])
            names.append(c.name)
        if len(set(names)) != len(names):
            return "two columns of the same name in the table map"
        try:
            key_idx = tuple(names.index(k) for k in key_names)
        except ValueError:
            return f"key column(s) {list(key_names)} not among the table map's columns"
        if any(specs[i][0] in (K_FLOAT, K_DOUBLE) for i in key_idx):
            return "a FLOAT or DOUBLE key column (its canonical key is Python's float repr)"
        return cls(table, names, tuple(specs), key_idx, logicals, key_names)

    def run(self, ev, major: int, minor: int, ts_ms: int, origin: tuple | None, kind: int) -> RowsRun | None:
        """The events of rows event ``ev`` (its row images not read yet), or None when the
        walker cannot decode it (the caller reads it the pure-Python way)."""
        wrapper = ev.packet
        raw = wrapper.packet
        data, start = getattr(raw, "_data", None), getattr(raw, "_position", None)
        pushed_back = getattr(wrapper, "_BinLogPacketWrapper__data_buffer", None)
        if data is None or start is None or pushed_back is None or pushed_back:
            # not where mysql-replication 1.x keeps the event's bytes: the pure-Python reader reads it
            return None
        end = start + ev.event_size - wrapper.read_bytes  # the rows, without the checksum
        second = bytes(ev.columns_present_bitmap2) if kind == _UPDATE else None
        present = (bytes(ev.columns_present_bitmap), second)
        at = (major, minor, ts_ms, origin)
        return self.decode(data, start, end, ev.number_of_columns, present, kind, at)

    def decode(
        self, data: bytes, start: int, end: int, ncols: int, present: tuple, kind: int, at: tuple
    ) -> RowsRun | None:
        """The events of the row images in ``data[start:end]`` (a rows event of ``ncols`` columns,
        its present-columns bitmaps, the second an update's), or None when the walker cannot decode
        them. ``at``: the rows event's (major, minor, ts_ms, origin)."""
        if ncols != len(self.spec):
            return None
        full = _full_bitmap(ncols)
        if present[0] != full or (kind == _UPDATE and present[1] != full):
            return None  # a partial row image (binlog_row_image is not FULL)
        try:
            out = _rows.decode(data, start, end, kind, self.spec, self.key_idx)
        except ValueError as exc:
            log.warning(
                "the compiled rows walker cannot decode a rows event of %s (%s): read the pure-Python way",
                self.table_id,
                exc,
            )
            return None
        images, ops, before, after, kdata, klens, cols = out
        n = len(ops)
        return RowsRun(self, *at, images, ops, before, after, kdata, klens, cols, 0, n)


_FULL: dict[int, bytes] = {}


def _full_bitmap(ncols: int) -> bytes:
    hit = _FULL.get(ncols)
    if hit is None:
        b = bytearray(b"\xff" * ((ncols + 7) // 8))
        if ncols % 8:
            b[-1] = (1 << (ncols % 8)) - 1
        hit = _FULL[ncols] = bytes(b)
    return hit


@dataclass(slots=True)
class RowsRun:
    """The events ``lo``..``hi`` of one rows event, as the walker returned them: ``images``
    row images (a column at a time: validity bytes, data, int32 lengths for variable-width
    values), and per event its op (0 c, 1 u, 2 d), before/after image (-1: none) and key."""

    walker: TableWalker
    major: int
    minor: int
    ts_ms: int
    origin: tuple | None
    images: int
    ops: bytes
    before: bytes
    after: bytes
    key_data: bytes
    key_lengths: bytes
    columns: list
    lo: int
    hi: int

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, s: slice) -> RowsRun:
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("a RowsRun is sliced by a range of its events")
        lo, hi, _ = s.indices(len(self))
        hi = max(lo, hi)
        return RowsRun(
            self.walker,
            self.major,
            self.minor,
            self.ts_ms,
            self.origin,
            self.images,
            self.ops,
            self.before,
            self.after,
            self.key_data,
            self.key_lengths,
            self.columns,
            self.lo + lo,
            self.lo + hi,
        )

    def events(self, watermark_table: str = "") -> list[LogEvent]:
        """The run as ChangeEvents with canonical row images (a held group keeps these)."""
        return build_batch([self], watermark_table).events()


class EventBuffer:
    """A segment's events as the read loop gathers them: LogEvents and RowsRuns in log
    order, counted in events (a list of LogEvents when no run is in it)."""

    __slots__ = ("items", "n", "runs")

    def __init__(self) -> None:
        self.items: list = []
        self.n = 0
        self.runs = 0

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def extend(self, events) -> None:
        if isinstance(events, RowsRun):
            if len(events):
                self.items.append(events)
                self.runs += 1
        else:
            self.items.extend(events)
        self.n += len(events)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` events."""
        while self.n > n:
            last = self.items[-1]
            if isinstance(last, RowsRun):
                drop = min(len(last), self.n - n)
                if drop == len(last):
                    self.items.pop()
                    self.runs -= 1
                else:
                    self.items[-1] = last[: len(last) - drop]
                self.n -= drop
            else:
                self.items.pop()
                self.n -= 1

    def take(self, watermark_table: str) -> list[LogEvent] | EventBatch:
        """The events (a list of LogEvents, or an EventBatch when runs are among them); the
        buffer is empty after."""
        items = self.items
        self.items, self.n, self.runs = [], 0, 0
        if not any(isinstance(i, RowsRun) for i in items):
            return items
        try:
            return build_batch(items, watermark_table)
        except _TooLarge:
            # a column of more than 2 GiB (one segment per run): the runs as LogEvents, which staging
            # types in chunks as it does the pure-Python reader's
            out: list[LogEvent] = []
            for i in items:
                if isinstance(i, RowsRun):
                    out.extend(i.events(watermark_table))
                else:
                    out.append(i)
            return out


def build_batch(items: Sequence, watermark_table: str) -> EventBatch:
    """LogEvents and RowsRuns (log order) -> one EventBatch: the runs' log columns and typed
    images built a column at a time, the LogEvents' as events_to_batch builds them."""
    runs = [i for i in items if isinstance(i, RowsRun)]
    loose = [i for i in items if not isinstance(i, RowsRun)]
    # each item's first row in the batch, in log order
    n_total = sum(len(i) if isinstance(i, RowsRun) else 1 for i in items)
    loose_rows = np.empty(len(loose), dtype=np.int64)
    run_first = np.empty(len(runs), dtype=np.int64)
    row = li = ri = 0
    for i in items:
        if isinstance(i, RowsRun):
            run_first[ri] = row
            row += len(i)
            ri += 1
        else:
            loose_rows[li] = row
            row += 1
            li += 1
    counts = np.fromiter((len(r) for r in runs), dtype=np.int64, count=len(runs))
    n_run_events = int(counts.sum())
    run_of = np.repeat(np.arange(len(runs), dtype=np.int64), counts)  # run event -> its run
    starts = np.zeros(len(runs), dtype=np.int64)
    if len(runs) > 1:
        np.cumsum(counts[:-1], out=starts[1:])
    within = np.arange(n_run_events, dtype=np.int64) - starts[run_of]  # event number inside its slice
    run_rows = run_first[run_of] + within  # run event -> its row in the batch

    # the runs' log columns
    los = np.fromiter((r.lo for r in runs), dtype=np.int64, count=len(runs))
    index = los[run_of] + within
    major = np.fromiter((r.major for r in runs), dtype=np.int64, count=len(runs))[run_of]
    minor = np.fromiter((r.minor for r in runs), dtype=np.int64, count=len(runs))[run_of]
    position = encode_positions(major, minor, index)
    table_names = sorted({r.walker.table_id for r in runs})
    tcode = {t: i for i, t in enumerate(table_names)}
    table = at.string_array(table_names).take(
        at.index_array(
            np.fromiter((tcode[r.walker.table_id] for r in runs), dtype=np.int64, count=len(runs))[run_of]
        )
    )
    if all(r.lo == 0 and r.hi == len(r.ops) for r in runs):
        opcode = np.frombuffer(b"".join(r.ops for r in runs), dtype=np.uint8).astype(np.int64)
    else:
        opcode = np.concatenate([np.frombuffer(r.ops, dtype=np.uint8)[r.lo : r.hi] for r in runs]).astype(
            np.int64
        )
    op = _OPS.take(at.index_array(opcode))
    key = _strings([(r.key_data, r.key_lengths, r.lo, r.hi) for r in runs], pa.string())
    ts = at.index_array(np.fromiter((r.ts_ms for r in runs), dtype=np.int64, count=len(runs))[run_of])
    origin = origin_array([r.origin for r in runs]).take(at.index_array(run_of))
    run_log = pa.Table.from_arrays(
        [position, table, op, key, ts, pa.nulls(n_run_events, pa.string()), origin], schema=SEGMENT_SCHEMA
    )

    parts: list[ImagePart] = []
    # the runs' images, one typed part per table map (a table described anew is another part)
    walkers: dict[int, list[int]] = {}
    for k, r in enumerate(runs):
        walkers.setdefault(id(r.walker), []).append(k)
    for ks in walkers.values():
        rows = np.concatenate([run_rows[starts[k] : starts[k] + counts[k]] for k in ks])
        parts.append(_typed_part([runs[k] for k in ks], rows))

    if not loose:
        return EventBatch(run_log, tuple(parts))
    loose_batch = events_to_batch(loose, watermark_table)
    log = pa.concat_tables([run_log, loose_batch.log.cast(SEGMENT_SCHEMA)])
    # batch row -> row of the concatenation
    src = np.empty(n_total, dtype=np.int64)
    src[run_rows] = np.arange(n_run_events, dtype=np.int64)
    src[loose_rows] = n_run_events + np.arange(len(loose), dtype=np.int64)
    log = log.take(at.index_array(src))
    for p in loose_batch.parts:
        parts.append(ImagePart(p.table, loose_rows[p.rows], p.before, p.after, p.schema, p.text_columns))
    return EventBatch(log, tuple(parts))


def _typed_part(runs: list[RowsRun], rows: np.ndarray) -> ImagePart:
    """The images of ``runs`` (one table map) as one typed ImagePart; ``rows``: the runs'
    events' rows in the batch."""
    w = runs[0].walker
    n_images = sum(r.images for r in runs)
    base = np.zeros(len(runs), dtype=np.int64)
    if len(runs) > 1:
        np.cumsum(np.fromiter((r.images for r in runs), dtype=np.int64, count=len(runs))[:-1], out=base[1:])
    arrays = []
    for j, (spec, logical) in enumerate(zip(w.spec, w.logicals, strict=True)):
        arrays.append(_column([r.columns[j] for r in runs], spec, logical, n_images, w, j))
    struct = pa.StructArray.from_arrays(
        arrays, fields=[pa.field(nm, a.type) for nm, a in zip(w.names, arrays, strict=True)]
    )
    # each event's image numbers, from the run's own to the part's (-1: none)
    run_base = np.repeat(base, np.fromiter((len(r) for r in runs), dtype=np.int64, count=len(runs)))
    b_idx, a_idx = (_image_numbers(runs, which, run_base) for which in ("before", "after"))
    return ImagePart(w.table_id, rows, _take(struct, b_idx), _take(struct, a_idx), w.schema, ())


def _image_numbers(runs: list[RowsRun], which: str, run_base: np.ndarray) -> np.ndarray:
    whole = all(r.lo == 0 and r.hi * 4 == len(getattr(r, which)) for r in runs)
    if whole:
        idx = np.frombuffer(b"".join(getattr(r, which) for r in runs), dtype=np.int32).astype(np.int64)
    else:
        idx = np.concatenate(
            [np.frombuffer(getattr(r, which), dtype=np.int32)[r.lo : r.hi] for r in runs]
        ).astype(np.int64)
    return np.where(idx >= 0, idx + run_base, -1)


def _take(arr: pa.Array, idx: np.ndarray) -> pa.Array:
    """Rows ``idx`` of ``arr`` (-1: null)."""
    valid = idx >= 0
    if not valid.any():  # the before-images of inserts, the after-images of deletes
        return pa.nulls(len(idx), arr.type)
    if len(idx) == len(arr) and valid.all() and (idx == np.arange(len(idx))).all():  # every image, in order
        return arr
    return arr.take(at.index_array(np.maximum(idx, 0), None if valid.all() else valid))


def _strings(pieces: list[tuple[bytes, bytes, int, int]], typ: pa.DataType) -> pa.Array:
    """Values ``lo``..``hi`` of each (data, int32 lengths) piece, concatenated -> one array."""
    datas, lens = [], []
    for data, lengths, lo, hi in pieces:
        ln = np.frombuffer(lengths, dtype=np.int32)
        if lo or hi != len(ln):
            skip = int(ln[:lo].sum())
            datas.append(memoryview(data)[skip : skip + int(ln[lo:hi].sum())])
            ln = ln[lo:hi]
        else:
            datas.append(data)
        lens.append(ln)
    return _var_array(typ, b"".join(datas), np.concatenate(lens) if lens else np.zeros(0, np.int32), None)


class _TooLarge(Exception):
    """A column of a batch beyond 32-bit offsets."""


_MAX_DATA = 2**31  # bytes of one string or binary array (int32 offsets)


def _var_array(typ: pa.DataType, data: bytes, lens: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    n = len(lens)
    if len(data) >= _MAX_DATA:
        raise _TooLarge()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    bitmap, nulls = _validity(valid, n)
    return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


def _validity(valid: np.ndarray | None, n: int) -> tuple[pa.Buffer | None, int]:
    if valid is None:
        return None, 0
    nulls = n - int(np.count_nonzero(valid))
    return (at.bitmap(valid.astype(np.bool_)) if nulls else None), nulls


def _column(pieces: list[tuple], spec: tuple, logical: str, n: int, w: TableWalker, j: int) -> pa.Array:
    """One column of the images of several runs -> its typed Arrow array (core/arrow_types/
    arrow_type(logical)), typed as staging types the same canonical values."""
    code = spec[0]
    valid = np.frombuffer(b"".join(p[0] for p in pieces), dtype=np.uint8)
    data = b"".join(p[1] for p in pieces)
    if code in _FIXED:
        bitmap, nulls = _validity(valid, n)
        if code == K_FLOAT:
            return pa.Array.from_buffers(pa.float32(), n, [bitmap, pa.py_buffer(data)], nulls)
        if code == K_DOUBLE:
            return pa.Array.from_buffers(pa.float64(), n, [bitmap, pa.py_buffer(data)], nulls)
        if logical == "uint64":
            arr = pa.Array.from_buffers(pa.uint64(), n, [bitmap, pa.py_buffer(data)], nulls)
        else:
            arr = pa.Array.from_buffers(pa.int64(), n, [bitmap, pa.py_buffer(data)], nulls)
        return arr.cast(at.arrow_type(logical))
    lens = np.concatenate([np.frombuffer(p[2], dtype=np.int32) for p in pieces])
    if code == K_STR and logical == "binary":
        return _var_array(pa.binary(), data, lens, valid)
    text = _var_array(pa.string(), data, lens, valid)
    if code == K_STR:
        try:
            text.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise SourceError(
                f"table {w.table_id}, column {w.names[j]!r}: the binlog holds text that is not UTF-8 ({exc})"
            ) from exc
        return text
    target = at.arrow_type(logical)
    if target == pa.string():
        return text
    if code == K_DECIMAL:
        return text.cast(target)
    # DATE, DATETIME, TIMESTAMP: as staging types their canonical text (arrow_types.decode_column)
    try:
        return text.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return at.decode_column(text.to_pylist(), logical)
