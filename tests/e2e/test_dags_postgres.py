"""The example DAGs end to end on the real PostgreSQL: cdc_snapshot under concurrent
writers from several connections, then cdc_changelog; the mirror equals the source.

Runs the DAGs with ``dag.test(run_conf=...)`` (real Airflow task runner, XCom, Variables,
mapped tasks, reschedule sensor) and real ``spark-submit --master local[2]`` jobs, and once
more with the in-process merge/apply engine that small rounds use.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import psycopg2
import pytest

from airflow_provider_cdc import airflow_variables

from .helpers import load_dag, mirror_rows, source_rows


def writers(uri: str, table: str, stop: threading.Event, count: int = 3) -> list[threading.Thread]:
    """Inserts, updates and deletes from several connections until ``stop``. Deletes hit only
    original keys that are multiples of 5, so most original rows survive and can only have
    reached the mirror through the snapshot (or an update)."""

    def work(n: int) -> None:
        conn = psycopg2.connect(uri)
        conn.autocommit = True
        cur = conn.cursor()
        i = 0
        while not stop.is_set():
            i += 1
            k = (i * 7919 + n * 104729) % 3000 + 1
            cur.execute(f'UPDATE "{table}" SET v = %s, amount = amount + 1 WHERE id = %s', (f"w{n}-{i}", k))  # noqa: S608
            cur.execute(
                f'INSERT INTO "{table}" VALUES (%s, %s, %s, now()) ON CONFLICT (id) DO UPDATE SET v = excluded.v',  # noqa: S608
                (3000 + n * 100_000 + i, f"new{n}-{i}", Decimal("0.01") * i),
            )
            cur.execute(f'DELETE FROM "{table}" WHERE id = %s', (((k * 31) % 600 + 1) * 5,))  # noqa: S608
            time.sleep(0.005)
        conn.close()

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in range(count)]
    for t in threads:
        t.start()
    return threads


def task_result(run, task_id: str):
    """A task's return value (XCom) in a DAG run, None when it returned nothing."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id,
                                                  key="return_value").one_or_none()
        return None if row is None else XComModel.deserialize_value(row)


def merge_engine(run, task_id: str) -> str:
    """Which engine ran a merge/apply task: the in-process one returns its summary as XCom;
    after a spark-submit, merge returns nothing and apply {"engine": "spark", "schema_stopped": ...}."""
    value = task_result(run, task_id)
    return value["engine"] if isinstance(value, dict) else "spark"


@pytest.mark.parametrize("engine", ["spark", "local"])
def test_snapshot_then_changelog_mirror_equals_source(pg_source, unique_name, engine, monkeypatch):
    """Both merge/apply engines: CDC_LOCAL_MAX_ROWS=0 submits every round to Spark; a high
    limit runs these rounds (3,000-row table) in the worker."""
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "0" if engine == "spark" else "1000000")
    src = pg_source
    snapshot_dag = load_dag("cdc_snapshot", unique_name)
    changelog_dag = load_dag("cdc_changelog", unique_name)
    table_id = f"public.{src['table']}"

    stop = threading.Event()
    threads = writers(src["uri"], src["table"], stop)
    try:
        time.sleep(0.3)  # writers are running before the first watermark
        run = snapshot_dag.test(
            run_conf={"action": "start", "tables": [table_id], "chunk_size": 400, "parallelism": 2}
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert run.state == "success", f"cdc_snapshot ended {run.state}"
    assert merge_engine(run, "merge") == engine

    progress = airflow_variables.load(src["conn_id"], table_id, src["data_dir"])
    assert progress is not None and progress.status == "done", progress
    assert progress.table(table_id).chunks >= 2  # parallelism 2: two ranges, each read to its end

    run = changelog_dag.test()
    assert run.state == "success", f"cdc_changelog ended {run.state}"
    assert merge_engine(run, "apply") == engine
    # the run says how far behind the log the capture is (it read to the end: 0 s)
    lag = task_result(run, "log_retention")
    assert lag.startswith(f"source {src['conn_id']!r}: ") and "s behind (replication slot 'cdc_" in lag, lag
    assert task_result(run, "capture")["retention_risk"] is None
    last = airflow_variables.load_lags(src["conn_id"])[src["conn_id"]]  # what `airflow cdc status` shows
    assert last["holder"].startswith("replication slot 'cdc_") and last["risk"] is None and last["bytes"] >= 0

    expected = source_rows(src["uri"], src["table"])
    # writers delete only original keys and insert only new ones: an original key still
    # there was there all along, so only the snapshot can have delivered it
    assert progress.table(table_id).rows >= sum(1 for k in expected if k <= 3000) >= 2400
    got = mirror_rows(src["data_dir"], src["conn_id"], src["table"])
    # the writers inserted rows during the snapshot (each insert may be matched by a delete,
    # so the count alone can stay at 3,000: look for the new keys themselves)
    assert any(k > 3000 for k in expected)
    missing = sorted(set(expected) - set(got))[:5]
    extra = sorted(set(got) - set(expected))[:5]
    wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])[:5]
    assert got == expected, f"mirror differs: missing {missing}, extra {extra}, wrong {wrong}"

    # rounds fold a bucket once its changes reach its base (mirror_compaction.CHANGE_SHARE), so
    # the stored rows (versions and tombstones) stay within twice the live ones; the snapshot is
    # done, so a fold removes the delete tombstones (compact: every bucket folded now)
    from airflow_provider_cdc.sinks.mirror_compaction import CHANGE_SHARE, compact, tombstone_count
    from airflow_provider_cdc.sinks.mirror_readers import read_mirror_raw

    assert sum(1 for k in expected if k <= 3000) < 3000, "the writers deleted original rows"
    from airflow_provider_cdc.core.schema import TableName
    from airflow_provider_cdc.sinks.delta_buckets import read_version
    from airflow_provider_cdc.sinks.mirror_table import _delta, _rows
    from airflow_provider_cdc.storage.layout import mirror_dir

    path = mirror_dir(src["data_dir"], src["conn_id"], TableName.parse(table_id))
    v = read_version(_delta(path), path)
    for b, files in v.files.items():  # after the round's compaction no bucket is due a fold
        base = [f for f in files if not v.info[f].change] or list(files[:1])
        change = [f for f in files if f not in base]
        assert _rows(v, change) < max(1, CHANGE_SHARE * _rows(v, base)), (b, files)
    compact(src["data_dir"], src["conn_id"], table_id)
    assert tombstone_count(src["data_dir"], src["conn_id"], table_id) == 0
    assert read_mirror_raw(src["data_dir"], src["conn_id"], table_id).num_rows == len(expected)
