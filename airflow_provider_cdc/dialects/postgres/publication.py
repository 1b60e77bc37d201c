"""The publication capture reads through (its tables, created or altered only for tables with a
key the log carries, a hot standby's checked, dropped): PgOffsets' part that manages it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ...core.errors import ConfigurationError, SourceError
from ...core.schema import TableName

log = logging.getLogger(__name__)


class Publication:
    """PgOffsets' publication methods (a mixin: ``self`` is the PgOffsets)."""

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
