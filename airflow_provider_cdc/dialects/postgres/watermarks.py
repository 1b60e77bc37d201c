"""The watermark table (strategy "table"): created once, published so the slot decodes its
updates, one UPDATE per watermark; the dialect's ``watermark_rows``.
"""

from __future__ import annotations

from ...core.errors import ConfigurationError, SourceError, SourceUnreachableError, WatermarkError
from ...core.schema import TableName
from .catalog import PgCatalog
from .offsets import PgOffsets
from .server import PgServer


class PgWatermarkTable:
    """The watermark table: created once (by an administrator or here), one UPDATE a watermark."""

    def __init__(self, server: PgServer, catalog: PgCatalog, offsets: PgOffsets, table: TableName) -> None:
        self.server = server
        self.catalog = catalog
        self.offsets = offsets
        self.table = table
        self._ready = False

    def ensure_published(self, table: TableName) -> None:
        """A table snapshotted while its changes are not published would lose the changes
        inside its chunk windows: when our publication exists and lists tables, add it
        (before any watermark of the snapshot is written). On a hot standby nothing can be added:
        a table the publication lacks is refused with the statement to run on the primary."""
        if self.server.on_standby:
            problem = self.offsets.standby_publication_problem([table])
            if problem:
                raise SourceError(f"source {self.server.source!r}: {problem}")
            return
        pub = self.server.query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.offsets.publication_name,)
        )
        if pub and not pub[0][0]:
            try:
                self.offsets.add_to_publication([table])
            except SourceUnreachableError:
                raise  # the server went away: not a grant an administrator must give
            except SourceError as exc:
                raise SourceError(
                    f"table {table} is not in publication {self.offsets.publication_name!r} and could "
                    "not be added "
                    f"({exc.__cause__ or exc}): have an administrator run ALTER PUBLICATION "
                    f"{self.server.quote_ident(self.offsets.publication_name)} ADD TABLE "
                    f"{self.server.quote_table(table)}"
                ) from exc

    @property
    def standby_watermark_problem(self) -> str:
        return (
            "watermark_strategy 'table' writes watermark rows, and PostgreSQL at "
            f"{self.server.params.host}:{self.server.params.port} is a hot standby, which cannot be "
            "written. Set "
            "watermark_strategy to 'log' (positions read around each chunk, nothing written), or point the "
            "source's connection at the primary"
        )

    # --- watermarks ---------------------------------------------------------------------
    def ensure(self) -> None:
        import psycopg2

        if self.server.on_standby:
            raise ConfigurationError(f"source {self.server.source!r}: {self.standby_watermark_problem}")
        wm = self.table
        # DDL only when something is missing: CREATE ... IF NOT EXISTS still demands the
        # CREATE privilege, which a least-privilege CDC user may not have once it exists
        for attempt in range(3 if self.catalog.relation(wm) is None else 0):
            try:
                if not self.server.query("SELECT 1 FROM pg_namespace WHERE nspname = %s", (wm.schema,)):
                    self.server.query(f"CREATE SCHEMA IF NOT EXISTS {self.server.quote_ident(wm.schema)}")
                self.server.query(
                    f"CREATE TABLE IF NOT EXISTS {self.server.quote_table(wm)} (id integer PRIMARY KEY "
                    "CHECK (id = 1), "
                    "value text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
                )
                break
            except SourceError as exc:  # two sessions creating it at once: the loser retries
                if attempt == 2 or not isinstance(exc.__cause__, psycopg2.IntegrityError):
                    raise
        if not self.server.query(f"SELECT 1 FROM {self.server.quote_table(wm)} WHERE id = 1"):  # noqa: S608
            self.server.query(
                f"INSERT INTO {self.server.quote_table(wm)} (id, value) VALUES (1, '') ON CONFLICT "  # noqa: S608
                "(id) DO NOTHING"
            )
        pub = self.server.query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.offsets.publication_name,)
        )
        if pub and not pub[0][0]:
            self.offsets.add_to_publication([wm])
        self._ready = True

    def write(self, watermark_id: str) -> None:
        """DBLog steps 1/3: its own autocommit transaction, so it is in the log before the
        chunk SELECT starts (low) and after it ended (high)."""
        if not self._ready:
            self.ensure()
        rows = self.server.query(
            f"UPDATE {self.server.quote_table(self.table)} SET value = %s, updated_at = now() WHERE id "  # noqa: S608
            "= 1 RETURNING id",
            (watermark_id,),
        )
        if not rows:
            raise WatermarkError(
                f"watermark table {self.table} has no row with id 1; run ensure_watermark_table() again"
            )
