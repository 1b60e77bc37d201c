"""A fake third database (``fakedb``): a profile and an in-memory dialect, no server, its tables
Python lists, registered for a test by the :func:`fakedb` fixture as DESIGN.md's "Adding a
database" says (one line in dialects/registry.py's ``PROFILES``, patched, undone after). Used by
test_third_database.py (the checklist) and test_dialect_contract.py (the contract's defaults)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from airflow_provider_cdc.core.errors import SourceError, SourceUnreachableError
from airflow_provider_cdc.core.filters import FilterRules
from airflow_provider_cdc.core.findings import OK, WARNING, Finding
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema
from airflow_provider_cdc.dialects import registry
from airflow_provider_cdc.dialects.base import ConnectionParams, Dialect, LogBatch, LogRead
from airflow_provider_cdc.dialects.profile import DATABASE, DatabaseProfile, OwnedObject


# --- the fake database: its profile (dialects/<db>/profile.py) ---------------------------------
def quote_bracket(name: str) -> str:
    """FakeDB quotes identifiers in brackets, as SQL Server does (``]`` doubled inside)."""
    return "[" + name.replace("]", "]]") + "]"


#: parsed as T-SQL: a dialect neither real database uses, so a filter rendered in brackets can
#: only have come from this profile
FAKE_FILTER_RULES = FilterRules("tsql", quote_bracket)


class FakeProfile(DatabaseProfile):
    name = "fakedb"
    label = "FakeDB"
    aliases = ("fake",)
    conn_types = ("fakedb", "fake_db")
    default_port = 7777
    lineage_scheme = "fakedb"
    option_keys = frozenset({"cursor_name", "down"})
    debezium_connectors = ("fakedb",)
    debezium_source_fields = (("string", "schema", False), ("string", "table", False), ("int64", "seq", False))
    dialect_path = f"{__name__}:FakeDialect"
    system_schemas = frozenset({"fake_catalog", "information_schema"})
    system_schema_prefixes = ("fk_",)

    @property
    def filter_rules(self) -> FilterRules:
        return FAKE_FILTER_RULES

    def owned_objects(self, source: str, options: dict[str, Any]) -> list[OwnedObject]:
        """A named log cursor per database, defaulting to one derived from the source."""
        return [OwnedObject("log cursor", "cursor_name", DATABASE, str(options.get("cursor_name") or f"c_{source}"))]


PROFILE = FakeProfile()


# --- ... and its dialect (dialects/<db>/dialect.py), in memory ------------------------------------
APP = "app"
ORDERS = TableName(APP, "orders")
NOTES = TableName(APP, "notes")  # no key
CODES = TableName(APP, "codes")  # a text key, ordered by the server's case-insensitive collation
ORDERS_SCHEMA = TableSchema(ORDERS, (Column("id", "int64", "BIGINT", False), Column("amount", "int64")), ("id",))
CODES_SCHEMA = TableSchema(CODES, (Column("code", "string", "NVARCHAR(20)", False),), ("code",))
#: the server's tables: rows as dicts, in no order (the dialect orders them by key)
TABLES: dict[TableName, tuple[TableSchema | None, list[dict]]] = {
    ORDERS: (ORDERS_SCHEMA, [{"id": i, "amount": i % 7} for i in range(400, 0, -1)]),
    NOTES: (None, [{"text": "x"}]),
    CODES: (CODES_SCHEMA, [{"code": c} for c in ("b", "M", "a", "z")]),
}


def collation(key: Sequence) -> tuple:
    """FakeDB's order of keys: text without regard to case (``a < b < M < z``; Python: ``M < a``)."""
    return tuple(v.casefold() if isinstance(v, str) else v for v in key)


class FakeDialect(Dialect):
    """A database whose tables are the Python lists of TABLES; it runs no SQL (a statement is
    refused), so every step below works through the Dialect contract alone."""

    name = "fakedb"
    default_schema = APP
    lock_acquire_sql = "LOCK ?"
    lock_release_sql = "UNLOCK ?"

    def __init__(self, params: ConnectionParams, *, tables: Sequence[Any] | None = None, down: bool = False,
                 **options: Any) -> None:
        super().__init__(params, **options)
        self.tables = None if tables is None else [
            t if isinstance(t, TableName) else TableName.parse(str(t), self.default_schema) for t in tables]
        self.down = down
        self.read_only = False

    # connections and identifiers
    def open_session(self) -> Any:
        raise SourceError("FakeDB keeps its tables in memory: there is no session to open")

    def quote_ident(self, name: str) -> str:
        return quote_bracket(name)

    # metadata
    def describe_table(self, table: TableName, *, keyed: bool = True) -> TableSchema:
        if table not in TABLES:
            raise SourceError(f"table {table} does not exist")
        schema, _rows = TABLES[table]
        if schema is None:
            raise SourceError(f"table {table} has no primary key")
        return schema

    def check_readable(self, table: TableName) -> None:
        return None

    def check_prerequisites(self) -> None:
        return None

    def scope_problems(self, tables: Sequence[TableName]) -> list[str]:
        return [f"table {t} has no primary key: give it one, or name its key in CDC_KEY_COLUMNS"
                for t in tables if TABLES.get(t, (ORDERS_SCHEMA, []))[0] is None]

    # keys, in the database's own order
    def _keys(self, schema: TableSchema) -> list[tuple]:
        return sorted((tuple(r[k] for k in schema.primary_key) for r in TABLES[schema.table][1]), key=collation)

    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        keys = self._keys(schema)
        step = max(1, len(keys) // max(1, count))
        return keys[::step]

    def max_key(self, schema: TableSchema, where: str | None = None) -> tuple | None:
        keys = self._keys(schema)
        return keys[-1] if keys else None

    def key_ranks(self, schema: TableSchema, keys: Sequence[Sequence]) -> list[int]:
        order = sorted({collation(k) for k in keys})
        return [order.index(collation(k)) + 1 for k in keys]

    def stream_query(self, sql: str, params: Sequence[Any], batch_size: int = 10_000) -> Iterator[list[tuple]]:
        raise AssertionError(f"FakeDB runs no SQL; a caller reached past the Dialect contract: {sql}")

    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        return dict(zip(schema.column_names, row, strict=True))

    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        return value

    # watermarks and the log (not walked here: the dialect suite's part)
    def ensure_watermark_table(self) -> None:
        return None

    def write_watermark(self, watermark_id: str) -> None:
        return None

    def current_position(self) -> Position:
        raise NotImplementedError("FakeDB has no log")

    def load_offset(self, data_dir: str) -> str:
        return "0"

    def read_log(self, request: LogRead) -> LogBatch:
        return LogBatch([], request.offset, request.offset)

    def commit_offset(self, offset: str, data_dir: str) -> None:
        return None

    # airflow-cdc doctor
    def begin_read_only(self) -> None:
        if self.down:
            raise SourceUnreachableError.at(f"FakeDB at {self.params.host}:{self.params.port}", "no route")
        self.read_only = True

    def server_label(self) -> str:
        return "FakeDB 1.0"

    def doctor_findings(self) -> list[Finding]:
        assert self.read_only, "doctor asks for findings only in a read-only session"
        return [Finding(OK, "log retention", "FakeDB keeps its whole log"),
                Finding(WARNING, "cursor", f"log cursor {self.options.get('cursor_name') or 'c_' + self.source!r} "
                                           "does not exist yet: the first capture creates it")]

    def existing_tables(self, tables: Sequence[TableName]) -> dict[TableName, bool]:
        return {t: t in TABLES for t in tables}


@pytest.fixture
def fakedb(monkeypatch) -> Iterator[DatabaseProfile]:
    """FakeDB registered as the checklist says: one line in dialects/registry.py's PROFILES."""
    monkeypatch.setitem(registry.PROFILES, "fakedb", f"{__name__}:PROFILE")
    registry.profiles.cache_clear()
    yield PROFILE
    monkeypatch.undo()
    registry.profiles.cache_clear()


def fake_dialect(**options: Any) -> FakeDialect:
    from airflow_provider_cdc.dialects import get_dialect

    params = ConnectionParams.from_uri("fakedb://cdc:secret@db.example:7001/shop")
    return get_dialect(params, source="shop", **{"tables": [ORDERS], **options})
