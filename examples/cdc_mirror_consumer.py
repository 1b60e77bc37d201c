"""An example downstream DAG: runs once the mirrors of every table of every source in the
sources config have been updated since its last run (Airflow Assets; see
airflow_provider_cdc/assets.py and the README's "Assets").

Copy it into your DAG folder next to dags/cdc_sources.py. Each run's triggering Asset events
carry the source, the table, the position the mirror is complete up to, the row counts and, for
a changelog apply, the commit time of the table's newest change it made visible (``committed_at``).
"""

from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_cdc import settings
from airflow_provider_cdc.assets import mirror_asset
from airflow_provider_cdc.sources_config import read_sources

_GIVEN = settings.load().sources_file  # CDC_SOURCES_FILE, or [cdc] sources_file
_CONFIG = _GIVEN or str(Path(__file__).with_name("cdc_sources.yaml"))
MIRRORS = [mirror_asset(e.name, t) for e in read_sources(_CONFIG) for t in e.settings.tables]

with DAG(
    dag_id="cdc_mirror_consumer",
    schedule=MIRRORS,  # all of them: one run after each has been updated at least once
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    tags=["cdc", "example"],
    doc_md=__doc__,
):

    @task
    def report(*, triggering_asset_events=None) -> dict[str, int]:
        """What changed: the Asset events that started this run, per mirror."""
        import time

        seen: dict[str, int] = {}
        for asset, events in (triggering_asset_events or {}).items():
            for ev in events:
                extra = ev.extra or {}
                seen[asset.name] = seen.get(asset.name, 0) + int(extra.get("events") or extra.get("chunk_rows") or 0)
                age = f", newest change {time.time() - extra['committed_at']:.1f} s old" if extra.get("committed_at") else ""
                print(f"{asset.name}: position {extra.get('readable_position')}{age}, {extra}")
        return seen

    report()
