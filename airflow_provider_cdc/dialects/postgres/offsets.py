"""Where capture stands: the logical slot and the publication, their lifecycle, the confirmed
position and the WAL the slot holds back; the dialect's ``offsets``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...core.errors import SourceChangedError, SourceError
from ...core.position import Position, just_before, lsn_to_int, next_record_start
from ...core.schema import TableName
from ...storage.source_server import read_server, resync_pending, write_server
from ..base import LogActivity, LogRetention
from .catalog import PgCatalog
from .continuity import Continuity, _invalidation_reason, slot_invalidated_why  # noqa: F401 - log_reader's
from .publication import Publication
from .server import PgServer
from .types import pg_message

log = logging.getLogger(__name__)


class PgOffsets(Publication, Continuity):
    """The slot (created, checked, confirmed, dropped) and the publication (its tables)."""

    def __init__(
        self,
        server: PgServer,
        catalog: PgCatalog,
        *,
        slot_name: str,
        publication_name: str,
        tables: list[TableName] | None,
        failover_slot: bool,
        read_timeout: float,
        watermark_tables: Callable[[], list[TableName]],
        resync_hint: str,
    ) -> None:
        self.server = server
        self.catalog = catalog
        self.slot_name = slot_name
        self.publication_name = publication_name
        self.tables = tables  # the capture scope (None: every table, on the all_tables opt-in)
        self.failover_slot = failover_slot
        self.read_timeout = read_timeout
        self.watermark_tables = watermark_tables  # the tables the watermark strategy writes
        self.resync_hint = resync_hint  # what a SourceChangedError tells the user to do
        self._warned_missing: set[TableName] = set()

    def current_position(self) -> Position:
        """The end of the log capture can read: the WAL written (a primary), or replayed (a hot
        standby the source captures from: what its slot can decode)."""
        return Position.pg(
            self.server.query(f"SELECT {self.server.wal_end_sql('pg_current_wal_lsn')}::text")[0][0]
        )

    def mark_position(self) -> Position:
        """Just before the WAL insert position, where a chunk read now records itself
        (chunks.py ``_read_snapshot``): on an idle server a chunk read after a mark sits at the
        mark, not before it. On a hot standby the source captures from: just before the start of
        the record after its replay position, where a chunk read there later lands or after it
        (``standby_mark``), and which capture passes once it read what the standby replayed."""
        if self.server.on_standby:
            replay = lsn_to_int(self.server.query("SELECT pg_last_wal_replay_lsn()::text")[0][0])
            return just_before(Position.pg(next_record_start(replay, *self.server.wal_geometry())))
        return just_before(Position.pg(self.server.query("SELECT pg_current_wal_insert_lsn()::text")[0][0]))

    def slot_row(self) -> tuple | None:
        v17 = self.server.server_version >= 170000  # (columns failover and invalidation_reason)
        rows = self.server.query(
            f"SELECT confirmed_flush_lsn::text, wal_status, plugin, database, active, "  # noqa: S608 - column names
            f"{'failover, invalidation_reason' if v17 else 'false, NULL'} FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.slot_name,),
        )
        return rows[0] if rows else None

    def resnapshot_error(self, why: str) -> SourceError:
        return SourceChangedError(
            f"replication slot {self.slot_name!r} {why}: changes since the last capture may be lost. "
            + self.resync_hint
        )

    def load_offset(
        self,
        data_dir: str,
        *,
        check_prerequisites: Callable[[], None],
        prepare_watermarks: Callable[[], None],
    ) -> str:
        """The slot's confirmed position; creates publication and slot on first use. The server
        must be the one capture read before, or a promoted standby the slot followed (I14,
        :meth:`_check_continuity`); a slot that vanished after capture had staged segments means
        lost changes: error. Every check runs before anything is created on the source: a run
        that fails leaves it unchanged."""
        from ...storage.layout import changelog_dir

        directory = changelog_dir(data_dir, self.server.source)
        server = self.server_identity()
        known = read_server(directory)
        row = self.slot_row()
        if (
            known is not None
            and self.server.on_standby
            and known.get("system_identifier") == server["system_identifier"]
            and (known.get("timeline") or 0) > (server["timeline"] or 0)
        ):
            # a timeline never goes back: while a standby's WAL receiver restarts, the reading is
            # its last restartpoint's, which may still be the timeline before its primary's failover
            server["timeline"] = known["timeline"]
        if known is not None:
            self._check_continuity(known, server, row, directory)
        if row is None:
            from ...storage.segment_index import changelog_used

            # (segments, or the index that outlives the segments staging retention removed; or a
            # capture that staged nothing yet: the slot it confirmed is gone all the same, and what
            # was committed since is not in any new slot)
            if (known is not None or changelog_used(directory)) and not resync_pending(directory):
                raise self.resnapshot_error("does not exist although capture read through it before")
            check_prerequisites()
        else:
            self._check_slot(row)
        prepare_watermarks()
        self.ensure_publication()
        if row is None:
            self._create_slot()
            row = self.slot_row()
        self._check_slot(row)
        if row[5]:
            self._check_standby_slots()
        server["failover"] = bool(row[5])
        if server != known:
            write_server(directory, server)
        return row[0]

    def log_retention(self, offset: str) -> LogRetention | None:
        """The slot's lag (WAL written past its confirmed position) and, when
        ``max_slot_wal_keep_size`` limits the WAL a slot keeps, how much more may be written
        before the lag reaches it. None when the slot does not exist.

        The headroom is counted from the confirmed position, the part the capture controls,
        not from the server's ``safe_wal_size``: that one counts from the slot's restart point,
        which trails a confirmation until the server decodes its next running-transactions
        record (up to ~15 s of activity later), so it stays near zero for a while after a
        capture that caught up. ``wal_status = lost`` is reported as it is."""
        rows = self.server.query(
            f"SELECT wal_status, pg_wal_lsn_diff({self.server.wal_end_sql('pg_current_wal_lsn')}, "  # noqa: S608 - a function
            "confirmed_flush_lsn)::bigint, "
            "(SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size') "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot_name,),
        )
        if not rows:
            return None
        wal_status, lag, limit_mb = rows[0]
        lag = max(0, int(lag or 0))
        limit = None if limit_mb is None or int(limit_mb) < 0 else int(limit_mb) * 1024 * 1024
        unbounded = "" if limit is not None else self.unbounded_wal_warning()
        return LogRetention(
            holder=f"replication slot {self.slot_name!r}",
            lag_bytes=lag,
            lost=wal_status == "lost",
            limit_bytes=limit,
            safe_bytes=None if limit is None else max(0, limit - lag),
            setting="max_slot_wal_keep_size",
            fix="run the capture more often (the changelog DAG's schedule), or raise max_slot_wal_keep_size; "
            "a slot already lost needs airflow-cdc resync, which starts capture anew and repairs only what "
            "differs (docs: operations, 'Failover')",
            unbounded=unbounded,
        )

    def log_activity(self) -> LogActivity:
        """The write counters of the publication's tables and the watermark tables
        (``pg_stat_user_tables``, readable by any role; a backend publishes its counters within
        about a second of a commit), so writes elsewhere in the cluster, which move the WAL
        too, start no round; and the slot's lag. Only the rows inserted, updated and deleted:
        ``n_live_tup`` moves with ANALYZE's estimates too, and a TRUNCATE moves none of them
        (the next write or the heartbeat's round captures it). On a standby, whose counters do not follow
        replay, the replayed WAL position instead."""
        marks = self.watermark_tables()
        end_sql = self.server.wal_end_sql("pg_current_wal_lsn")  # a function name, no input
        # the only text put in is a function name
        sql = (
            "SELECT coalesce(sum(s.n_tup_ins + s.n_tup_upd + s.n_tup_del), 0)::text, "  # noqa: S608
            f"(SELECT pg_wal_lsn_diff({end_sql}, confirmed_flush_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s), "
            f"{end_sql}::text FROM pg_stat_user_tables s "
            "WHERE (s.schemaname, s.relname) IN (SELECT schemaname, tablename FROM pg_publication_tables "
            "WHERE pubname = %s) "
            "OR (s.schemaname, s.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
        )
        rows = self.server.query(
            sql,
            (self.slot_name, self.publication_name, [t.schema for t in marks], [t.name for t in marks]),
        )
        counters, lag, end = rows[0]
        return LogActivity(
            token=f"wal {end}" if self.server.on_standby else f"writes {counters}",
            pending_bytes=None if lag is None else max(0, int(lag)),
        )

    def wal_keep_limit_mb(self) -> int:
        """``max_slot_wal_keep_size`` in MB (-1, PostgreSQL's default: nothing bounds a slot's WAL)."""
        return int(
            self.server.query(
                "SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'"
            )[0][0]
        )

    def unbounded_wal_warning(self) -> str:
        """What status, the CDC page, doctor and a connection test say while
        ``max_slot_wal_keep_size = -1`` (:meth:`wal_keep_limit_mb`)."""
        return (
            f"nothing bounds the WAL replication slot {self.slot_name!r} holds (max_slot_wal_keep_size = -1, "
            "PostgreSQL's default): while capture does not run (the changelog DAG paused or failing, "
            "the source "
            "removed but its slot left), the server keeps every WAL file from the slot's position on "
            "and can fill "
            "its disk, which stops the database. Set a limit, e.g. ALTER SYSTEM SET max_slot_wal_keep_size = "
            "'50GB'; SELECT pg_reload_conf(); (a slot past it is lost and needs airflow-cdc resync), "
            "and drop "
            "the slots of sources no longer captured (airflow-cdc drop-source)"
        )

    def _slot_row(self) -> tuple | None:
        """(type, plugin, database, this database) of the slot of the source's name, or None."""
        rows = self.server.query(
            "SELECT slot_type, coalesce(plugin, ''), coalesce(database::text, ''), current_database() "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot_name,),
        )
        return rows[0] if rows else None

    def slot_not_ours(self, row: tuple | None = None) -> str | None:
        """Why the slot of the source's name is not one this package made (a physical slot,
        another plugin's, another database's), in words; None when it is (or does not exist).
        Nothing that is not ours is ever dropped. ``row``: its :meth:`_slot_row`, when read."""
        row = self._slot_row() if row is None else row
        if row is None:
            return None
        kind, plugin, database, here = row
        if kind != "logical":
            return f"it is a {kind} replication slot"
        if plugin != "pgoutput":
            return f"it decodes with plugin {plugin!r}, not pgoutput"
        if database != here:
            return f"it belongs to database {database!r}, not {here!r}"
        return None

    def held(self) -> list[str]:
        """What the source holds on this server, in words, as drop-source treats it: only what
        exists, and what is not the source's said so (it is left)."""
        out = []
        slot = self._slot_row()
        if slot is not None:
            why = self.slot_not_ours(slot)
            note = "" if why is None else f" (not this source's: {why}; left)"
            out.append(f"replication slot {self.slot_name!r}{note}")
        publication = self._publication_row()
        if publication is not None:
            owner = self.publication_owner(publication)
            out.append(
                f"publication {self.publication_name!r}"
                + ("" if owner is None else f" (owned by {owner!r}, not this connection's role: left)")
            )
        return out

    def drop_slot(self, timeout: float = 10.0) -> bool:
        """Drop the slot (it retains WAL forever otherwise). Waits while a just-closed
        stream still holds it. Returns False when it did not exist. Refuses (SourceError, nothing
        dropped) a slot of that name this package did not make (:meth:`slot_not_ours`)."""
        import psycopg2

        why = self.slot_not_ours()
        if why is not None:
            raise SourceError(
                f"replication slot {self.slot_name!r} on {self.server.params.host}:{self.server.params.port} "
                f"is not a slot of source {self.server.source!r} ({why}), so it was not dropped. Another "
                "tool may use it: if nothing does, drop it by hand; or give this source another "
                "slot_name (connection extra)"
            )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.server.conn.cursor() as cur:
                    cur.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE "
                        "slot_name = %s",
                        (self.slot_name,),
                    )
                    return bool(cur.fetchall())
            except psycopg2.errors.ObjectInUse as exc:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"replication slot {self.slot_name!r} is in use ({pg_message(exc)}): stop the "
                        "capture "
                        "that reads it, then drop it"
                    ) from exc
                time.sleep(0.1)

    def flush_lsn(self) -> int:
        """Where a read of the slot ends: the WAL flushed (a primary), or replayed (a standby)."""
        return lsn_to_int(
            self.server.query(f"SELECT {self.server.wal_end_sql('pg_current_wal_flush_lsn')}::text")[0][0]
        )

    def visibility(self) -> str | None:
        """A primary's snapshot now (commit order is not visibility order there). None on a hot
        standby the source captures from: a transaction becomes visible there when its commit
        record is replayed, in log order, so every chunk read after a mark sees each commit
        before it (and its pg_current_snapshot() lists no running xid: core/visibility.py)."""
        if self.server.on_standby:
            return None
        return self.server.query("SELECT pg_current_snapshot()::text")[0][0]

    def offset_position(self, offset: str) -> Position:
        """A read ends at the flush position it aimed at: every transaction whose commit record
        ends before it was read (a record the flush had not reached yet is not). Taken as the
        start of the next record (core/position.py ``next_record_start``), so that a mark at the
        insert position of a server idle on a page boundary is reached."""
        return Position.pg(next_record_start(lsn_to_int(offset), *self.server.wal_geometry()))

    def log_bytes_between(self, start: Position, end: Position) -> int:
        """WAL bytes between two positions (their LSNs)."""
        return max(0, end.major - start.major)

    def commit_offset(self, offset: str, data_dir: str) -> None:
        """I6: confirm the slot up to ``offset`` only now that the batch is staged
        (``pg_replication_slot_advance``: it reads the WAL without decoding the changes)."""
        import psycopg2

        lsn = lsn_to_int(offset)
        row = self.slot_row()
        if row is None:
            raise self.resnapshot_error("does not exist")
        if row[0] is not None and lsn_to_int(row[0]) >= lsn:
            return
        deadline = time.monotonic() + 15
        while True:
            try:
                with self.server.conn.cursor() as c:
                    c.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot_name, offset))
                return
            except psycopg2.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
