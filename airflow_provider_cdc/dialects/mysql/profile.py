"""MySQL and MariaDB as the package knows them before connecting (dialects/profile.py): no driver here."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from ...core.filters import DIALECTS as FILTER_RULES
from ...core.filters import FilterRules
from ..profile import SERVER, DatabaseProfile, OwnedObject


def default_server_id(source: str) -> int:
    """A replication server id derived from the source name: stable across runs (one
    capture per source at a time) and unlikely to collide with real replicas' small ids."""
    return 1_000_000 + zlib.crc32(f"airflow-provider-cdc:{source}".encode()) % 3_000_000_000


class MySqlProfile(DatabaseProfile):
    name = "mysql"
    label = "MySQL/MariaDB"
    aliases = ("mariadb",)
    conn_types = ("mysql", "mariadb")
    default_port = 3306
    lineage_scheme = "mysql"
    schema_is_database = True
    option_keys = frozenset({"server_id", "connect_timeout", "on_truncate", "rows_decoder"})
    debezium_connectors = ("mysql", "mariadb")
    debezium_source_fields = (
        ("string", "table", True),
        ("int64", "server_id", False),
        ("string", "gtid", True),
        ("string", "file", False),
        ("int64", "pos", False),
        ("int32", "row", False),
        ("int64", "thread", True),
        ("string", "query", True),
    )
    dialect_path = "airflow_provider_cdc.dialects.mysql.dialect:MySqlDialect"
    system_schemas = frozenset({"mysql", "information_schema", "performance_schema", "sys"})

    @property
    def filter_rules(self) -> FilterRules:
        return FILTER_RULES["mysql"]

    def owned_objects(self, source: str, options: Mapping[str, Any]) -> list[OwnedObject]:
        """A replication server id is unique per server; it defaults to one derived from the source."""
        sid = options.get("server_id")
        return [
            OwnedObject(
                "server_id", "server_id", SERVER, int(sid) if sid is not None else default_server_id(source)
            )
        ]


PROFILE = MySqlProfile()
