"""cdc_snapshot: DBLog watermark snapshot of source tables, one bounded job per DAG run.

Trigger with a conf (a Debezium-style signal), e.g.::

    airflow dags trigger cdc_snapshot -c '{"action": "start", "tables": ["public.orders"], "chunk_size": 50000, "parallelism": 4}'
    airflow dags trigger cdc_snapshot -c '{"action": "pause", "tables": ["public.orders"]}'
    airflow dags trigger cdc_snapshot -c '{"action": "resume", "tables": ["public.orders"]}'
    airflow dags trigger cdc_snapshot -c '{"action": "stop", "tables": ["public.orders"]}'

Scheduled runs (``CDC_SNAPSHOT_SCHEDULE``) default to ``"action": "refresh"``: tables whose
snapshot is done, stopped or missing start a new one, running or failed ones continue,
paused ones stay paused.

Other keys: ``key_ranges`` (only these key ranges), ``where`` (filter condition),
``delay_seconds`` (throttle between chunks). A bad conf fails the ``plan`` task with a
message naming the setting, before anything is written.

plan -> read_chunks (mapped over the planned key ranges; each range chunk by chunk:
low watermark, SELECT, high watermark) -> round (the chunk list as a file) ->
wait_high_watermarks (drains the changelog itself when cdc_changelog is not running) ->
merge (DBLog steps 4-5, writes the event log and the mirror: spark-submit, or in the
worker when the round has at most CDC_LOCAL_MAX_ROWS rows) -> commit.

Pausing: the ``pause`` action (or ``airflow-cdc``/the Variable) stops chunk tasks before
their next chunk; pausing the DAG in Airflow stops new tasks from being scheduled (and
running chunk tasks stop too where the API server reports the pause). Chunks read so far
are merged and kept; ``resume`` continues after the last committed chunk.

Environment (airflow_provider_cdc/settings.py; read when the tasks run, except
CDC_SNAPSHOT_SCHEDULE, CDC_SPARK_CONN_ID, CDC_SPARK_CONF, CDC_MAX_PARALLEL_CHUNKS and the
CDC_SENSOR_* settings, which Airflow needs when it parses this file):
CDC_SOURCE_CONN_ID (default cdc_source), CDC_SOURCE (staging name; default
the conn id), CDC_TABLES (comma list, default tables when the conf has none),
CDC_DATA_DIR (default $AIRFLOW_HOME/cdc-data), CDC_SNAPSHOT_SCHEDULE (optional cron for periodic refresh),
CDC_SPARK_CONN_ID (default spark_default), CDC_SPARK_CONF (JSON of Spark settings),
CDC_SINKS (default events,mirror), CDC_LOCAL_MAX_ROWS (rounds up to this many rows merge
in the worker without a spark-submit; default 100000, 0 = always Spark),
CDC_MAX_PARALLEL_CHUNKS (chunk tasks at once per run, default 4),
CDC_SENSOR_DEFERRABLE (true/false: wait_high_watermarks waits in the triggerer between
pokes instead of poking in its worker slot; unset = Airflow's [operators] default_deferrable),
CDC_SENSOR_POKE_INTERVAL (seconds between the sensor's checks, default 5; a deferred
sensor drains the changelog again every 6 intervals), CDC_SENSOR_TIMEOUT (seconds the
sensor waits in all, default 21600).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_cdc import settings
from airflow_provider_cdc.operators.snapshot import (
    SnapshotChunkOperator,
    SnapshotCommitOperator,
    SnapshotPlanOperator,
    record_snapshot_failure,
)
from airflow_provider_cdc.operators.spark_jobs import SnapshotMergeOperator
from airflow_provider_cdc.sensors.high_watermark import HighWatermarkSensor

# Only what Airflow needs while parsing; the operators read the data location, the source,
# the tables, the sinks and CDC_LOCAL_MAX_ROWS when they run (airflow_provider_cdc/settings.py).
PARSE = settings.load()

with DAG(
    dag_id="cdc_snapshot",
    description="DBLog watermark snapshot (start / pause / resume / stop by trigger conf)",
    schedule=PARSE.snapshot_schedule,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    # a pause/stop run must be able to run next to the snapshot run it pauses
    max_active_runs=3,
    # a task that fails for good marks the run's snapshots failed, with its error
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10), "on_failure_callback": record_snapshot_failure},
    tags=["cdc", "snapshot"],
    doc_md=__doc__,
) as dag:
    plan = SnapshotPlanOperator(task_id="plan", retries=0)

    chunks = SnapshotChunkOperator.partial(
        task_id="read_chunks",
        max_active_tis_per_dagrun=PARSE.max_parallel_chunks,
    ).expand(work=plan.output)

    @task(task_id="round")
    def write_round(results) -> str:
        """The round's chunk list as a JSON file for the merge job (XCom stays small)."""
        import json

        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowSkipException

        from airflow_provider_cdc import settings, storage
        from airflow_provider_cdc.core.chunk import flatten_chunk_results
        from airflow_provider_cdc.hooks.cdc_storage import apply_storage_connection
        from airflow_provider_cdc.storage.layout import round_path

        now = settings.load()  # at run time, like the operators
        apply_storage_connection(now.storage_conn_id)
        data_dir, source = now.data_dir, now.source
        flat = flatten_chunk_results(results)
        if not flat:
            raise AirflowSkipException("no chunks to merge in this run (pause/stop, or nothing left)")
        path = round_path(data_dir, source, get_current_context()["run_id"])
        storage.write_text(path, json.dumps(flat))
        return path

    round_file = write_round(chunks.output)

    wait = HighWatermarkSensor(
        task_id="wait_high_watermarks",
        chunks=chunks.output,
        # poke: a reschedule-mode sensor can lose its tries to an Airflow race while the
        # capture lock is held for minutes (apache/airflow#71172); waiting must never fail a run
        mode="poke",
        poke_interval=PARSE.sensor_poke_interval,
        timeout=PARSE.sensor_timeout,
        **({} if PARSE.sensor_deferrable is None else {"deferrable": PARSE.sensor_deferrable}),
    )

    merge = SnapshotMergeOperator(
        task_id="merge",
        round_file=round_file,
        conn_id=PARSE.spark_conn_id,
        conf=PARSE.spark_conf,
    )

    commit = SnapshotCommitOperator(task_id="commit", chunks=chunks.output)

    round_file >> wait >> merge >> commit
