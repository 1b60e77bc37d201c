"""PostgreSQL capture in batches: the pgoutput row messages of a segment -> an EventBatch
(core/event_batch.py), decoded a column at a time.

Why: decoding one message at a time (dialects/pgoutput.parse, a decoder per value, a dict
and a ChangeEvent per row, then typing the dicts again to stage them) cost tens of
microseconds of Python per change, a tenth of what the server's own decoder drains. Here the
read loop only keeps each row message's bytes (:meth:`Segment.row`); when a segment is
complete, each relation's messages are parsed together (pgoutput.parse_tuples: numpy over
all messages, a column at a time) and their text values typed by the same Arrow kernels as
the COPY chunk read (dialects/pgcopy.ChunkAssembler: the server renders a value with the same
output function in both). The event-at-a-time path (:meth:`Segment.events`) stays for
watermark writes and TRUNCATEs, and as the reference (the dialect option
``capture_decode="rows"``) the batch decode is tested against.

Positions are assigned when the segment is built: ``(commit LSN, 0, n)`` for the n-th event of
its transaction, as the event-at-a-time path numbers them (an UPDATE that changes the key is
two events, a delete then a create).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...core.arrow_types import bools_to_numpy, conform_images, index_array, string_array, validity_mask
from ...core.event_batch import ORIGIN_TYPE, SEGMENT_SCHEMA, EventBatch, ImagePart, encode_positions
from ...core.events import WATERMARK_OP, ChangeEvent, LogEvent, Op, WatermarkEvent
from ...core.schema import MULTISET, Column, TableName, TableSchema
from . import pgoutput
from .pgcopy import ChunkAssembler

_I, _U, _D = 0x49, 0x55, 0x44  # Insert, Update, Delete
_K, _O, _N = 0x4B, 0x4F, 0x4E  # old key, old row, new row markers
_UNCHANGED = 0x75  # an unchanged TOASTed value ('u')


@dataclass
class Relation:
    """What decoding a relation's messages needs (one version of its columns)."""

    table: TableName
    names: tuple[str, ...]
    logicals: tuple[str, ...]
    decoders: tuple
    key_names: tuple[str, ...]
    replica_identity: str = "d"
    _assembler: ChunkAssembler | None = field(default=None, repr=False)
    _schema: TableSchema | None = field(default=None, repr=False)

    @property
    def assembler(self) -> ChunkAssembler:
        if self._assembler is None:
            self._assembler = ChunkAssembler(self.names, self.logicals, self.decoders, self.key_names)
        return self._assembler

    @property
    def schema(self) -> TableSchema:
        """The columns as the relation message describes them (the images' types here)."""
        if self._schema is None:
            self._schema = TableSchema(
                self.table,
                tuple(Column(n, t) for n, t in zip(self.names, self.logicals, strict=True)),
                self.key_names,
                {} if self.key_names else {MULTISET: "true"},  # no key: a multiset, keyed by the whole row
            )
        return self._schema


#: raised for an UPDATE whose new row leaves a TOASTed column out with no old value to take
#: it from: (relation, column names) -> the error
ToastError = Callable[[Relation, list[str]], Exception]


class Segment:
    """The messages of one segment's whole transactions, kept as they came until :meth:`build`.

    Every message that may yield events takes one *slot*, its index in ``payloads`` (log
    order); its events are numbered inside the slot (``sub``). Row messages (Insert, Update,
    Delete of any relation) are only kept (:meth:`row`, inlined in the read loop as two list
    appends); at :meth:`build` they are grouped by relation, those of captured tables decoded
    together and the rest handed to ``other`` one at a time (the watermark table's writes, a
    skipped table's changes). A message made into events at once (a TRUNCATE, or every row
    message with ``capture_decode="rows"``) comes through :meth:`events`.

    ``rels``: relid -> what the dialect knows of the relation (its ``batch`` attribute: a
    :class:`Relation` for a captured table, None otherwise) when the segment starts;
    :meth:`relation` records a relation described anew inside it, from that slot on."""

    def __init__(
        self,
        watermark_table: str,
        toast_error: ToastError,
        rels: dict,
        other: Callable[[object, bytes], list[LogEvent]],
        header: int = 0,
    ) -> None:
        self.watermark_table = watermark_table
        self.header = header  # bytes before the message in each kept payload (a COPY row's header)
        self.toast_error = toast_error
        self.other = other
        self.payloads: list[bytes] = []  # per slot: the message (a placeholder for ready events)
        self.lsns: list[int] = []  # per slot: the message's WAL position
        self.txn_first: list[
            int
        ] = []  # per transaction: its first slot, commit LSN, time, xid, the commit before it
        self.txn_lsn: list[int] = []
        self.txn_ts: list[int] = []
        self.txn_xid: list[str] = []
        self.txn_last: list[int | None] = []
        self.txn_base: list[int] = []  # per transaction: its events in earlier segments (one cut inside it)
        self.open_txn_events = 0  # after build: the last transaction's events up to this segment's end
        self.relations: list[tuple[int, int, object]] = [(0, relid, info) for relid, info in rels.items()]
        self.ready: list[tuple[int, int, LogEvent]] = []  # (slot, sub, event): position set at build
        self.extra = 0  # events beyond one per slot

    def __len__(self) -> int:
        """Events so far, counting a row message as one (a key change is two, a skipped
        table's change none: the exact count is the built batch's length)."""
        return len(self.payloads) + self.extra

    def begin(self, commit_lsn: int, ts_ms: int, xid: str, last_commit: int | None, base: int = 0) -> None:
        """A transaction starts at the next slot; ``base``: its events already in earlier
        segments (a transaction too large for one segment continues here), so the positions
        inside it go on from there."""
        self.txn_first.append(len(self.payloads))
        self.txn_lsn.append(commit_lsn)
        self.txn_ts.append(ts_ms)
        self.txn_xid.append(xid)
        self.txn_last.append(last_commit)
        self.txn_base.append(base)

    def row(self, payload: bytes, lsn: int) -> None:
        """An Insert, Update or Delete message (the read loop appends these itself)."""
        self.payloads.append(payload)
        self.lsns.append(lsn)

    def relation(self, relid: int, info: object) -> None:
        """Relation ``relid`` is described as ``info`` from the next slot on."""
        self.relations.append((len(self.payloads), relid, info))

    def events(self, events: Sequence[LogEvent], lsn: int) -> None:
        """Events made one at a time from one message (their positions are set at build)."""
        if not events:
            return
        slot = len(self.payloads)
        self.payloads.append(b"")
        self.lsns.append(lsn)
        self.ready.extend((slot, sub, ev) for sub, ev in enumerate(events))
        self.extra += len(events) - 1

    # --- build ------------------------------------------------------------------------------
    def build(self) -> EventBatch | None:
        """The segment's events, in log order, as an EventBatch (None: no events)."""
        buf, base, sizes, rows, relid = self._frame()
        ready = list(self.ready)
        # (slots, subs, table ids, ops, keys, watermarks, image part or None)
        pieces = self._row_pieces(buf, base, sizes, rows, relid, ready)
        if ready:
            pieces.append(self._ready_piece(ready))
        if not pieces:
            self.open_txn_events = self.txn_base[-1] if self.txn_base else 0
            return None
        log, rank = self._log(pieces)
        return EventBatch(log, _image_parts(pieces, rank))

    def _frame(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The slots' messages in one buffer: each one's first byte and length past the header,
        the row messages' slots and every slot's relid (0: not a row message)."""
        n, h = len(self.payloads), self.header
        sizes = np.fromiter(map(len, self.payloads), dtype=np.int64, count=n)
        base = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=base[1:])
        buf = np.frombuffer(b"".join([*self.payloads, b"\0" * (8 + h)]), dtype=np.uint8)  # one copy
        base += h  # each message's first byte (a placeholder's: padding)
        sizes = np.maximum(sizes - h, 0)
        kind = np.where(sizes > 0, buf[base], 0)
        is_row = (kind == _I) | (kind == _U) | (kind == _D)
        relid = np.zeros(n, dtype=np.int64)
        rows = np.flatnonzero(is_row)
        relid[rows] = pgoutput.be32(buf, base[rows] + 1)
        return buf, base, sizes, rows, relid

    def _row_pieces(
        self,
        buf: np.ndarray,
        base: np.ndarray,
        sizes: np.ndarray,
        rows: np.ndarray,
        relid: np.ndarray,
        ready: list[tuple[int, int, LogEvent]],
    ) -> list[tuple]:
        """The row messages of each captured relation's version decoded together, a piece each;
        those of a relation not captured made into events by ``other``, added to ``ready``."""
        h = self.header
        pieces = []
        for rid in np.unique(relid[rows]).tolist():
            versions = [(first, info) for first, r, info in self.relations if r == rid]
            mine = rows[relid[rows] == rid]
            version = (
                np.searchsorted(np.asarray([f for f, _ in versions], dtype=np.int64), mine, side="right") - 1
            )
            if not versions or (version < 0).any():
                raise pgoutput.ProtocolError(f"a change of relation {rid} before its Relation message")
            for v in np.unique(version).tolist():
                msgs = mine[version == v]
                info = versions[v][1]
                rel = info.batch
                if rel is None:  # the watermark table, a table capture skips or fails on
                    for m in msgs.tolist():
                        ready.extend(
                            (m, sub, ev) for sub, ev in enumerate(self.other(info, self.payloads[m][h:]))
                        )
                    continue
                ev = decode_rows(rel, buf, base[msgs], sizes[msgs], self.toast_error)
                tid = rel.table.id
                pieces.append(
                    (
                        msgs[ev.message],
                        ev.sub,
                        _repeat(tid, len(ev.sub)),
                        ev.op,
                        ev.key,
                        pa.nulls(len(ev.sub), pa.string()),
                        (tid, ev.before, ev.after, rel.schema, ev.text_columns),
                    )
                )
        return pieces

    def _ready_piece(self, ready: list[tuple[int, int, LogEvent]]) -> tuple:
        """The piece of the events made one at a time (``ready``: (slot, sub, event))."""
        r_slot = np.fromiter((s for s, _, _ in ready), dtype=np.int64, count=len(ready))
        r_sub = np.fromiter((s for _, s, _ in ready), dtype=np.int64, count=len(ready))
        evs = [e for _, _, e in ready]
        wm = [isinstance(e, WatermarkEvent) for e in evs]
        return (
            r_slot,
            r_sub,
            string_array([self.watermark_table if w else e.table for w, e in zip(wm, evs, strict=True)]),
            string_array([WATERMARK_OP if w else e.op for w, e in zip(wm, evs, strict=True)]),
            string_array([None if w else e.key for w, e in zip(wm, evs, strict=True)]),
            string_array([e.id if w else e.watermark for w, e in zip(wm, evs, strict=True)]),
            evs,
        )

    def _log(self, pieces: list[tuple]) -> tuple[pa.Table, np.ndarray]:
        """The pieces' events as the log table, in log order with their positions, and each
        concatenated event's row in it; sets ``open_txn_events``."""
        slot = np.concatenate([p[0] for p in pieces])
        sub = np.concatenate([p[1] for p in pieces])
        order = np.lexsort((sub, slot))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order), dtype=np.int64)  # concatenated event -> its row in the batch
        take = index_array(order)

        slot_sorted = slot[order]
        txn = np.searchsorted(np.asarray(self.txn_first, dtype=np.int64), slot_sorted, side="right") - 1
        # the n-th event of its transaction: rows of one transaction are contiguous
        first_of_txn = np.searchsorted(txn, txn, side="left")
        base = np.asarray(self.txn_base, dtype=np.int64)
        index = np.arange(len(order), dtype=np.int64) - first_of_txn + base[txn]
        last = len(self.txn_first) - 1
        self.open_txn_events = int(base[last] + np.count_nonzero(txn == last)) if last >= 0 else 0
        lsn = np.asarray(self.txn_lsn, dtype=np.uint64)[txn]
        position = encode_positions(lsn, np.zeros(len(order), dtype=np.uint64), index)
        ts = index_array(np.asarray(self.txn_ts, dtype=np.int64)[txn])
        table = pa.concat_arrays([p[2] for p in pieces]).take(take)
        op = pa.concat_arrays([p[3] for p in pieces]).take(take)
        key = pa.concat_arrays([p[4] for p in pieces]).take(take)
        watermark = pa.concat_arrays([p[5] for p in pieces]).take(take)
        origin = self._origin(slot_sorted, txn, pc.equal(op, pa.scalar(WATERMARK_OP)))
        log = pa.Table.from_arrays([position, table, op, key, ts, watermark, origin], schema=SEGMENT_SCHEMA)
        return log, rank

    def _origin(self, slots: np.ndarray, txn: np.ndarray, is_watermark: pa.Array) -> pa.Array:
        """Debezium's source block per event: the xid, the change's WAL position and the commit
        before its transaction (null for watermark rows)."""
        n = len(slots)
        xid = string_array(self.txn_xid).take(index_array(txn))
        lsn = index_array(np.asarray(self.lsns, dtype=np.int64)[slots])
        last = np.asarray([-1 if v is None else v for v in self.txn_last], dtype=np.int64)[txn]
        last_arr = index_array(np.maximum(last, 0), last >= 0)
        none_i = pa.nulls(n, pa.int64())
        children = [xid, lsn, last_arr, none_i, none_i, pa.nulls(n, pa.string())]
        return pa.StructArray.from_arrays(children, fields=list(ORIGIN_TYPE), mask=is_watermark)


def _repeat(text: str, n: int) -> pa.Array:
    return string_array([text]).take(index_array(np.zeros(n, dtype=np.int64)))


def _image_parts(pieces: list[tuple], rank: np.ndarray) -> tuple[ImagePart, ...]:
    """The pieces' before and after images, by table, at their events' rows in the batch (``rank``)."""
    parts: list[ImagePart] = []
    offset = 0
    dicts: dict[str, tuple[list, list, list]] = {}
    for p in pieces:
        n = len(p[0])
        if isinstance(p[6], tuple):
            tid, before, after, schema, text = p[6]
            parts.append(ImagePart(tid, rank[offset : offset + n], before, after, schema, tuple(text)))
        else:
            for j, ev in enumerate(p[6]):
                if isinstance(ev, ChangeEvent):
                    mine = dicts.setdefault(ev.table, ([], [], []))
                    mine[0].append(int(rank[offset + j]))
                    mine[1].append(ev.before)
                    mine[2].append(ev.after)
        offset += n
    for tid, (rows_, befores, afters) in dicts.items():
        by_row = np.argsort(np.asarray(rows_, dtype=np.int64), kind="stable")
        parts.append(
            ImagePart(
                tid,
                np.asarray(rows_, dtype=np.int64)[by_row],
                [befores[i] for i in by_row],
                [afters[i] for i in by_row],
            )
        )
    return tuple(parts)


@dataclass
class RowEvents:
    """The events of one relation's row messages: ``message`` (which message each came from),
    ``sub`` (0, or 1 for the create half of a key change), op, key, and the images as structs
    of the relation's columns (``text_columns``: kept as canonical text)."""

    message: np.ndarray
    sub: np.ndarray
    op: pa.Array
    key: pa.Array
    before: pa.StructArray
    after: pa.StructArray
    text_columns: list[str]


_OPS = string_array([Op.CREATE.value, Op.UPDATE.value, Op.DELETE.value])


def decode_rows(
    rel: Relation, buf: np.ndarray, base: np.ndarray, sizes: np.ndarray, toast_error: ToastError
) -> RowEvents:
    """Insert/Update/Delete messages of one relation (in log order), at ``base`` (``sizes``
    bytes each) in ``buf`` -> their events."""
    n = len(base)
    kind = buf[base]
    ins, upd, dele = kind == _I, kind == _U, kind == _D
    if not (ins | upd | dele).all():
        raise pgoutput.ProtocolError("a row message is not an Insert, Update or Delete")
    marker = buf[base + 5]
    old_marker = (marker == _K) | (marker == _O)
    if (dele & ~old_marker).any():
        raise pgoutput.ProtocolError("Delete without old tuple")
    has_old = dele | (upd & old_marker)
    ncols = len(rel.names)
    old_rows = np.flatnonzero(has_old)
    old = pgoutput.parse_tuples(buf, base[old_rows] + 6, ncols)
    new_rows = np.flatnonzero(~dele)
    new_marker = base + 5
    new_marker[old_rows] = old.end
    if (buf[new_marker[new_rows]] != _N).any():
        raise pgoutput.ProtocolError("Insert or Update without new tuple")
    new = pgoutput.parse_tuples(buf, new_marker[new_rows] + 1, ncols)
    ends = base + sizes
    if (new.end != ends[new_rows]).any() or (old.end[dele[old_rows]] != ends[old_rows][dele[old_rows]]).any():
        raise pgoutput.ProtocolError("a row message holds more than its tuples")
    oi = np.full(n, -1, dtype=np.int64)  # message -> its old tuple / new tuple (-1: none)
    oi[old_rows] = np.arange(len(old_rows), dtype=np.int64)
    ni = np.full(n, -1, dtype=np.int64)
    ni[new_rows] = np.arange(len(new_rows), dtype=np.int64)
    _fill_unchanged(rel, new, old, oi[new_rows], marker[new_rows] == _O, toast_error)

    asm = rel.assembler
    new_cols = [new.text(j) for j in range(ncols)]
    old_cols = [old.text(j) for j in range(ncols)]
    empty = (string_array([]), [pa.nulls(0, _type(a)) for a in asm.logical], [], None)
    key_new, arr_new, text_new, _ = asm.build_typed(new_cols) if len(new_rows) else empty
    key_old, arr_old, text_old, _ = asm.build_typed(old_cols) if len(old_rows) else empty

    # an UPDATE whose key columns' text changed: a delete of the old key, then a create
    changed = np.zeros(n, dtype=np.bool_)
    upd_old = np.flatnonzero(upd & has_old)
    if len(upd_old):
        diff = np.zeros(len(upd_old), dtype=np.bool_)
        for j in asm.pk_idx:
            a, b = old_cols[j].take(index_array(oi[upd_old])), new_cols[j].take(index_array(ni[upd_old]))
            same = bools_to_numpy(pc.equal(a, b)) | (~validity_mask(a) & ~validity_mask(b))
            diff |= ~same
        changed[upd_old] = diff

    # one event per message, plus the create half of each key change
    extra = np.flatnonzero(changed)
    message = np.concatenate([np.arange(n, dtype=np.int64), extra])
    sub = np.concatenate([np.zeros(n, dtype=np.int64), np.ones(len(extra), dtype=np.int64)])
    opcode = np.where(ins, 0, np.where(dele | changed, 2, 1))  # c, u, d (a key change's first half: d)
    opcode = np.concatenate([opcode, np.zeros(len(extra), dtype=np.int64)])
    is_first = sub == 0
    # before: the old tuple of updates and deletes (and of a key change's delete); after: the
    # new tuple of inserts, updates and a key change's create
    b_idx = np.where(is_first, oi[message], -1)
    a_idx = np.where(is_first & changed[message], -1, ni[message])
    old_key = opcode == 2  # deletes (and a key change's delete) carry the old key
    keys = pc.coalesce(
        _take(key_old, np.where(old_key, oi[message], -1)), _take(key_new, np.where(old_key, -1, ni[message]))
    )

    text = sorted(set(text_new) | set(text_old))
    names = list(rel.names)
    new_struct = _struct(arr_new, names, rel.schema, text_new, text)
    old_struct = _struct(arr_old, names, rel.schema, text_old, text)
    before = _take(old_struct, b_idx)
    after = _take(new_struct, a_idx)
    return RowEvents(message, sub, _OPS.take(index_array(opcode)), keys, before, after, text)


def _fill_unchanged(
    rel: Relation,
    new: pgoutput.TupleColumns,
    old: pgoutput.TupleColumns,
    old_of_new: np.ndarray,
    old_is_row: np.ndarray,
    toast_error: ToastError,
) -> None:
    """Unchanged TOASTed values of new rows ('u') take the old row's value (REPLICA IDENTITY
    FULL sends it); without one the after-image cannot be built: ``toast_error``."""
    unchanged = new.kinds == _UNCHANGED
    if not unchanged.any():
        return
    for j in np.flatnonzero(unchanged.any(axis=1)):
        r = np.flatnonzero(unchanged[j])
        s = old_of_new[r]
        bad = (s < 0) | ~old_is_row[r]
        s = np.maximum(s, 0)
        if len(old.kinds[j]):
            bad |= old.kinds[j][s] == _UNCHANGED
        if bad.any():
            first = r[np.flatnonzero(bad)[0]]
            raise toast_error(rel, [rel.names[c] for c in np.flatnonzero(unchanged[:, first])])
        new.kinds[j][r] = old.kinds[j][s]
        new.starts[j][r] = old.starts[j][s]
        new.lengths[j][r] = old.lengths[j][s]


def _type(logical: str) -> pa.DataType:
    from ...core.arrow_types import arrow_type

    return arrow_type(logical)


def _struct(
    arrays: list[pa.Array], names: list[str], schema: TableSchema, text: list[str], want_text: list[str]
) -> pa.StructArray:
    fields = [pa.field(nm, a.type) for nm, a in zip(names, arrays, strict=True)]
    s = pa.StructArray.from_arrays(arrays, fields=fields)
    if sorted(text) != want_text:  # a column typed in one image and text in the other: text in both
        s = conform_images(s, schema, text, schema, want_text)
    return s


def _take(arr: pa.Array, idx: np.ndarray) -> pa.Array:
    """Rows ``idx`` of ``arr`` (-1: null)."""
    valid = idx >= 0
    return arr.take(index_array(np.maximum(idx, 0), None if valid.all() else valid))
