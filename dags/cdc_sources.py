"""cdc_snapshot__<source>, cdc_changelog__<source> and cdc_verify__<source> for every source of the
sources config, and cdc_refresh__<source> for those that name refresh tables.

The config is ``CDC_SOURCES_FILE`` (a path or URI), else ``cdc_sources.yaml`` next to this
file; without either, this file builds no DAG. Its format and keys:
airflow_provider_cdc/sources_config.py (and the README's reference). A bad entry fails the
parse of this file with a message naming the file, the source and the key: Airflow shows it
as this file's import error and keeps no half of the sources.
"""

from __future__ import annotations

from pathlib import Path

from airflow_provider_cdc import settings
from airflow_provider_cdc.dag_builders import (
    changelog_dag,
    connection_options,
    refresh_dag,
    snapshot_dag,
    verify_dag,
)
from airflow_provider_cdc.sources_config import read_sources

_GIVEN = settings.load().sources_file  # CDC_SOURCES_FILE, or [cdc] sources_file
_CONFIG = _GIVEN or str(Path(__file__).with_name("cdc_sources.yaml"))

if _GIVEN or Path(_CONFIG).exists():
    # connections are read too, so two sources whose extras name one slot, publication or
    # server_id are refused here, naming both (a connection this process cannot read is
    # left out of that check)
    for _entry in read_sources(_CONFIG, connections=connection_options):
        globals()[f"snapshot__{_entry.name}"] = snapshot_dag(
            f"cdc_snapshot__{_entry.name}", _entry.overrides, throttle=_entry.throttle, tags=(_entry.name,))
        globals()[f"changelog__{_entry.name}"] = changelog_dag(
            f"cdc_changelog__{_entry.name}", _entry.overrides, tags=(_entry.name,))
        globals()[f"verify__{_entry.name}"] = verify_dag(
            f"cdc_verify__{_entry.name}", _entry.overrides, tags=(_entry.name,))
        if _entry.settings.refresh_tables:
            globals()[f"refresh__{_entry.name}"] = refresh_dag(
                f"cdc_refresh__{_entry.name}", _entry.overrides, tags=(_entry.name,))
