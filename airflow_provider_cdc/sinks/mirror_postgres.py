"""A second mirror: a PostgreSQL table per source table, with the same position guard (an
upsert that keeps a row only when its position is newer; docs/outputs.md). Values are bound as
canonical text and cast by PostgreSQL; identifiers are always quoted. A sink shipped to Spark
executors carries its connection without the password (docs/security.md).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping

import pyarrow as pa

from ..core.arrow_types import DELETED_COLUMN, KEY_COLUMN, META_COLUMNS, POSITION_COLUMN
from ..core.errors import ConfigurationError
from ..core.schema import TableName, TableSchema, decimal_params, decode_key
from ..core.sqlnames import quote_pg
from .base import (
    UNITS,
    Events,
    SchemaCache,
    Sink,
    TableEvents,
    newest_truncate,
    past_truncate,
    table_events,
    type_json_events,
)
from .mirror_delta import newest_per_key
from .postgres_target import SECRET_PARAMETERS, connection_parameters, public_dsn  # noqa: F401 - offered here too

log = logging.getLogger(__name__)

_PG_TYPES = {
    "bool": "boolean",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "uint64": "numeric(20,0)",
    "float32": "real",
    "float64": "double precision",
    "decimal": "numeric",
    "string": "text",
    "uuid": "uuid",
    "json": "json",  # json, not jsonb: keeps the source's text exactly
    "binary": "bytea",
    "date": "date",
    "time": "text",  # MySQL TIME may be negative or beyond 24 h
    "timestamp": "timestamp(6) without time zone",
    "timestamptz": "timestamp(6) with time zone",
}


def pg_type(logical: str) -> str:
    if logical in _PG_TYPES:
        return _PG_TYPES[logical]
    ps = decimal_params(logical)
    if ps:
        return f"numeric({ps[0]},{ps[1]})"
    if logical.startswith("array<"):
        return "json"
    raise ConfigurationError(f"no PostgreSQL type for logical type {logical!r}")


def quote_ident(name: str) -> str:
    """core.sqlnames.quote_pg, refusing names PostgreSQL would truncate (two long tables must
    not share one mirror table). Statements here always pass parameters (``%%`` for ``%``)."""
    if isinstance(name, str) and len(name.encode()) > 63:
        raise ConfigurationError(
            f"PostgreSQL identifier {name!r} is longer than 63 bytes; choose a shorter "
            "CDC_POSTGRES_SINK_SCHEMA (--pg-schema) or table name"
        )
    return quote_pg(name)


def _value_sql(logical: str) -> str:
    if logical == "binary":
        return "decode(%s, 'base64')"
    return f"%s::{pg_type(logical)}"


def _text(value, logical: str):
    """Canonical value -> the text PostgreSQL casts back exactly."""
    if value is None:
        return None
    if logical.startswith("array<"):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


class MirrorPostgresSink(Sink):
    placement = UNITS  # its upsert keeps a row only when newer: units land in any order
    needs_truncates = True
    name = "postgres"

    def __init__(
        self,
        conn: str | Mapping[str, object],
        data_dir: str,
        source: str,
        *,
        target_schema: str | None = None,
        require_schema: bool = False,
        fence=None,
    ) -> None:
        self.params, self.source = connection_parameters(conn), source
        self.fence = fence  # a merge's MergeFence (sinks/mirror_fencing.py): refuse once superseded
        self.target_schema = target_schema or f"cdc_{source}"
        self.schemas = SchemaCache(data_dir, source)
        self.require_schema = require_schema
        self._conn = None
        self._ready: set[str] = set()

    @property
    def conn(self):
        if self._conn is None or self._conn.closed:
            import psycopg2

            params = dict(self.params)
            if "passfile" in params and not os.path.isfile(params["passfile"]):
                del params["passfile"]  # an executor on another host: its own PGPASSFILE, ~/.pgpass
            self._conn = psycopg2.connect(**params)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def target(self, table: TableName) -> str:
        return f"{quote_ident(self.target_schema)}.{quote_ident(table.id)}"

    def ensure_table(self, schema: TableSchema) -> None:
        if schema.table.id in self._ready:
            return
        clash = set(schema.column_names).intersection(META_COLUMNS)
        if clash:
            raise ConfigurationError(
                f"table {schema.table} has column(s) {sorted(clash)} that the mirror reserves; rename them"
            )
        cols = [f"{quote_ident(c.name)} {pg_type(c.type)}" for c in schema.columns]
        cols += [
            f"{quote_ident(KEY_COLUMN)} text PRIMARY KEY",
            f'{quote_ident(POSITION_COLUMN)} text COLLATE "C" NOT NULL',
            f"{quote_ident(DELETED_COLUMN)} boolean NOT NULL",
        ]
        with self.conn, self.conn.cursor() as cur:
            # Spark executors create the same schema and table at once, and IF NOT EXISTS is
            # not safe against that (a unique violation in pg_namespace / pg_class): one at a
            # time per target schema, by a lock held to the end of this transaction
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cdc-mirror:{self.target_schema}",))
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self.target_schema)}", ())
            cur.execute(f"CREATE TABLE IF NOT EXISTS {self.target(schema.table)} ({', '.join(cols)})", ())
        self._ready.add(schema.table.id)

    def write(self, events: Events) -> None:
        for part in table_events(events, self.schemas.get):
            table_id = part.table
            if self.fence is not None:
                self.fence.check(table_id)
            schema = self.schemas.lookup(table_id, require=self.require_schema, sink="postgres mirror")
            if schema is None:
                continue
            newest = newest_truncate(part.events)
            if newest is not None:
                # every row older than the TRUNCATE goes (no horizon here: see the docs' operations page,
                # TRUNCATE)
                self._delete_before(schema, newest)
                part = past_truncate(part, newest)
                if part.num_rows == 0:
                    continue
            self.upsert(schema, part.with_events(newest_per_key(part.events)))

    def _delete_before(self, schema: TableSchema, position: str) -> None:
        self.ensure_table(schema)
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                f"DELETE FROM {self.target(schema.table)} WHERE {quote_ident(POSITION_COLUMN)} < %s",  # noqa: S608
                (position,),
            )

    def prepare(self, truncates: Mapping[str, str | None]) -> None:
        """The Spark engine's driver, before its executors write the events past each
        TRUNCATE: every row older than a table's newest TRUNCATE goes. The driver's
        connection is then closed: the executors connect themselves."""
        for table_id, newest in sorted(truncates.items()):
            if newest is not None:
                self.truncate_before(table_id, newest)
        self.close()

    def truncate_before(self, table_id: str, position: str) -> None:
        """A TRUNCATE of ``table_id`` at ``position``: every row older than it goes."""
        if self.fence is not None:
            self.fence.check(table_id)
        schema = self.schemas.lookup(table_id, require=self.require_schema, sink="postgres mirror")
        if schema is not None:
            self._delete_before(schema, position)

    def __getstate__(self) -> dict:
        """Shipped to Spark executors without the driver's connection and without the
        password: each executor connects itself, with the credentials it finds (module docstring)."""
        state = dict(self.__dict__)
        state["params"] = {k: v for k, v in self.params.items() if k not in SECRET_PARAMETERS}
        state["_conn"] = None
        state["_ready"] = set()
        return state

    def upsert(self, schema: TableSchema, events: pa.Table | TableEvents) -> int:
        """Events of one table (one per key; TableEvents, or the canonical-JSON form) upserted,
        each row only over an older one."""
        from psycopg2.extras import execute_values

        te = events if isinstance(events, TableEvents) else type_json_events(schema.table.id, events, schema)
        self.ensure_table(schema)
        names = [*schema.column_names, KEY_COLUMN, POSITION_COLUMN, DELETED_COLUMN]
        types = [c.type for c in schema.columns]
        rows = []
        afters = te.canonical("after")
        for ev, after in zip(te.events.select(["op", "key", "position"]).to_pylist(), afters, strict=True):
            deleted = ev["op"] == "d"
            if deleted:
                row = dict(zip(schema.primary_key, decode_key(ev["key"]), strict=True))
            else:
                row = after
                if row is None:
                    raise ConfigurationError(
                        f"table {schema.table}: {ev['op']!r} event for key {ev['key']} has no 'after' row"
                    )
            rows.append(
                (
                    *[_text(row.get(c.name), c.type) for c in schema.columns],
                    ev["key"],
                    ev["position"],
                    deleted,
                )
            )
        tgt = self.target(schema.table)
        quoted = [quote_ident(n) for n in names]
        sets = ", ".join(f"{q} = EXCLUDED.{q}" for q in quoted if q != quote_ident(KEY_COLUMN))
        sql = (
            f"INSERT INTO {tgt} AS t ({', '.join(quoted)}) VALUES %s "  # noqa: S608 - identifiers quoted
            f"ON CONFLICT ({quote_ident(KEY_COLUMN)}) DO UPDATE SET {sets} "
            f"WHERE t.{quote_ident(POSITION_COLUMN)} < EXCLUDED.{quote_ident(POSITION_COLUMN)}"
        )
        template = "(" + ", ".join([*[_value_sql(t) for t in types], "%s", "%s", "%s"]) + ")"
        with self.conn, self.conn.cursor() as cur:
            execute_values(cur, sql, rows, template=template, page_size=1000)
        log.info("postgres mirror %s: %d rows upserted (position-guarded)", tgt, len(rows))
        return len(rows)

    def compact(self, table: str | TableName) -> int:
        """Remove tombstones once no snapshot of the table is active."""
        t = table if isinstance(table, TableName) else TableName.parse(table)
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"DELETE FROM {self.target(t)} WHERE {quote_ident(DELETED_COLUMN)}", ())  # noqa: S608 - quoted
            return cur.rowcount

    def read(self, table: str | TableName, *, with_tombstones: bool = False) -> list[dict]:
        """Rows of the mirror table ordered by ``__key`` (live rows unless ``with_tombstones``)."""
        t = table if isinstance(table, TableName) else TableName.parse(table)
        where = "" if with_tombstones else f" WHERE NOT {quote_ident(DELETED_COLUMN)}"
        with self.conn, self.conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {self.target(t)}{where} ORDER BY {quote_ident(KEY_COLUMN)}", ())  # noqa: S608
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
