"""Log events in columns: what capture stages as one segment (storage/staged.py), a run of whole
transactions in position order. A dialect that decodes its log in batches builds an
:class:`EventBatch` from the protocol's bytes; one that builds events one at a time hands
LogEvents to :func:`events_to_batch`. Staging writes both the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .events import ORIGIN_FIELDS, WATERMARK_OP, ChangeEvent, LogEvent, WatermarkEvent
from .position import Position
from .schema import TableSchema

#: ChangeEvent.origin as staged (core/events.py ORIGIN_FIELDS)
ORIGIN_TYPE = pa.struct(
    [
        ("tx", pa.string()),
        ("lsn", pa.int64()),
        ("last_commit_lsn", pa.int64()),
        ("server_id", pa.int64()),
        ("thread", pa.int64()),
        ("file", pa.string()),
    ]
)
assert tuple(f.name for f in ORIGIN_TYPE) == ORIGIN_FIELDS
#: the log columns of a staged segment (its typed images follow, per table: storage/staged.py)
SEGMENT_SCHEMA = pa.schema(
    [
        ("position", pa.string()),
        ("table", pa.string()),
        ("op", pa.string()),
        ("key", pa.string()),
        ("ts_ms", pa.int64()),
        ("watermark", pa.string()),
        ("origin", ORIGIN_TYPE),
    ]
)


@dataclass(frozen=True)
class ImagePart:
    """The images of some events of one table: ``rows`` (ascending) are their row numbers in
    the batch's ``log``; ``before``/``after`` hold one image per row (null: none), typed
    structs with ``schema``/``text_columns``, or canonical row dicts (``schema`` None)."""

    table: str
    rows: np.ndarray
    before: pa.StructArray | list
    after: pa.StructArray | list
    schema: TableSchema | None = None
    text_columns: tuple[str, ...] = ()

    @property
    def typed(self) -> bool:
        return self.schema is not None


@dataclass(frozen=True)
class EventBatch:
    log: pa.Table
    parts: tuple[ImagePart, ...]

    def __len__(self) -> int:
        return self.log.num_rows

    @property
    def first(self) -> Position:
        return Position.decode(self.log["position"][0].as_py())

    @property
    def last(self) -> Position:
        return Position.decode(self.log["position"][-1].as_py())

    @property
    def tables(self) -> list[str]:
        """The tables with events in the batch (not the watermark table), in order of their
        first event: the order their image columns are staged in."""
        firsts: dict[str, int] = {}
        for p in self.parts:
            if len(p.rows):
                firsts[p.table] = min(firsts.get(p.table, 1 << 62), int(p.rows[0]))
        return sorted(firsts, key=firsts.__getitem__)

    @property
    def watermarks(self) -> int:
        return int(pc.sum(pc.equal(self.log["op"], WATERMARK_OP)).as_py() or 0)

    @property
    def newest_ts_ms(self) -> int | None:
        ts = pc.max(self.log["ts_ms"]).as_py()
        return ts or None

    def __iter__(self) -> Iterator[LogEvent]:
        return iter(self.events())

    def events(self) -> list[LogEvent]:
        """The batch as LogEvents with canonical row images (checks and tests; staging reads
        the columns)."""
        from .arrow_types import canonical_rows

        n = len(self)
        befores: list = [None] * n
        afters: list = [None] * n
        for p in self.parts:
            if p.typed:
                b = canonical_rows(p.before, p.schema, p.text_columns)
                a = canonical_rows(p.after, p.schema, p.text_columns)
            else:
                b, a = p.before, p.after
            for j, r in enumerate(p.rows.tolist()):
                befores[r], afters[r] = b[j], a[j]
        out: list[LogEvent] = []
        for i, rec in enumerate(self.log.to_pylist()):
            pos = Position.decode(rec["position"])
            if rec["op"] == WATERMARK_OP:
                out.append(WatermarkEvent(rec["watermark"], pos, rec["ts_ms"]))
                continue
            origin = rec["origin"]
            out.append(
                ChangeEvent(
                    rec["table"],
                    rec["op"],
                    rec["key"],
                    pos,
                    befores[i],
                    afters[i],
                    rec["ts_ms"],
                    watermark=rec["watermark"],
                    origin=None if origin is None else tuple(origin[f] for f in ORIGIN_FIELDS),
                )
            )
        return out


def events_to_batch(events: Sequence[LogEvent], watermark_table: str) -> EventBatch:
    """LogEvents (position order) -> an EventBatch whose images are the events' canonical
    row dicts (one part per table)."""
    from .arrow_types import int64_array, string_array

    pos: list = []
    tbl: list = []
    ops: list = []
    keys: list = []
    ts: list = []
    wms: list = []
    origins: list = []
    images: dict[str, tuple[list, list, list]] = {}  # table -> (rows, befores, afters)
    for i, ev in enumerate(events):
        pos.append(ev.position.encode())
        ts.append(ev.ts_ms)
        if isinstance(ev, WatermarkEvent):
            tbl.append(watermark_table)
            ops.append(WATERMARK_OP)
            keys.append(None)
            wms.append(ev.id)
            origins.append(None)
        else:
            tbl.append(ev.table)
            ops.append(ev.op)
            keys.append(ev.key)
            wms.append(ev.watermark)
            origins.append(ev.origin)
            mine = images.get(ev.table)
            if mine is None:
                mine = images[ev.table] = ([], [], [])
            mine[0].append(i)
            mine[1].append(ev.before)
            mine[2].append(ev.after)
    log = pa.Table.from_arrays(
        [
            string_array(pos),
            string_array(tbl),
            string_array(ops),
            string_array(keys),
            int64_array(ts),
            string_array(wms),
            origin_array(origins),
        ],
        schema=SEGMENT_SCHEMA,
    )
    parts = tuple(ImagePart(t, np.asarray(rows, dtype=np.int64), b, a) for t, (rows, b, a) in images.items())
    return EventBatch(log, parts)


def origin_array(origins: Sequence[tuple | None]) -> pa.Array:
    """ChangeEvent.origin tuples (None = unknown) -> the staged ``origin`` struct column, one
    child array per field (built from columns, see core/arrow_types.string_array)."""
    from .arrow_types import bitmap, int64_array, string_array

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
        mask = pa.Array.from_buffers(pa.bool_(), n, [None, bitmap(missing)])
    return pa.StructArray.from_arrays(children, fields=list(ORIGIN_TYPE), mask=mask)


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def encode_positions(major: np.ndarray, minor: np.ndarray, index: np.ndarray) -> pa.Array:
    """Positions as columns -> their encoded text (Position.encode: 16 + 16 + 8 lowercase hex
    digits), a string array built without a Python object per position."""
    n = len(major)
    out = np.empty((n, 40), dtype=np.uint8)
    col = 0
    for arr, digits in ((major, 16), (minor, 16), (index, 8)):
        v = np.asarray(arr, dtype=np.uint64)
        for k in range(digits):
            out[:, col] = _HEX[((v >> np.uint64(4 * (digits - 1 - k))) & np.uint64(15)).astype(np.intp)]
            col += 1
    offsets = np.arange(0, 40 * (n + 1), 40, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out.tobytes())])
