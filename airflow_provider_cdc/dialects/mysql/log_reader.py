"""The binlog: rows events read up to the current end, whole transactions only, a large one
held in bounded parts (spilled to files) until its end; TRUNCATE and statements refused or
staged; the dialect's ``log``. One read is a ``_BinlogRead`` (binlog_read.py: its state, one
method per event type). Rows are decoded by the compiled rows walker where it covers the table
(rows_walker.py), else by mysql-replication.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, StateError
from ...core.events import ChangeEvent, LogEvent, Op, WatermarkEvent
from ...core.position import Position, binlog_file_index, binlog_major
from ...core.schema import WHOLE_ROW, TableName, encode_key
from ..base import LogBatch, LogRead
from .binlog import _ER_MASTER_FATAL_ERROR_READING_BINLOG, OFFSET_FILE, BinlogOffset
from .binlog_read import _BinlogRead, parse_truncate
from .failover import GtidState
from .profile import PROFILE
from .rows_walker import RowsRun, TableWalker, decoder_mode
from .server import MyServer
from .types import TEXT_CODES, binlog_converter, query_text, text_or_b64
from .xa import MyXa

log = logging.getLogger(__name__)


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
        return schema not in PROFILE.system_schemas and schema != self.watermark_table.schema

    def read_log(self, request: LogRead) -> LogBatch:
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
        offset, max_events = request.offset, request.max_events
        segment_max_events, on_segment = request.segment_max_events, request.on_segment
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
        read = _BinlogRead(
            self,
            start,
            end,
            gtids,
            max_events=max_events,
            seg_max=segment_max_events if on_segment is not None and segment_max_events else None,
            on_segment=on_segment,
        )
        stream = self._open_stream(start, read.handlers)
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

    def _open_stream(self, start: BinlogOffset, handled: Iterable[type]) -> Any:
        """mysql-replication's binlog stream from ``start``: the event types the read has a
        handler for (``handled``) and the rotations and format descriptions, of the capture
        scope's schemas and the watermark's."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import FormatDescriptionEvent, RotateEvent

        wm = self.watermark_table
        only_schemas = None
        if self.tables:
            only_schemas = sorted({t.schema for t in self.tables} | {wm.schema})
        return BinLogStreamReader(
            connection_settings=self.server.stream_settings(),
            server_id=self.capture_server_id,
            blocking=False,
            resume_stream=True,
            log_file=start.file,
            log_pos=start.pos,
            only_events=[*handled, RotateEvent, FormatDescriptionEvent],
            only_schemas=only_schemas,
            # a table map event precedes each transaction's rows events of a table: parsing it
            # again (types, metadata, column names) cost 45% of a capture of single-row
            # transactions. The server gives a table a new id whenever its definition changes
            # (ALTER, or its share reopened), so an id already mapped in this server's run is the
            # same table: the library keeps that map. A new file may come from a restart, where
            # ids restart too: _BinlogRead.on_event clears the map at each one
            freeze_schema=True,
            enable_logging=False,
        )

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

    def _key_of(self, schema: str, table: str, mapped: Any) -> tuple[str, ...]:
        """The key columns of a mapped table: its primary key, else its CDC_KEY_COLUMNS (the
        binlog has whole rows; '*', a multiset: none)."""
        pk = mapped.primary_key
        want, own = self.key_columns.get(TableName(schema, table)), (pk,) if isinstance(pk, str) else pk
        return () if want == WHOLE_ROW else want or tuple(x for x in own or () if x)

    def captured_id(self, schema: str, table: str) -> str | None:
        """The table's id when this read captures it, else None (once per table and read)."""
        table_id = self._captured.get((schema, table), "")
        if table_id == "":
            table_id = TableName(schema, table).id if self._capture_table(schema, table) else None
            self._captured[schema, table] = table_id
        return table_id

    def fast_walker(self, table_id: int, mapped: Any) -> TableWalker | bool:
        """For a rows event read from its packet (packets.py): the compiled walker of its table,
        False when capture does not take the table (nothing to read), True when the event must be
        built by mysql-replication (the watermark table, no key, the walker off or not covering it).
        Decided once per table map and read, and cleared with the converters."""
        key = ("fast", table_id, mapped.schema, mapped.table)
        hit = self._binlog_converters.get(key)
        if hit is None:
            hit = self._binlog_converters[key] = self._fast_walker(table_id, mapped)
        return hit

    def _fast_walker(self, table_id: int, mapped: Any) -> TableWalker | bool:
        schema, table = mapped.schema, mapped.table
        if schema == self.watermark_table.schema and table == self.watermark_table.name:
            return True
        if self.captured_id(schema, table) is None:
            return False
        pk = self._key_of(schema, table, mapped)
        if not pk and self.key_columns.get(TableName(schema, table)) != WHOLE_ROW:
            return True  # refused or skipped with its message by _row_events
        return self._walker(table_id, schema, table, mapped.columns, pk) or True

    def _table_converters(self, ev: Any) -> tuple[dict[str, Callable[[Any], Any]], tuple[str, ...]] | None:
        table = ev.table_map[ev.table_id]
        key = (ev.table_id, ev.schema, ev.table)
        hit = self._binlog_converters.get(key)
        if hit is not None:
            return hit
        pk_cols = self._key_of(ev.schema, ev.table, table)
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

    def _walker(
        self, table_id: int, schema: str, table_name: str, columns: Any, pk: tuple[str, ...]
    ) -> TableWalker | None:
        """The compiled walker of a table map (None: the pure-Python reader decodes its rows),
        built once per table map and read, and cleared with the converters."""
        if self._rows_mode != "compiled":
            return None
        key = ("walker", table_id, schema, table_name)
        cache = self._binlog_converters
        if key in cache:
            return cache[key]
        table = TableName(schema, table_name)
        got = TableWalker.of(table, columns, pk)
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
        table_id = self.captured_id(ev.schema, ev.table)
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
        walker = self._walker(ev.table_id, ev.schema, ev.table, ev.table_map[ev.table_id].columns, pk)
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
