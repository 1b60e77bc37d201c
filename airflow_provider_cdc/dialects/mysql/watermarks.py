"""The watermark table (strategy "table"): created once, one UPDATE per watermark; the dialect's
``watermark_rows``.
"""

from __future__ import annotations

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, WatermarkError
from ...core.schema import TableName
from .prerequisites import _ER_ACCESS_DENIED
from .server import MyServer


class MyWatermarkTable:
    """The watermark table: created once (by an administrator or here), one UPDATE a watermark."""

    def __init__(self, server: MyServer, table: TableName) -> None:
        self.server = server
        self.table = table

    # --- watermarks -------------------------------------------------------------------
    def ensure(self) -> None:
        """DDL only when something is missing: CREATE ... IF NOT EXISTS still demands the CREATE
        privilege, which a least-privilege user of a pre-created watermark table lacks."""
        wm = self.table
        try:
            if self.server.query(f"SELECT 1 FROM {self.server.quote_table(wm)} WHERE `id` = 1"):  # noqa: S608
                return
        except pymysql.err.MySQLError as exc:
            if not (exc.args and exc.args[0] in (1049, 1146)):
                raise self._grant_error(
                    exc, f"GRANT SELECT, UPDATE ON {self.server.quote_table(wm)}"
                ) from None
        try:
            if not self.server.query(
                "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (wm.schema,)
            ):
                self.server.query(f"CREATE DATABASE IF NOT EXISTS {self.server.quote_ident(wm.schema)}")
            self.server.query(
                f"CREATE TABLE IF NOT EXISTS {self.server.quote_table(wm)} ("
                "`id` TINYINT UNSIGNED NOT NULL PRIMARY KEY, `value` VARCHAR(64) NOT NULL"
                ") ENGINE=InnoDB"
            )
            self.server.query(
                f"INSERT IGNORE INTO {self.server.quote_table(wm)} (`id`, `value`) VALUES (1, '')"  # noqa: S608
            )
        except pymysql.err.MySQLError as exc:
            raise self._grant_error(
                exc,
                f"GRANT CREATE, INSERT, SELECT, UPDATE ON {self.server.quote_ident(wm.schema)}.*",
                "or have an administrator create the watermark table (the docs' connections page, "
                "'Grants', set-up 2)",
            ) from None

    def _grant_error(self, exc: Exception, grant: str, alternative: str = "") -> Exception:
        """A permission error as a SourceError naming the grant; any other error as it is."""
        if not (getattr(exc, "args", None) and exc.args[0] in _ER_ACCESS_DENIED):
            return exc
        return SourceError(
            f"user {self.server.params.user!r} lacks a privilege ({exc.args[-1]}): {grant} TO "
            f"{self.server.params.user!r}" + (f", {alternative}" if alternative else "")
        )

    def write(self, watermark_id: str) -> None:
        """DBLog steps 1 and 3: autocommit, so the UPDATE is its own committed transaction."""
        with self.server.lock:
            with self.server.conn.cursor() as cur:
                try:
                    n = cur.execute(
                        f"UPDATE {self.server.quote_table(self.table)} SET `value` = %s WHERE `id` = 1",  # noqa: S608
                        (watermark_id,),
                    )
                except pymysql.err.MySQLError as exc:
                    if exc.args and exc.args[0] in _ER_ACCESS_DENIED:
                        raise self._grant_error(
                            exc, f"GRANT SELECT, UPDATE ON {self.server.quote_table(self.table)}"
                        ) from None
                    if not isinstance(exc, pymysql.err.ProgrammingError):
                        raise
                    raise WatermarkError(
                        f"watermark table {self.table} is missing ({exc.args[-1]}); run "
                        "ensure_watermark_table()"
                    ) from exc
        if n != 1:
            raise WatermarkError(
                f"watermark table {self.table} has no row id=1 (or the value did not change); "
                f"run ensure_watermark_table() and use a fresh watermark id"
            )
