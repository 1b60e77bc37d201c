"""Where capture stands: the logical slot and the publication, their lifecycle, the
confirmed position and the WAL the slot holds back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ...core.errors import ConfigurationError, SourceError
from ...core.position import Position, just_before, lsn_to_int, next_record_start
from ...core.schema import TableName
from ..base import LogRetention
from .types import pg_message


class PgOffsets:
    """The slot (created, checked, confirmed, dropped) and the publication (its tables)."""

    # --- changelog: slot and publication --------------------------------------------------
    def current_position(self) -> Position:
        return Position.pg(self._query("SELECT pg_current_wal_lsn()::text")[0][0])

    def mark_position(self) -> Position:
        """Just before the WAL insert position, where a chunk read now records itself
        (chunks.py ``_read_snapshot``): on an idle server a chunk read after a mark sits at the
        mark, not before it."""
        return just_before(Position.pg(self._query("SELECT pg_current_wal_insert_lsn()::text")[0][0]))

    def _publication_tables(self) -> list[TableName]:
        return [*(self.tables or []), *([self.watermark_table] if self.writes_watermarks else [])]

    def _add_to_publication(self, tables: Sequence[TableName]) -> None:
        have = {
            TableName(s, n)
            for s, n in self._query(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (self.publication_name,),
            )
        }
        missing = [t for t in tables if t not in have]
        if missing:
            self._query(
                f"ALTER PUBLICATION {self.quote_ident(self.publication_name)} ADD TABLE {self._qlist(missing)}"
            )

    def ensure_publication(self) -> None:
        pub = self._query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        q = self.quote_ident(self.publication_name)
        self.require_capture_scope()
        self.refuse_uncapturable(self.tables or ())
        if not pub:
            if not self.tables:
                self._refuse_unidentified_tables()
                self._query(f"CREATE PUBLICATION {q} FOR ALL TABLES WITH (publish_via_partition_root = true)")
            else:
                for t in self.tables:
                    if self._relation(t) is None:
                        raise SourceError(f"table {t} given in option 'tables' does not exist")
                self._query(
                    f"CREATE PUBLICATION {q} FOR TABLE {self._qlist(self._publication_tables())} "
                    "WITH (publish_via_partition_root = true)"
                )
        elif not pub[0][0]:
            self._add_to_publication(self._publication_tables())

    def _refuse_unidentified_tables(self) -> None:
        """Once a FOR ALL TABLES publication exists, PostgreSQL refuses UPDATE and DELETE on
        tables without a replica identity (no primary key, REPLICA IDENTITY DEFAULT or
        NOTHING): the applications writing them break. While any such table exists the
        publication is not created; the error names them."""
        rows = self._query(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%' "
            "AND (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS "
            "(SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary))) ORDER BY 1, 2 LIMIT 50"
        )
        if rows:
            raise ConfigurationError(
                f"source {self.source!r} (CDC_CAPTURE_ALL_TABLES): not creating publication "  # noqa: S608 - a message, not SQL
                f"{self.publication_name!r} FOR ALL TABLES, because PostgreSQL would then refuse UPDATE and DELETE "
                f"on these tables, which have no replica identity, and break the applications that write them: "
                f"{', '.join(f'{a}.{b}' for a, b in rows)}. Set CDC_TABLES to the tables to capture instead, or give "
                "those tables a primary key or REPLICA IDENTITY FULL first"
            )

    def _slot_row(self) -> tuple | None:
        rows = self._query(
            "SELECT confirmed_flush_lsn::text, wal_status, plugin, database, active FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (self.slot_name,),
        )
        return rows[0] if rows else None

    def _resnapshot_error(self, why: str) -> SourceError:
        return SourceError(
            f"replication slot {self.slot_name!r} {why}: changes since the last capture are lost. "
            "A re-snapshot is needed: drop the slot (drop_slot()) and the staged changelog of source "
            f"{self.source!r}, then start capture again and re-snapshot every captured table"
        )

    def load_offset(self, data_dir: str) -> str:
        """The slot's confirmed position; creates publication and slot on first use. A slot
        that vanished after capture had staged segments means lost changes: error. Every check
        runs before anything is created on the source: a run that fails leaves it unchanged."""
        self.require_capture_scope()
        self.refuse_uncapturable(self.tables or ())
        row = self._slot_row()
        if row is None:
            from ...storage.layout import changelog_dir
            from ...storage.segment_index import changelog_used

            # (segments, or the index that outlives the segments staging retention removed)
            if changelog_used(changelog_dir(data_dir, self.source)):
                raise self._resnapshot_error(
                    "does not exist although changes were captured through it before"
                )
            self.check_prerequisites()
        else:
            self._check_slot(row)
        self.prepare_watermarks()
        self.ensure_publication()
        if row is None:
            self._query("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot_name,))
            row = self._slot_row()
        self._check_slot(row)
        return row[0]

    def _check_slot(self, row: tuple) -> None:
        confirmed, wal_status, plugin, database, _active = row
        if plugin != "pgoutput":
            raise ConfigurationError(
                f"replication slot {self.slot_name!r} uses plugin {plugin!r}, not pgoutput: give another slot_name"
            )
        if database != (self.params.database or "postgres"):
            raise ConfigurationError(
                f"replication slot {self.slot_name!r} belongs to database {database!r}: give another slot_name"
            )
        if wal_status == "lost" or confirmed is None:
            raise self._resnapshot_error(
                "was invalidated (the WAL it needed was removed, see max_slot_wal_keep_size)"
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
        rows = self._query(
            "SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
            "(SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size') "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (self.slot_name,),
        )
        if not rows:
            return None
        wal_status, lag, limit_mb = rows[0]
        lag = max(0, int(lag or 0))
        limit = None if limit_mb is None or int(limit_mb) < 0 else int(limit_mb) * 1024 * 1024
        return LogRetention(
            holder=f"replication slot {self.slot_name!r}", lag_bytes=lag, lost=wal_status == "lost",
            limit_bytes=limit, safe_bytes=None if limit is None else max(0, limit - lag),
            setting="max_slot_wal_keep_size",
            fix="run the capture more often (the changelog DAG's schedule), or raise max_slot_wal_keep_size; "
                "a slot already lost needs drop_slot() and a re-snapshot of the captured tables",
        )

    def drop_slot(self, timeout: float = 10.0) -> bool:
        """Drop the slot (it retains WAL forever otherwise). Waits while a just-closed
        stream still holds it. Returns False when it did not exist."""
        import psycopg2

        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.conn.cursor() as cur:
                    cur.execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot_name,),
                    )
                    return bool(cur.fetchall())
            except psycopg2.errors.ObjectInUse as exc:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"replication slot {self.slot_name!r} is in use ({pg_message(exc)}): stop the capture "
                        "that reads it, then drop it"
                    ) from exc
                time.sleep(0.1)

    def drop_publication(self) -> None:
        self._query(f"DROP PUBLICATION IF EXISTS {self.quote_ident(self.publication_name)}")

    def _flush_lsn(self) -> int:
        return lsn_to_int(self._query("SELECT pg_current_wal_flush_lsn()::text")[0][0])

    def visibility(self) -> str:
        return self._query("SELECT pg_current_snapshot()::text")[0][0]

    def offset_position(self, offset: str) -> Position:
        """A read ends at the flush position it aimed at: every transaction whose commit record
        ends before it was read (a record the flush had not reached yet is not). Taken as the
        start of the next record (core/position.py ``next_record_start``), so that a mark at the
        insert position of a server idle on a page boundary is reached."""
        return Position.pg(next_record_start(lsn_to_int(offset), *self.wal_geometry()))

    def log_bytes_between(self, start: Position, end: Position) -> int:
        """WAL bytes between two positions (their LSNs)."""
        return max(0, end.major - start.major)

    def wal_geometry(self) -> tuple[int, int]:
        """(wal_block_size, wal_segment_size) in bytes, read once."""
        geo = getattr(self, "_wal_geo", None)
        if geo is None:
            row = self._query("SELECT current_setting('wal_block_size')::bigint, "
                              "pg_size_bytes(current_setting('wal_segment_size'))::bigint")[0]
            geo = self._wal_geo = (int(row[0]), int(row[1]))
        return geo

    def commit_offset(self, offset: str, data_dir: str) -> None:
        """I6: confirm the slot up to ``offset`` only now that the batch is staged
        (``pg_replication_slot_advance``: it reads the WAL without decoding the changes)."""
        import psycopg2

        lsn = lsn_to_int(offset)
        row = self._slot_row()
        if row is None:
            raise self._resnapshot_error("does not exist")
        if row[0] is not None and lsn_to_int(row[0]) >= lsn:
            return
        deadline = time.monotonic() + 15
        while True:
            try:
                with self.conn.cursor() as c:
                    c.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot_name, offset))
                return
            except psycopg2.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
