"""The binlog: rows events read up to the current end, whole transactions only, a large one
held in bounded parts (spilled to files) until its end; TRUNCATE and statements refused or
staged; the dialect's ``log``. One read is a ``_BinlogRead`` (its state, one method per event type).
Rows are decoded by the compiled rows walker where it covers the table (rows_walker.py), else by
mysql-replication.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, StateError
from ...core.events import ChangeEvent, LogEvent, Op, WatermarkEvent
from ...core.position import Position, binlog_file_index, binlog_major
from ...core.schema import WHOLE_ROW, TableName, encode_key
from ..base import LogBatch, SegmentSink
from .binlog import _ER_MASTER_FATAL_ERROR_READING_BINLOG, OFFSET_FILE, BinlogOffset
from .failover import GtidState
from .held import HeldGroup, Scratch, Xid, savepoint_name
from .prerequisites import SYSTEM_SCHEMAS
from .rows_walker import EventBuffer, RowsRun, TableWalker, decoder_mode
from .server import MyServer
from .types import IDENTIFIER, TEXT_CODES, binlog_converter, query_text, text_or_b64, unquote
from .xa import MyXa

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


class _BinlogRead:
    """One :meth:`MyLogReader.read_log`: the read's state (the segment being filled, the open
    group, whether it is held, the last whole group's position and GTID) and one method per binlog
    event type, looked up in :attr:`handlers` by the event's class. A handler returns True when
    the read stops at the group end it reached (``max_events``)."""

    def __init__(
        self,
        reader: MyLogReader,
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
        self.gtids = gtids  # MariaDB: the GTID position at ``committed``
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
        self.ev_end = start
        self.ev_start = 0
        self.where = ""
        #: the handler of each event type (a subclass finds its closest class: _own_rows's subclasses,
        #: MariadbGtidEvent before GtidEvent, PartialUpdateRowsEvent before UpdateRowsEvent)
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
        from pymysqlreplication.event import FormatDescriptionEvent, RotateEvent

        for ev in map(_own_rows, stream):
            # the reader's packet and event point at each other: a cycle per event that only
            # the cyclic GC frees, late in a process of many objects (memory would follow the
            # transaction); cut it so each event is freed when the next one is read
            ev.packet.event = None
            if isinstance(ev, RotateEvent):
                if ev.next_binlog != self.current_file:
                    # table ids are the server's, per run of it: a new file may come from a
                    # restart that reuses them, and its first rotate event (timestamp 0) does not
                    # clear the library's table map (freeze_schema, see MyLogReader.read_log)
                    stream.table_map = {}
                self.on_rotate(ev)
                continue
            if isinstance(ev, FormatDescriptionEvent):
                continue
            self.ev_end = self.start.at(self.current_file, ev.packet.log_pos)
            if self.ev_end > self.end:
                break  # written after this read began: the next capture takes it
            self.ev_start = ev.packet.log_pos - ev.packet.event_size
            self.where = f"{self.current_file}:{self.ev_start}"
            if self.handler(type(ev))(ev) or self.ev_end == self.end:
                break

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
        gtid = str(self.gtids) if self.gtids is not None else self.committed_gtid
        return LogBatch(out, replace(self.committed, gtid=gtid or None).to_json(), offset)

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
            self.gtids = self.gtids.after(self.group_gtid)
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
        # a MariaDB group starts here. flags2: FL_STANDALONE (1, one statement, no
        # BEGIN), FL_TRANSACTIONAL (4, InnoDB changes only: it ends with its XID and
        # nothing in it is rolled back), FL_PREPARED_XA (64, an XA PREPARE group)
        self.start_of_group()
        standalone, xa = bool(ev.flags & 1), bool(ev.flags & 64)
        self.begin_group(hold=not (standalone or ev.flags & 4), xa=xa)
        self.in_txn, self.group_gtid, self.thread = not standalone, ev.gtid, None
        return False

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


class MyLogReader:
    """Read the binlog into the segment sink: the dialect's ``log``."""

    def __init__(
        self,
        server: MyServer,
        *,
        source: str,
        watermark_table: TableName,
        tables: frozenset[TableName] | None,
        key_columns: dict[TableName, tuple[str, ...]],
        capture_server_id: int,
        on_truncate: str,
        on_unreadable: str,
        rows_decoder: Any,
        segment_max_events: int,
        segment_max_bytes: int,
        require_scope: Callable[[], None],
    ) -> None:
        self.server = server
        self.source = source
        self.watermark_table = watermark_table
        self.tables = tables  # the capture scope (None: every table, on the all_tables opt-in)
        self.key_columns = key_columns  # CDC_KEY_COLUMNS: the key of tables without a primary key
        self.capture_server_id = capture_server_id  # the replication id the binlog stream reads with
        self.on_truncate = on_truncate
        self.on_unreadable = on_unreadable
        self.rows_decoder = rows_decoder
        self.segment_max_events = segment_max_events
        self.segment_max_bytes = segment_max_bytes
        self.require_scope = require_scope  # the dialect's capture-scope rule (dialects/base.py)
        self.xa = MyXa(self)
        self._binlog_converters: dict = {}  # per table map (table ids are per binlog session)
        self._captured: dict[tuple[str, str], str | None] = {}  # per read: _row_events
        self._read_epoch = 0  # positions read carry the offset's epoch
        self._engines: dict[str, bool] = {}  # table -> transactional
        self._rows_mode = "python"

    def _capture_table(self, schema: str, table: str) -> bool:
        if self.tables:
            return TableName(schema, table) in self.tables
        # the watermark database holds every source's watermark tables: CDC's, not the user's
        return schema not in SYSTEM_SCHEMAS and schema != self.watermark_table.schema

    def read_log(
        self,
        offset: str,
        *,
        max_events: int | None = None,
        segment_max_events: int | None = None,
        on_segment: SegmentSink | None = None,
    ) -> LogBatch:
        """Binlog from ``offset`` to the end read at the start (SHOW MASTER STATUS). The
        returned end offset is always at a group end (after an XID, COMMIT, ROLLBACK, DDL or XA
        PREPARE), never inside a transaction (I6).

        Segments go to ``on_segment`` at a group end once ``segment_max_events`` events or
        ``segment_max_bytes`` bytes of rows events are read, and inside a group at twice the
        events or at the bytes: the binlog holds only committed groups, so a group's parts may
        be staged before it ends, and memory follows the segment, not the transaction (I11).
        The cuts depend only on the events read from ``offset``: a capture killed between parts
        rereads from the same offset and rewrites the same segment names.

        A group that may still drop events at its end is held (:class:`HeldGroup`: in memory
        up to the same bound, then in part files) instead of streamed: a MariaDB group not
        flagged transactional (it changed a non-transactional table: at ``ROLLBACK`` or
        ``ROLLBACK TO SAVEPOINT`` only those tables' changes stand), every MySQL group (its GTID
        event does not say), and an XA transaction: at ``XA PREPARE`` its events are written
        under ``<changelog dir>/_xa/`` before the offset may pass it, and they are staged at
        its ``XA COMMIT`` with the commit's position, where the change becomes visible (I1), or
        dropped at ``XA ROLLBACK``, in this run or a later one. Events whose changes cannot be
        read are refused (:meth:`_refuse`), never skipped silently."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            ExecuteLoadQueryEvent,
            FormatDescriptionEvent,
            GtidEvent,
            MariadbGtidEvent,
            NotImplementedEvent,
            QueryEvent,
            RotateEvent,
            XAPrepareEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import (
            DeleteRowsEvent,
            PartialUpdateRowsEvent,
            UpdateRowsEvent,
            WriteRowsEvent,
        )

        start = BinlogOffset.from_json(offset)
        end = self.server.binlog_end(start.epoch)
        if start > end:
            raise StateError(
                f"source {self.source!r}: committed offset {start.file}:{start.pos} is past the end of "
                "the binlog "
                f"({end.file}:{end.pos}); the offset belongs to another server or the binlog was reset. "
                f"Re-snapshot and delete {OFFSET_FILE}."
            )
        if start == end:
            return LogBatch([], offset, offset)
        self.check_not_purged(start)
        self._binlog_converters.clear()  # table ids are per binlog session
        self._captured.clear()
        self._read_epoch = start.epoch  # positions read carry the offset's epoch
        gtids = GtidState.parse(start.gtid) if self.server.flavour.is_mariadb else None  # at ``committed``
        self._engines = {}  # table -> transactional, looked up when a held group rolls back
        # rows events of captured tables: the compiled walker (rows_walker.py) or mysql-replication's reader
        self._rows_mode = decoder_mode(self.rows_decoder)

        self.require_scope()
        wm = self.watermark_table
        only_schemas = None
        if self.tables:
            only_schemas = sorted({t.schema for t in self.tables} | {wm.schema})
        stream = BinLogStreamReader(
            connection_settings=self.server.stream_settings(),
            server_id=self.capture_server_id,
            blocking=False,
            resume_stream=True,
            log_file=start.file,
            log_pos=start.pos,
            # NotImplementedEvent: every event type the reader does not decode comes here, so
            # the ones that carry changes (compressed, incident, LOAD) are refused, not dropped
            only_events=[
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
                PartialUpdateRowsEvent,
                XidEvent,
                QueryEvent,
                RotateEvent,
                MariadbGtidEvent,
                GtidEvent,
                FormatDescriptionEvent,
                XAPrepareEvent,
                ExecuteLoadQueryEvent,
                NotImplementedEvent,
            ],
            only_schemas=only_schemas,
            # a table map event precedes each transaction's rows events of a table: parsing it
            # again (types, metadata, column names) cost 45% of a capture of single-row
            # transactions. The server gives a table a new id whenever its definition changes
            # (ALTER, or its share reopened), so an id already mapped in this server's run is the
            # same table: the library keeps that map. A new file may come from a restart, where
            # ids restart too: _BinlogRead.run clears the map at each one
            freeze_schema=True,
            enable_logging=False,
        )
        read = _BinlogRead(
            self,
            start,
            end,
            gtids,
            max_events=max_events,
            seg_max=segment_max_events if on_segment is not None and segment_max_events else None,
            on_segment=on_segment,
        )
        try:
            read.run(stream)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == _ER_MASTER_FATAL_ERROR_READING_BINLOG:
                raise SourceError(
                    f"source {self.source!r}: the server cannot send the binlog from {start.file}:"
                    f"{start.pos} "
                    f"({exc.args[-1]}); if it was purged, re-snapshot the captured tables and delete "
                    f"{OFFSET_FILE}"
                ) from exc
            raise
        finally:
            stream.close()
            read.close()
        return read.batch(offset)

    # --- held groups and XA -------------------------------------------------------------
    def check_not_purged(self, start: BinlogOffset) -> None:
        files = [r[0] for r in self.server.query("SHOW BINARY LOGS")]
        if start.file not in files:
            oldest = files[0] if files else "none"
            raise SourceError(
                f"source {self.source!r}: binlog file {start.file} of the committed offset (pos "
                f"{start.pos}) is no "
                f"longer on the server (oldest binlog: {oldest}); the changes since were purged. "
                "Re-snapshot the "
                f"captured tables and reset the capture offset (delete {OFFSET_FILE} in the changelog "
                "staging dir)."
            )

    def binlog_major(self, file: str) -> int:
        """The major of positions in binlog ``file`` of the server read now (its epoch above the
        file index, core/position.py)."""
        return binlog_major(binlog_file_index(file), self._read_epoch)

    def refuse(self, what: str) -> None:
        """A binlog event whose changes capture cannot read: stop (on_unreadable="fail", the
        default) or, once the tables it changed are re-snapshotted, warn and pass it ("skip")."""
        msg = f"source {self.source!r}: {what}"
        if self.on_unreadable == "skip":
            log.warning("%s; passed because on_unreadable='skip': re-snapshot the tables it changed", msg)
            return
        raise SourceError(
            f"{msg}. After re-snapshotting the tables it changed, set the dialect option "
            "on_unreadable='skip' "
            "for one capture run to pass this point"
        )

    def _unclosed_group(self, where: str, events: int) -> None:
        """A new group began while one was open: nothing the reader knows ends groups that way."""
        if events:
            self.refuse(
                f"a binlog group with {events} captured change(s) did not end (no XID, COMMIT, ROLLBACK "
                f"or XA PREPARE) before the group at {where}"
            )

    def _may_touch_captured(self, sql: str) -> bool:
        """Whether a statement's text names a captured table (every statement when capturing
        every table): a cheap, conservative test for a statement-logged change."""
        if not self.tables:
            return True
        low = sql.lower()
        return any(t.name.lower() in low for t in self.tables)

    def transactional(self, event: LogEvent) -> bool:
        """Whether the event's table rolls back with its transaction (its engine's
        TRANSACTIONS in information_schema), looked up once per table and run."""
        table = event.table if isinstance(event, ChangeEvent) else self.watermark_table.id
        cache = self._engines
        hit = cache.get(table)
        if hit is None:
            name = TableName.parse(table)
            rows = self.server.query(
                "SELECT e.TRANSACTIONS FROM information_schema.TABLES t JOIN information_schema.ENGINES e "
                "ON e.ENGINE = t.ENGINE WHERE t.TABLE_SCHEMA = %s AND t.TABLE_NAME = %s",
                (name.schema, name.name),
            )
            if not rows:
                raise SourceError(
                    f"source {self.source!r}: a binlog group rolled back changes of table {table}, and "
                    "whether "
                    "its engine is transactional cannot be read (the table no longer exists), so "
                    "capture cannot tell "
                    "which of them stand. Re-snapshot the table and reset the capture offset (delete "
                    f"{OFFSET_FILE} in the changelog staging dir)"
                )
            hit = cache[table] = str(rows[0][0]).upper() == "YES"
        return hit

    def _table_converters(self, ev: Any) -> tuple[dict[str, Callable[[Any], Any]], tuple[str, ...]] | None:
        table = ev.table_map[ev.table_id]
        key = (ev.table_id, ev.schema, ev.table)
        hit = self._binlog_converters.get(key)
        if hit is not None:
            return hit
        pk = table.primary_key
        # no primary key: keyed by its CDC_KEY_COLUMNS (the binlog has whole rows; '*', a multiset: none)
        want, own = self.key_columns.get(TableName(ev.schema, ev.table)), (pk,) if isinstance(pk, str) else pk
        pk_cols = () if want == WHOLE_ROW else want or tuple(x for x in own or () if x)
        convs: dict[str, Callable[[Any], Any] | None] = {}
        for c in table.columns:
            conv = binlog_converter(c)
            # the reader already gives canonical ints and decoded text: skip the call
            if conv is int or (conv is text_or_b64 and c.type in TEXT_CODES):
                conv = None
            convs[c.name] = conv
        hit = self._binlog_converters[key] = (convs, pk_cols)
        return hit

    def _truncate(self, ev: Any, file: str, origin: tuple | None = None) -> list[LogEvent]:
        """A TRUNCATE statement (row-less in the binlog): a ``t`` event for its table when
        captured (on_truncate="event"); "fail" raises, "skip" warns."""
        sql = query_text(ev.query)
        where = f"{file}:{ev.packet.log_pos}"
        table = parse_truncate(sql, query_text(ev.schema) if ev.schema else None)
        if table is None:
            raise SourceError(
                f"source {self.source!r}: cannot tell which table the statement {sql!r} at {where} "
                "truncates; "
                "re-snapshot the tables it may name, and set the dialect option on_truncate='skip' to "
                "let capture "
                "pass this point"
            )
        if table == self.watermark_table or not self._capture_table(table.schema, table.name):
            return []
        if self.on_truncate == "skip":
            log.warning(
                "source %r: TRUNCATE of %s at %s skipped (on_truncate='skip'); re-snapshot it",
                self.source,
                table,
                where,
            )
            return []
        if self.on_truncate == "fail":
            raise SourceError(
                f"source {self.source!r}: TRUNCATE of {table} at {where} is in the binlog and "
                "on_truncate='fail'. "
                "Re-snapshot the table, and set on_truncate='event' (the default) or 'skip' to let "
                "capture pass"
            )
        start_pos = ev.packet.log_pos - ev.packet.event_size
        log.info("source %r: TRUNCATE of %s at %s staged as a 't' event", self.source, table, where)
        return [
            ChangeEvent(
                table.id,
                Op.TRUNCATE.value,
                None,
                Position(self.binlog_major(file), start_pos, 0),
                None,
                None,
                int(ev.timestamp) * 1000,
                origin=origin,
            )
        ]

    def _rows_walker(self, ev: Any, pk: tuple[str, ...]) -> TableWalker | None:
        """The compiled walker of the rows event's table map (None: the pure-Python reader
        decodes it), built once per table map and read, and cleared with the converters."""
        if self._rows_mode != "compiled":
            return None
        key = ("walker", ev.table_id, ev.schema, ev.table)
        cache = self._binlog_converters
        if key in cache:
            return cache[key]
        table = TableName(ev.schema, ev.table)
        got = TableWalker.of(table, ev.table_map[ev.table_id].columns, pk)
        if isinstance(got, str):
            log.info("table %s: its rows are read by the pure-Python reader (%s)", table, got)
            got = None
        cache[key] = got
        return got

    def _row_events(
        self, ev: Any, file: str, wm: TableName, skipped: set[str], origin: tuple | None = None
    ) -> list[LogEvent] | RowsRun:
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        start_pos = ev.packet.log_pos - ev.packet.event_size
        file_index = self.binlog_major(file)
        ts_ms = int(ev.timestamp) * 1000
        if ev.schema == wm.schema and ev.table == wm.name:
            if not isinstance(ev, UpdateRowsEvent):
                return []
            return [
                WatermarkEvent(str(r["after_values"]["value"]), Position(file_index, start_pos, i), ts_ms)
                for i, r in enumerate(ev.rows)
            ]
        # (schema, table) -> its id when captured, else None: once per table and read, not per event
        table_id = self._captured.get((ev.schema, ev.table), "")
        if table_id == "":
            captured = self._capture_table(ev.schema, ev.table)
            table_id = TableName(ev.schema, ev.table).id if captured else None
            self._captured[ev.schema, ev.table] = table_id
        if table_id is None:
            return []
        convs, pk = self._table_converters(ev)
        if not pk and self.key_columns.get(TableName(ev.schema, ev.table)) != WHOLE_ROW:
            if self.tables is not None:
                raise SourceError(
                    f"table {table_id} has no primary key in the binlog's row metadata; add one"
                )
            if table_id not in skipped:
                log.warning("capture skips table %s: it has no primary key", table_id)
                skipped.add(table_id)
            return []
        walker = self._rows_walker(ev, pk)
        if walker is not None:
            kind = 0 if isinstance(ev, WriteRowsEvent) else (2 if isinstance(ev, DeleteRowsEvent) else 1)
            run = walker.run(ev, file_index, start_pos, ts_ms, origin, kind)
            if run is not None:
                return run

        def canon(values: dict, none_sources: dict | None) -> dict:
            row = {name: v if v is None or (c := convs[name]) is None else c(v) for name, v in values.items()}
            if none_sources:  # an empty SET decodes as None: tell it from NULL
                for name, why in none_sources.items():
                    if why == "empty set":
                        row[name] = ""
            return row

        events: list[LogEvent] = []
        for r in ev.rows:
            # the index is the event's number inside the rows event (one per row, two
            # for a key-changing update), so every staged event has its own position
            if isinstance(ev, WriteRowsEvent):
                after = canon(r["values"], r.get("none_sources"))
                pairs = [(Op.CREATE, None, after)]
            elif isinstance(ev, DeleteRowsEvent):
                pairs = [(Op.DELETE, canon(r["values"], r.get("none_sources")), None)]
            else:
                before = canon(r["before_values"], r.get("before_none_sources"))
                after = canon(r["after_values"], r.get("after_none_sources"))
                if [before[k] for k in pk] == [after[k] for k in pk]:
                    pairs = [(Op.UPDATE, before, after)]
                else:
                    # a key change is a delete of the old key and an insert of the new one,
                    # so the window's per-key de-duplication sees both keys
                    pairs = [(Op.DELETE, before, None), (Op.CREATE, None, after)]
            for op, before, after in pairs:
                keyrow = after if after is not None else before
                pos = Position(file_index, start_pos, len(events))
                events.append(
                    ChangeEvent(
                        table_id,
                        op,
                        encode_key([keyrow[k] for k in pk]),
                        pos,
                        before,
                        after,
                        ts_ms,
                        origin=origin,
                    )
                )
        return events
