"""cdc_changelog: capture the source's changelog to staging, then apply it to the sinks.

Short schedule, one active run, never waits for snapshots (I5). The capture holds the
source's capture lock (an advisory lock on the source) so it never runs at the same
time as another capture, e.g. the snapshot DAG's sensor draining the log; when the lock
is held, the capture task is skipped and the apply still runs. The apply (a spark-submit,
or in the worker for at most CDC_LOCAL_MAX_ROWS staged rows) is skipped when nothing
staged is newer than what the sinks have.

Environment: CDC_SOURCE_CONN_ID (default cdc_source), CDC_SOURCE (default the conn id),
CDC_DATA_DIR, CDC_CHANGELOG_SCHEDULE (default every minute; "none" for manual only),
CDC_SPARK_CONN_ID (default spark_default), CDC_SPARK_CONF (JSON of Spark settings),
CDC_SINKS (default events,mirror), CDC_LOCAL_MAX_ROWS (default 100000; 0 = always Spark),
CDC_CAPTURE_MAX_EVENTS (cap per capture; default unbounded),
CDC_CAPTURE_SEGMENT_MAX_EVENTS (events per staged segment, cut at transaction boundaries;
default the connection's ``segment_max_events`` extra or 20,000; 0 = one segment per run).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_cdc.operators.capture import ChangelogCaptureOperator
from airflow_provider_cdc.operators.spark_jobs import ChangelogApplyOperator, local_max_rows_from_env

CONN_ID = os.environ.get("CDC_SOURCE_CONN_ID", "cdc_source")
SOURCE = os.environ.get("CDC_SOURCE") or CONN_ID
DATA_DIR = os.environ.get("CDC_DATA_DIR", os.path.join(os.getcwd(), ".cdc-local", "data"))
SPARK_CONN_ID = os.environ.get("CDC_SPARK_CONN_ID", "spark_default")
SINKS = os.environ.get("CDC_SINKS", "events,mirror")
SPARK_CONF = json.loads(os.environ.get("CDC_SPARK_CONF") or "{}")  # e.g. {"spark.executor.memory": "4g"}
_schedule = os.environ.get("CDC_CHANGELOG_SCHEDULE", "* * * * *")
_max_events = os.environ.get("CDC_CAPTURE_MAX_EVENTS")
_segment_events = os.environ.get("CDC_CAPTURE_SEGMENT_MAX_EVENTS")

with DAG(
    dag_id="cdc_changelog",
    description="Changelog capture (logical slot / binlog) to staging, then apply to the sinks",
    schedule=None if _schedule.lower() in ("", "none") else _schedule,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(seconds=10)},
    tags=["cdc", "changelog"],
    doc_md=__doc__,
) as dag:
    capture = ChangelogCaptureOperator(
        task_id="capture",
        data_dir=DATA_DIR,
        cdc_conn_id=CONN_ID,
        source=SOURCE,
        max_events=int(_max_events) if _max_events else None,
        segment_max_events=int(_segment_events) if _segment_events else None,
    )
    apply = ChangelogApplyOperator(
        task_id="apply",
        conn_id=SPARK_CONN_ID,
        conf=SPARK_CONF,
        data_dir=DATA_DIR,
        source=SOURCE,
        sinks=SINKS,
        local_max_rows=local_max_rows_from_env(),
    )

    @task.short_circuit(
        task_id="anything_to_apply", trigger_rule="none_failed", ignore_downstream_trigger_rules=False
    )
    def anything_to_apply(data_dir: str, source: str, sinks: str) -> bool:
        """Skip the spark-submit (seconds of JVM start) when no staged segment is past
        every sink's applied-position marker."""
        from airflow_provider_cdc.core.staging import changelog_dir
        from airflow_provider_cdc.sinks.base import read_marker
        from airflow_provider_cdc.staging_io import list_segments

        segments = list_segments(changelog_dir(data_dir, source))
        if not segments:
            return False
        newest = max(last for _first, last, _path in segments)
        markers = [read_marker(data_dir, source, s.strip()) for s in sinks.split(",") if s.strip()]
        return any(m is None or newest > m for m in markers)

    @task(task_id="compact_tombstones", trigger_rule="none_failed")
    def compact_tombstones(data_dir: str, source: str) -> dict[str, int]:
        """Delete tombstones guard the mirror against late chunk rows only while a snapshot
        of the table can still merge chunks; once none is running or paused, drop them."""
        from airflow_provider_cdc import progress_store
        from airflow_provider_cdc.sinks.base import read_marker
        from airflow_provider_cdc.sinks.mirror_delta import compact, mirror_tables, tombstone_count

        # Read the applied position BEFORE the snapshot status: a snapshot that starts
        # after the check reads its chunks after this point, so only tombstones of deletes
        # after it could matter to its chunks, and those are kept.
        applied = read_marker(data_dir, source, "mirror")
        removed: dict[str, int] = {}
        if applied is None:
            return removed
        for table in mirror_tables(data_dir, source):
            if progress_store.status(source, table.id) in ("running", "paused"):
                continue
            if tombstone_count(data_dir, source, table):
                removed[table.id] = compact(data_dir, source, table, upto_position=applied.encode())
        return removed

    check = anything_to_apply(DATA_DIR, SOURCE, SINKS)
    capture >> check >> apply >> compact_tombstones(DATA_DIR, SOURCE)
