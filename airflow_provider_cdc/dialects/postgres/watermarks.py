"""Watermarks as rows of the watermark table, published so the slot decodes their updates.
"""

from __future__ import annotations

from ...core.errors import ConfigurationError, SourceError, WatermarkError
from ...core.schema import TableName


class PgWatermarks:
    """The watermark table: created once (by an administrator or here), one UPDATE a watermark."""

    def _ensure_published(self, table: TableName) -> None:
        """A table snapshotted while its changes are not published would lose the changes
        inside its chunk windows: when our publication exists and lists tables, add it
        (before any watermark of the snapshot is written). On a hot standby nothing can be added:
        a table the publication lacks is refused with the statement to run on the primary."""
        self.refuse_uncapturable([table])
        if self.on_standby:
            problem = self.standby_publication_problem([table])
            if problem:
                raise SourceError(f"source {self.source!r}: {problem}")
            return
        pub = self._query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        if pub and not pub[0][0]:
            try:
                self._add_to_publication([table])
            except SourceError as exc:
                raise SourceError(
                    f"table {table} is not in publication {self.publication_name!r} and could not be added "
                    f"({exc.__cause__ or exc}): have an administrator run ALTER PUBLICATION "
                    f"{self.quote_ident(self.publication_name)} ADD TABLE {self.quote_table(table)}"
                ) from exc

    @property
    def standby_watermark_problem(self) -> str:
        return ("watermark_strategy 'table' writes watermark rows, and PostgreSQL at "
                f"{self.params.host}:{self.params.port} is a hot standby, which cannot be written. Set "
                "watermark_strategy to 'log' (positions read around each chunk, nothing written), or point the "
                "source's connection at the primary")

    # --- watermarks ---------------------------------------------------------------------
    def ensure_watermark_table(self) -> None:
        import psycopg2

        if self.on_standby:
            raise ConfigurationError(f"source {self.source!r}: {self.standby_watermark_problem}")
        wm = self.watermark_table
        # DDL only when something is missing: CREATE ... IF NOT EXISTS still demands the
        # CREATE privilege, which a least-privilege CDC user may not have once it exists
        for attempt in range(3 if self._relation(wm) is None else 0):
            try:
                if not self._query("SELECT 1 FROM pg_namespace WHERE nspname = %s", (wm.schema,)):
                    self._query(f"CREATE SCHEMA IF NOT EXISTS {self.quote_ident(wm.schema)}")
                self._query(
                    f"CREATE TABLE IF NOT EXISTS {self.quote_table(wm)} (id integer PRIMARY KEY CHECK (id = 1), "
                    "value text NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())"
                )
                break
            except SourceError as exc:  # two sessions creating it at once: the loser retries
                if attempt == 2 or not isinstance(exc.__cause__, psycopg2.IntegrityError):
                    raise
        if not self._query(f"SELECT 1 FROM {self.quote_table(wm)} WHERE id = 1"):  # noqa: S608
            self._query(
                f"INSERT INTO {self.quote_table(wm)} (id, value) VALUES (1, '') ON CONFLICT (id) DO NOTHING"  # noqa: S608
            )
        pub = self._query(
            "SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication_name,)
        )
        if pub and not pub[0][0]:
            self._add_to_publication([wm])
        self._watermark_ready = True

    def write_watermark(self, watermark_id: str) -> None:
        """DBLog steps 1/3: its own autocommit transaction, so it is in the log before the
        chunk SELECT starts (low) and after it ended (high)."""
        if not self._watermark_ready:
            self.ensure_watermark_table()
        rows = self._query(
            f"UPDATE {self.quote_table(self.watermark_table)} SET value = %s, updated_at = now() WHERE id = 1 RETURNING id",  # noqa: S608
            (watermark_id,),
        )
        if not rows:
            raise WatermarkError(
                f"watermark table {self.watermark_table} has no row with id 1; run ensure_watermark_table() again"
            )
