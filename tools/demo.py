"""``make demo``: the whole DBLog loop on the local PostgreSQL, through Airflow, then verified.

1. creates ``public.cdc_demo`` with ``CDC_DEMO_ROWS`` rows (default 300,000: the ~1M of the
   issue took 592 s on the shared 2-core machine, mostly the Spark merge; 300k takes ~210 s;
   ``CDC_DEMO_ROWS=1000000 make demo`` runs the full size);
2. runs ``cdc_changelog`` once (creates the replication slot: the log is captured from here);
3. starts a background writer (3 connections, inserts/updates/deletes/key reuse);
4. runs ``cdc_snapshot`` (action=start) with ``airflow dags test``; its sensor drains the
   changelog itself (with ``CDC_DEMO_CHANGELOG_LOOP=1``, ``cdc_changelog`` also runs back to
   back next to it: the log never waits for the snapshot, I5);
5. stops the writer, writes a catch-up watermark and runs ``cdc_changelog`` until that
   watermark is staged and applied to both sinks;
6. runs ``airflow-cdc verify`` (chunked checksums, mirror vs source, plus the per-key
   event-log check) and prints where the outputs are and how to read them.

Ends with PASS or FAIL and exit code 0 or 1. Settings (environment): ``CDC_DEMO_ROWS``,
``CDC_DEMO_CHUNK_SIZE`` (50000), ``CDC_DEMO_PARALLELISM`` (2), ``CDC_DEMO_WRITER_TPS``
(100), ``CDC_DEMO_WRITER_THREADS`` (3), ``CDC_DEMO_DATA_DIR`` (``$CDC_DATA_DIR/demo``),
``CDC_DEMO_CHANGELOG_LOOP`` (0).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.sinks.base import applied_everywhere
from airflow_provider_cdc.storage.layout import changelog_dir, events_dir, mirror_dir
from airflow_provider_cdc.storage.staged import staged_watermark_position

ROOT = Path(__file__).resolve().parent.parent
CONN_ID = "cdc_source"


# --- running DAGs the way a user does -----------------------------------------------------
def airflow_bin() -> str:
    """The ``airflow`` next to this interpreter (the venv), else the one on PATH."""
    cand = Path(sys.executable).with_name("airflow")
    return str(cand) if cand.exists() else "airflow"


class DagRunError(RuntimeError):
    pass


def run_dag(
    dag_id: str, conf: dict | None = None, *, env: dict[str, str] | None = None, log_dir: Path, tag: str = "", timeout: float = 1800
) -> float:
    """``airflow dags test <dag_id> -c <conf>`` as a subprocess; its output goes to a log file.

    Returns the seconds it took; raises DagRunError with the log's tail when the run fails.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{dag_id}{'-' + tag if tag else ''}-{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}.log"
    cmd = [airflow_bin(), "dags", "test", dag_id]
    if conf is not None:
        cmd += ["-c", json.dumps(conf)]
    t0 = time.monotonic()
    with open(log_path, "w") as fh:
        proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise DagRunError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}) after {took:.0f}s; log {log_path}\n{tail}")
    return took


def catch_up(dialect, data_dir: str, source: str, *, env, log_dir: Path, max_runs: int = 10) -> int:
    """Write a watermark now and run cdc_changelog until it is staged and applied: then every
    change committed before this call is in both sinks (I2's "applied past" condition)."""
    marker = f"catchup-{uuid.uuid4()}"
    dialect.write_watermark(marker)
    for i in range(1, max_runs + 1):
        run_dag("cdc_changelog", env=env, log_dir=log_dir, tag=f"catchup{i}")
        pos = staged_watermark_position(data_dir, source, marker)
        if pos is not None and applied_everywhere(data_dir, source, pos):
            return i
    raise DagRunError(f"cdc_changelog did not stage and apply watermark {marker} after {max_runs} runs")


class ChangelogLoop:
    """Runs cdc_changelog back to back in a thread while something else runs."""

    def __init__(self, env, log_dir: Path, pause: float = 5.0, *, enabled: bool = True) -> None:
        self.env, self.log_dir, self.pause, self.enabled = env, log_dir, pause, enabled
        self.runs = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cdc-changelog-loop", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                run_dag("cdc_changelog", env=self.env, log_dir=self.log_dir, tag=f"loop{self.runs + 1}")
                self.runs += 1
            except Exception as exc:  # noqa: BLE001 - reported at the end; the snapshot does not depend on it
                self.errors.append(str(exc))
            self._stop.wait(self.pause)

    def __enter__(self) -> ChangelogLoop:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.enabled:
            self._thread.join()


# --- the demo ---------------------------------------------------------------------------------
def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _int_env(name: str, default: int) -> int:
    v = os.environ.get(name, "").strip()
    return int(v) if v else default


def reset_demo_state(dialect, source: str, table: TableName, data_dir: str) -> None:
    """A rerun starts clean: old outputs, the Variable and the old slot (which would
    otherwise replay the previous run's changes and retain WAL) are removed."""
    from airflow_provider_cdc import airflow_variables

    storage.delete_dir(data_dir)  # a local folder or a prefix on object storage
    try:
        from airflow.models.variable import Variable

        Variable.delete(airflow_variables.variable_key(source, table.id))
    except Exception:  # noqa: BLE001 - absent on a first run
        pass
    for name in ("drop_slot", "drop_publication"):
        fn = getattr(dialect, name, None)
        if callable(fn):
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - absent on a first run
                _say(f"(nothing to drop for {name}: {exc.__class__.__name__})")


def unpause_dag(dag_id: str) -> None:
    """New DAGs start paused in Airflow, and a paused cdc_snapshot pauses its snapshot:
    unpause it as a user does before triggering it. No scheduler runs here, so this only
    lifts the pause check; runs still start only from `airflow dags test`."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": False})


def how_to_read(data_dir: str, source: str, table: TableName) -> str:
    ev = f"{events_dir(data_dir, source)}/table={table.path_segment}"
    mir = mirror_dir(data_dir, source, table)
    return f"""
Where the outputs are
  staged changelog : {changelog_dir(data_dir, source)}/seg-<first>-<last>.parquet
  event log        : {ev}   (a Delta table; Debezium envelope: op, key, typed before/after structs, source{{position,...}}, ts_ms)
  mirror           : {mir}   (a Delta table: deletion vectors mask every row that is not live)

How to read them with any Delta reader (venv python; `source scripts/env.sh` first)
  event log: python -c "from deltalake import DeltaTable; t = DeltaTable('{ev}').to_pyarrow_table(columns=['op', 'key']); print(t.group_by('op').aggregate([('key', 'count')]))"
  mirror   : python -c "from deltalake import DeltaTable, QueryBuilder; print(QueryBuilder().register('t', DeltaTable('{mir}')).execute('SELECT count(*) AS live_rows FROM t').read_all())"
  as of    : airflow-cdc mirror-version --source {source} --table {table.id} --data-dir {data_dir} --at <LSN>
  pyarrow  : python -c "from airflow_provider_cdc.sinks.mirror_readers import read_mirror; print(read_mirror('{data_dir}', '{source}', '{table.id}').slice(0, 2).to_pylist())"
  status   : airflow-cdc status
  verify   : airflow-cdc verify --conn-id {source} --table {table.id} --data-dir {data_dir} --events
"""  # noqa: S608 - printed help text, no SQL is run here


def main() -> int:
    from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
    from tools.workload import BackgroundWriter, create_demo_table, default_table

    t_start = time.monotonic()
    uri = os.environ.get("CDC_TEST_PG_URI", "postgresql://postgres@127.0.0.1:55432/cdc_test")
    rows = _int_env("CDC_DEMO_ROWS", 300_000)
    chunk_size = _int_env("CDC_DEMO_CHUNK_SIZE", 50_000)
    parallelism = _int_env("CDC_DEMO_PARALLELISM", 2)
    tps = _int_env("CDC_DEMO_WRITER_TPS", 100)
    threads = _int_env("CDC_DEMO_WRITER_THREADS", 3)
    loop_on = _int_env("CDC_DEMO_CHANGELOG_LOOP", 0) == 1
    base = os.environ.get("CDC_DATA_DIR", str(ROOT / ".cdc-local" / "data"))
    data_dir = storage.check_location(os.environ.get("CDC_DEMO_DATA_DIR", f"{base}/demo"), "CDC_DEMO_DATA_DIR")
    if storage.is_local(data_dir):
        data_dir = storage.local_path(data_dir)
        log_dir = Path(f"{data_dir}-logs")
    else:
        # Airflow's task logs stay on this machine; the data goes to object storage. Spark
        # reads staging through Hadoop paths (no S3 jars here): rounds of this size merge in
        # the worker with the Arrow engine, which reaches object storage through pyarrow.fs
        log_dir = ROOT / ".cdc-local" / "demo-logs"
        os.environ.setdefault("CDC_LOCAL_MAX_ROWS", str(max(rows, 100_000) * 4))
    table = default_table(uri)
    source = CONN_ID

    # the environment the DAGs read (also inherited by `airflow dags test` subprocesses)
    # the capture scope is the demo table (CDC_TABLES below: a FOR TABLE publication)
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = uri
    os.environ["CDC_CHANGELOG_SCHEDULE"] = "none"
    os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
    os.environ["CDC_SOURCE_CONN_ID"] = CONN_ID
    os.environ["CDC_TABLES"] = table.id
    os.environ["CDC_DATA_DIR"] = data_dir
    env = dict(os.environ)

    writer = None
    ok = False
    try:
        with CdcSourceHook(CONN_ID).get_dialect(source=source) as dialect:
            _say(f"source {uri} table {table.id}; data dir {data_dir}; Airflow logs {log_dir}")
            reset_demo_state(dialect, source, table, data_dir)
            if log_dir.exists():
                shutil.rmtree(log_dir)
            t0 = time.monotonic()
            n = create_demo_table(uri, table, rows)
            _say(f"1/6 created {table.id} with {n:,} rows in {time.monotonic() - t0:.1f}s")

            took = run_dag("cdc_changelog", env=env, log_dir=log_dir, tag="first")
            unpause_dag("cdc_snapshot")  # registered by that run (dags test syncs the whole folder)
            _say(f"2/6 cdc_changelog ran once ({took:.0f}s): replication slot in place, the log is captured from here")

            writer = BackgroundWriter(uri, table, threads=threads, rate=tps).start()
            _say(f"3/6 background writer started: {threads} connections, ~{tps} transactions/s")

            conf = {"action": "start", "tables": [table.id], "chunk_size": chunk_size, "parallelism": parallelism}
            side = " (cdc_changelog keeps running next to it)" if loop_on else ""
            _say(f"4/6 airflow dags test cdc_snapshot -c '{json.dumps(conf)}'{side}")
            t0 = time.monotonic()
            with ChangelogLoop(env, log_dir, enabled=loop_on) as loop:
                run_dag("cdc_snapshot", conf, env=env, log_dir=log_dir, tag="start")
            snap_s = time.monotonic() - t0
            _say(f"    snapshot done in {snap_s:.0f}s ({n / snap_s:,.0f} rows/s end to end, Airflow + Spark included)"
                 + (f"; cdc_changelog ran {loop.runs} times meanwhile" if loop_on else ""))
            for e in loop.errors[:2]:
                _say(f"    changelog run failed: {e.splitlines()[0]}")

            stats = writer.stop()
            writer = None
            _say(f"5/6 writer stopped: {stats.summary()}")
            runs = catch_up(dialect, data_dir, source, env=env, log_dir=log_dir)
            _say(f"    caught up: {runs} cdc_changelog run(s) until the catch-up watermark was staged and applied")

        _say(f"6/6 airflow-cdc verify --conn-id {CONN_ID} --table {table.id} --data-dir {data_dir} --events")
        cli = Path(sys.executable).with_name("airflow-cdc")
        cmd = [str(cli)] if cli.exists() else [sys.executable, "-m", "airflow_provider_cdc.cli"]
        proc = subprocess.run(
            [*cmd, "verify", "--conn-id", CONN_ID, "--table", table.id, "--data-dir", data_dir, "--events"],
            env=env, check=False,
        )
        subprocess.run([*cmd, "status", "--source", source], env=env, check=False)
        ok = proc.returncode == 0
        print(how_to_read(data_dir, source, table))
    except DagRunError as exc:
        print(f"\n{exc}\n", file=sys.stderr)
    finally:
        if writer is not None:
            writer.stop()
    total = time.monotonic() - t_start
    print(f"{'PASS' if ok else 'FAIL'}: demo of {rows:,} rows in {total:.0f}s "
          f"({'mirror equals the source, event log consistent' if ok else 'see the messages above'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
