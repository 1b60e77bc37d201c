"""The server behind the source (I14): its identity, the slot's creation on a primary or a hot
standby, and the checks that the log capture reads continues the one it read before (a promoted
standby the failover slot followed, the timeline's fork point): PgOffsets' part for failover."""

from __future__ import annotations

import logging
import re

from ...core.errors import ConfigurationError, SourceChangedError, SourceError
from ...core.position import Position, int_to_lsn, lsn_to_int, next_record_start
from ...storage.source_server import resync_pending
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


class Continuity:
    """PgOffsets' server and slot-continuity methods (a mixin: ``self`` is the PgOffsets)."""

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
