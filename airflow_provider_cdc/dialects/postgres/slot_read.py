"""One read of the logical slot (``_SlotRead``: its state, one method per kind of message), a
block of pgoutput rows at a time, and what a Relation message tells it (``_RelInfo``): the part
of the dialect's ``log`` that walks a read's messages (log_reader.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.events import LogEvent
from ...core.position import Position, int_to_lsn
from ...core.schema import TableName
from ..base import LogBatch, SegmentSink
from . import pgbatch, pgoutput
from .types import identity

log = logging.getLogger(__name__)


@dataclass
class _RelInfo:
    table: TableName
    kind: str  # "table", "watermark", "skip", "error"
    names: tuple[str, ...] = ()
    decoders: tuple = ()
    key_idx: tuple[int, ...] = ()
    value_idx: int = -1  # watermark value column
    replica_identity: str = "d"
    problem: str | None = None  # set for kind "error": raised on the first change
    logicals: tuple[str, ...] = ()
    table_id: str = ""
    key_names: tuple[str, ...] = ()
    conversions: tuple = ()  # (index, decoder) of columns whose text needs decoding
    batch: pgbatch.Relation | None = None  # what the batch decode needs (kind "table")

    def __post_init__(self) -> None:
        self.table_id = self.table.id
        self.key_names = tuple(self.names[i] for i in self.key_idx)
        self.conversions = tuple((i, d) for i, d in enumerate(self.decoders) if d is not identity)
        if self.kind == "table":
            self.batch = pgbatch.Relation(
                self.table, self.names, self.logicals, self.decoders, self.key_names, self.replica_identity
            )


_UNSET = Position(0)  # the position of an event made one at a time, until its segment is built


_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_TRAILER = b"\xff\xff"
#: a binary COPY row of (lsn, data): field count (2 bytes), 8 (4), the LSN (8), the data's length (4)
_ROW_HEAD = 18
_BLOCK_BYTES = 8 << 20  # COPY rows kept before they are handled


#: why a server invalidated a slot: PostgreSQL 17+ names it (pg_replication_slots.invalidation_reason,
#: and the DETAIL of a read of the slot: 'invalidated due to "idle_timeout"'), older ones do not
def _unset() -> Position:  # events made one at a time: their positions are set when the segment is built
    return _UNSET


class _SlotRead:
    """One :meth:`PostgresDialect.read_log`: the binary COPY rows of a peek of the slot ->
    segments. ``write`` is called by psycopg2 once per row (one pgoutput message) and only
    keeps it; every ``_BLOCK_BYTES`` the block is handled: its messages' kinds and LSNs are
    read with numpy, runs of row messages go to the segment as they are (decoded when it is
    built), and the few others (Begin, Commit, Relation, TRUNCATE) are handled one at a time."""

    def __init__(
        self,
        reader: Any,  # the log_reader.PgLogReader this read is one of (not imported: it imports this)
        start: int,
        max_events: int | None,
        seg_max: int | None,
        on_segment: SegmentSink | None,
    ) -> None:
        self.d = reader
        self.offset = int_to_lsn(start)
        self.max_events = max_events
        self.seg_max = seg_max or None
        self.on_segment = on_segment
        # a cut inside a transaction: past twice the segment's events, or its bytes
        self.cut_messages = 2 * self.seg_max if self.seg_max is not None else None
        self.cut_bytes = reader.segment_max_bytes if self.seg_max is not None else None
        self.rows: list[bytes] = []
        self.nbytes = 0
        self.messages = 0  # rows the server sent
        self.header = True  # the COPY header is still ahead
        self.done = False  # max_events reached at a commit: the rest of the stream is not read on
        self.rels: dict[int, _RelInfo] = {}
        self.warned: set[TableName] = set()
        self.batched = reader.capture_decode == "batch"
        self.total = 0  # events of whole transactions read (max_events)
        self.seg_bytes = 0
        self.txn_begin: tuple = ()  # the open transaction's Begin: (commit LSN, time, xid, commit before)
        self.in_txn = False
        self.ts_ms = self.txn_start = 0
        self.last_commit = None  # the commit before the transaction (if this read saw it)
        self.end = start
        self.seg = self._segment()

    # --- psycopg2's side ------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.rows.append(data)
        self.nbytes += len(data)
        if self.nbytes >= _BLOCK_BYTES:
            self.flush()

    def flush(self) -> None:
        rows, self.rows, self.nbytes = self.rows, [], 0
        if self.header and rows:
            first = rows[0]
            if not first.startswith(_COPY_SIGNATURE) or len(first) < 19:
                raise pgoutput.ProtocolError(
                    "the slot's COPY stream does not start with a binary COPY header"
                )
            skip = 19 + int.from_bytes(first[15:19], "big")
            rows[0] = first[skip:]
            if not rows[0]:
                rows.pop(0)
            self.header = False
        if rows and rows[-1] == _COPY_TRAILER:
            rows.pop()
        if not rows or self.done:
            return
        self.messages += len(rows)
        self._block(rows)

    # --- a block of messages ---------------------------------------------------------------
    def _segment(self) -> pgbatch.Segment:
        d = self.d

        def other(info: _RelInfo, payload: bytes) -> list[LogEvent]:
            out: list[LogEvent] = []
            d._other_change(info, pgoutput.parse(payload), _unset, out, 0, self.warned)
            return out

        return pgbatch.Segment(d.watermark_table.id, d._toast_error, self.rels, other, header=_ROW_HEAD)

    def _block(self, rows: list[bytes]) -> None:
        n = len(rows)
        sizes = np.fromiter(map(len, rows), dtype=np.int64, count=n)
        if (sizes <= _ROW_HEAD).any():
            raise pgoutput.ProtocolError("a row of the slot's COPY stream is shorter than its header")
        psize = sizes - _ROW_HEAD
        rows_head = rows
        if int(sizes.sum()) > 4096 * n:  # large messages: a copy of their headers only, not of the block
            sizes = np.full(n, _ROW_HEAD + 1, dtype=np.int64)
            rows_head = [r[: _ROW_HEAD + 1] for r in rows]
        base = np.zeros(n, dtype=np.int64)
        np.cumsum(sizes[:-1], out=base[1:])
        buf = np.frombuffer(b"".join(rows_head), dtype=np.uint8)
        if (buf[base + 1] != 2).any() or (buf[base] != 0).any():
            raise pgoutput.ProtocolError("a row of the slot's COPY stream does not hold two fields")
        lsn = buf[base[:, None] + np.arange(6, 14)].view(">u8").ravel().astype(np.int64)
        kind = buf[base + _ROW_HEAD]
        ctrl = np.flatnonzero(
            (kind != 0x49) & (kind != 0x55) & (kind != 0x44)
        ).tolist()  # not Insert/Update/Delete
        i = 0
        for c in ctrl + [n]:
            if c > i:
                self._rows(rows, lsn, psize, i, c)
            if c == n or self.done:
                break
            self._control(rows[c][_ROW_HEAD:], int(lsn[c]))
            if self.done:
                break
            i = c + 1

    def _rows(self, rows: list[bytes], lsn: np.ndarray, psize: np.ndarray, i: int, j: int) -> None:
        """Row messages ``i:j`` of the block, in log order."""
        if not self.batched:
            for m in range(i, j):
                self._row_at_a_time(rows[m][_ROW_HEAD:], int(lsn[m]))
            return
        if self.cut_messages is None:
            self.seg.payloads.extend(rows[i:j])
            self.seg.lsns.extend(lsn[i:j].tolist())
            return
        cum = np.cumsum(psize[i:j])  # the run's bytes up to and including each message
        at = 0  # messages of the run kept so far
        kept = 0  # their bytes
        while at < j - i:
            # the first message after which the segment reaches its cut (as a message at a time would)
            by_count = at + max(self.cut_messages - len(self.seg.payloads) - 1, 0)
            by_bytes = max(int(np.searchsorted(cum, self.cut_bytes - self.seg_bytes + kept, side="left")), at)
            k = min(by_count, by_bytes)
            if k >= j - i:
                self.seg.payloads.extend(rows[i + at : j])
                self.seg.lsns.extend(lsn[i + at : j].tolist())
                self.seg_bytes += int(cum[-1]) - kept
                return
            self.seg.payloads.extend(rows[i + at : i + k + 1])
            self.seg.lsns.extend(lsn[i + at : i + k + 1].tolist())
            at, kept = k + 1, int(cum[k])
            self._cut()

    def _row_at_a_time(self, payload: bytes, lsn: int) -> None:
        """The reference decode (``capture_decode="rows"``): one row message's events now."""
        info = self.rels[pgoutput.U32.unpack_from(payload, 1)[0]]
        out: list[LogEvent] = []
        if info.batch is not None:
            self.d._row_events(info, pgoutput.parse(payload), _unset, out, self.ts_ms)
        else:
            self.d._other_change(info, pgoutput.parse(payload), _unset, out, self.ts_ms, self.warned)
        self.seg.events(out, lsn)
        if self.cut_messages is not None:
            self.seg_bytes += len(payload)
            if self.seg_bytes >= self.cut_bytes or len(self.seg.payloads) >= self.cut_messages:
                self._cut()

    def _cut(self) -> None:
        """A transaction too large for one segment: stage what it has so far."""
        self.total += len(self.seg) - self.txn_start
        built = self.seg.build()
        if built is not None:
            self.on_segment(built)
        base = self.seg.open_txn_events  # its events number the next part's
        self.seg = self._segment()
        self.seg.begin(*self.txn_begin, base=base)
        self.txn_start, self.seg_bytes = 0, 0

    def _control(self, payload: bytes, lsn: int) -> None:
        kind = payload[0]
        if kind == 66:  # Begin
            commit_lsn, ts_us, xid = pgoutput.BEGIN.unpack_from(payload, 1)
            self.in_txn, self.ts_ms, self.txn_start = (
                True,
                ts_us // 1000 + pgoutput.PG_EPOCH_MS,
                len(self.seg),
            )
            self.txn_begin = (commit_lsn, self.ts_ms, str(xid), self.last_commit)
            self.seg.begin(*self.txn_begin)
        elif kind == 67:  # Commit
            _flags, self.last_commit, end_lsn, _ts = pgoutput.COMMIT.unpack_from(
                payload, 1
            )  # Debezium's lastCommitLsn next
            self.in_txn = False
            self.total += len(self.seg) - self.txn_start
            self.end = max(self.end, end_lsn)
            if self.seg_max is not None and len(self.seg) >= self.seg_max:
                built = self.seg.build()  # ends at this commit
                if built is not None:
                    self.on_segment(built)
                self.seg = self._segment()
                self.seg_bytes = 0
            if self.max_events is not None and self.total >= self.max_events:
                self.done = True
        else:
            m = pgoutput.parse(payload)
            if isinstance(m, pgoutput.Relation):
                self.rels[m.relid] = self.d._relinfo(m)
                self.seg.relation(m.relid, self.rels[m.relid])
            elif isinstance(m, pgoutput.Truncate):
                out: list[LogEvent] = []
                self.d._truncate(m, self.rels, _unset, out, self.ts_ms)
                self.seg.events(out, lsn)

    def finish(self, upto: int, limited: bool) -> LogBatch:
        """The batch after the stream ended: ``limited``, the server stopped at the step's
        message bound (so the end it aimed at may not be reached)."""
        if self.in_txn and not self.done:
            raise pgoutput.ProtocolError("the slot's changes ended inside a transaction")
        more = self.done or limited
        if not more:
            self.end = max(self.end, upto)  # every transaction committed before ``upto`` is read
        return LogBatch(self.seg.build() or [], int_to_lsn(self.end), self.offset, more=more)
