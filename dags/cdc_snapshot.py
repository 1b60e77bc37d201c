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

Environment: CDC_SOURCE_CONN_ID (default cdc_source), CDC_SOURCE (staging name; default
the conn id), CDC_TABLES (comma list, default tables when the conf has none),
CDC_DATA_DIR, CDC_SNAPSHOT_SCHEDULE (optional cron for periodic refresh),
CDC_SPARK_CONN_ID (default spark_default), CDC_SPARK_CONF (JSON of Spark settings),
CDC_SINKS (default events,mirror), CDC_LOCAL_MAX_ROWS (rounds up to this many rows merge
in the worker without a spark-submit; default 100000, 0 = always Spark),
CDC_MAX_PARALLEL_CHUNKS (chunk tasks at once per run, default 4),
CDC_SENSOR_DEFERRABLE (true/false: wait_high_watermarks waits in the triggerer between
pokes instead of being rescheduled; unset = Airflow's [operators] default_deferrable),
CDC_SENSOR_POKE_INTERVAL (seconds between the sensor's checks, default 5; a deferred
sensor drains the changelog again every 6 intervals).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_provider_cdc.operators.snapshot import (
    SnapshotChunkOperator,
    SnapshotCommitOperator,
    SnapshotPlanOperator,
)
from airflow_provider_cdc.operators.spark_jobs import SnapshotMergeOperator, local_max_rows_from_env
from airflow_provider_cdc.sensors.high_watermark import (
    HighWatermarkSensor,
    deferrable_from_env,
    poke_interval_from_env,
)

CONN_ID = os.environ.get("CDC_SOURCE_CONN_ID", "cdc_source")
SOURCE = os.environ.get("CDC_SOURCE") or CONN_ID
DATA_DIR = os.environ.get("CDC_DATA_DIR", os.path.join(os.getcwd(), ".cdc-local", "data"))
TABLES = os.environ.get("CDC_TABLES", "")
SPARK_CONN_ID = os.environ.get("CDC_SPARK_CONN_ID", "spark_default")
SINKS = os.environ.get("CDC_SINKS", "events,mirror")
SPARK_CONF = json.loads(os.environ.get("CDC_SPARK_CONF") or "{}")  # e.g. {"spark.executor.memory": "4g"}

LOCAL_MAX_ROWS = local_max_rows_from_env()  # rounds of at most this many rows merge without spark-submit
SENSOR_DEFERRABLE = deferrable_from_env()  # None: Airflow's [operators] default_deferrable
SENSOR_POKE_INTERVAL = poke_interval_from_env()

common = {"data_dir": DATA_DIR, "cdc_conn_id": CONN_ID, "source": SOURCE}
merge_args = {"data_dir": DATA_DIR, "source": SOURCE, "sinks": SINKS}

with DAG(
    dag_id="cdc_snapshot",
    description="DBLog watermark snapshot (start / pause / resume / stop by trigger conf)",
    schedule=os.environ.get("CDC_SNAPSHOT_SCHEDULE") or None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    # a pause/stop run must be able to run next to the snapshot run it pauses
    max_active_runs=3,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=10)},
    tags=["cdc", "snapshot"],
    doc_md=__doc__,
) as dag:
    plan = SnapshotPlanOperator(task_id="plan", default_tables=TABLES, retries=0, **common)

    chunks = SnapshotChunkOperator.partial(
        task_id="read_chunks",
        max_active_tis_per_dagrun=int(os.environ.get("CDC_MAX_PARALLEL_CHUNKS", "4")),
        **common,
    ).expand(work=plan.output)

    @task(task_id="round")
    def write_round(results, data_dir: str, source: str) -> str:
        """The round's chunk list as a JSON file for the merge job (XCom stays small)."""
        import json
        import re
        import uuid
        from pathlib import Path

        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowSkipException

        from airflow_provider_cdc.core.staging import staging_dir
        from airflow_provider_cdc.sensors.high_watermark import flatten_chunk_results

        flat = flatten_chunk_results(results)
        if not flat:
            raise AirflowSkipException("no chunks to merge in this run (pause/stop, or nothing left)")
        run_id = re.sub(r"[^A-Za-z0-9_.-]", "_", get_current_context()["run_id"])
        path = Path(staging_dir(data_dir, source), "rounds", f"{run_id}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(flat))
        tmp.replace(path)
        return str(path)

    round_file = write_round(chunks.output, DATA_DIR, SOURCE)

    wait = HighWatermarkSensor(
        task_id="wait_high_watermarks",
        chunks=chunks.output,
        mode="reschedule",
        poke_interval=SENSOR_POKE_INTERVAL,
        timeout=3600,
        **({} if SENSOR_DEFERRABLE is None else {"deferrable": SENSOR_DEFERRABLE}),
        **common,
    )

    merge = SnapshotMergeOperator(
        task_id="merge",
        round_file=round_file,
        conn_id=SPARK_CONN_ID,
        conf=SPARK_CONF,
        local_max_rows=LOCAL_MAX_ROWS,
        **merge_args,
    )

    commit = SnapshotCommitOperator(task_id="commit", chunks=chunks.output, **common)

    round_file >> wait >> merge >> commit
