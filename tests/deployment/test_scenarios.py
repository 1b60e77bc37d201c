"""Operations a user performs on a real deployment (tests/deployment/conftest.py), each under a
background writer, each ending with a catch-up and `airflow-cdc verify --events` clean.

Driven only through the `airflow` CLI and the REST API; processes are found by the title the
task runner gives itself (`airflow worker -- <task instance id>`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import time
import uuid
from contextlib import contextmanager
from datetime import datetime

import psutil
import pytest

from .conftest import CONFIG_SOURCES, CONN_ID, ScenarioError

pytestmark = pytest.mark.timeout(600)

LOCAL_CONF = {"chunk_size": 2000, "parallelism": 2}
SPARK_CONF = {"chunk_size": 5000, "parallelism": 2}


@contextmanager
def writing(dep, name: str, rate: float = 40):
    from tools.workload import BackgroundWriter, TableName

    w = BackgroundWriter(dep.pg_uri, TableName("public", dep.tables[name]), threads=2, rate=rate).start()
    try:
        yield w
    finally:
        w.stop()


def table_id(dep, name: str) -> str:
    return f"public.{dep.tables[name]}"


def catch_up_and_verify(dep, name: str, writer) -> None:
    """Stop the writer, write a watermark, run cdc_changelog until it is staged and applied
    (demo.catch_up through the deployment), then verify the table with --events."""
    from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
    from airflow_provider_cdc.sinks.base import applied_everywhere
    from airflow_provider_cdc.storage.staged import staged_watermark_position

    stats = writer.stop()
    assert stats.committed > 0, f"the writer committed nothing: {stats.summary()}"
    marker = f"catchup-{uuid.uuid4()}"
    old = os.environ.get(f"AIRFLOW_CONN_{CONN_ID.upper()}")
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = dep.env[f"AIRFLOW_CONN_{CONN_ID.upper()}"]
    try:
        with CdcSourceHook(CONN_ID).get_dialect(source=CONN_ID) as dialect:
            dialect.write_watermark(marker)
    finally:
        if old is None:
            os.environ.pop(f"AIRFLOW_CONN_{CONN_ID.upper()}", None)
        else:
            os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = old
    for i in range(1, 7):
        run_id = dep.trigger("cdc_changelog", tag=f"catchup{i}")
        dep.wait_run("cdc_changelog", run_id, timeout=240)
        pos = staged_watermark_position(dep.data_dir, CONN_ID, marker)
        if pos is not None and applied_everywhere(dep.data_dir, CONN_ID, pos):
            break
    else:
        raise dep.failure(f"cdc_changelog did not stage and apply catch-up watermark {marker} in 6 runs")
    proc = dep.cdc("verify", "--conn-id", CONN_ID, "--table", table_id(dep, name), "--data-dir", dep.data_dir, "--events")
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, f"airflow-cdc verify --events of {table_id(dep, name)} exited {proc.returncode}:\n{out[-4000:]}"


def start_conf(dep, name: str, base: dict, **extra) -> dict:
    return {"action": "start", "tables": [table_id(dep, name)], **base, **extra}


def status_of(dep, name: str) -> str | None:
    p = dep.progress(table_id(dep, name))
    return None if p is None else p.get("status")


def task_runner(ti_id: str) -> psutil.Process | None:
    """The task runner process of a task instance (title `airflow worker -- <ti id>`),
    not its supervisor (`airflow worker -- LocalExecutor: <ti id>`)."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or []).strip()
        if cmd.endswith(f"-- {ti_id}") and "LocalExecutor" not in cmd:
            return p
    return None


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def spark_procs(ti_id: str) -> list[psutil.Process]:
    """Live spark-submit / JVM / Python driver processes under a task's runner."""
    p = task_runner(ti_id)
    if p is None:
        return []
    try:
        kids = p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [c for c in kids if alive(c)]


def merge_job_started(dep, run_id: str, ti: dict, min_jvm_seconds: float = 10) -> bool:
    """The merge's Spark job is doing its work, not just starting its JVM: its task log says
    it claimed the mirror's epoch, or a JVM under it has run for min_jvm_seconds."""
    log = dep.home / "logs" / "dag_id=cdc_snapshot" / f"run_id={run_id}" / "task_id=merge" / f"attempt={ti['try_number']}.log"
    try:
        if "epoch" in log.read_text(errors="replace") and any("java" in " ".join(c.cmdline()) for c in spark_procs(ti["id"])):
            return True
    except OSError:
        pass
    now = time.time()
    return any("java" in " ".join(c.cmdline()) and now - c.create_time() >= min_jvm_seconds for c in spark_procs(ti["id"]))


def poll(what: str, fn, timeout: float, dep, *runs):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise dep.failure(f"timed out after {timeout:.0f}s waiting for {what}", *runs)
        time.sleep(1)


def reading_chunks(dep, name: str):
    """Start a slow snapshot (2 s between chunks) and wait for a running chunk task: (run id,
    task instance, its task runner process)."""
    run = dep.trigger("cdc_snapshot", start_conf(dep, name, LOCAL_CONF, delay_seconds=2), tag="start")
    ti = dep.wait_ti("cdc_snapshot", run, "read_chunks", {"running"}, timeout=180,
                     also=lambda t: task_runner(t["id"]) is not None)
    proc = task_runner(ti["id"])
    assert proc is not None, "the chunk task's runner process vanished before it could be signalled"
    return run, ti, proc


# --- (1) stop while the merge runs ---------------------------------------------------------------
def test_stop_during_merge_then_restart(deployment):
    dep, name = deployment, "stop"
    # the merge waits after its epoch claim until the stop is recorded: a Spark job faster than
    # the stop's run would otherwise commit first (the stop then refuses a done snapshot)
    hold = dep.home / "merge-holds" / table_id(dep, name)
    hold.touch()
    with writing(dep, name) as w:
        run = dep.trigger("cdc_snapshot", start_conf(dep, name, SPARK_CONF), tag="start1")
        try:
            dep.wait_ti("cdc_snapshot", run, "merge", {"running"}, timeout=300,
                        also=lambda t: merge_job_started(dep, run, t))
            stop = dep.trigger("cdc_snapshot", {"action": "stop", "tables": [table_id(dep, name)]}, tag="stop")
            dep.wait_run("cdc_snapshot", stop, timeout=180)
        finally:
            hold.unlink()
        first = dep.wait_run("cdc_snapshot", run, timeout=300, expect=None)
        print(dep.describe("cdc_snapshot", run))
        st = status_of(dep, name)
        assert st == "stopped", dep.failure(f"after stop the snapshot is {st!r}", ("cdc_snapshot", run))
        cl = dep.trigger("cdc_changelog", tag="afterstop")
        dep.wait_run("cdc_changelog", cl, timeout=240)
        run2 = dep.trigger("cdc_snapshot", start_conf(dep, name, SPARK_CONF), tag="start2")
        dep.wait_run("cdc_snapshot", run2, timeout=420)
        assert status_of(dep, name) == "done", dep.failure(f"second start ended with status {status_of(dep, name)!r}",
                                                           ("cdc_snapshot", run2))
        merge1 = next(t for t in dep.tis("cdc_snapshot", run) if t["task_id"] == "merge")
        print(f"first run {run} ended {first['state']}; its merge (running when the stop was sent) ended {merge1['state']}")
        catch_up_and_verify(dep, name, w)


# --- (2) pause the DAG mid-run ------------------------------------------------------------------
def test_pause_dag_mid_run_then_unpause_and_resume(deployment):
    dep, name = deployment, "pause"
    with writing(dep, name) as w:
        run = dep.trigger("cdc_snapshot", start_conf(dep, name, LOCAL_CONF, delay_seconds=2), tag="start")
        dep.wait_ti("cdc_snapshot", run, "read_chunks", {"running"}, timeout=180)
        dep.cli("dags", "pause", "cdc_snapshot")
        try:
            # running chunk tasks stop before their next chunk (or finish); nothing new starts
            poll("no read_chunks task running after the DAG was paused",
                 lambda: not any(t["task_id"] == "read_chunks" and t["state"] == "running"
                                 for t in dep.tis("cdc_snapshot", run)), 120, dep, ("cdc_snapshot", run))
            print("while paused:\n" + dep.describe("cdc_snapshot", run))
        finally:
            dep.cli("dags", "unpause", "cdc_snapshot")
        dep.wait_run("cdc_snapshot", run, timeout=300)
        st = status_of(dep, name)
        print(f"after the first run: status {st}")
        if st != "done":
            assert st == "paused", dep.failure(f"after unpause the snapshot is {st!r}", ("cdc_snapshot", run))
            res = dep.trigger("cdc_snapshot", {"action": "resume", "tables": [table_id(dep, name)], **LOCAL_CONF},
                              tag="resume")
            dep.wait_run("cdc_snapshot", res, timeout=300)
        assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
        catch_up_and_verify(dep, name, w)


# --- (2b) a key range, started from the package's CLI -------------------------------------------
def test_snapshot_start_of_a_key_range_from_the_cli_reads_exactly_that_range(deployment):
    """Issue 58's command on a running deployment: ``airflow cdc snapshot start --range 5000:6000
    --chunk-size 500`` triggers a run the scheduler runs, and the mirror gains exactly ids
    5000..5999 (the table holds 1..12,000), read by deltalake's scan."""
    import re

    import pyarrow as pa
    from deltalake import DeltaTable

    from airflow_provider_cdc.core.schema import TableName
    from airflow_provider_cdc.storage.layout import mirror_dir

    dep, name = deployment, "range"
    out = dep.cli("cdc", "snapshot", "start", "--table", table_id(dep, name), "--range", "5000:6000",
                  "--chunk-size", "500", timeout=300)
    found = re.search(r"triggered cdc_snapshot run (\S+)", out.stdout)
    assert found, out.stdout + out.stderr
    dep.wait_run("cdc_snapshot", found.group(1), timeout=300)
    assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
    # deltalake's scan applies the mirror's deletion vectors (its to_pyarrow_table refuses them)
    mirror = pa.table(DeltaTable(mirror_dir(dep.data_dir, CONN_ID, TableName.parse(table_id(dep, name)))).scan(
        columns=["id"]))
    assert sorted(mirror["id"].to_pylist()) == list(range(5000, 6000))


# --- (3) kill -9 a running chunk task -----------------------------------------------------------
def test_kill_chunk_task_retry_finishes(deployment):
    dep, name = deployment, "killchunk"
    with writing(dep, name) as w:
        run, ti, proc = reading_chunks(dep, name)
        print(f"kill -9 {proc.pid} ({' '.join(proc.cmdline())}) = read_chunks[{ti['map_index']}] try {ti['try_number']}")
        os.kill(proc.pid, signal.SIGKILL)
        dep.wait_run("cdc_snapshot", run, timeout=300)
        after = next(t for t in dep.tis("cdc_snapshot", run) if t["id"] == ti["id"] or
                     (t["task_id"] == "read_chunks" and t["map_index"] == ti["map_index"]))
        assert after["try_number"] > ti["try_number"], dep.failure("the killed chunk task was not retried",
                                                                   ("cdc_snapshot", run))
        assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
        catch_up_and_verify(dep, name, w)


def test_sigterm_stops_a_chunk_task_within_seconds_and_its_retry_finishes(deployment):
    """The signal a scheduler sends first (task timeout, a user marking the task failed, a
    worker shutting down): the chunk task's runner must end promptly, between or inside a
    chunk, and its retry must finish the snapshot with nothing lost."""
    dep, name = deployment, "termchunk"
    with writing(dep, name) as w:
        run, ti, proc = reading_chunks(dep, name)
        print(f"kill -TERM {proc.pid} = read_chunks[{ti['map_index']}] try {ti['try_number']}")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)  # a liveness bound, not a speed measurement
        except psutil.TimeoutExpired:
            raise dep.failure(f"read_chunks[{ti['map_index']}] still runs 30 s after SIGTERM", ("cdc_snapshot", run)) from None
        dep.wait_run("cdc_snapshot", run, timeout=300)
        assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
        catch_up_and_verify(dep, name, w)


# --- (4) kill -9 a running merge (spark-submit) --------------------------------------------------
def test_kill_spark_merge_retry_finishes_and_old_jvm_dies(deployment):
    dep, name = deployment, "killmerge"
    leftovers: list[psutil.Process] = []
    try:
        with writing(dep, name) as w:
            run = dep.trigger("cdc_snapshot", start_conf(dep, name, SPARK_CONF), tag="start")

            ti = dep.wait_ti("cdc_snapshot", run, "merge", {"running"}, timeout=300,
                             also=lambda t: merge_job_started(dep, run, t))
            proc = task_runner(ti["id"])
            kids = spark_procs(ti["id"])
            print(f"kill -9 {proc.pid} (merge try {ti['try_number']}); its processes: "
                  + "; ".join(f"{c.pid} {' '.join(c.cmdline())[:120]}" for c in kids))
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            # the retry starts ~10 s later (retry_delay): by then the old try must be gone
            dep.wait_ti("cdc_snapshot", run, "merge", {"running", "success"}, timeout=240,
                        also=lambda t: t["try_number"] > ti["try_number"])
            at_retry = [c for c in kids if alive(c)]
            print(f"{len(at_retry)} process(es) of the killed try alive when the retry started, "
                  f"{time.monotonic() - killed_at:.0f}s after the kill")
            dep.wait_run("cdc_snapshot", run, timeout=420)
            merge = next(t for t in dep.tis("cdc_snapshot", run) if t["task_id"] == "merge")
            assert merge["try_number"] > ti["try_number"], dep.failure("the killed merge was not retried",
                                                                       ("cdc_snapshot", run))
            leftovers = [c for c in kids if alive(c)]
            assert not leftovers, (
                "processes of the killed merge try are still alive after the retry finished: "
                + "; ".join(f"{c.pid} {' '.join(c.cmdline())[:200]}" for c in leftovers))
            assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
            catch_up_and_verify(dep, name, w)
    finally:
        for c in leftovers:  # the zombie JVM: ours to end (started by this test's deployment)
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass


# --- (5) clear a finished task ------------------------------------------------------------------
def test_clear_finished_merge_reruns(deployment):
    dep, name = deployment, "clear"
    with writing(dep, name) as w:
        run = dep.trigger("cdc_snapshot", start_conf(dep, name, LOCAL_CONF), tag="start")
        dep.wait_run("cdc_snapshot", run, timeout=300)
        before = {t["task_id"]: t["try_number"] for t in dep.tis("cdc_snapshot", run) if t["map_index"] < 0}
        dep.api("POST", "/api/v2/dags/cdc_snapshot/clearTaskInstances", {
            "dry_run": False, "dag_run_id": run, "task_ids": ["merge"], "include_downstream": True,
            "only_failed": False, "reset_dag_runs": True,
        })
        poll("the cleared run to start again", lambda: dep.run("cdc_snapshot", run)["state"] != "success"
             or any(t["task_id"] == "merge" and t["try_number"] > before["merge"] for t in dep.tis("cdc_snapshot", run)),
             60, dep, ("cdc_snapshot", run))
        dep.wait_run("cdc_snapshot", run, timeout=300)
        after = {t["task_id"]: t for t in dep.tis("cdc_snapshot", run) if t["map_index"] < 0}
        for task in ("merge", "commit"):
            assert after[task]["try_number"] > before[task] and after[task]["state"] == "success", dep.failure(
                f"cleared {task} did not re-run to success", ("cdc_snapshot", run))
        assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
        catch_up_and_verify(dep, name, w)


# --- (6) backfill of cdc_changelog -------------------------------------------------------------
def test_backfill_changelog_three_intervals(deployment):
    dep, name = deployment, "backfill"
    with writing(dep, name) as w:
        run = dep.trigger("cdc_snapshot", start_conf(dep, name, LOCAL_CONF), tag="start")
        dep.wait_run("cdc_snapshot", run, timeout=300)
        out = dep.cli("backfill", "create", "--dag-id", "cdc_changelog", "--from-date", "2025-01-01",
                      "--to-date", "2025-03-01")
        print(out.stdout[-2000:])

        def backfill_runs():
            return [r for r in dep.runs("cdc_changelog") if r.get("run_type") == "backfill"]

        runs = poll("3 backfill runs of cdc_changelog", lambda: (lambda rs: rs if len(rs) >= 3 else None)(backfill_runs()),
                    120, dep)
        assert len(runs) == 3, f"expected 3 backfill runs, got {[r['dag_run_id'] for r in runs]}"
        concurrent = 0
        deadline = time.monotonic() + 420
        while True:
            runs = backfill_runs()
            concurrent = max(concurrent, sum(1 for r in runs if r["state"] == "running"))
            if all(r["state"] in ("success", "failed") for r in runs):
                break
            if time.monotonic() > deadline:
                raise dep.failure("backfill runs not finished after 420s", *[("cdc_changelog", r["dag_run_id"]) for r in runs])
            time.sleep(1)
        failed = [r["dag_run_id"] for r in runs if r["state"] != "success"]
        if failed:
            raise dep.failure(f"backfill runs failed: {failed}", *[("cdc_changelog", r) for r in failed])

        def ts(v):
            return datetime.fromisoformat(v.replace("Z", "+00:00"))

        # Airflow counts every backfill run as running at once (a backfill ignores the DAG's
        # max_active_runs); what cdc_changelog promises is that the *work* of the intervals
        # (capture .. compaction, after the earlier_intervals_done gate) never overlaps and
        # follows the logical dates.
        spans = []
        for r in sorted(runs, key=lambda r: r["logical_date"]):
            work = [t for t in dep.tis("cdc_changelog", r["dag_run_id"])
                    if t["task_id"] != "earlier_intervals_done" and t.get("start_date") and t.get("end_date")]
            assert work, f"run {r['dag_run_id']} did no work: {dep.describe('cdc_changelog', r['dag_run_id'])}"
            spans.append((min(ts(t["start_date"]) for t in work), max(ts(t["end_date"]) for t in work), r["dag_run_id"]))
        overlaps = [(a[2], b[2]) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
        summary = "\n".join(f"  {s[2]}: work {s[0].time()} -> {s[1].time()}" for s in spans)
        print(f"backfill runs (up to {concurrent} counted running at once by Airflow):\n{summary}")
        catch_up_and_verify(dep, name, w)  # the data first, then the scheduling semantics
        assert not overlaps, f"backfill intervals of cdc_changelog worked at the same time ({overlaps}):\n{summary}"


# --- (7) the sensor has to wait: reschedule mode in a real deployment ---------------------------
def test_sensor_waits_while_capture_lock_is_held(deployment):
    """A capture running elsewhere (another deployment on the same source) holds the source's
    capture lock, so the sensor cannot drain the log itself: it must wait (poking, rescheduled
    or deferred, whichever mode the DAG uses) and succeed once the lock is free, not fail the run."""
    import psycopg2

    from airflow_provider_cdc.dialects.postgres import PostgresDialect
    from airflow_provider_cdc.pipeline.locks import lock_name

    dep, name = deployment, "sensor"
    # the lock of the source's slot (locks.lock_key), taken as the capture takes it
    slot = json.loads(dep.env[f"AIRFLOW_CONN_{CONN_ID.upper()}"])["extra"]["slot_name"]
    lock = lock_name(f"slot.{slot}")
    holder = psycopg2.connect(dep.pg_uri)
    holder.autocommit = True
    cur = holder.cursor()
    try:
        with writing(dep, name) as w:
            cur.execute(PostgresDialect.lock_acquire_sql, (lock,))
            assert cur.fetchone()[0], "the capture lock is held by something else"
            run = dep.trigger("cdc_snapshot", start_conf(dep, name, LOCAL_CONF), tag="start")

            def waiting(t):  # rescheduled/deferred, or poking: it has checked (and logged) twice
                if t["state"] in ("up_for_reschedule", "deferred"):
                    return True
                log = (dep.home / "logs" / "dag_id=cdc_snapshot" / f"run_id={run}" / "task_id=wait_high_watermarks"
                       / f"attempt={max(1, t['try_number'])}.log")
                try:
                    return log.read_text(errors="replace").count("not staged yet") >= 2
                except OSError:
                    return False

            ti = dep.wait_ti("cdc_snapshot", run, "wait_high_watermarks",
                             {"running", "up_for_reschedule", "deferred"}, timeout=240, also=waiting)
            print(f"sensor {ti['state']} (try {ti['try_number']}) while the lock was held")
            cur.execute(PostgresDialect.lock_release_sql, (lock,))
            dep.wait_run("cdc_snapshot", run, timeout=300)
            assert status_of(dep, name) == "done", f"snapshot ended {status_of(dep, name)!r}"
            catch_up_and_verify(dep, name, w)
    finally:
        holder.close()


# --- (9) sources from a config, and a consumer scheduled on their mirrors' Assets --------------------
def test_config_sources_run_and_a_consumer_scheduled_on_their_mirrors_runs_after_them(deployment):
    """dags/cdc_sources.py made a DAG pair for a PostgreSQL and a MariaDB source of one config;
    both snapshot runs commit, and the example consumer (scheduled on both mirrors' Assets) is
    started by the scheduler only once both merges have emitted their Asset events."""
    dep = deployment
    consumer = "cdc_mirror_consumer"
    assert not dep.runs(consumer), "the consumer ran before any mirror was updated"
    for s in CONFIG_SOURCES:  # the first capture creates the slot / binlog offset
        dep.wait_run(f"cdc_changelog__{s}", dep.trigger(f"cdc_changelog__{s}", tag="first"), timeout=240)
    runs = {s: dep.trigger(f"cdc_snapshot__{s}", {"action": "start", "chunk_size": 1000}, tag="start")
            for s in CONFIG_SOURCES}
    merged_at = {}
    for s, run in runs.items():
        dep.wait_run(f"cdc_snapshot__{s}", run, timeout=360)
        merge = next(t for t in dep.tis(f"cdc_snapshot__{s}", run) if t["task_id"] == "merge")
        assert merge["state"] == "success", dep.describe(f"cdc_snapshot__{s}", run)
        merged_at[s] = datetime.fromisoformat(merge["end_date"])
    poll(f"a successful {consumer} run", lambda: [r for r in dep.runs(consumer) if r["state"] == "success"],
                180, dep, *((f"cdc_snapshot__{s}", r) for s, r in runs.items()))
    # the merges emit, and so does each commit that finishes a snapshot: one or two runs
    assert all(r["run_type"] == "asset_triggered" for r in dep.runs(consumer)), dep.runs(consumer)
    first = min(datetime.fromisoformat(r["queued_at"] or r["start_date"]) for r in dep.runs(consumer))
    assert first >= max(merged_at.values()), (first, merged_at)
    for s, (_uri, table) in dep.config_tables.items():
        proc = dep.cdc("verify", "--conn-id", s, "--table", table.id, "--data-dir", dep.data_dir, "--events")
        assert proc.returncode == 0, f"verify of {s} {table.id}:\n{(proc.stdout + proc.stderr)[-3000:]}"


# --- (10) a source scheduled on its own writes, and a consumer of its mirror --------------------------
def test_a_write_reaches_a_consumer_of_the_mirror_with_nothing_triggered_by_hand(deployment):
    """The @log source's changelog (CDC_CHANGELOG_SCHEDULE=@log) runs only when its table is
    written (plus a heartbeat every 10 minutes): the other scenarios' writes on the same server
    started none of its rounds. One insert then starts a round through the triggerer's watch,
    its apply emits the mirror's Asset event, and the consumer scheduled on it runs; its
    triggering event carries the position range and the insert's commit time."""
    import psycopg2

    from .conftest import LOG_SOURCE

    dep = deployment
    dag, consumer = f"cdc_changelog__{LOG_SOURCE}", f"{LOG_SOURCE}_consumer"
    # the watch's first round (no slot yet) created the slot; nothing else of this session
    # wrote to its table
    poll(f"the first {dag} run", lambda: [r for r in dep.runs(dag) if r["state"] == "success"], 240, dep)
    before = dep.runs(dag)
    heartbeats = math.ceil((time.time() - dep.started) / 600)
    assert all(r["run_type"] == "asset_triggered" for r in before), before
    # the watch's start (no slot yet), the publication's tables entering the count, heartbeats
    assert len(before) <= 2 + heartbeats, f"rounds without writes to the source: {before}"
    seen = {r["dag_run_id"] for r in dep.runs(consumer)}
    conn = psycopg2.connect(dep.pg_uri)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(f'UPDATE public."{dep.log_table}" SET "note" = %s WHERE "id" = 1', ("fresh",))
        committed = time.time()
    finally:
        conn.close()
    new = poll(f"a {consumer} run after the write",
               lambda: [r for r in dep.runs(consumer) if r["dag_run_id"] not in seen and r["state"] == "success"],
               180, dep)
    run = new[0]
    events = dep.api("GET", f"/api/v2/dags/{consumer}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents")["asset_events"]
    extras = [e["extra"] for e in events if e["extra"].get("committed_at")]
    assert extras, events
    newest = max(extras, key=lambda e: e["committed_at"])
    assert newest["committed_at"] >= committed - 5 and newest["events"] >= 1, newest
    assert newest["from_position"] is None or newest["from_position"] < newest["position"]
    started = datetime.fromisoformat(run["start_date"]).timestamp()
    print(f"{consumer} started {started - newest['committed_at']:.1f} s after the commit it reads")
    # the consumer starts on the apply's Asset event, which the round task emits before its
    # run's other tasks are done: wait for the run itself to end
    earlier = {b["dag_run_id"] for b in before}
    rounds = poll(f"a successful {dag} run after the write",
                  lambda: [r for r in dep.runs(dag) if r["dag_run_id"] not in earlier and r["state"] == "success"],
                  120, dep)
    assert all(r["run_type"] == "asset_triggered" for r in dep.runs(dag)), dep.runs(dag)
    # a round is one task: the checks that fail a run were skipped, no process started for them
    done = rounds[0]
    tis = dep.api("GET", f"/api/v2/dags/{dag}/dagRuns/{done['dag_run_id']}/taskInstances")["task_instances"]
    states = {t["task_id"]: t["state"] for t in tis}
    assert states["round"] == "success", states
    assert states["mirror_schema_stops"] == states["log_retention"] == "skipped", states
    assert states["compact_tombstones"] in ("success", "skipped"), states  # every 300 s


def test_deployment_components_still_up(deployment):
    """Last: every component survived the scenarios."""
    try:
        deployment.check_alive()
    except ScenarioError as exc:
        pytest.fail(str(exc))
