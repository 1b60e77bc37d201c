"""Debezium export: the options, the connector of a table, schema names."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.errors import ConfigurationError
from ...core.schema import TableName, TableSchema
from ...dialects.registry import debezium_connectors

#: the Debezium release whose format this is, written to ``source.version``
DEBEZIUM_VERSION = "3.6.1.Final"
#: Debezium's connectors, each of the database whose profile names it (dialects/registry.py)
CONNECTORS = debezium_connectors()
FORMS = ("keyvalue", "value")
_SNAPSHOT_ENUM = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
#: pgjdbc's ±infinity for timestamps, as Debezium emits them (microseconds)
_PG_TS_INFINITY_US = (9223372036825200000, -9223372036832400000)


@dataclass(frozen=True)
class DebeziumOptions:
    topic_prefix: str  # Debezium's topic.prefix: source.name and the first part of schema names
    connector: str | None = None  # postgresql | mysql | mariadb (default: from the table's schema)
    version: str = DEBEZIUM_VERSION
    tombstones: bool = True  # a null-value record after each delete (tombstones.on.delete)
    truncates: bool = False  # TRUNCATE records (Debezium skips them by default: skipped.operations=t)
    # "keyvalue": {"key": ..., "value": ...} per line (Kafka records); "value": the value document
    # alone per line (what Flink's debezium-json and most file readers take; no tombstones)
    form: str = "keyvalue"
    # source.db: PostgreSQL's database name (default: the event log's, which capture takes from the
    # connection); MySQL/MariaDB: always the table's database, as Debezium writes it
    database: str | None = None

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ConfigurationError(f"Debezium export form {self.form!r}: one of {', '.join(FORMS)}")
        if not self.topic_prefix or not re.fullmatch(r"[A-Za-z0-9._-]+", self.topic_prefix):
            raise ConfigurationError(
                f"Debezium topic prefix {self.topic_prefix!r}: use letters, digits, '.', '_' and '-' "
                "(Debezium's "
                "topic.prefix)"
            )
        if self.connector is not None and self.connector not in CONNECTORS:
            raise ConfigurationError(f"Debezium connector {self.connector!r}: one of {', '.join(CONNECTORS)}")


def connector_of(schema: TableSchema, opts: DebeziumOptions) -> str:
    connector = opts.connector or schema.connector
    if connector is None:
        raise ConfigurationError(
            f"table {schema.table}: the event log does not say which database it came from; give the "
            "connector "
            f"({', '.join(CONNECTORS)})"
        )
    return connector


def _sanitise(name: str) -> str:
    """Debezium's topic/schema name sanitising: each Java char (UTF-16 unit) outside
    [A-Za-z0-9._-] -> '_', cut at 249."""
    return re.sub(r"[^A-Za-z0-9._-]", lambda m: "__" if ord(m.group()) > 0xFFFF else "_", name)[:249]


def schema_prefix(table: TableName, opts: DebeziumOptions) -> str:
    return _sanitise(f"{opts.topic_prefix}.{table.schema}.{table.name}")
