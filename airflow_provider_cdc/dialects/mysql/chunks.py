"""Chunk reads (DBLog step 2): a keyset SELECT streamed in batches bounded by rows and bytes, rows
decoded to canonical values, key bounds and samples; the dialect's ``chunks``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import logging
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pymysql
import pymysql.cursors

from ...core.errors import SourceError
from ...core.position import Position, position_mark
from ...core.schema import TableSchema
from ..base import ReadSnapshot, value_bytes
from .offsets import MyOffsets
from .server import MyServer, ReplicaStatusDenied
from .types import json_text, select_converter

log = logging.getLogger(__name__)


def bounded_batches(cur: Any, batch_size: int, max_bytes: int) -> Iterator[list[tuple]]:
    """Rows of an unbuffered cursor in batches of at most ``batch_size`` rows, each ending
    once its values reach ``max_bytes`` (the row that reaches it included)."""
    fetchone = cur.fetchone
    while True:
        rows: list[tuple] = []
        size = 0
        row = None
        while len(rows) < batch_size and size < max_bytes:
            row = fetchone()
            if row is None:
                break
            rows.append(row)
            size += value_bytes(row)
        if rows:
            box = [rows]
            del rows
            yield box.pop()  # no reference left here: the caller may free the batch
        if row is None:
            return


class MyChunkReader:
    """Read chunks and keys: the dialect's ``chunks``."""

    def __init__(self, server: MyServer, offsets: MyOffsets) -> None:
        self.server = server
        self.offsets = offsets  # the epoch of the server capture reads (a chunk's position mark)
        self._converters: dict[int, tuple[TableSchema, list]] = {}
        self._replica_status_denied = False  # SHOW SLAVE STATUS refused once: replica lag is not shown

    def widen_floats(self, schema: TableSchema, sql: str, columns: Sequence[str] | None) -> str:
        """The shared keyset SELECT (``sql``) with FLOAT columns widened to DOUBLE (``+ 0e0``):
        the server prints FLOAT with 6 significant digits, the binlog has all 24 bits."""
        q = self.server.quote_ident
        names = list(columns or schema.column_names)
        plain = ", ".join(q(c) for c in names)
        widened = ", ".join(
            f"{q(c)} + 0e0 AS {q(c)}" if schema.column(c).type == "float32" else q(c) for c in names
        )
        prefix = f"SELECT {plain} FROM "  # noqa: S608
        if widened != plain and sql.startswith(prefix):
            sql = f"SELECT {widened} FROM " + sql[len(prefix) :]  # noqa: S608
        return sql

    def stream_query(
        self,
        sql: str,
        params: Sequence[Any],
        batch_size: int = 10_000,
        max_bytes: int | None = None,
        snapshot: list | None = None,
    ) -> Iterator[list[tuple]]:
        """A fresh autocommit statement on its own connection with an unbuffered cursor:
        InnoDB gives it a read view taken when it starts, after the low watermark committed.
        ``max_bytes``: a batch also ends once its rows' values (:func:`value_bytes`) reach it,
        so rows of large values come a few at a time (the cursor reads a row at a time).
        ``snapshot`` (watermark strategy "log"): the SELECT reads a consistent snapshot whose
        binlog position (its position mark) is appended to the list first."""
        conn = self.server.connect(cursorclass=pymysql.cursors.SSCursor)
        try:
            with conn.cursor() as cur:
                if snapshot is not None:
                    snapshot.append(ReadSnapshot(self._consistent_snapshot(cur)))
                try:
                    cur.execute(sql, list(params))
                except pymysql.err.MySQLError as exc:
                    raise SourceError(f"the source rejected the chunk query ({exc.args[-1]}): {sql}") from exc
                if max_bytes:
                    yield from bounded_batches(cur, batch_size, max_bytes)
                    return
                while True:
                    box = [list(cur.fetchmany(batch_size))]
                    if not box[0]:
                        break
                    yield box.pop()  # no reference left here: the caller may free the batch
        finally:
            conn.close()

    def _consistent_snapshot(self, cur: Any) -> str:
        """Start a read-only REPEATABLE READ transaction WITH CONSISTENT SNAPSHOT and return the
        position mark of the binlog position it corresponds to. MariaDB takes the snapshot in
        step with its ordered commits and reports that position (``binlog_snapshot_file`` /
        ``binlog_snapshot_position``): every transaction before it in the binlog is in the
        snapshot and none after it, so the chunk's window is empty (docs/DESIGN.md,
        "Watermarks without writes")."""
        try:
            cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            cur.execute("SHOW SESSION STATUS LIKE 'binlog\\_snapshot\\_%'")
            status = {str(k).lower(): v for k, v in cur.fetchall()}
            cur.execute("SELECT @@server_id")
            server_id = int(cur.fetchall()[0][0])
        except pymysql.err.MySQLError as exc:
            raise SourceError(
                f"source {self.server.source!r}: could not start a consistent snapshot ({exc.args[-1]})"
            ) from exc
        file, pos = status.get("binlog_snapshot_file"), status.get("binlog_snapshot_position")
        if not file or pos in (None, ""):
            raise SourceError(
                f"source {self.server.source!r}: the server reports no binlog position for a "
                "consistent snapshot "
                f"(binlog_snapshot_file={file!r}); watermark_strategy 'log' needs MariaDB with binary "
                "logging on. "
                "Use watermark_strategy 'table' on this server"
            )
        # the epoch of the server capture reads (failover.py): a chunk of another server waits for capture
        epoch = self.offsets.chunk_epoch(server_id)
        return position_mark(Position.binlog(file, int(pos), 0, epoch), int(time.time() * 1000))

    def replica_lag(self) -> tuple[int, float] | None:
        """(bytes, seconds) this source is behind its primary when it is itself a replica (chunks
        and capture both read it), from ``SHOW SLAVE STATUS`` (needs ``SLAVE MONITOR``, MySQL
        ``REPLICATION CLIENT``); None when it is not a replica or the role may not ask. Bytes:
        what the replica has received of the primary's current binlog file and not applied yet
        (a lower bound once it is a file or more behind); seconds: ``Seconds_Behind_Master``,
        infinite while replication is stopped."""
        if self._replica_status_denied:
            return None
        try:
            row = self.server.slave_status()
        except ReplicaStatusDenied as exc:  # not asked again
            self._replica_status_denied = True
            log.info(
                "source %r: its replica lag is not shown: grant SLAVE MONITOR (MySQL: REPLICATION CLIENT) "
                "to see it (%s)",
                self.server.source,
                exc,
            )
            return None
        if row is None:
            return None
        seconds = row.get("Seconds_Behind_Master")
        read, done = int(row.get("Read_Master_Log_Pos") or 0), int(row.get("Exec_Master_Log_Pos") or 0)
        behind = (
            max(0, read - done) if row.get("Master_Log_File") == row.get("Relay_Master_Log_File") else read
        )
        if seconds is None:  # the SQL or IO thread is not running: it does not catch up
            return behind, float("inf")
        return behind, float(seconds)

    def _select_converters(self, schema: TableSchema) -> list[tuple[str, Callable[[Any], Any] | None]]:
        """Per-column converters, cached per schema object (looked up once per row)."""
        hit = self._converters.get(id(schema))
        if hit is None or hit[0] is not schema:
            convs = []
            for c in schema.columns:
                conv = select_converter(c)
                # pymysql already returns canonical ints and text
                passthrough = conv is int or (c.type in ("string", "json") and conv is not json_text)
                convs.append((c.name, None if passthrough else conv))
            hit = self._converters[id(schema)] = (schema, convs)
        return hit[1]

    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        return {
            name: (v if conv is None or v is None else conv(v))
            for (name, conv), v in zip(self._select_converters(schema), row, strict=True)
        }

    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        if value is None:
            return None
        t = schema.column(column).type
        if t == "binary":
            return base64.b64decode(value)
        if t.startswith("decimal"):
            return decimal.Decimal(value)
        if t in ("timestamptz", "timestamp", "date"):
            text = str(value).removesuffix("Z")  # session time_zone is UTC
            try:
                return dt.date.fromisoformat(text) if t == "date" else dt.datetime.fromisoformat(text)
            except ValueError:
                return text.replace("T", " ")  # a zero or partial date: the server compares its text
        if t in ("float32", "float64") and isinstance(value, str):
            return float(value.replace("Infinity", "inf"))
        if t == "float32":
            # the canonical FLOAT is the shortest decimal that rounds to it; bound as that
            # decimal it may sit below the stored value, and `k <= bound` would lose the row
            return struct.unpack("<f", struct.pack("<f", float(value)))[0]
        return value

    def _key_tuple(self, schema: TableSchema, row: tuple) -> tuple:
        convs = dict(self._select_converters(schema))
        return tuple(
            v if v is None or convs[k] is None else convs[k](v)
            for k, v in zip(schema.primary_key, row, strict=True)
        )

    def _key_columns(self, schema: TableSchema) -> str:
        """The key columns for a SELECT, FLOAT ones widened to DOUBLE as in chunk_query: a
        FLOAT key printed with 6 digits is not the stored value, so a bound taken from it
        would cut off the largest key (or split a range between two keys)."""
        return ", ".join(
            f"{self.server.quote_ident(k)} + 0e0 AS {self.server.quote_ident(k)}"
            if schema.column(k).type == "float32"
            else self.server.quote_ident(k)
            for k in schema.primary_key
        )

    def max_key(self, schema: TableSchema, where: tuple[str, list] | None = None) -> tuple | None:
        """``where``: a rendered row filter ``(sql, params)``."""
        pk = self._key_columns(schema)
        desc = ", ".join(f"{self.server.quote_ident(k)} DESC" for k in schema.primary_key)
        cond, params = where or ("", [])
        cond = f" WHERE {cond}" if cond else ""
        sql = f"SELECT {pk} FROM {self.server.quote_table(schema.table)}{cond} ORDER BY {desc} LIMIT 1"  # noqa: S608
        try:
            rows = self.server.query(sql, tuple(params))
        except pymysql.err.MySQLError as exc:
            raise SourceError(f"table {schema.table}: the source rejected {sql!r} ({exc.args[-1]})") from exc
        return self._key_tuple(schema, rows[0]) if rows else None

    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        """Every n-th key by a window function, n from the optimizer's row estimate, so
        only ~count keys cross the wire."""
        if count <= 0:
            return []
        est = self.server.query(
            "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
            (schema.table.schema, schema.table.name),
        )
        n = int(est[0][0] or 0) if est else 0
        if n < 10 * count:
            n = int(self.server.query(f"SELECT COUNT(*) FROM {self.server.quote_table(schema.table)}")[0][0])  # noqa: S608
        if n == 0:
            return []
        step = max(1, n // (count + 1))
        pk = ", ".join(self.server.quote_ident(k) for k in schema.primary_key)
        exact = self._key_columns(schema)  # FLOAT keys as stored (see _key_columns)
        rows = self.server.query(
            f"SELECT {pk} FROM (SELECT {exact}, ROW_NUMBER() OVER (ORDER BY {pk}) AS `__cdc_rn`"  # noqa: S608
            f" FROM {self.server.quote_table(schema.table)}) AS `__cdc_s` WHERE MOD(`__cdc_rn`, %s) = "
            f"0 ORDER BY {pk} LIMIT %s",
            (step, count),
        )
        return [self._key_tuple(schema, r) for r in rows]
