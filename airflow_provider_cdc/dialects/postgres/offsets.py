"""Where capture stands: the logical slot and the publication, their lifecycle, the confirmed
position and the WAL the slot holds back; the dialect's ``offsets``.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence

from ...core.errors import ConfigurationError, SourceChangedError, SourceError
from ...core.position import Position, int_to_lsn, just_before, lsn_to_int, next_record_start
from ...core.schema import TableName
from ...storage.source_server import read_server, resync_pending, write_server
from ..base import LogActivity, LogRetention
from .catalog import PgCatalog
from .server import PgServer
from .types import pg_message

log = logging.getLogger(__name__)


_INVALIDATED_BECAUSE = {
    "wal_removed": "the WAL it needed was removed, see max_slot_wal_keep_size",
    "idle_timeout": "it stayed idle longer than idle_replication_slot_timeout (PostgreSQL 18): run the "
    "capture "
    "more often than that, or raise the setting (0 turns it off)",
    "rows_removed": "catalog rows it needed were vacuumed away",
    "wal_level_insufficient": "wal_level was lowered below logical",
}


def slot_invalidated_why(reason: str | None) -> str:
    """``was invalidated (...)`` for a slot ``reason`` (invalidation_reason, PostgreSQL 17+; None
    before: then it was the WAL, the only reason those servers invalidate a logical slot for)."""
    because = _INVALIDATED_BECAUSE.get(reason or "wal_removed", f"reason {reason!r}")
    return f"was invalidated ({because})"


def _invalidation_reason(message: str) -> str | None:
    m = re.search(r'invalidated due to "([a-z_]+)"', message)
    return m.group(1) if m else None


class PgOffsets:
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

    def _publication_tables(self) -> list[TableName]:
        """The scope's tables that exist (each missing one is named in a warning and left out: it
        has no changes to capture, the others go on), and the watermark table."""
        present = [t for t in (self.tables or []) if not self._missing_table(t)]
        if self.tables and not present:
            raise SourceError(
                f"source {self.server.source!r}: none of the tables of its capture scope exists on "
                "PostgreSQL at "
                f"{self.server.params.host}:{self.server.params.port}/{self.server.params.database} ("
                f"{', '.join(map(str, self.tables))}), "
                "or the connection's user cannot see them. Correct CDC_TABLES (or the source's "
                "'tables' in the "
                "sources config): schema.table, names exact, case included"
            )
        return [*present, *self.watermark_tables()]

    def _missing_table(self, table: TableName) -> bool:
        """True (and a warning naming it, once per dialect) when ``table`` of the scope does not exist."""
        if self.catalog.relation(table) is not None:
            return False
        warned = self._warned_missing
        if table not in warned:
            warned.add(table)
            close = [
                f"{a}.{b}"
                for a, b in self.server.query(
                    "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                    "c.relnamespace "
                    "WHERE lower(n.nspname) = lower(%s) AND lower(c.relname) = lower(%s) AND c.relkind "
                    "IN ('r', 'p')",
                    (table.schema, table.name),
                )
            ]
            log.warning(
                "source %r: table %s of its capture scope (CDC_TABLES) does not exist on PostgreSQL at "
                "%s:%s/%s, or "
                "the connection's user cannot see it%s. Capture goes on for the other tables and adds it to "
                "publication %r once it exists (then snapshot it); else remove it from CDC_TABLES",
                self.server.source,
                table,
                self.server.params.host,
                self.server.params.port,
                self.server.params.database,
                f"; did you mean {' or '.join(close)}? (names are exact, case included)" if close else "",
                self.publication_name,
            )
        return True

    def add_to_publication(self, tables: Sequence[TableName]) -> None:
        have = {
            TableName(s, n)
            for s, n in self.server.query(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (self.publication_name,),
            )
        }
        missing = [t for t in tables if t not in have]
        if missing:
            self.server.query(
                f"ALTER PUBLICATION {self.server.quote_ident(self.publication_name)} ADD TABLE "
                f"{self.server.qlist(missing)}"
            )

    def ensure_publication(self) -> None:
        pub = self.server.query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        q = self.server.quote_ident(self.publication_name)
        if self.server.on_standby:
            problem = self.standby_publication_problem()
            if problem:
                raise ConfigurationError(f"source {self.server.source!r}: {problem}")
            return
        if not pub:
            if not self.tables:
                self._refuse_unidentified_tables()
                self.server.query(
                    f"CREATE PUBLICATION {q} FOR ALL TABLES WITH (publish_via_partition_root = true)"
                )
            else:
                self.server.query(
                    f"CREATE PUBLICATION {q} FOR TABLE {self.server.qlist(self._publication_tables())} "
                    "WITH (publish_via_partition_root = true)"
                )
        elif not pub[0][0]:
            self.add_to_publication(self._publication_tables())

    def standby_publication_problem(self, tables: Sequence[TableName] | None = None) -> str | None:
        """A hot standby cannot create or alter a publication (it is read-only; the publication
        comes from the primary in the WAL): what is missing, as the statement an administrator
        runs on the primary; None when the publication carries ``tables`` (default: the scope)."""
        q = self.server.quote_ident(self.publication_name)
        where = f"PostgreSQL at {self.server.params.host}:{self.server.params.port} is a hot standby"
        pub = self.server.query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        wanted = list(self.tables or []) if tables is None else list(tables)
        if not pub:
            what = f"FOR TABLE {self.server.qlist(wanted)}" if wanted else "FOR ALL TABLES"
            return (
                f"{where}, where publication {self.publication_name!r} cannot be created (a standby is "
                "read-only; "
                "publications come from the primary through the WAL). Run on the primary: CREATE "
                f"PUBLICATION {q} "
                f"{what} WITH (publish_via_partition_root = true); then capture again once the standby "
                "replayed it"
            )
        if pub[0][0] or not wanted:
            return None
        have = {
            TableName(a, b)
            for a, b in self.server.query(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (self.publication_name,),
            )
        }
        missing = [t for t in wanted if t not in have]
        if not missing:
            return None
        return (
            f"{where}, where publication {self.publication_name!r} cannot be altered, and it lacks "
            f"{', '.join(map(str, missing))}. Run on the primary: ALTER PUBLICATION {q} ADD TABLE "
            f"{self.server.qlist(missing)}"
        )

    def _refuse_unidentified_tables(self) -> None:
        """Once a FOR ALL TABLES publication exists, PostgreSQL refuses UPDATE and DELETE on
        tables without a replica identity (no primary key, REPLICA IDENTITY DEFAULT or
        NOTHING): the applications writing them break. While any such table exists the
        publication is not created; the error names them."""
        rows = self.server.query(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%' "
            "AND (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS "
            "(SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))) ORDER BY 1, 2 LIMIT 50"
        )
        if rows:
            raise ConfigurationError(
                f"source {self.server.source!r} (CDC_CAPTURE_ALL_TABLES): not creating publication "  # noqa: S608 - a message, not SQL
                f"{self.publication_name!r} FOR ALL TABLES, because PostgreSQL would then refuse "
                "UPDATE and DELETE "
                "on these tables, which have no replica identity, and break the applications that "
                "write them: "
                f"{', '.join(f'{a}.{b}' for a, b in rows)}. Set CDC_TABLES to the tables to capture "
                "instead, or give "
                "those tables a primary key or REPLICA IDENTITY FULL first"
            )

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

    # --- the server behind the source (I14) ------------------------------------------------
    def server_identity(self) -> dict:
        """Which server this is: its system identifier (the same on a primary and the standbys
        cloned from it, another after a restore into a new cluster) and its timeline (a promotion
        starts a new one)."""
        # one round trip (snapshot chunks ask it at both watermarks). In recovery pg_walfile_name
        # fails: there the timeline the standby receives, or, while its WAL receiver is not
        # running, the one of its last restartpoint (CASE evaluates only the branch taken)
        sysid, recovering, received, primary = self.server.query(
            "SELECT system_identifier::text, pg_is_in_recovery(), "
            "CASE WHEN pg_is_in_recovery() THEN coalesce((SELECT received_tli FROM pg_stat_wal_receiver), "
            "(SELECT timeline_id FROM pg_control_checkpoint())) END, "
            "CASE WHEN NOT pg_is_in_recovery() THEN substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END "
            "FROM pg_control_system()"
        )[0]
        self.server.on_standby = bool(recovering)
        if recovering:
            timeline = None if received is None else int(received)
        else:
            timeline = int(primary, 16)
        return {"system_identifier": sysid, "timeline": timeline}

    def _create_slot(self) -> None:
        """The slot, as a failover slot where the server has them (PostgreSQL 17+, unless the
        connection extra ``failover_slot`` is false): a standby with ``sync_replication_slots``
        keeps a copy, and capture goes on from it after that standby is promoted. On a hot
        standby (PostgreSQL 16+) a plain slot: :meth:`_create_standby_slot`."""
        if self.server.on_standby:
            self._create_standby_slot()
        elif self.server.server_version >= 170000 and self.failover_slot:
            self.server.query(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)",
                (self.slot_name,),
            )
            standbys, held = self.server.query(
                "SELECT (SELECT count(*) FROM pg_stat_replication), "
                "current_setting('synchronized_standby_slots')"
            )[0]
            if standbys and not held:
                log.warning(
                    "source %r: failover slot %r created, but synchronized_standby_slots is empty "
                    "while %d standby(s) "
                    "stream from this server: capture may read changes a standby has not received yet, "
                    "and after that "
                    "standby is promoted capture stops (those changes are not on it) instead of going "
                    "on. Set "
                    "synchronized_standby_slots to the standbys' physical slots",
                    self.server.source,
                    self.slot_name,
                    standbys,
                )
        else:
            self.server.query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot_name,))

    def _create_standby_slot(self) -> None:
        """The slot on the hot standby the source captures from. The standby builds its starting
        point from a running-transactions record of the primary, so creation waits for the next
        one: the primary logs one every 15 s while it writes WAL, none while it is idle
        (``SELECT pg_log_standby_snapshot()`` on the primary logs one at once). Bounded by
        ``read_timeout``, then says so. (A slot created on a standby cannot be a failover slot.)"""
        import psycopg2

        where = f"the hot standby at {self.server.params.host}:{self.server.params.port}"
        log.info(
            "source %r: creating replication slot %r on %s: it waits for the primary's next "
            "running-transactions "
            "record (one every 15 s while the primary writes WAL; SELECT pg_log_standby_snapshot() on "
            "the primary "
            "logs one now)",
            self.server.source,
            self.slot_name,
            where,
        )
        conn = self.server.new_connection()
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SET statement_timeout = %s", (max(1, int(self.read_timeout * 1000)),))
                cur.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot_name,))
        except psycopg2.errors.QueryCanceled as exc:
            raise SourceError(
                f"source {self.server.source!r}: creating replication slot {self.slot_name!r} on "
                f"{where} waited longer than "
                f"read_timeout ({self.read_timeout:.0f} s) for a running-transactions record from the "
                "primary. The "
                "primary logs one every 15 s while it writes WAL, none while it is idle: run SELECT "
                "pg_log_standby_snapshot() on the primary (PostgreSQL 16+), or capture again once it writes"
            ) from exc
        except psycopg2.Error as exc:
            msg = pg_message(exc)
            fix = (
                " Set wal_level = logical on the primary (ALTER SYSTEM SET wal_level = logical, then "
                "restart it)"
                if "wal_level" in msg
                else ""
            )
            raise SourceError(
                f"source {self.server.source!r}: cannot create replication slot {self.slot_name!r} on "
                f"{where}: {msg}.{fix}"
            ) from exc
        finally:
            conn.close()

    def _check_standby_slots(self) -> None:
        """Logical decoding of a failover slot waits until every physical slot named in
        ``synchronized_standby_slots`` has received the WAL it decodes. A name without a slot
        (typically on a promoted standby that kept its old primary's setting) or a lost slot
        makes every read wait until read_timeout: said at once instead."""
        rows = self.server.query(
            "SELECT n, s.wal_status, s.active FROM "
            "unnest(string_to_array(current_setting('synchronized_standby_slots'), "
            "',')) AS u(raw) CROSS JOIN LATERAL trim(u.raw) AS n LEFT JOIN pg_replication_slots s "
            "ON s.slot_name = n AND s.slot_type = 'physical' WHERE n <> '' AND n <> '*'"
        )
        missing = [n for n, status, _active in rows if status is None or status == "lost"]
        if missing:
            raise SourceError(
                f"source {self.server.source!r}: synchronized_standby_slots on PostgreSQL at "
                f"{self.server.params.host}:"
                f"{self.server.params.port} names {', '.join(map(repr, missing))}, which is not a "
                "usable physical slot here, "
                f"and decoding failover slot {self.slot_name!r} waits for every slot named there: "
                "capture would wait "
                "forever. Set synchronized_standby_slots to this server's standbys' physical slots (or "
                "'' without "
                "standbys) and reload the configuration (after a promotion, the old primary's setting "
                "is often kept)"
            )
        idle = [n for n, _status, active in rows if active is False]
        if idle:
            log.warning(
                "source %r: standby slot(s) %s of synchronized_standby_slots are not streaming: "
                "capture waits "
                "until they receive the WAL it decodes",
                self.server.source,
                ", ".join(idle),
            )

    def _check_continuity(self, known: dict, server: dict, row: tuple | None, directory: str) -> None:
        """I14: capture goes on only from a position proven to continue the captured log. The
        same server: nothing to prove. A promoted standby (same system identifier, a new
        timeline): only when the slot followed it (a synchronized failover slot) and everything
        capture staged lies before the point where the new timeline forked from the old one, so
        each staged change is on this server at the same position; otherwise SourceChangedError."""
        same_system = known.get("system_identifier") == server["system_identifier"]
        before, now = known.get("timeline"), server["timeline"]
        if same_system and (before is None or now is None or before == now):
            return  # (every capture of an unchanged server stops here, without reading the gaps)
        if resync_pending(directory):
            return
        where = f"PostgreSQL at {self.server.params.host}:{self.server.params.port}"
        if not same_system:
            raise SourceChangedError(
                f"source {self.server.source!r}: {where} is not the server capture read before (system "
                "identifier "
                f"{known.get('system_identifier')} before, {server['system_identifier']} now: a "
                "restore, or another "
                "cluster). Nothing proves its log continues the captured one, so capture stops. "
                f"{self.resync_hint}"
            )
        promoted = (
            # a hot standby capture reads from, whose primary failed over to another server that it
            # now follows: its own slot is still here; the same proof applies
            f"the primary of {where} (a hot standby) failed over and it follows the new one "
            f"(timeline {before} -> {now})"
            if self.server.on_standby
            else f"{where} was promoted from a standby (timeline {before} -> {now})"
        )
        if row is None:
            why = (
                f"PostgreSQL {self.server.server_version // 10000} has no failover slots (17 and newer do)"
                if self.server.server_version < 170000
                else "it was not a synchronized failover slot on that standby (the standby needs "
                "sync_replication_slots "
                "= on, hot_standby_feedback = on and a primary_slot_name)"
            )
            raise SourceChangedError(
                f"source {self.server.source!r}: {promoted} and replication slot {self.slot_name!r} "
                f"did not follow it: {why}. "
                f"The changes between the last capture and the promotion may be lost. {self.resync_hint}"
            )
        from ...storage.segment_index import staged_through

        fork = self._fork_point(before, now)
        through = staged_through(directory)
        staged = through[0] if through else None
        if fork is None:
            raise SourceChangedError(
                f"source {self.server.source!r}: {promoted}, and the point where timeline {now} forked "
                f"from {before} cannot be "
                "read (TIMELINE_HISTORY over a replication connection), so it cannot be proven that "
                "the changes capture "
                f"staged are on this server. {self.resync_hint}"
            )
        fork_pos = Position.pg(next_record_start(fork, *self.server.wal_geometry()))
        if staged is not None and staged > fork_pos:
            raise SourceChangedError(
                f"source {self.server.source!r}: {promoted} at {int_to_lsn(fork)}, but capture had "
                "staged changes up to "
                f"{staged.encode()}, past that point: some of them are not on this server (set "
                "synchronized_standby_slots on the primary so that logical decoding waits for the standby). "
                f"{self.resync_hint}"
            )
        log.warning(
            "source %r: %s at %s; capture goes on from slot %r, which followed it (confirmed %s, "
            "staged through %s)",
            self.server.source,
            promoted,
            int_to_lsn(fork),
            self.slot_name,
            row[0],
            staged.encode() if staged else "nothing",
        )

    def _fork_point(self, old_timeline: int, new_timeline: int) -> int | None:
        """Where timeline ``old_timeline`` ends in this server's history (the timeline history
        file, read with TIMELINE_HISTORY over a replication connection: the role has REPLICATION)."""
        import psycopg2
        import psycopg2.extras

        kw = self.server.connect_kwargs()
        kw.pop("options", None)
        try:
            conn = psycopg2.connect(**kw, connection_factory=psycopg2.extras.PhysicalReplicationConnection)
        except psycopg2.Error as exc:
            log.warning(
                "source %r: no replication connection for TIMELINE_HISTORY: %s",
                self.server.source,
                pg_message(exc),
            )
            return None
        try:
            with conn.cursor() as cur:
                cur.execute(f"TIMELINE_HISTORY {int(new_timeline)}")
                _name, content = cur.fetchone()
        except psycopg2.Error as exc:
            log.warning(
                "source %r: TIMELINE_HISTORY %d failed: %s", self.server.source, new_timeline, pg_message(exc)
            )
            return None
        finally:
            conn.close()
        text = bytes(content).decode() if not isinstance(content, str) else content
        for line in text.splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0].isdigit() and int(parts[0]) == old_timeline:
                return lsn_to_int(parts[1])
        return None

    def _check_slot(self, row: tuple) -> None:
        confirmed, wal_status, plugin, database, _active, _failover, invalidated = row
        if plugin != "pgoutput":
            raise ConfigurationError(
                f"replication slot {self.slot_name!r} uses plugin {plugin!r}, not pgoutput: give "
                "another slot_name"
            )
        if database != (self.server.params.database or "postgres"):
            raise ConfigurationError(
                f"replication slot {self.slot_name!r} belongs to database {database!r}: give another "
                "slot_name"
            )
        if wal_status == "lost" or confirmed is None or invalidated is not None:
            # (PostgreSQL 17+ says why: the WAL, idle_replication_slot_timeout on 18, wal_level...)
            raise self.resnapshot_error(slot_invalidated_why(invalidated))
        if (
            self.server.on_standby
            and self.server.server_version >= 170000
            and self.server.query(
                "SELECT synced FROM pg_replication_slots WHERE slot_name = %s", (self.slot_name,)
            )
            == [(True,)]
        ):
            raise ConfigurationError(
                f"source {self.server.source!r}: replication slot {self.slot_name!r} on the hot "
                f"standby at {self.server.params.host}:"
                f"{self.server.params.port} is the primary's failover slot, synchronized here "
                "(sync_replication_slots): "
                "nothing may decode it on the standby. Give this source another slot_name (capture "
                "then creates its "
                "own slot on the standby), or point its connection at the primary"
            )

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

    def _publication_row(self) -> tuple | None:
        """(owner's name, owner's oid) of the source's publication, or None."""
        rows = self.server.query(
            "SELECT pg_get_userbyid(pubowner)::text, pubowner FROM pg_publication WHERE pubname = %s",
            (self.publication_name,),
        )
        return rows[0] if rows else None

    def publication_owner(self, row: tuple | None = None) -> str | None:
        """The role owning the source's publication when that is not this connection's role
        (an administrator made it, or another tool); None when this role owns it or it does not
        exist. ``row``: its :meth:`_publication_row`, when read."""
        row = self._publication_row() if row is None else row
        if row is None:  # (asked first: the session's role may be gone, and with it current_user)
            return None
        me = self.server.query("SELECT oid FROM pg_roles WHERE rolname = current_user")
        return None if me and me[0][0] == row[1] else row[0]

    def drop_publication(self) -> bool:
        """Drop the source's publication if this connection's role owns it (the package made
        it); one another role owns (an administrator's, another tool's) is left: returns False."""
        if self.publication_owner() is not None:
            return False
        self.server.query(f"DROP PUBLICATION IF EXISTS {self.server.quote_ident(self.publication_name)}")
        return True

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
