"""What the rest of the package knows about a database without connecting to it.

A :class:`DatabaseProfile` is the light, driver-free half of a database's package
(``dialects/<db>/profile.py``): its names and Airflow connection types, default port, the
connection-extra keys that are its CDC settings, the objects a capture owns on the server (a
replication slot, a server id), its system catalogs, how OpenLineage names its tables, its
row-filter rules, its Debezium connectors and the shape of their ``source`` block. Hooks,
lineage, the sources config and DAG parsing ask it (dialects/registry.py, by name) instead of
comparing names; none of them may import a driver or open a connection, so a profile imports
neither and names its dialect class as a string, loaded only by
:meth:`DatabaseProfile.dialect_class`.

A profile is declarative, as sqlglot's dialects are: a subclass whose class attributes are the
differences, and a few methods where a difference is a rule.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..core.filters import FilterRules
    from ..core.schema import TableName
    from ..core.scope import SystemCatalogs

#: connection-extra keys that are CDC settings (dialect options) of every database; every other
#: extra key is a driver setting (libpq's sslmode, pymysql's ssl_ca...) kept in
#: ConnectionParams.extra for the dialect's connections
COMMON_OPTION_KEYS = frozenset(
    {
        "watermark_schema",
        "watermark_table",
        "segment_max_events",
        "segment_max_bytes",
        "fetch_batch_rows",
        "batch_max_bytes",
        "watermark_strategy",
    }
)

#: the scopes an owned object is unique in (OwnedObject.per)
SERVER, DATABASE = "server", "database"


@dataclass(frozen=True)
class OwnedObject:
    """An object on the source server that one capture owns alone (two sources sharing it would
    lose changes): ``what`` it is ("replication slot"), the connection-extra ``option`` that
    names it, ``per`` which scope it is unique in (SERVER or DATABASE) and its ``identity``."""

    what: str
    option: str
    per: str
    identity: Any


class DatabaseProfile:
    """A source database, as the package knows it before it connects (see the module)."""

    #: the dialect's name (ConnectionParams.scheme, Dialect.name)
    name: ClassVar[str]
    #: how messages name the server ("PostgreSQL")
    label: ClassVar[str]
    #: other names ``get_dialect``/``dialect_class`` accept ("postgresql")
    aliases: ClassVar[tuple[str, ...]] = ()
    #: Airflow connection types of the source (and the values of a ``cdc`` connection's extra "dialect")
    conn_types: ClassVar[tuple[str, ...]]
    default_port: ClassVar[int]
    #: the scheme of its OpenLineage dataset namespace (``{scheme}://{host}:{port}``)
    lineage_scheme: ClassVar[str]
    #: a table's schema is its database (MySQL): names carry no separate database part
    schema_is_database: ClassVar[bool] = False
    #: connection-extra keys that are CDC settings of this database, beside COMMON_OPTION_KEYS
    option_keys: ClassVar[frozenset[str]]
    #: Debezium connectors of this database (DebeziumOptions.connector); the first is the default
    debezium_connectors: ClassVar[tuple[str, ...]]
    #: the fields of Debezium's ``source`` block after the common ones: (type, name, optional)
    debezium_source_fields: ClassVar[tuple[tuple[str, str, bool], ...]]
    #: the dialect class, ``module:Class``; imported (with its driver) only when asked for
    dialect_path: ClassVar[str]
    #: the schemas of the server's own catalogs (matched in any case): never captured, snapshotted,
    #: refreshed or verified, whatever a setting or a run's conf says (core/scope.py)
    system_schemas: ClassVar[frozenset[str]]
    #: prefixes of schema names the server reserves for itself (PostgreSQL's ``pg_``), matched as written
    system_schema_prefixes: ClassVar[tuple[str, ...]] = ()

    #: every attribute a profile must give (tests/unit/test_profiles.py checks each registered one)
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "name",
        "label",
        "conn_types",
        "default_port",
        "lineage_scheme",
        "option_keys",
        "debezium_connectors",
        "debezium_source_fields",
        "dialect_path",
        "system_schemas",
    )

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def cdc_option_keys(self) -> frozenset[str]:
        """The connection-extra keys that are CDC settings (every other key is the driver's)."""
        return COMMON_OPTION_KEYS | self.option_keys

    def accepts_conn_type(self, conn_type: str | None) -> bool:
        return (conn_type or "").lower().replace("-", "_") in self.conn_types

    def dialect_class(self) -> type:
        """Its dialect, a dialects.base.Dialect subclass (not imported here: base asks the
        registry for a dialect's profile, so an import back would be a cycle)."""
        module, cls = self.dialect_path.split(":")
        return getattr(importlib.import_module(module), cls)

    @property
    def system_catalogs(self) -> SystemCatalogs:
        """Its system catalogs as the capture scope takes them (core/scope.py)."""
        from ..core.scope import SystemCatalogs

        return SystemCatalogs(frozenset(self.system_schemas), tuple(self.system_schema_prefixes))

    def is_system_schema(self, schema: str) -> bool:
        """``schema`` is one of the server's own catalogs (the capture scope's rule)."""
        from ..core.scope import is_system_schema

        return is_system_schema(schema, self.system_catalogs)

    # --- rules (one method each where the databases differ by more than a value) ------------------
    @property
    def filter_rules(self) -> FilterRules:
        """How a snapshot's row filter is parsed and rendered (core/filters.py)."""
        raise NotImplementedError

    def owned_objects(self, source: str, options: Mapping[str, Any]) -> list[OwnedObject]:
        """What a capture of ``source`` with connection options ``options`` owns on its server."""
        raise NotImplementedError

    def lineage_name(self, database: str | None, table: TableName) -> str:
        """The OpenLineage dataset name of ``table`` in ``database`` (``db.schema.table``, or
        ``schema.table`` where the schema is the database)."""
        if self.schema_is_database:
            return f"{table.schema}.{table.name}"
        return f"{database}.{table.schema}.{table.name}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
