"""The logical stream: pgoutput messages read up to the current end, decoded a block of
rows at a time into segments (pgbatch), bounded by events and bytes per segment; the dialect's
``log``. One read is a ``_SlotRead`` (slot_read.py: its state, one method per kind of message).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...core.errors import SourceError
from ...core.events import ChangeEvent, Op, WatermarkEvent
from ...core.position import Position, int_to_lsn, lsn_to_int
from ...core.schema import TableName, encode_key
from ..base import LogBatch, LogRead
from . import pgbatch, pgoutput
from .catalog import PgCatalog
from .offsets import PgOffsets, _invalidation_reason, slot_invalidated_why
from .server import PgServer
from .slot_read import _RelInfo, _SlotRead
from .types import REPLICA_IDENTITY, UnsupportedType, decoder, logical_type, pg_message

log = logging.getLogger(__name__)
DEFAULT_CAPTURE_STEP_MESSAGES = 500_000


class PgLogReader:
    """Read the slot's stream into the segment sink, whole transactions only: the dialect's ``log``."""

    def __init__(
        self,
        server: PgServer,
        catalog: PgCatalog,
        offsets: PgOffsets,
        *,
        watermark_table: TableName,
        on_truncate: str,
        read_timeout: float,
        capture_step_messages: int,
        capture_decode: str,
        segment_max_bytes: int,
    ) -> None:
        self.server = server
        self.catalog = catalog
        self.offsets = offsets  # the slot and publication read, and their errors
        self.watermark_table = watermark_table
        self.on_truncate = on_truncate
        self.read_timeout = read_timeout
        self.capture_step_messages = capture_step_messages
        self.capture_decode = capture_decode
        self.segment_max_bytes = segment_max_bytes
        self._read_upto: int | None = None  # the end a read that stopped at its step bound reads on towards

    @property
    def tables(self) -> list[TableName] | None:
        return self.offsets.tables

    @property
    def publication_name(self) -> str:
        return self.offsets.publication_name

    @property
    def slot_name(self) -> str:
        return self.offsets.slot_name

    def _relinfo(self, rel: pgoutput.Relation) -> _RelInfo:
        table = TableName(rel.namespace, rel.name)
        names = tuple(c.name for c in rel.columns)
        if table == self.watermark_table:
            return _RelInfo(table, "watermark", names, value_idx=names.index("value"))
        explicit = bool(self.tables) and table in self.tables
        if self.tables and not explicit:  # a publication wider than the scope: not ours to copy
            return _RelInfo(table, "skip", names, problem=f"table {table} is outside the capture scope")
        generated = self._published_generated_columns(rel)
        if generated:
            q = self.server.quote_ident(self.publication_name)
            problem = (
                f"publication {self.publication_name!r} publishes generated column(s) "
                f"{', '.join(generated)} of table "
                f"{table} (PostgreSQL 18's publish_generated_columns = stored, or a column list naming "
                "them), which "
                "chunks never read: the mirror's rows would differ by the way they came. "
                f"Run ALTER PUBLICATION {q} SET (publish_generated_columns = none) and leave them out "
                "of its column "
                "list"
            )
            return _RelInfo(table, "error" if explicit else "skip", names, problem=problem)
        narrowed = self._publication_narrowing(rel)
        if narrowed:
            q, qt = self.server.quote_ident(self.publication_name), self.server.quote_table(table)
            problem = (
                f"publication {self.publication_name!r} carries {narrowed} of table {table}, while "
                "chunks read all of "
                "it: the mirror would keep values and rows the log never updates. Publish the whole table: "
                f"ALTER PUBLICATION {q} DROP TABLE {qt}; ALTER PUBLICATION {q} ADD TABLE {qt}"
            )
            return _RelInfo(table, "error" if explicit else "skip", names, problem=problem)
        try:
            self.catalog.load_types([c.type_oid for c in rel.columns])
            logicals = tuple(logical_type(c.type_oid, c.typmod, self.catalog.pg_type) for c in rel.columns)
            decs = tuple(decoder(t) for t in logicals)
        except UnsupportedType as exc:
            problem = f"table {table} has a column of type {exc.type_name}, which CDC does not support"
            return _RelInfo(table, "error" if explicit else "skip", names, problem=problem)
        pk, why = self.catalog.table_key(table, rel.relid, rel.replica_identity)
        if pk is None or any(k not in names for k in pk):  # (() is a multiset: keyed by its whole row)
            problem = (
                f"table {table} {why or 'has a key column the publication does not carry'}, so "
                "its changes cannot be keyed"
            )
            return _RelInfo(table, "error" if explicit else "skip", names, problem=problem)
        return _RelInfo(
            table,
            "table",
            names,
            decs,
            tuple(names.index(k) for k in pk),
            replica_identity=rel.replica_identity,
            logicals=logicals,
        )

    def _published_generated_columns(self, rel: pgoutput.Relation) -> list[str]:
        """The generated columns among those the Relation message carries. Before PostgreSQL 18
        a publication never carries one; 18 publishes stored ones when the publication says
        ``publish_generated_columns = stored`` or names them in its column list (virtual ones
        never). describe_table and the chunk reads leave generated columns out."""
        if self.server.conn.server_version < 180000:
            return []
        generated = {
            r[0]
            for r in self.server.query(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped "
                "AND attgenerated <> ''",
                (rel.relid,),
            )
        }
        return [c.name for c in rel.columns if c.name in generated]

    def _publication_narrowing(self, rel: pgoutput.Relation) -> str | None:
        """What a publication made by an administrator leaves out of the table (PostgreSQL 15+):
        its column list (the log then carries NULL for the other columns) or its row filter
        (changes to other rows are not in the log at all); None when it carries the whole table."""
        if self.server.conn.server_version < 150000:
            return None
        rows = self.server.query(
            "SELECT pt.rowfilter, ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid "
            "AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' AND a.attname <> ALL "
            "(pt.attnames)) "
            "FROM pg_publication_tables pt JOIN pg_namespace n ON n.nspname = pt.schemaname "
            "JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename "
            "WHERE pt.pubname = %s AND pt.schemaname = %s AND pt.tablename = %s",
            (self.publication_name, rel.namespace, rel.name),
        )
        if not rows:
            return None
        rowfilter, left_out = rows[0]
        what = []
        if left_out:
            what.append(f"only some columns (its column list leaves out {', '.join(left_out)})")
        if rowfilter:
            what.append(f"only the rows WHERE {rowfilter}")
        return " and ".join(what) or None

    def read_log(self, request: LogRead) -> LogBatch:
        """Whole transactions from the slot's confirmed position up to the WAL flush position
        when the run's first read started (or fewer: one *step*, see below; or ending at a
        commit once ``max_events`` is reached); segments go to ``on_segment`` at commits (see
        :meth:`Dialect.read_log`), as EventBatches.

        The slot is read as one byte stream: ``COPY (SELECT lsn, data FROM
        pg_logical_slot_peek_binary_changes(...)) TO STDOUT (FORMAT binary)``. The server
        decodes the WAL as fast as its own SQL interface does (the replication protocol flushes
        one network write per message and measured slower than this process), and this process
        handles the stream a block of messages at a time (:class:`_SlotRead`): row messages are
        only kept, and decoded a segment at a time (pgbatch); Begin, Commit, Relation and
        TRUNCATE are handled one at a time. Peeking moves nothing: the slot is confirmed by
        :meth:`commit_offset` (``pg_replication_slot_advance``) after the caller staged the
        batch (I6).

        A read is one step of at most ``capture_step_messages`` messages (the server keeps a
        step's decoded messages in a tuplestore, spilled to its temporary files past
        ``work_mem``; a single transaction larger than that comes whole): when it stops there,
        ``LogBatch.more`` is set and the next call on this dialect (after the caller committed)
        reads on towards the same end.

        A transaction larger than a segment (twice ``segment_max_events`` messages, or
        ``segment_max_bytes`` bytes of them) is staged in parts as it arrives: pgoutput sends a
        transaction only once it committed (never an aborted one, nor a rolled-back
        subtransaction's changes), so its parts are final; the offset still only moves to a
        commit. Positions inside it go on across parts (``Segment.begin(base=...)``)."""
        offset, max_events = request.offset, request.max_events
        segment_max_events, on_segment = request.segment_max_events, request.on_segment
        start = lsn_to_int(offset)
        upto, self._read_upto = (
            (self.offsets.flush_lsn() if self._read_upto is None else self._read_upto),
            None,
        )
        if start >= upto:  # the end this run aims at is reached
            return LogBatch([], offset, offset)
        step = (
            self.capture_step_messages if max_events is None else min(self.capture_step_messages, max_events)
        )
        reader = _SlotRead(
            self, start, max_events, segment_max_events if on_segment is not None else None, on_segment
        )
        messages = self._peek(upto, step, reader)
        batch = reader.finish(upto, messages >= step)
        self._read_upto = upto if batch.more else None
        return batch

    def _peek(self, upto: int, step: int, reader: _SlotRead) -> int:
        """COPY the slot's decoded messages up to ``upto`` (at most ``step``, rounded up to a
        whole transaction) into ``reader``; the number of messages the server sent."""
        import psycopg2

        # Protocol 1 on every server (13 to 18): versions 2 to 4 (PostgreSQL 14, 15, 16) add only
        # streaming of transactions in progress, two-phase commits and parallel streaming, each
        # sent only when asked for ('streaming', 'two_phase'). Capture stages committed
        # transactions only, so it asks for none, and then 18 sends byte for byte the same
        # messages under 1, 2, 3 and 4 (checked there).
        sql = (
            "COPY (SELECT lsn, data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', '1', 'publication_names', %s)) TO STDOUT (FORMAT binary)"
        )
        params = (self.slot_name, int_to_lsn(upto), int(step), self.server.quote_ident(self.publication_name))
        deadline = time.monotonic() + 15
        while True:
            conn = self.server.new_connection()
            try:
                conn.autocommit = True
                with conn.cursor() as cur:
                    cur.execute("SET statement_timeout = %s", (max(1, int(self.read_timeout * 1000)),))
                    cur.copy_expert(cur.mogrify(sql, params).decode(), reader)
                reader.flush()
                return reader.messages
            except psycopg2.Error as exc:
                msg = pg_message(exc)
                if isinstance(exc, psycopg2.errors.QueryCanceled):
                    raise SourceError(
                        f"reading replication slot {self.slot_name!r} took longer than read_timeout "
                        f"({self.read_timeout:.0f} s) for one step of {step} messages: raise the option "
                        "read_timeout, or lower capture_step_messages"
                    ) from exc
                if (
                    isinstance(exc, psycopg2.errors.ObjectInUse)
                    and time.monotonic() < deadline
                    and not reader.messages
                ):
                    time.sleep(0.2)  # a reader that just stopped still holds the slot for a moment
                    continue
                if isinstance(exc, psycopg2.errors.UndefinedObject) and "slot" in msg:
                    raise self.offsets.resnapshot_error("does not exist") from exc
                if (
                    "invalidated" in msg
                    or "can no longer get changes" in msg
                    or "has already been removed" in msg
                ):
                    raise self.offsets.resnapshot_error(
                        slot_invalidated_why(_invalidation_reason(msg))
                    ) from exc
                raise SourceError(
                    f"cannot read the changes of replication slot {self.slot_name!r}: {msg}"
                ) from exc
            finally:
                conn.close()

    def _toast_error(self, rel: pgbatch.Relation, missing: list[str]) -> SourceError:
        return SourceError(
            f"table {rel.table}: an UPDATE left the large (TOASTed) column(s) {missing} unchanged and, with "
            "REPLICA IDENTITY "
            f"{REPLICA_IDENTITY.get(rel.replica_identity, rel.replica_identity).upper()}, the "
            "changelog does not carry their values, so the full after-image cannot be built. Run "
            f"ALTER TABLE {self.server.quote_table(rel.table)} REPLICA IDENTITY FULL; this transaction "
            "cannot be "
            "completed: re-snapshot the table and restart capture from a new slot (drop_slot())"
        )

    def _other_change(self, info: _RelInfo, m, pos, txn: list, ts_ms: int, warned: set) -> None:
        if info.kind == "watermark":
            if isinstance(m, pgoutput.Update):
                txn.append(WatermarkEvent(m.new[info.value_idx], pos(), ts_ms))
        elif info.kind == "error":
            raise SourceError(
                f"{info.problem}. It is in the capture scope (CDC_TABLES); remove it there and from "
                "publication "
                f"{self.publication_name!r}, or fix the table"
            )
        elif info.table not in warned:
            warned.add(info.table)
            log.warning("capture skips changes of %s: %s", info.table, info.problem)

    def _row_events(
        self,
        info: _RelInfo,
        m,
        pos: Callable[[], Position],
        txn: list,
        ts_ms: int,
        origin: tuple | None = None,
    ) -> None:
        """The change events of one pgoutput Insert, Update or Delete, appended to ``txn``; an
        update that changes the key is a delete of the old key and a create of the new one."""
        tid, names, key_idx = info.table.id, info.names, info.key_idx

        def emit(op: Op, before: dict | None, after: dict | None) -> None:
            keyrow = after if after is not None else before
            key = encode_key([keyrow[names[i]] for i in key_idx])
            txn.append(ChangeEvent(tid, op.value, key, pos(), before, after, ts_ms, origin=origin))

        if isinstance(m, pgoutput.Insert):
            emit(Op.CREATE, None, _row(info, m.new))
        elif isinstance(m, pgoutput.Delete):
            emit(Op.DELETE, _old_row(info, m), None)
        else:
            new = self._whole_new(info, m)
            after = _row(info, new)
            before = None if m.old is None else _old_row(info, m)
            if m.old is not None and [m.old[i] for i in key_idx] != [new[i] for i in key_idx]:
                emit(Op.DELETE, before, None)
                emit(Op.CREATE, None, after)
            else:
                emit(Op.UPDATE, before, after)

    def _whole_new(self, info: _RelInfo, m) -> list:
        """An update's new tuple, its unchanged TOASTed values taken from the old tuple (which
        has them only with REPLICA IDENTITY FULL; otherwise the error says so)."""
        new = list(m.new)
        if any(v is pgoutput.UNCHANGED for v in new):
            missing = [info.names[i] for i, v in enumerate(new) if v is pgoutput.UNCHANGED]
            if m.old_kind != "O" or any(
                m.old[i] is pgoutput.UNCHANGED for i, v in enumerate(new) if v is pgoutput.UNCHANGED
            ):
                raise self._toast_error(info.batch, missing)
            new = [m.old[i] if v is pgoutput.UNCHANGED else v for i, v in enumerate(new)]
        return new

    def _truncate(
        self,
        m: pgoutput.Truncate,
        rels: dict[int, _RelInfo],
        pos,
        txn: list,
        ts_ms: int,
        origin: tuple | None = None,
    ) -> None:
        """One Truncate message may name several tables (TRUNCATE a, b; CASCADE): a ``t``
        event for each captured one, at its place in the transaction."""
        hit = [rels[r].table for r in m.relids if r in rels and rels[r].kind in ("table", "error")]
        if not hit:
            return
        if self.on_truncate == "event":
            for table in hit:
                log.info("capture: TRUNCATE of %s staged as a 't' event", table)
                txn.append(
                    ChangeEvent(table.id, Op.TRUNCATE.value, None, pos(), None, None, ts_ms, origin=origin)
                )
            return
        if self.on_truncate == "skip":
            log.warning("capture skips TRUNCATE of %s (on_truncate='skip'): re-snapshot these tables", hit)
            return
        raise SourceError(
            f"TRUNCATE of {', '.join(map(str, hit))} is in the changelog; it removes rows without row "
            "events, so "
            "the mirror cannot follow it. Re-snapshot these tables, and set the dialect option "
            "on_truncate='skip' "
            "to let capture pass this point"
        )


def _row(info: _RelInfo, values: list) -> dict:
    """A tuple's values as a canonical row (the relation's conversions applied)."""
    vals = list(values)
    for i, d in info.conversions:
        v = vals[i]
        if v is not None:
            vals[i] = d(v)
    return dict(zip(info.names, vals, strict=True))


def _old_row(info: _RelInfo, m) -> dict:
    """The old tuple of an update or delete: the whole row (REPLICA IDENTITY FULL, kind 'O'),
    else its key columns only."""
    if m.old_kind == "O":
        return _row(info, m.old)
    names, decs = info.names, info.decoders
    return {names[i]: None if m.old[i] is None else decs[i](m.old[i]) for i in info.key_idx}
