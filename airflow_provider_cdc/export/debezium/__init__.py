"""The event log as Debezium's JSON: the records Debezium's PostgreSQL or MySQL/MariaDB connector
would publish for the same changes, serialised by Kafka Connect's JsonConverter, so consumers
written for Debezium read the export unchanged. The settings it matches, what it writes where
the event log lacks Debezium's input, and why every document validates against its own schema:
docs/outputs.md, "Debezium JSON".
"""

from __future__ import annotations

from .fields import _FIELD_MAPS, ZERO_DATE_DAYS, field_schema, zero_date_days
from .options import CONNECTORS, DEBEZIUM_VERSION, FORMS, DebeziumOptions, connector_of, schema_prefix
from .records import _SOURCE_VALUES, TableExport, export_table, file_records

__all__ = [
    "CONNECTORS",
    "DEBEZIUM_VERSION",
    "FORMS",
    "ZERO_DATE_DAYS",
    "DebeziumOptions",
    "TableExport",
    "_FIELD_MAPS",
    "_SOURCE_VALUES",
    "connector_of",
    "export_table",
    "field_schema",
    "file_records",
    "schema_prefix",
    "zero_date_days",
]
