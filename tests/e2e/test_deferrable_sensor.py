"""The cdc_snapshot DAG with its high-watermark sensor in deferrable mode, end to end on
the real PostgreSQL: the sensor defers to HighWatermarkTrigger, the trigger runs (inline,
as Airflow 3's ``dag.test()`` runs triggers) and the run ends with the mirror equal to the
source.

In drain mode the sensor's first poke captures the changelog itself and normally finds
every high watermark at once. To make it defer, the test holds the source's capture lock
(``locks.capture_lock``, the lock every capture takes) from another connection in a
thread, as a cdc_changelog capture running elsewhere would:

* ``trigger_sees_capture``: the thread keeps the lock for the whole run and, once the
  sensor deferred, captures the changelog itself. The sensor can never drain; it ends
  through its trigger.
* ``sensor_drains_after_recheck``: the thread releases the lock once the sensor deferred
  and captures nothing. Only the sensor drains, so the trigger cannot see the watermarks:
  it hands back ``pending`` after its recheck interval and the sensor's next poke drains.
"""

from __future__ import annotations

# Everything the lock-holder thread uses is imported here, in the main thread: a thread
# importing Airflow models while dag.test() imports them too can deadlock on import locks.
import airflow.models
import airflow.models.taskinstance
import airflow.models.trigger
import airflow.models.xcom
import airflow.utils.session
import psycopg2.extensions
import psycopg2.extras  # noqa: F401 - pre-imported for the lock-holder thread
import pyarrow.parquet  # noqa: F401 - pre-imported for the lock-holder thread
import pytest

import airflow_provider_cdc.dialects.postgres
import airflow_provider_cdc.operators.capture  # noqa: F401 - see above
from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments

from .helpers import CaptureLockHolder, load_dag, mirror_rows, source_rows, xcom_of

# Every ORM model, now: the thread's first query configures SQLAlchemy's mappers, which fails
# ("expression 'DagModel' failed to locate a name") when run alone, before anything else
# imported the models.
airflow.models.import_all_models()

def sensor_ti(run):
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id="wait_high_watermarks")
            .one()
        )
        session.expunge(ti)
        return ti


@pytest.mark.timeout(300)
@pytest.mark.parametrize("capture", [True, False], ids=["trigger_sees_capture", "sensor_drains_after_recheck"])
def test_deferred_sensor_completes_the_snapshot(pg_source, unique_name, capture, monkeypatch):  # noqa: F811 - fixture
    src = pg_source
    table_id = f"public.{src['table']}"
    monkeypatch.setenv("CDC_SENSOR_DEFERRABLE", "true")
    monkeypatch.setenv("CDC_SENSOR_POKE_INTERVAL", "1")  # trigger polls every 1 s, hands back after 6 s
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000")  # merge in the worker, no spark-submit
    dag = load_dag("cdc_snapshot", unique_name)
    sensor = dag.task_dict["wait_high_watermarks"]
    assert sensor.deferrable and sensor.poke_interval == 1

    hook = CdcSourceHook(src["conn_id"])
    holder = CaptureLockHolder(hook.connection_params(), hook.get_dialect(), src["data_dir"], capture=capture)
    holder.start()
    holder.locked.wait(60)
    assert holder.acquired, f"the test could not take the capture lock: {holder.error!r}"
    try:
        run = dag.test(run_conf={"action": "start", "tables": [table_id], "chunk_size": 700, "parallelism": 2})
    finally:
        holder.finish.set()
        holder.join(timeout=60)
    assert holder.error is None, f"lock holder failed: {holder.error!r}"
    assert run.state == "success", f"cdc_snapshot ended {run.state}"

    # the sensor deferred: the execution API stored its trigger, with this run's watermarks
    assert holder.deferral is not None, "the sensor never deferred"
    trigger_id, trigger_kwargs = holder.deferral
    assert sensor_ti(run).trigger_id == trigger_id
    chunks = [c for r in xcom_of(run, "read_chunks") for c in (r if isinstance(r, list) else [r])]
    hw_ids = sorted({c["high_watermark"] for c in chunks})
    assert trigger_kwargs["watermark_ids"] == hw_ids and len(hw_ids) >= 2

    # ... and it ended through execute_complete, with the trigger's event
    returned = xcom_of(run, "wait_high_watermarks")
    assert len(returned) == 1, "the sensor returned nothing: it did not finish through its trigger"
    ended = returned[0]
    assert ended["watermarks"] == len(hw_ids)
    segments = [path for _a, _b, path in list_segments(changelog_dir(src["data_dir"], src["conn_id"]))]
    if capture:
        # the lock was never free: every staged segment is the test's capture, none the sensor's
        assert holder.captured is not None and holder.captured.watermarks >= 2 * len(hw_ids)
        assert sorted(map(str, segments)) == sorted(map(str, holder.captured.segments))
        assert ended["trigger_event"] in ("success", "pending")
    else:
        # nobody but the sensor captures: the trigger can only have handed back "pending"
        assert holder.captured is None and segments
        assert ended["trigger_event"] == "pending"

    progress = airflow_variables.load(src["conn_id"], table_id, src["data_dir"])
    assert progress is not None and progress.status == "done", progress
    expected = source_rows(src["uri"], src["table"])
    got = mirror_rows(src["data_dir"], src["conn_id"], src["table"])
    assert len(expected) == 3000 and got == expected
