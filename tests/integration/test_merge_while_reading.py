"""Merging while reading (pipeline/merge_while_reading.py, the snapshot DAG's
``merge_while_reading`` task) on the real PostgreSQL: chunks committed while the range is
still being read are merged and committed in batches, the round's merge takes only what is
left, no chunk reaches the sinks twice, and the mirror equals the source (I2) with writes
landing between the chunks.

The interleaving is forced, not slept for: the chunk task runs in a thread that stops after
each committed chunk (a hook on the sidecar write) until the merge task's next poll lets it
read one more; the merge task's view of "is a chunk task still reading" is that thread.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace
from urllib.parse import urlsplit

import psycopg2
import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.operators.snapshot import (
    SnapshotChunkOperator,
    SnapshotCommitOperator,
    SnapshotPlanOperator,
)
from airflow_provider_cdc.operators.spark_jobs import SnapshotMergeOperator, SnapshotMergeWhileReadingOperator
from airflow_provider_cdc.pipeline import snapshot as steps
from airflow_provider_cdc.pipeline.arrow_engine import apply_changelog
from airflow_provider_cdc.pipeline.capture import run_capture
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.pipeline.verify import check_event_log, verify_table
from airflow_provider_cdc.sinks.event_log import read_events

ROWS, CHUNK = 3000, 300


class LockstepReader:
    """The chunk task in a thread that waits after every committed chunk until released."""

    def __init__(self, op: SnapshotChunkOperator, monkeypatch, between_chunks) -> None:
        self.go, self.committed = threading.Semaphore(0), threading.Semaphore(0)
        self.results: list[dict] = []
        self.error: BaseException | None = None
        self.chunks = 0
        real = steps.write_sidecar

        def write_sidecar(result, range_index, merged=False):
            real(result, range_index, merged)
            if threading.current_thread() is self.thread and not merged:
                self.chunks += 1
                between_chunks(self.chunks)
                self.committed.release()
                self.go.acquire()

        monkeypatch.setattr(steps, "write_sidecar", write_sidecar)

        def run():
            try:
                self.go.acquire()
                self.results = op.execute({})
            except BaseException as exc:  # noqa: BLE001 - re-raised by the test
                self.error = exc
            finally:
                self.committed.release()

        self.thread = threading.Thread(target=run, name="read_chunks", daemon=True)
        self.thread.start()

    def step(self) -> bool:
        """Let the reader commit one more chunk (or finish); True while it still reads."""
        if not self.thread.is_alive():
            return False
        self.go.release()
        self.committed.acquire()  # released after each chunk, and once when the task returns
        return self.thread.is_alive()


@pytest.mark.parametrize("engine", ["worker", "spark"])
def test_chunks_merged_while_reading_reach_the_sinks_once_and_the_round_merges_the_rest(
    pg_uri, unique_name, tmp_path, monkeypatch, variables, engine
):
    """``spark``: every merge is a spark-submit, several from one task instance (a job handed
    the first batch's arguments again marked later batches merged that it never wrote)."""
    table = f"mwr_{unique_name}"
    conn_id = f"cdc_mwr_{unique_name}"
    p = urlsplit(pg_uri)
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       f"postgresql://{p.username}@{p.hostname}:{p.port}{p.path}?watermark_table=wm_{unique_name}")
    monkeypatch.setenv("CDC_TABLES", f"public.{table}")
    # worker: every merge in this process (arrow engine); spark: every merge a spark-submit
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "1000000" if engine == "worker" else "0")
    monkeypatch.setenv("CDC_MERGE_WHILE_READING_ROWS", str((2 if engine == "worker" else 4) * CHUNK))
    monkeypatch.setenv("CDC_SENSOR_POKE_INTERVAL", "0.01")
    data = str(tmp_path)
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    cur.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY, v text)')
    cur.execute(f"INSERT INTO \"{table}\" SELECT g, 'v' || g FROM generate_series(1, {ROWS}) g")
    plan = SnapshotPlanOperator(task_id="plan", data_dir=data, cdc_conn_id=conn_id)
    try:
        work = plan.execute({"dag_run": SimpleNamespace(conf={
            "action": "start", "tables": [f"public.{table}"], "chunk_size": CHUNK, "parallelism": 1}), "ti": None})
        assert len(work) == 1

        def between_chunks(n: int) -> None:  # writes between the chunks: behind, inside and ahead of the keyset
            cur.execute(f'UPDATE "{table}" SET v = %s WHERE id = %s', (f"u{n}", n * CHUNK - 5))
            cur.execute(f'UPDATE "{table}" SET v = %s WHERE id = %s', (f"a{n}", n * CHUNK + 5))
            cur.execute(f'DELETE FROM "{table}" WHERE id = %s', (n * CHUNK + 7,))
            cur.execute(f'INSERT INTO "{table}" VALUES (%s, %s)', (ROWS + n, f"i{n}"))

        reader = LockstepReader(
            SnapshotChunkOperator(task_id="read_chunks", work=work[0], data_dir=data, cdc_conn_id=conn_id,
                                  check_dag_paused=False),
            monkeypatch, between_chunks)

        class Watched(SnapshotMergeWhileReadingOperator):
            def _readers(self, context):  # what Airflow says of the chunk task: the thread
                return reader.step()

        source = plan.hook.source
        early = Watched(task_id="merge_while_reading", work=work, data_dir=data, cdc_conn_id=conn_id, source=source)
        summary = early.execute({"run_id": "r1"})
        reader.thread.join(timeout=60)
        if reader.error:
            raise reader.error
        results = reader.results
        assert reader.chunks == len(results) >= ROWS // CHUNK, (reader.chunks, len(results))
        assert summary["batches"] >= 2 and 0 < summary["chunks"] < len(results), summary

        # the round: what the chunk task returned, the merge drops what merged while reading
        run_capture(plan.hook, data)  # the sensor's drain
        round_file = tmp_path / "round.json"
        round_file.write_text(json.dumps(results))
        final = SnapshotMergeOperator(task_id="merge", round_file=str(round_file), data_dir=data, source=source)
        final.execute({})
        assert final.round_file != str(round_file)  # it merged only the chunks left (a live round)
        left = json.loads(open(final.round_file).read())
        assert 0 < len(left) == len(results) - summary["chunks"]
        SnapshotCommitOperator(task_id="commit", chunks=results, data_dir=data, cdc_conn_id=conn_id).execute({})
        t = TableName("public", table)
        assert airflow_variables.status(source, t.id, data) == "done"

        # every chunk row reached the event log once: r events at distinct (key, position), and
        # every row the chunks read is one (a chunk marked merged that no merge wrote is missing)
        r = [e for e in read_events(data, source, t).to_pylist() if e["op"] == "r"]
        assert len({(e["key"], e["position"]) for e in r}) == len(r) == sum(c["rows"] for c in results)

        run_capture(plan.hook, data)
        sinks = build_sinks("events,mirror", data_dir=data, source=source, database=None, require_schema=True)
        try:
            apply_changelog(data, source, sinks)
        finally:
            for s in sinks:
                s.close()
        with plan.hook.get_dialect() as d:
            res = verify_table(d, data, source, t)
        cur.execute(f'SELECT count(*) FROM "{table}"')
        assert res.ok and res.rows_checked == cur.fetchone()[0], res.summary()
        report = check_event_log(data, source, t, primary_key=("id",))
        assert report.ok and report.duplicates == 0, report.summary()
    finally:
        with plan.hook.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()
        cur.execute(f'DROP TABLE IF EXISTS "{table}"')
        cur.execute(f'DROP TABLE IF EXISTS cdc."wm_{unique_name}"')
        admin.close()
