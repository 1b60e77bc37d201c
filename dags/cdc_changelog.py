"""cdc_changelog: capture the source's changelog to staging, then apply it to the sinks.

Short schedule, one active run, never waits for snapshots (I5). The capture holds the
source's capture lock (an advisory lock on the source) so it never runs at the same
time as another capture, e.g. the snapshot DAG's sensor draining the log; when the lock
is held, the capture task is skipped and the apply still runs. The apply (a spark-submit,
or in the worker for at most CDC_LOCAL_MAX_ROWS staged rows) is skipped when nothing
staged is newer than what the sinks have. ``log_retention`` logs how far the capture is
behind its source's log (also Airflow metrics ``cdc.capture.lag_bytes`` / ``lag_seconds`` /
``retention_at_risk``, tagged by source) and fails the run, naming the replication slot or
binlog file and what to do, when the source may soon drop log the capture has not read.

Schedules and backfills: each run captures the log up to now and applies it; a run is not
tied to its interval's data. ``airflow backfill create`` works (e.g. to catch up after the
DAG was off) and its intervals run one at a time in logical-date order: a backfill run's
first task, ``earlier_intervals_done``, waits until the run of the previous interval has
finished (a backfill ignores ``max_active_runs``), and every other task has
``max_active_tis_per_dag=1``, so two captures or two applies never overlap.

Environment (read when the tasks run, airflow_provider_cdc/settings.py, except the
schedule and the Spark connection/conf, read when the file is parsed):
CDC_SOURCE_CONN_ID (default cdc_source), CDC_SOURCE (default the conn id),
CDC_DATA_DIR (default $AIRFLOW_HOME/cdc-data), CDC_CHANGELOG_SCHEDULE (default every minute; "none" for manual only),
CDC_SPARK_CONN_ID (default spark_default), CDC_SPARK_CONF (JSON of Spark settings),
CDC_SINKS (default events,mirror), CDC_LOCAL_MAX_ROWS (default 100000; 0 = always Spark),
CDC_CAPTURE_MAX_EVENTS (cap per capture; default unbounded),
CDC_CAPTURE_SEGMENT_MAX_EVENTS (events per staged segment, cut at transaction boundaries;
default the connection's ``segment_max_events`` extra or 20,000; 0 = one segment per run).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_cdc import settings
from airflow_provider_cdc.operators.capture import ChangelogCaptureOperator
from airflow_provider_cdc.operators.spark_jobs import ChangelogApplyOperator

# Only what Airflow needs while parsing; the operators read the data location, the source,
# the sinks and the capture limits when they run (airflow_provider_cdc/settings.py).
PARSE = settings.load()

with DAG(
    dag_id="cdc_changelog",
    description="Changelog capture (logical slot / binlog) to staging, then apply to the sinks",
    schedule=PARSE.changelog_schedule,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    max_active_runs=1,
    # Backfill runs ignore max_active_runs (a backfill has its own, default 10) but every
    # task honours max_active_tis_per_dag: across all runs, one capture, one apply and one
    # compaction at a time, taken in logical-date order by the scheduler.
    default_args={"retries": 3, "retry_delay": timedelta(seconds=10), "max_active_tis_per_dag": 1},
    tags=["cdc", "changelog"],
    doc_md=__doc__,
    # the task arguments below that are templates read the settings when the task runs
    user_defined_macros={"cdc_settings": settings.load},
) as dag:
    @task.sensor(
        task_id="earlier_intervals_done", mode="poke", poke_interval=5, timeout=6 * 3600,
        max_active_tis_per_dag=None,  # every run's gate may wait at once: no gate blocks an earlier one
    )
    def earlier_intervals_done() -> bool:
        """A backfill run starts its work only once the run of the previous interval has
        finished: backfill intervals run one at a time, in logical-date order (a backfill
        ignores max_active_runs). Other runs pass at once."""
        from airflow.sdk import get_current_context

        from airflow_provider_cdc.sensors.high_watermark import previous_run_active

        ctx = get_current_context()
        return previous_run_active(ctx["dag_run"], ctx["ti"]) is None

    capture = ChangelogCaptureOperator(task_id="capture")
    apply = ChangelogApplyOperator(task_id="apply", conn_id=PARSE.spark_conn_id, conf=PARSE.spark_conf)

    @task.short_circuit(
        task_id="anything_to_apply", trigger_rule="none_failed", ignore_downstream_trigger_rules=False
    )
    def anything_to_apply(data_dir: str, source: str, sinks: str) -> bool:
        """Skip the spark-submit (seconds of JVM start) when no staged segment is past
        every sink's applied-position marker."""
        from airflow_provider_cdc.hooks.cdc_storage import apply_storage_connection
        from airflow_provider_cdc.sinks.base import read_marker
        from airflow_provider_cdc.storage.layout import changelog_dir
        from airflow_provider_cdc.storage.staged import list_segments

        apply_storage_connection()
        segments = list_segments(changelog_dir(data_dir, source))
        if not segments:
            return False
        newest = max(last for _first, last, _path in segments)
        markers = [read_marker(data_dir, source, s.strip()) for s in sinks.split(",") if s.strip()]
        return any(m is None or newest > m for m in markers)

    # multiple_outputs=False: the dict is keyed by table ids, which must not become XCom keys
    # (a key is a URL path segment of the Task SDK API; a table may be named "a/b?é")
    @task(task_id="compact_tombstones", trigger_rule="none_failed", multiple_outputs=False)
    def compact_tombstones(data_dir: str, source: str) -> dict[str, int]:
        """Tombstones of deletes the mirror has applied go, for every table whose snapshot
        cannot merge chunks any more (not running, paused or failed). Stopped snapshots count
        as finished: a merge of theirs still in flight is fenced (sinks/mirror_delta.py)."""
        from airflow_provider_cdc import progress_store
        from airflow_provider_cdc.hooks.cdc_storage import apply_storage_connection
        from airflow_provider_cdc.sinks.mirror_delta import compact_inactive

        apply_storage_connection()
        from airflow_provider_cdc import settings

        return compact_inactive(data_dir, source, lambda table_id: progress_store.status(source, table_id),
                                retention_hours=settings.load().mirror_retention_hours)

    @task(task_id="log_retention")
    def log_retention(capture_result: dict | None) -> str:
        """Fail the run loudly when the source may soon drop log the capture has not read (a
        replication slot near max_slot_wal_keep_size, a binlog file near its expiry); the
        message names the slot or file and what to do. Otherwise log how far behind the
        capture is. Beside apply, not before it: a warning never holds back the catch-up."""
        from airflow_provider_cdc.operators.capture import check_log_retention

        return check_log_retention(capture_result)

    now = {"data_dir": "{{ cdc_settings().data_dir }}", "source": "{{ cdc_settings().source }}"}
    check = anything_to_apply(sinks="{{ cdc_settings().sinks }}", **now)
    earlier_intervals_done() >> capture >> check >> apply >> compact_tombstones(**now)
    log_retention(capture.output)  # after capture (its XCom), a leaf of its own
