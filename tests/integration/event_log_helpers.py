"""Staged changelog segments -> the event log, as the apply job writes them (both engines call
the same EventLogSink), for tests that check what the event log holds for real captured changes."""

from __future__ import annotations

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.arrow_engine import segment_events, segment_units
from airflow_provider_cdc.sinks.event_log import EventLogSink
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments


def write_event_log(data_dir: str, source: str, table: TableName, database: str | None = None) -> int:
    """Every staged event of ``table`` written to the event log; returns how many."""
    sink = EventLogSink(data_dir, source, database)
    n = 0
    for unit in segment_units(list_segments(changelog_dir(data_dir, source)), None, None):
        events = [te for te in segment_events(unit) if te.table == table.id]
        sink.write(events)
        n += sum(te.num_rows for te in events)
    return n
