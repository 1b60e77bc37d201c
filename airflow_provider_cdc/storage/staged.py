"""Parquet I/O for staged changelog segments and chunks (formats: storage/layout.py).

Files are written to a temporary name and renamed, so a reader never sees half a file
and a retry that writes the same name replaces it whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..core.events import ORIGIN_FIELDS, WATERMARK_OP, ChangeEvent, LogEvent, WatermarkEvent
from ..core.position import Position
from ..core.schema import decode_row, encode_row
from .layout import parse_segment_name

#: ChangeEvent.origin as staged (core/events.py ORIGIN_FIELDS)
ORIGIN_TYPE = pa.struct([("tx", pa.string()), ("lsn", pa.int64()), ("last_commit_lsn", pa.int64()),
                         ("server_id", pa.int64()), ("thread", pa.int64()), ("file", pa.string())])
assert tuple(f.name for f in ORIGIN_TYPE) == ORIGIN_FIELDS
CHANGELOG_SCHEMA = pa.schema(
    [
        ("position", pa.string()),
        ("table", pa.string()),
        ("op", pa.string()),
        ("key", pa.string()),
        ("before", pa.string()),
        ("after", pa.string()),
        ("ts_ms", pa.int64()),
        ("watermark", pa.string()),
        ("origin", ORIGIN_TYPE),
    ]
)
CHUNK_SCHEMA = pa.schema([("key", pa.string()), ("after", pa.string())])
#: ParquetWriter options of staged chunks: keys and rows are unique, so a dictionary
#: page only costs memory and time before the writer falls back to plain encoding
#: ParquetWriter options of staged chunks: keys and rows are unique, so a dictionary
#: page only costs memory and time before the writer falls back to plain encoding
CHUNK_PARQUET_OPTIONS: dict = {"use_dictionary": False}


def chunk_writer(path: str, filesystem=None) -> pq.ParquetWriter:
    """A ParquetWriter for a staged chunk (CHUNK_SCHEMA), one row group per written batch;
    ``path`` inside ``filesystem`` (see storage.atomic_output)."""
    return pq.ParquetWriter(path, CHUNK_SCHEMA, filesystem=filesystem, **CHUNK_PARQUET_OPTIONS)


def string_array(values: Sequence[str | None]) -> pa.Array:
    """Python strings (None = null) -> an Arrow string array, built from buffers.

    Why not ``pa.array(values)``: pyarrow imports pandas at its first conversion of Python
    objects (``pa.array``, ``pa.scalar``, a Python value given to a compute kernel) when
    pandas is installed, as it is next to Airflow: ~60 MB of RSS and seconds of import
    in every chunk and capture task, for nothing. This builds the same array from one
    UTF-8 buffer and its offsets."""
    n = len(values)
    validity = None
    nulls = 0
    if None in values:
        valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=n)
        nulls = n - int(valid.sum())
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        values = ["" if v is None else v for v in values]
    text = "".join(values)
    if text.isascii():  # one byte per character: lengths without encoding each value
        data = text.encode("ascii")
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    else:
        encoded = [v.encode("utf-8") for v in values]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    del text
    if len(data) >= 2**31:  # beyond 32-bit offsets: let pyarrow split it into chunks
        return pa.chunked_array([pa.array(values, pa.string())]).combine_chunks()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), validity, nulls)


def int64_array(values: Sequence[int | None]) -> pa.Array:
    """Python ints (None = null) -> an Arrow int64 array, without pa.array (see string_array)."""
    n = len(values)
    validity, nulls = None, 0
    if None in values:
        valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=n)
        nulls = n - int(valid.sum())
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        values = [0 if v is None else v for v in values]
    buf = np.array(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(buf)], nulls)


def atomic_write_table(table: pa.Table, path: str, **kwargs) -> None:
    """One Parquet file at a location, whole or not at all (storage.atomic_output)."""
    with storage.atomic_output(path) as (fs, tmp):
        pq.write_table(table, tmp, filesystem=fs, **kwargs)


def read_table(location: str, **kwargs) -> pa.Table:
    """A Parquet file at a location."""
    fs, path = storage.filesystem(location)
    return pq.read_table(path, filesystem=fs, **kwargs)


def events_to_table(events: Iterable[LogEvent], watermark_table: str) -> pa.Table:
    # one list per column, filled in a single pass (this runs once per captured event)
    pos: list = []
    tbl: list = []
    ops: list = []
    keys: list = []
    befores: list = []
    afters: list = []
    ts: list = []
    wms: list = []
    origins: list = []
    for ev in events:
        pos.append(ev.position.encode())
        ts.append(ev.ts_ms)
        if isinstance(ev, WatermarkEvent):
            tbl.append(watermark_table)
            ops.append(WATERMARK_OP)
            keys.append(None)
            befores.append(None)
            afters.append(None)
            wms.append(ev.id)
            origins.append(None)
        else:
            tbl.append(ev.table)
            ops.append(ev.op)
            keys.append(ev.key)
            befores.append(None if ev.before is None else encode_row(ev.before))
            afters.append(None if ev.after is None else encode_row(ev.after))
            wms.append(ev.watermark)
            origins.append(ev.origin)
    arrays = [string_array(c) for c in (pos, tbl, ops, keys, befores, afters)]
    arrays += [int64_array(ts), string_array(wms), origin_array(origins)]
    return pa.Table.from_arrays(arrays, schema=CHANGELOG_SCHEMA)


def origin_array(origins: Sequence[tuple | None]) -> pa.Array:
    """ChangeEvent.origin tuples (None = unknown) -> the staged ``origin`` struct column, one
    child array per field (built from columns, see :func:`string_array`)."""
    n = len(origins)
    if all(o is None for o in origins):
        return pa.nulls(n, ORIGIN_TYPE)
    cols = list(zip(*((o if o is not None else (None,) * len(ORIGIN_FIELDS)) for o in origins), strict=True))
    children = []
    for f, col in zip(ORIGIN_TYPE, cols, strict=True):
        if all(v is None for v in col):
            children.append(pa.nulls(n, f.type))
        elif pa.types.is_string(f.type):
            children.append(string_array([None if v is None else str(v) for v in col]))
        else:
            children.append(int64_array(col))
    mask = None
    if None in origins:
        missing = np.fromiter((o is None for o in origins), dtype=np.bool_, count=n)
        mask = pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(missing, bitorder="little"))])
    return pa.StructArray.from_arrays(children, fields=list(ORIGIN_TYPE), mask=mask)


def write_segment(events: list[LogEvent], directory: str, watermark_table: str) -> str:
    """Stage events (already in position order) as one segment named by its position range."""
    from .layout import segment_name

    if not events:
        raise ValueError("write_segment needs at least one event")
    path = storage.join(directory, segment_name(events[0].position, events[-1].position))
    atomic_write_table(events_to_table(events, watermark_table), path)
    return path


def list_segments(directory: str) -> list[tuple[Position, Position, str]]:
    out = []
    for name in storage.list_names(directory, suffix=".parquet"):
        if name.startswith("seg-"):
            first, last = parse_segment_name(name)
            out.append((first, last, storage.join(directory, name)))
    return sorted(out)


def read_log_events(
    directory: str, after: Position | None = None, upto: Position | None = None
) -> Iterator[LogEvent]:
    """Staged events with ``after < position <= upto``, in position order, duplicates removed."""
    seen_last: Position | None = None
    for first, last, path in list_segments(directory):
        if after is not None and last <= after:
            continue
        if upto is not None and first > upto:
            break
        tbl = read_table(path)
        for rec in tbl.to_pylist():
            pos = Position.decode(rec["position"])
            if (after is not None and pos <= after) or (upto is not None and pos > upto):
                continue
            if seen_last is not None and pos <= seen_last:
                continue  # overlap left by a crashed capture: same position, same event
            seen_last = pos
            if rec["op"] == WATERMARK_OP:
                yield WatermarkEvent(rec["watermark"], pos, rec["ts_ms"])
            else:
                origin = rec.get("origin")
                yield ChangeEvent(
                    rec["table"], rec["op"], rec["key"], pos, decode_row(rec["before"]), decode_row(rec["after"]),
                    rec["ts_ms"], origin=None if origin is None else tuple(origin[f] for f in ORIGIN_FIELDS),
                )


def find_watermarks(segments: Sequence[tuple[Position, Position, str]], ids: Iterable[str]) -> dict[str, tuple[str, int]]:
    """id -> (encoded position, ts_ms) of the first staged write of each watermark id.

    Read on the driver with pyarrow (only the op/watermark/position/ts_ms columns, ``op = 'w'``
    pushed down): watermark rows are few, and a Spark job here would cost more than the read.
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    wanted = sorted(set(ids))
    if not segments or not wanted:
        return {}
    fs, _ = storage.filesystem(segments[0][2])
    paths = [storage.filesystem(p)[1] for _, _, p in segments]
    table = ds.dataset(paths, filesystem=fs, format="parquet").to_table(
        columns=["position", "watermark", "ts_ms"],
        filter=(pc.field("op") == "w") & pc.field("watermark").isin(wanted),
    )
    found: dict[str, tuple[str, int]] = {}
    for pos, wid, ts in zip(*(table[c].to_pylist() for c in ("position", "watermark", "ts_ms")), strict=True):
        if wid not in found or pos < found[wid][0]:
            found[wid] = (pos, ts or 0)
    return found


def staged_watermarks(changelog: str, ids: Iterable[str], *, attempts: int = 3) -> dict[str, tuple[str, int]]:
    """:func:`find_watermarks` over the segments staged in ``changelog`` now. A segment that
    disappears between the listing and the read (a concurrent capture replaced an orphan)
    makes it list again."""
    for attempt in range(attempts):
        try:
            return find_watermarks(list_segments(changelog), ids)
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    return {}


def staged_watermark_position(data_dir: str, source: str, watermark_id: str) -> Position | None:
    """Where a watermark write landed in the staged changelog of ``source`` (None: not yet)."""
    from .layout import changelog_dir

    hit = staged_watermarks(changelog_dir(data_dir, source), [watermark_id]).get(watermark_id)
    return None if hit is None else Position.decode(hit[0])
