"""One read of the binlog (``_BinlogRead``: its state, one method per event type), the rows
events' zero-date handling, and TRUNCATE statements parsed: the part of the dialect's ``log``
that walks the events of a read (log_reader.py).
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...core.events import LogEvent
from ...core.schema import TableName
from ..base import LogBatch, SegmentSink
from .binlog import BinlogOffset
from .failover import GtidState
from .held import HeldGroup, Scratch, Xid, savepoint_name
from .packets import FAST_TYPES, PacketEvents, RawStream
from .rows_walker import EventBuffer, RowsRun
from .types import IDENTIFIER, query_text, unquote

log = logging.getLogger(__name__)


class _ZeroDateRows:
    """mysql-replication decodes zero and partial DATE / DATETIME values to None, which would
    turn '2020-00-00' into NULL on the changelog path only. Rows events of this package's
    streams are of subclasses with this mixin first (:func:`_own_rows`), whose date readers
    decode such values to the server's text (the bits hold year, month and day exactly);
    valid dates are unchanged. The library itself is left as it is for every other user in
    the process. The method names are the ones RowsEvent's row decoder calls (its private,
    name-mangled readers), so a subclass's method is found first."""

    packet: Any

    def _RowsEvent__read_date(self):  # noqa: N802 - the name RowsEvent calls
        time = self.packet.read_uint24()
        year, month, day = (time >> 9) & ((1 << 15) - 1), (time >> 5) & 15, time & 31
        try:
            return dt.date(year, month, day)
        except ValueError:
            return f"{year:04d}-{month:02d}-{day:02d}"

    def _RowsEvent__read_datetime2(self, column):  # noqa: N802
        data = self.packet.read_int_be_by_size(5)
        part = self._RowsEvent__read_binary_slice
        year, month = divmod(part(data, 1, 17, 40), 13)
        day, hour, minute, second = (
            part(data, 18, 5, 40),
            part(data, 23, 5, 40),
            part(data, 28, 6, 40),
            part(data, 34, 6, 40),
        )
        try:
            t = dt.datetime(year, month, day, hour, minute, second)
        except ValueError:
            us = self._RowsEvent__read_fsp(column)
            return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}.{us:06d}"
        return self._RowsEvent__add_fsp_to_time(t, column)

    def _RowsEvent__read_datetime(self):  # noqa: N802
        value = self.packet.read_uint64()
        day_part, clock = divmod(value, 1_000_000)
        year, rest = divmod(day_part, 10_000)
        month, day = divmod(rest, 100)
        hour, rest = divmod(clock, 10_000)
        minute, second = divmod(rest, 100)
        try:
            return dt.datetime(year, month, day, hour, minute, second)
        except ValueError:
            return f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"


@functools.cache
def _rows_subclasses() -> dict[type, type]:
    from pymysqlreplication.row_event import (
        DeleteRowsEvent,
        PartialUpdateRowsEvent,
        UpdateRowsEvent,
        WriteRowsEvent,
    )

    return {
        c: type(c.__name__, (_ZeroDateRows, c), {"__module__": __name__})
        for c in (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, PartialUpdateRowsEvent)
    }


def _own_rows(ev: Any) -> Any:
    """A rows event as the :class:`_ZeroDateRows` subclass of its class, before its rows are
    decoded (the library decodes them at the first read of ``rows``); other events as they are."""
    sub = _rows_subclasses().get(type(ev))
    if sub is not None:
        ev.__class__ = sub
    return ev


_TRUNCATE_RE = re.compile(
    rf"^\s*TRUNCATE\s+(?:TABLE\s+)?(?P<a>{IDENTIFIER})(?:\s*\.\s*(?P<b>{IDENTIFIER}))?\s*(?:(?:WAIT\s+\d+|NOWAIT)\s*)?;?\s*$",
    re.IGNORECASE | re.DOTALL,
)


def parse_truncate(sql: str, default_schema: str | None) -> TableName | None:
    """The table of ``TRUNCATE [TABLE] [db.]t [WAIT n|NOWAIT]`` (backquoted names with
    doubled backticks, or bare ones), or None when the statement is not that shape."""
    m = _TRUNCATE_RE.match(sql)
    if m is None:
        return None
    if m.group("b") is not None:
        return TableName(unquote(m.group("a")), unquote(m.group("b")))
    if not default_schema:
        return None
    return TableName(default_schema, unquote(m.group("a")))


_ANONYMOUS_GTID = 0x22  # MySQL without GTIDs: the event that starts a group
#: event types the reader does not decode whose changes would be lost if passed over
_UNREADABLE_EVENTS: dict[int, str] = {
    **{t: "a LOAD DATA event of statement-based logging" for t in (0x06, 0x08, 0x09, 0x0A, 0x0B, 0x0C)},
    **{t: "a pre-GA rows event" for t in (0x14, 0x15, 0x16)},
    0x1A: "an INCIDENT event: the server recorded that changes may be missing from the binlog (for "
    "example a non-transactional write that could not be logged)",
    0x28: "a compressed transaction (MySQL binlog_transaction_compression = ON: SET GLOBAL "
    "binlog_transaction_compression = OFF)",
    **{
        t: "a compressed event (MariaDB log_bin_compress = ON: SET GLOBAL log_bin_compress = OFF)"
        for t in range(0xA5, 0xAC)
    },
}
#: a change logged as a statement (the writer's session not in binlog_format=ROW)
_STATEMENT_DML_RE = re.compile(
    r"^(?:/\*.*?\*/\s*)*(?:INSERT|UPDATE|DELETE|REPLACE|LOAD\s+(?:DATA|XML))\b", re.IGNORECASE | re.DOTALL
)


class _BinlogRead(PacketEvents):
    """One :meth:`MyLogReader.read_log`: the read's state (the segment being filled, the open
    group, whether it is held, the last whole group's position and GTID) and one method per binlog
    event type, looked up in :attr:`handlers` by the event's class. A handler returns True when
    the read stops at the group end it reached (``max_events``)."""

    def __init__(
        self,
        reader: Any,  # the log_reader.MyLogReader this read is one of (not imported: it imports this)
        start: BinlogOffset,
        end: BinlogOffset,
        gtids: GtidState | None,
        *,
        max_events: int | None,
        seg_max: int | None,
        on_segment: SegmentSink | None,
    ) -> None:
        from pymysqlreplication.event import (
            ExecuteLoadQueryEvent,
            GtidEvent,
            MariadbGtidEvent,
            NotImplementedEvent,
            QueryEvent,
            XAPrepareEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import (
            DeleteRowsEvent,
            PartialUpdateRowsEvent,
            UpdateRowsEvent,
            WriteRowsEvent,
        )

        self.d = reader
        self.start, self.end = start, end
        self.gtids = gtids  # MariaDB: the GTID position at the start (gtid_state: at ``committed``)
        self.max_events = max_events
        self.seg_max = seg_max
        self.on_segment = on_segment
        self.wm = reader.watermark_table
        self.inside_max = 2 * seg_max if seg_max is not None else None  # a cut inside a group
        self.max_bytes = reader.segment_max_bytes
        self.hold_max = self.inside_max or 2 * (reader.segment_max_events or 20_000)  # held events in memory
        self.scratch = Scratch()
        # the segment's events: LogEvents and runs of the compiled walker's rows (rows_walker.py)
        self.out = EventBuffer()
        self.seg_bytes = 0  # rows-event bytes of the events in ``out``
        self.total = 0  # events of whole groups read (max_events)
        self.group_count = 0  # events the open group put in ``out``
        self.group_mark = 0  # where the open group's events start in ``out``
        self.in_group = False
        self.held: HeldGroup | None = None  # the open group is held (None: streamed into ``out``)
        self.group_start: tuple[int, int] | None = None  # (file index, offset) of its GTID event
        self.committed = start
        self.current_file = start.file
        self.skipped: set[str] = set()
        self.in_txn = False  # inside BEGIN .. COMMIT/XID: no boundary until it ends
        self.group_gtid = self.committed_gtid = None  # GTID of the last whole group (for the record)
        self.thread = None  # thread id of the transaction's BEGIN (Debezium's source.thread)
        # the event being handled: where it ends and starts, and "file:offset" for messages
        self.ev_pos = start.pos  # where it ends (ev_end: as an offset)
        self.ev_start = 0
        self.end_file, self.end_pos = end.file, end.pos
        #: MariaDB: per GTID domain the last group read whole (``gtids`` is the position at the start)
        self.last_groups: dict[str, str] = {}
        #: the handler of each event type (a subclass finds its closest class: _own_rows's subclasses,
        #: MariadbGtidEvent before GtidEvent, PartialUpdateRowsEvent before UpdateRowsEvent); the
        #: stream sends these types (MyLogReader._open_stream). NotImplementedEvent: every type the
        #: library does not decode comes here, so the ones that carry changes (compressed, incident,
        #: LOAD) are refused, not dropped
        self.handlers: dict[type, Callable[[Any], bool]] = {
            WriteRowsEvent: self.on_rows,
            UpdateRowsEvent: self.on_rows,
            DeleteRowsEvent: self.on_rows,
            PartialUpdateRowsEvent: self.on_partial_rows,
            MariadbGtidEvent: self.on_mariadb_gtid,
            GtidEvent: self.on_gtid,
            XidEvent: self.on_xid,
            XAPrepareEvent: self.on_xa_prepare,
            QueryEvent: self.on_query,
            ExecuteLoadQueryEvent: self.on_query,
            NotImplementedEvent: self.on_not_implemented,
        }
        self._by_class: dict[type, Callable[[Any], bool]] = {}

    def handler(self, cls: type) -> Callable[[Any], bool]:
        h = self._by_class.get(cls)
        if h is None:
            h = next((self.handlers[c] for c in cls.__mro__ if c in self.handlers), self.on_other)
            self._by_class[cls] = h
        return h

    def run(self, stream: Any) -> None:
        self.stream = stream
        self.fast_raw = raw = RawStream.of(stream)
        if raw is None:  # not the mysql-replication this reads the packets of: its events
            for ev in stream:
                if self.on_event(ev):
                    break
            return
        for pkt in raw.packets():
            data = pkt._data
            if data[5] in FAST_TYPES:
                done = self.on_packet(data, stream)
                if done is not None:
                    if done:
                        break
                    continue
            ev = raw.event(pkt)
            if ev is not None and self.on_event(ev):
                break

    def on_event(self, ev: Any) -> bool:
        """One event as mysql-replication built it; True when the read stops."""
        from pymysqlreplication.event import FormatDescriptionEvent, RotateEvent

        ev = _own_rows(ev)
        # the reader's packet and event point at each other: a cycle per event that only
        # the cyclic GC frees, late in a process of many objects (memory would follow the
        # transaction); cut it so each event is freed when the next one is read
        ev.packet.event = None
        if isinstance(ev, RotateEvent):
            if ev.next_binlog != self.current_file:
                # table ids are the server's, per run of it: a new file may come from a
                # restart that reuses them, and its first rotate event (timestamp 0) does not
                # clear the library's table map (freeze_schema, see MyLogReader.read_log)
                self.stream.table_map = {}
            self.on_rotate(ev)
            return False
        if isinstance(ev, FormatDescriptionEvent):
            return False
        if self.at_event(ev.packet.log_pos, ev.packet.event_size):
            return True  # written after this read began: the next capture takes it
        return self.handler(type(ev))(ev) or self.at_end()

    def at_event(self, log_pos: int, size: int) -> bool:
        """Where the event being read lies; True when it was written after this read began."""
        self.ev_pos, self.ev_start = log_pos, log_pos - size
        if self.current_file == self.end_file:
            return log_pos > self.end_pos
        return self.ev_end > self.end

    @property
    def ev_end(self) -> BinlogOffset:
        """Where the event being read ends, as an offset."""
        return self.start.at(self.current_file, self.ev_pos)

    def at_end(self) -> bool:
        """Whether the event read last ends where this read ends."""
        return self.ev_pos == self.end_pos and self.current_file == self.end_file

    @property
    def where(self) -> str:
        """The event being read, as ``file:offset`` for messages."""
        return f"{self.current_file}:{self.ev_start}"

    def close(self) -> None:
        if self.in_group:
            self.close_open_group()  # the read ended inside a group: the next capture reads it whole
        self.scratch.close()

    def batch(self, offset: str) -> LogBatch:
        out = self.out.take(self.wm.id)
        if self.committed == self.start:
            return LogBatch(out, offset, offset)
        # MariaDB: the GTID position at the offset (per domain its last group), which a promoted
        # replica must hold for capture to follow it; MySQL: the last group's GTID, for the record
        gtid = str(self.gtid_state()) if self.gtids is not None else self.committed_gtid
        return LogBatch(out, replace(self.committed, gtid=gtid or None).to_json(), offset)

    def gtid_state(self) -> GtidState:
        """MariaDB's GTID position at ``committed``: the start's, with each domain's last group."""
        return functools.reduce(GtidState.after, self.last_groups.values(), self.gtids)

    # --- the segment and the open group -----------------------------------------------------
    def flush(self) -> None:
        if self.out:
            self.on_segment(self.out.take(self.wm.id))
        self.seg_bytes, self.group_mark = 0, 0

    def emit(self, events: list[LogEvent] | RowsRun, nbytes: int) -> None:
        self.group_count += len(events)
        if self.inside_max is None:
            self.out.extend(events)
            return
        out, i = self.out, 0
        while len(out) + len(events) - i > self.inside_max:
            # the segment would pass twice its events inside a group: stage it full, go on
            room = self.inside_max - len(out)
            out.extend(events[i : i + room])
            i += room
            self.flush()
        out.extend(events[i:] if i else events)
        self.seg_bytes += nbytes
        if self.seg_bytes >= self.max_bytes:
            self.flush()

    def add(self, events: list[LogEvent] | RowsRun, nbytes: int) -> None:
        if self.held is None:
            self.emit(events, nbytes)
        else:
            if isinstance(events, RowsRun):  # a held group keeps ChangeEvents (it may spill them to files)
                events = events.events(self.wm.id)
            self.held.add(events, nbytes)

    def begin_group(self, hold: bool, xa: bool = False) -> None:
        if self.in_group:
            self.d._unclosed_group(self.where, self.group_count + (self.held.count if self.held else 0))
            self.close_open_group()
        self.in_group, self.group_count, self.group_mark = True, 0, len(self.out)
        self.held = (
            HeldGroup(self.d, self.hold_max, self.max_bytes, self.scratch, self.group_start)
            if hold or xa
            else None
        )
        if xa:
            self.held.make_xa(self.d.xa.root())

    def close_open_group(self) -> None:
        """Forget a group that did not end (its events are not part of the returned batch)."""
        if self.held is not None:
            self.held.discard()
        elif self.group_mark < len(self.out):
            self.out.truncate(self.group_mark)
        self.in_group, self.held = False, None

    def end_group(self, how: str = "commit") -> bool:
        """``how``: commit (its events stand), rollback (only non-transactional tables'
        changes stand), prepared (an XA PREPARE: its events were persisted by the caller).
        True when the read stops here (``max_events``)."""
        if self.held is not None:
            if how != "prepared":
                for events, nbytes in self.held.drain(rollback=how == "rollback"):
                    self.emit(events, nbytes)
                self.held.discard()
        self.total += self.group_count
        self.in_group, self.held, self.in_txn, self.group_count = False, None, False, 0
        self.committed, self.committed_gtid = self.ev_end, self.group_gtid
        if self.gtids is not None and self.group_gtid:
            self.last_groups[self.group_gtid.partition("-")[0]] = self.group_gtid
        if self.seg_max is not None and (len(self.out) >= self.seg_max or self.seg_bytes >= self.max_bytes):
            self.flush()  # ends at this group's end
        return self.max_events is not None and self.total >= self.max_events

    def start_of_group(self) -> None:
        self.group_start = (self.d.binlog_major(self.current_file), self.ev_start)

    # --- one method per event type ------------------------------------------------------------
    def on_rotate(self, ev: Any) -> None:
        self.current_file = ev.next_binlog
        nxt = self.start.at(ev.next_binlog, ev.position)
        if not self.in_group and self.committed < nxt <= self.end:
            self.committed = nxt

    def on_rows(self, ev: Any) -> bool:
        origin = (self.group_gtid, None, None, ev.packet.server_id, self.thread, self.current_file)
        events = self.d._row_events(ev, self.current_file, self.wm, self.skipped, origin)
        if events:
            self.add(events, ev.packet.event_size)
        return False

    def on_partial_rows(self, ev: Any) -> bool:
        self.d.refuse(
            f"a partial JSON rows event (binlog_row_value_options = PARTIAL_JSON) of table "
            f"{TableName(ev.schema, ev.table)} at {self.where}: its rows lack the whole after image. Make "
            "binlog_row_value_options empty and re-snapshot the table"
        )
        return False

    def on_mariadb_gtid(self, ev: Any) -> bool:
        self.mariadb_group(ev.gtid, ev.flags)
        return False

    def mariadb_group(self, gtid: str, flags: int) -> None:
        # a MariaDB group starts here. flags2: FL_STANDALONE (1, one statement, no
        # BEGIN), FL_TRANSACTIONAL (4, InnoDB changes only: it ends with its XID and
        # nothing in it is rolled back), FL_PREPARED_XA (64, an XA PREPARE group)
        self.start_of_group()
        standalone, xa = bool(flags & 1), bool(flags & 64)
        self.begin_group(hold=not (standalone or flags & 4), xa=xa)
        self.in_txn, self.group_gtid, self.thread = not standalone, gtid, None

    def on_gtid(self, ev: Any) -> bool:
        self.start_of_group()
        self.begin_group(hold=True)  # MySQL: BEGIN follows unless DDL; whether it may roll back is unknown
        self.in_txn, self.group_gtid, self.thread = False, ev.gtid, None
        return False

    def on_xid(self, ev: Any) -> bool:
        return self.end_group()  # InnoDB commit

    def on_xa_prepare(self, ev: Any) -> bool:
        if ev.one_phase:  # MySQL's XA COMMIT ... ONE PHASE: the group commits here
            return self.end_group()
        xid = Xid(ev.xid_format_id, bytes(ev.xid_gtrid), bytes(ev.xid_bqual))
        if self.held is None or not self.held.xa:
            self.d.refuse(
                f"XA PREPARE of {xid} at {self.where} ends a group this capture did not hold "
                "as an XA transaction; its changes would be lost"
            )
            self.held = None
        else:
            self.held.persist(self.d.xa.manifest(xid, self.held.start), xid, self.where)
        return self.end_group("prepared")

    def on_query(self, ev: Any) -> bool:
        """A statement: the bounds of a transaction (BEGIN, COMMIT, ROLLBACK, savepoints, XA), a
        change logged as a statement (refused), or DDL, a group of its own."""
        from pymysqlreplication.event import ExecuteLoadQueryEvent

        # ExecuteLoadQueryEvent (a LOAD DATA logged as a statement) keeps no readable text
        raw = query_text(getattr(ev, "query", "LOAD DATA (statement-based)")).strip()
        text = raw.upper()
        held = self.held
        if text == "BEGIN" or text.startswith("XA START"):
            self.in_txn = True
            self.thread = ev.slave_proxy_id  # the connection that ran the transaction
            if text.startswith("XA START") and held is not None:
                held.make_xa(self.d.xa.root())  # MySQL logs XA START; MariaDB flags the GTID
        elif text in ("COMMIT", "ROLLBACK"):
            # the end of a group with non-transactional changes; after ROLLBACK only
            # those stand (the server logs the rolled-back ones too)
            return self.end_group("rollback" if text == "ROLLBACK" else "commit")
        elif text.startswith("SAVEPOINT"):
            if held is not None:
                held.savepoint(savepoint_name(raw))
        elif text.startswith("ROLLBACK TO"):
            if held is not None:
                held.rollback_to(savepoint_name(raw))
            elif self.group_count:
                self.d.refuse(
                    f"{raw!r} at {self.where} rolls back part of a group already staged as "
                    "committed (a MariaDB group flagged transactional)"
                )
        elif text.startswith(("XA COMMIT", "XA ROLLBACK")):
            return self.xa_end(raw, commit=text.startswith("XA COMMIT"))
        elif text.startswith("XA "):
            pass  # XA END (MySQL, MariaDB): inside the XA group
        elif _STATEMENT_DML_RE.match(raw) or isinstance(ev, ExecuteLoadQueryEvent):
            if isinstance(ev, ExecuteLoadQueryEvent) or self.d._may_touch_captured(raw):
                self.d.refuse(
                    f"the statement {raw[:200]!r} at {self.where} was logged as a statement (the writer's "
                    "session had binlog_format STATEMENT or MIXED): the rows it changed are not in the "
                    "binlog. Make every writer use binlog_format=ROW and re-snapshot the tables it changed"
                )
            if not self.in_txn:
                return self.end_group()
        elif not self.in_txn:
            # DDL and other standalone statements are groups of their own;
            # inside a transaction (SAVEPOINT, ROLLBACK TO ...) they end nothing
            self.d._binlog_converters.clear()  # DDL may change a table's columns
            if text.startswith("TRUNCATE"):
                origin = (
                    self.group_gtid,
                    None,
                    None,
                    ev.packet.server_id,
                    ev.slave_proxy_id,
                    self.current_file,
                )
                self.add(self.d._truncate(ev, self.current_file, origin), 0)
            return self.end_group()
        return False

    def xa_end(self, raw: str, *, commit: bool) -> bool:
        """XA COMMIT or XA ROLLBACK: of the group just read (ONE PHASE), or of a transaction
        prepared earlier, whose events were held under ``_xa/`` (held.py)."""
        if self.held is not None and self.held.xa and self.held.count:
            # XA COMMIT ... ONE PHASE written as a statement of its own group
            return self.end_group("commit" if commit else "rollback")
        xid = Xid.parse(raw)
        if xid is None:
            self.d.refuse(f"cannot read the transaction id of {raw!r} at {self.where}")
        elif commit:
            for events, nbytes in self.d.xa.commit(
                xid, self.current_file, self.ev_start, self.ev_end, self.where
            ):
                self.emit(events, nbytes)
        else:
            self.d.xa.forget(xid, self.current_file, self.ev_start, self.ev_end)
        return self.end_group()

    def on_not_implemented(self, ev: Any) -> bool:
        """Event types the reader does not decode: MySQL's anonymous GTID (a group starts), or
        one whose changes would be lost (refused)."""
        kind = ev.packet.event_type
        if kind == _ANONYMOUS_GTID:  # MySQL without GTIDs: a group starts here
            self.start_of_group()
            self.begin_group(hold=True)
            self.in_txn, self.thread = False, None
        elif kind in _UNREADABLE_EVENTS:
            self.d.refuse(
                f"{_UNREADABLE_EVENTS[kind]} at {self.where} (event type {kind}): capture cannot "
                "read the changes it carries"
            )
        return False

    def on_other(self, ev: Any) -> bool:
        return False
