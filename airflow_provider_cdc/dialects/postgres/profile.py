"""PostgreSQL as the package knows it before connecting (dialects/profile.py): no driver here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.filters import DIALECTS as FILTER_RULES
from ...core.filters import FilterRules
from ..profile import DATABASE, SERVER, DatabaseProfile, OwnedObject
from .prerequisites import default_object_name


class PostgresProfile(DatabaseProfile):
    name = "postgres"
    label = "PostgreSQL"
    aliases = ("postgresql",)
    conn_types = ("postgres", "postgresql")
    default_port = 5432
    lineage_scheme = "postgres"
    option_keys = frozenset(
        {
            "slot_name",
            "publication_name",
            "on_truncate",
            "read_timeout",
            "copy_batch_rows",
            "capture_step_messages",
            "chunk_conn_id",
            "max_replica_lag_seconds",
            "failover_slot",
        }
    )
    debezium_connectors = ("postgresql",)
    debezium_source_fields = (
        ("string", "schema", False),
        ("string", "table", False),
        ("int64", "txId", True),
        ("int64", "lsn", True),
        ("int64", "xmin", True),
        ("string", "origin", True),
        ("int64", "origin_lsn", True),
    )
    dialect_path = "airflow_provider_cdc.dialects.postgres.dialect:PostgresDialect"
    system_schemas = frozenset({"pg_catalog", "information_schema", "pg_toast"})
    system_schema_prefixes = ("pg_",)  # every pg_* schema is reserved to the server (pg_temp_3...)

    @property
    def filter_rules(self) -> FilterRules:
        return FILTER_RULES["postgres"]

    def owned_objects(self, source: str, options: Mapping[str, Any]) -> list[OwnedObject]:
        """A slot is unique per server (cluster), a publication per database; both default to
        a name derived from the source."""
        default = default_object_name(source)
        return [
            OwnedObject("replication slot", "slot_name", SERVER, str(options.get("slot_name") or default)),
            OwnedObject(
                "publication", "publication_name", DATABASE, str(options.get("publication_name") or default)
            ),
        ]


PROFILE = PostgresProfile()
