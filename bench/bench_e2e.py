"""End-to-end benchmark: snapshot and changelog through the real DAGs, against raw baselines.

Everything a user would compare, measured in one run with its baseline next to it
(ratios; absolute times on a shared machine mean little alone), on the local
PostgreSQL and MariaDB:

* raw dump: the demo table (workload.create_demo_table: 8 mixed columns, ~130 bytes a
  row) to one Parquet file - PostgreSQL ``COPY (SELECT ...) TO STDOUT (FORMAT csv)``
  streamed through a pipe into pyarrow's CSV reader and a ParquetWriter; MariaDB a
  streaming (unbuffered) ``SELECT`` into pyarrow batches and a ParquetWriter;
* snapshot: ``airflow dags test cdc_snapshot`` (plan, chunk tasks, high-watermark
  sensor, spark-submit merge into the event log and the Delta mirror, commit), wall time
  of the whole run, idle source, and again while workload.BackgroundWriter commits
  small transactions from several connections: the writer's committed TPS before,
  during and after the snapshot (the drop in percent);
* changelog: N row changes (UPDATEs in 10k-row transactions), then one
  ``airflow dags test cdc_changelog`` (capture + spark-submit apply), against the raw
  decoder drain of the same changes (PostgreSQL: pg_logical_slot_peek_binary_changes on
  a copy of the slot; MariaDB: mysql-replication over the same binlog range, as in
  bench_postgres/bench_mysql) and against the capture alone (a child process);
* memory: the chunk step (low watermark, SELECT, Parquet, high watermark) and the
  capture each in a child process, peak RSS above the RSS just before the step (the
  peak is reset through /proc/self/clear_refs, read from VmHWM); the DAG runs sampled
  with psutil every 0.2 s: the Airflow process (tasks run inside ``airflow dags test``)
  and the Spark processes (JVM + Python driver) separately;
* fixed cost: the same snapshot DAG on a 1,000-row table.

Results: a Markdown table on stdout and in ``bench/results/<UTC time>.md`` plus the raw
figures in ``.json`` (git-ignored), with the machine, its load (``uptime``) and the
targets met or missed.

    python -m bench e2e                 # default size (the `make bench` run)
    python -m bench e2e --quick         # ~50k rows, a couple of minutes
    python -m bench e2e --rows 5000000 --changes 500000   # the full run of the issue
"""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:55432/cdc_test"
DEFAULT_MY = "mysql://root@127.0.0.1:53306/cdc_test"

TARGETS = {
    # issue 19's targets, each printed as met or missed
    "snapshot_ratio": 0.5,  # snapshot rows/s >= 0.5x the raw dump, idle source
    "changelog_ratio": 0.7,  # changelog DAG events/s >= 0.7x the raw decoder drain
    "tps_drop_pct": 10.0,  # committed write TPS drop while the snapshot runs <= 10%
    "chunk_mem_x": 3.0,  # chunk task peak memory <= 3x the chunk's size
    "fixed_cost_s": 5.0,  # one snapshot round on a tiny table <= 5 s
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench e2e", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="rows of the demo table (default 500,000: ~10-15 min for both databases on an idle 2-core machine; --quick 50,000)")
    ap.add_argument("--changes", type=int, default=None, help="row changes for the changelog run (default 100,000; --quick 20,000)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a couple of minutes")
    ap.add_argument("--dialects", default="postgres,mysql", help="comma list of postgres, mysql")
    ap.add_argument("--pg-uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--mysql-uri", default=os.environ.get("CDC_TEST_MYSQL_URI", DEFAULT_MY))
    ap.add_argument("--chunk-size", type=int, default=50_000, help="snapshot chunk size (rows)")
    ap.add_argument("--parallelism", type=int, default=2, help="snapshot ranges read at once")
    ap.add_argument("--mem-chunk-sizes", default="10000,50000,200000", help="chunk sizes of the memory probe")
    ap.add_argument("--writer-threads", type=int, default=4, help="connections of the write load")
    ap.add_argument("--writer-tps", type=float, default=200.0, help="offered write load, transactions/s (0 = as fast as possible)")
    ap.add_argument("--writer-window", type=float, default=None, help="seconds of writer-only load before and after the snapshot (default 20; --quick 8)")
    ap.add_argument("--no-load", action="store_true", help="skip the snapshot under write load")
    ap.add_argument("--local-max-rows", type=int, default=None,
                    help="CDC_LOCAL_MAX_ROWS of the DAG runs (rounds up to this many rows merge without spark-submit; "
                         "default: the DAGs' default, 100,000; 0 = always Spark)")
    ap.add_argument("--out", default=str(RESULTS), help="folder for <timestamp>.md/.json")
    ap.add_argument("--keep", action="store_true", help="keep tables, slots and staged data (for inspection)")
    a = ap.parse_args(argv)
    a.rows = a.rows if a.rows is not None else (50_000 if a.quick else 500_000)
    a.changes = a.changes if a.changes is not None else (20_000 if a.quick else 100_000)
    a.writer_window = a.writer_window if a.writer_window is not None else (8.0 if a.quick else 20.0)
    a.dialects = [d.strip() for d in a.dialects.split(",") if d.strip()]
    for d in a.dialects:
        if d not in ("postgres", "mysql"):
            ap.error(f"unknown dialect {d!r}; known: postgres, mysql")
    a.mem_chunk_sizes = sorted({int(x) for x in a.mem_chunk_sizes.split(",") if x.strip()})
    return a


def _say(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- machine
def machine() -> dict[str, Any]:
    import psutil

    os_name = platform.platform()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": os_name,
        "python": platform.python_version(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# --------------------------------------------------------------------------- memory sampling
class TreeSampler:
    """Peak RSS of a process tree, sampled: the root (``airflow dags test``: the tasks run
    inside it) and everything under a spark-submit (JVM + Python driver + workers)."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.interval = interval
        self.airflow_peak = 0
        self.spark_peak = 0
        self.other_peak = 0
        self.task_peak = 0  # the largest single process outside Spark (a task's own process)
        self.samples: list[tuple[float, int, int]] = []  # (unix time, Airflow process RSS, Spark RSS)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                air = self.root.memory_info().rss
                spark = other = 0
                spark_pids: set[int] = set()
                for ch in self.root.children(recursive=True):
                    try:
                        cmd = " ".join(ch.cmdline())
                        if ch.pid in spark_pids or "spark" in cmd.lower() or ch.name() == "java":
                            spark += ch.memory_info().rss
                            spark_pids.update(c.pid for c in ch.children(recursive=True))
                        else:
                            rss = ch.memory_info().rss
                            other += rss
                            self.task_peak = max(self.task_peak, rss)
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
                self.samples.append((time.time(), air, spark))
                self.airflow_peak = max(self.airflow_peak, air)
                self.spark_peak = max(self.spark_peak, spark)
                self.other_peak = max(self.other_peak, other)
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()


@dataclass
class DagRun:
    dag_id: str
    seconds: float
    log: Path
    airflow_peak_mb: float
    spark_peak_mb: float
    other_peak_mb: float
    cpu_s: float = 0.0  # user+sys CPU of the run's whole process tree (Airflow, spark-submit JVM, Python workers)
    text: str = field(repr=False, default="")
    samples: list = field(repr=False, default_factory=list)  # TreeSampler.samples

    def task_spans(self) -> list[tuple[str, float, float]]:
        """(task id, start, end) of every task instance, unix times, from the ``[DAG TEST]
        starting`` / ``end task`` lines of the run's log (``airflow dags test`` runs tasks one
        by one; the log's times are UTC)."""
        spans: list[tuple[str, float, float]] = []
        started: dict[tuple[str, str], float] = {}
        pat = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z .*\[DAG TEST\] (starting|end task) task_id=(\w+) map_index=(-?\d+)")
        for line in self.text.splitlines():
            m = pat.match(line)
            if not m:
                continue
            ts = dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.UTC).timestamp()
            key = (m.group(3), m.group(4))
            if m.group(2) == "starting":
                started[key] = ts
            elif key in started:
                spans.append((key[0], started.pop(key), ts))
        return spans

    def task_seconds(self) -> dict[str, float]:
        """Seconds per task (mapped instances summed)."""
        out: dict[str, float] = {}
        for task, start, end in self.task_spans():
            out[task] = out.get(task, 0.0) + end - start
        return out

    def task_memory(self) -> dict[str, dict[str, float]]:
        """Per task kind, from the samples taken while its instances ran: the Airflow process's
        peak RSS (MB; the tasks run inside it, so a task also holds what earlier ones left),
        how far that peak rose above the RSS at the task's start, and the Spark processes'
        peak (a spark-submit task's JVM, Python driver and workers)."""
        out: dict[str, dict[str, float]] = {}
        mb = 1 / 2**20
        for task, start, end in self.task_spans():
            during = [s for s in self.samples if start <= s[0] <= end]
            before = [s for s in self.samples if s[0] <= start]
            if not during:
                continue
            base = (before[-1] if before else during[0])[1]
            peak = max(s[1] for s in during)
            m = out.setdefault(task, {"airflow_peak_mb": 0.0, "rise_mb": 0.0, "spark_peak_mb": 0.0})
            m["airflow_peak_mb"] = max(m["airflow_peak_mb"], peak * mb)
            m["rise_mb"] = max(m["rise_mb"], (peak - base) * mb)
            m["spark_peak_mb"] = max(m["spark_peak_mb"], max(s[2] for s in during) * mb)
        return out

    def merge_summary(self) -> dict | None:
        m = re.search(r"CDC_MERGE_RESULT (\{.*?\})", self.text)
        return json.loads(m.group(1)) if m else None


def run_dag(dag_id: str, conf: dict | None, env: dict[str, str], log_dir: Path, tag: str, timeout: float = 7200) -> DagRun:
    """``airflow dags test`` as a subprocess (as demo.run_dag), sampled for memory."""
    from tools.demo import DagRunError, airflow_bin

    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{dag_id}-{tag}-{time.strftime('%H%M%S')}.log"
    cmd = [airflow_bin(), "dags", "test", dag_id]
    if conf is not None:
        cmd += ["-c", json.dumps(conf)]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with open(log_path, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
        with TreeSampler(proc.pid) as s:
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    took = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    text = log_path.read_text(errors="replace")
    if rc != 0:
        tail = "\n".join(text.splitlines()[-40:])
        raise DagRunError(f"`airflow dags test {dag_id}` failed (exit {rc}) after {took:.0f}s; log {log_path}\n{tail}")
    mb = 1 / 2**20
    return DagRun(dag_id, took, log_path, s.airflow_peak * mb, s.spark_peak * mb, s.other_peak * mb, cpu, text, s.samples)


_EMPTY_DAG = """
import pendulum
from airflow.sdk import DAG, task

with DAG("cdc_bench_empty", schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False):
    @task
    def step(i):
        return i

    prev = None
    for i in range({tasks}):
        t = step.override(task_id=f"step_{{i}}")(i)
        if prev is not None:
            prev >> t
        prev = t
"""


def run_empty_dag(env: dict[str, str], log_dir: Path, tasks: int) -> DagRun:
    """``airflow dags test`` of a DAG of ``tasks`` chained no-op tasks, in a DAG folder of its
    own: Airflow's own cost of a run, the floor under our fixed cost of a round."""
    folder = log_dir / "empty_dag"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cdc_bench_empty.py").write_text(_EMPTY_DAG.format(tasks=tasks))
    return run_dag("cdc_bench_empty", None, dict(env, AIRFLOW__CORE__DAGS_FOLDER=str(folder)), log_dir, "empty")


# --------------------------------------------------------------------------- child probes
_CHILD_PRELUDE = r"""
import json, os, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0
"""

_CHUNK_CHILD = _CHILD_PRELUDE + r"""
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
a = json.loads(sys.argv[1])
params = ConnectionParams.from_uri(a["uri"])
out = []
with get_dialect(params, source=a["source"], tables=[TableName.parse(a["table"])]) as d:
    schema = d.describe_table(TableName.parse(a["table"]))
    snapshot_chunk(d, schema, FULL_RANGE, data_dir=a["dir"], snapshot_id="warm", seq=0, limit=100)  # imports, connections
    for i, size in enumerate(a["sizes"]):
        before = rss(); ok = reset_peak()
        t = time.perf_counter()
        r = snapshot_chunk(d, schema, FULL_RANGE, data_dir=a["dir"], snapshot_id="probe", seq=i + 1, limit=size)
        took = time.perf_counter() - t
        out.append({"size": size, "rows": r.rows, "seconds": took, "rss_before": before, "peak": hwm(), "reset": ok,
                    "parquet_bytes": os.path.getsize(r.path)})
print("RESULT " + json.dumps(out))
"""

_CAPTURE_CHILD = _CHILD_PRELUDE + r"""
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.capture import stage_changelog
a = json.loads(sys.argv[1])
params = ConnectionParams.from_uri(a["uri"])
with get_dialect(params, source=a["source"], tables=[TableName.parse(a["table"])], **a["options"]) as d:
    if a.get("offset"):
        d.commit_offset(a["offset"], a["dir"])
    d.load_offset(a["dir"])  # connections, slot check
    import pyarrow.parquet  # noqa: F401 - imported before the peak is reset
    before = rss(); ok = reset_peak()
    t = time.perf_counter()
    r = stage_changelog(d, a["dir"])
    took = time.perf_counter() - t
print("RESULT " + json.dumps({"events": r.events, "watermarks": r.watermarks, "seconds": took, "rss_before": before, "peak": hwm(), "reset": ok,
                              "segment_bytes": sum(os.path.getsize(p) for p in (r.segments or ([r.segment] if r.segment else []))),
                              "segments": len(r.segments or ([r.segment] if r.segment else []))}))
"""


_WARM_ROUND_CHILD = r"""
import json, sys, time
a = json.loads(sys.argv[1])
from airflow_provider_cdc.dag_builders import snapshot_dag
dag = snapshot_dag("cdc_snapshot")
out = []
for i in range(a["runs"]):
    t = time.monotonic()
    dr = dag.test(run_conf=a["conf"])
    took = time.monotonic() - t
    if dr.state != "success":
        raise SystemExit(f"dag.test() run {i + 1} of cdc_snapshot ended {dr.state}")
    out.append(took)
print("RESULT " + json.dumps(out))
"""


def warm_rounds(conf: dict, env: dict[str, str], runs: int = 3) -> list[float]:
    """Wall seconds of ``runs`` snapshot rounds one after the other in one Python process
    (``dag.test()``): the first pays the imports and Airflow's in-process set-up, the later
    ones are what a round costs our code and Airflow's task handling once warm."""
    return run_child(_WARM_ROUND_CHILD, {"conf": conf, "runs": runs}, env=env)


def run_child(code: str, arg: dict, timeout: float = 3600, env: dict[str, str] | None = None) -> Any:
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(arg)], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        check=False, env=env,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"probe failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


# --------------------------------------------------------------------------- raw dumps
_ARROW_TYPES = None


def _arrow_types():
    import pyarrow as pa

    return {
        "id": pa.int64(),
        "name": pa.string(),
        "amount": pa.decimal128(12, 2),
        "updated_at": pa.timestamp("us", tz="UTC"),
        "active": pa.bool_(),
        "attrs": pa.string(),
        "payload": pa.binary(),
        "note": pa.string(),
    }


def raw_dump_pg(uri: str, qtable: str, path: Path) -> int:
    """COPY ... TO STDOUT (CSV) -> pipe -> pyarrow streaming CSV reader -> ParquetWriter.
    bytea stays hex text here (PostgreSQL's CSV form); everything else is typed."""
    import psycopg2
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from tools.workload import COLUMNS

    types = dict(_arrow_types(), payload=pa.string())
    rfd, wfd = os.pipe()
    err: list[BaseException] = []

    def produce() -> None:
        conn = psycopg2.connect(uri)
        try:
            with os.fdopen(wfd, "wb", buffering=1 << 20) as w, conn.cursor() as cur:
                cur.copy_expert(f"COPY (SELECT * FROM {qtable}) TO STDOUT WITH (FORMAT csv)", w, size=1 << 20)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            err.append(exc)
        finally:
            conn.close()

    th = threading.Thread(target=produce, daemon=True)
    th.start()
    rows = 0
    with os.fdopen(rfd, "rb") as r:
        reader = pcsv.open_csv(
            r,
            read_options=pcsv.ReadOptions(column_names=list(COLUMNS), block_size=8 << 20),
            convert_options=pcsv.ConvertOptions(
                column_types=types, true_values=["t"], false_values=["f"], strings_can_be_null=True,
                quoted_strings_can_be_null=False,
            ),
        )
        with pq.ParquetWriter(path, reader.schema) as pw:
            for batch in reader:
                pw.write_batch(batch)
                rows += batch.num_rows
    th.join()
    if err:
        raise err[0]
    return rows


def raw_dump_mysql(uri: str, qtable: str, path: Path, batch: int = 20_000) -> int:
    """Streaming SELECT (unbuffered cursor) -> pyarrow batches -> ParquetWriter."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pymysql
    import pymysql.cursors

    from airflow_provider_cdc.dialects import ConnectionParams
    from tools.workload import COLUMNS

    p = ConnectionParams.from_uri(uri)
    types = _arrow_types()
    schema = pa.schema([(c, types[c]) for c in COLUMNS])
    conn = pymysql.connect(
        host=p.host, port=p.port or 3306, user=p.user or "root", password=p.password or "", charset="utf8mb4",
        cursorclass=pymysql.cursors.SSCursor, init_command="SET time_zone = '+00:00'",
    )
    rows = 0
    try:
        with conn.cursor() as cur, pq.ParquetWriter(path, schema) as pw:
            cur.execute(f"SELECT * FROM {qtable}")
            while fetched := cur.fetchmany(batch):
                cols = list(zip(*fetched, strict=True))
                cols[4] = [None if v is None else bool(v) for v in cols[4]]
                pw.write_batch(pa.record_batch([pa.array(c, type=schema.field(i).type) for i, c in enumerate(cols)], schema=schema))
                rows += len(fetched)
    finally:
        conn.close()
    return rows


# --------------------------------------------------------------------------- one source
@dataclass
class Src:
    """One database under test and the Airflow environments pointed at it."""

    kind: str  # postgres | mysql
    uri: str
    u: str
    work: Path
    envs: list[dict] = field(default_factory=list)  # every env made: cleanup drops their slots/Variables
    local_max_rows: int | None = None  # CDC_LOCAL_MAX_ROWS of the DAG runs (None: the DAGs' default)

    @property
    def params(self):
        from airflow_provider_cdc.dialects import ConnectionParams

        return ConnectionParams.from_uri(self.uri)

    def table(self, suffix: str):
        from tools.workload import default_table

        return default_table(self.uri, f"bench_e2e_{self.u}_{suffix}")

    def qtable(self, t) -> str:
        from tools.workload import quote_table

        return quote_table(self.params, t)

    def env(self, tag: str, tables) -> dict:
        """Environment of ``airflow dags test`` for a fresh source (own conn id, slot,
        publication, staging): runs never see each other's log or mirror."""
        conn_id = f"cdc_bench_{tag}"
        source = f"bench_{self.u}_{self.kind[:2]}_{tag}"
        q = {}
        if self.kind == "postgres":
            q.update(slot_name=source, publication_name=source)
        else:
            q["server_id"] = str(1_000_000 + uuid.uuid4().int % 1_000_000_000)
        sep = "&" if "?" in self.uri else "?"
        from urllib.parse import urlencode

        conn_uri = self.uri + (sep + urlencode(q) if q else "")
        data = self.work / f"data-{self.kind}-{tag}"
        e = dict(os.environ)
        e.update({
            f"AIRFLOW_CONN_{conn_id.upper()}": conn_uri,
            "CDC_SOURCE_CONN_ID": conn_id,
            "CDC_SOURCE": source,
            "CDC_TABLES": ",".join(t.id for t in tables),
            "CDC_DATA_DIR": str(data),
            "CDC_CHANGELOG_SCHEDULE": "none",
            "CDC_SNAPSHOT_SCHEDULE": "",
        })
        if self.local_max_rows is not None:
            e["CDC_LOCAL_MAX_ROWS"] = str(self.local_max_rows)
        rec = {"env": e, "conn_uri": conn_uri, "source": source, "data": data, "tables": list(tables), "opts": q}
        self.envs.append(rec)
        return rec

    def dialect(self, rec: dict):
        from airflow_provider_cdc.dialects import ConnectionParams, get_dialect

        opts = dict(rec["opts"])
        opts["tables"] = rec["tables"]
        if "server_id" in opts:
            opts["server_id"] = int(opts["server_id"])
        return get_dialect(ConnectionParams.from_uri(self.uri), source=rec["source"], **opts)

    def cleanup(self) -> None:
        from airflow_provider_cdc import airflow_variables

        for rec in self.envs:
            if self.kind == "postgres":
                try:
                    with self.dialect(rec) as d:
                        d.drop_slot()
                        d.drop_publication()
                except Exception as exc:  # noqa: BLE001 - report, continue cleaning
                    _say(f"cleanup of slot {rec['source']}: {exc}")
            try:
                from airflow.models.variable import Variable

                for t in rec["tables"]:
                    Variable.delete(airflow_variables.variable_key(rec["source"], t.id))
            except Exception:  # noqa: BLE001 - absent Variables are fine
                pass


def _rows_bytes(src: Src, t) -> float:
    """Average stored row size on the source (the unit of "chunk size" in bytes)."""
    from tools.workload import connect

    conn = connect(src.params)
    try:
        cur = conn.cursor()
        if src.kind == "postgres":
            cur.execute(f"SELECT avg(pg_column_size(s.*)) FROM (SELECT * FROM {src.qtable(t)} LIMIT 20000) s")
        else:
            cur.execute(
                "SELECT AVG(LENGTH(`name`) + 7 + 8 + 1 + LENGTH(`attrs`) + COALESCE(LENGTH(`payload`), 0) + COALESCE(LENGTH(`note`), 0) + 8)"
                f" FROM (SELECT * FROM {src.qtable(t)} LIMIT 20000) s"
            )
        v = cur.fetchone()[0]
        conn.commit()
        return float(v or 0)
    finally:
        conn.close()


def _change_rows(src: Src, t, n: int, batch: int = 10_000) -> float:
    """n row changes: UPDATEs of ids 1..n (wrapping), 10k rows per transaction."""
    from tools.workload import connect, count_rows, quote_ident

    total = count_rows(src.params, t)
    conn = connect(src.params)
    q = lambda c: quote_ident(src.params, c)  # noqa: E731
    t0 = time.monotonic()
    try:
        cur = conn.cursor()
        done = 0
        while done < n:
            lo = done % max(total, 1) + 1
            k = min(batch, n - done, total - lo + 1)
            cur.execute(
                f"UPDATE {src.qtable(t)} SET {q('amount')} = {q('amount')} + 1, {q('active')} = NOT {q('active')} "
                f"WHERE {q('id')} >= %s AND {q('id')} < %s",
                (lo, lo + k),
            )
            conn.commit()
            done += cur.rowcount if cur.rowcount > 0 else k
    finally:
        conn.close()
    return time.monotonic() - t0


def _writer_window(writer, seconds: float) -> float:
    c0, t0 = writer.committed, time.monotonic()
    time.sleep(seconds)
    return (writer.committed - c0) / (time.monotonic() - t0)


# --------------------------------------------------------------------------- the phases
def bench_source(src: Src, a: argparse.Namespace) -> dict[str, Any]:
    from tools.workload import BackgroundWriter, create_demo_table

    R: dict[str, Any] = {"kind": src.kind, "rows": a.rows, "changes": a.changes}
    big, tiny = src.table("big"), src.table("tiny")
    logs = src.work / f"logs-{src.kind}"
    t0 = time.monotonic()
    R["rows_loaded"] = create_demo_table(src.uri, big, a.rows)
    create_demo_table(src.uri, tiny, 1_000)
    R["row_bytes"] = _rows_bytes(src, big)
    _say(f"{src.kind}: {big.id} loaded with {R['rows_loaded']:,} rows (~{R['row_bytes']:.0f} B/row) in {time.monotonic() - t0:.0f}s")

    # --- raw dump baseline (idle)
    dump = src.work / f"raw-{src.kind}.parquet"
    t0, c0 = time.monotonic(), time.process_time()
    n = (raw_dump_pg if src.kind == "postgres" else raw_dump_mysql)(src.uri, src.qtable(big), dump)
    R["raw_dump_s"] = time.monotonic() - t0
    R["raw_dump_cpu_s"] = time.process_time() - c0
    R["raw_dump_rows"] = n
    R["raw_dump_rps"] = n / R["raw_dump_s"]
    R["raw_dump_bytes"] = dump.stat().st_size
    _say(f"{src.kind}: raw dump {n:,} rows in {R['raw_dump_s']:.1f}s = {R['raw_dump_rps']:,.0f} rows/s")

    # --- fixed cost: a snapshot round of a 1,000-row table
    fx = src.env("fixed", [tiny])
    conf = {"action": "start", "tables": [tiny.id], "chunk_size": a.chunk_size, "parallelism": 1}
    r = run_dag("cdc_snapshot", conf, fx["env"], logs, "fixed")
    R["fixed_cost_s"] = r.seconds
    R["fixed_cost_cpu_s"] = r.cpu_s
    R["fixed_tasks"] = r.task_seconds()
    R["fixed_merge"] = r.merge_summary()
    _say(f"{src.kind}: fixed cost of a snapshot round (1,000 rows): {r.seconds:.1f}s; tasks {R['fixed_tasks']}")
    # the same round with the merge forced through spark-submit (CDC_LOCAL_MAX_ROWS=0)
    fxs = src.env("fixedspark", [tiny])
    fxs["env"]["CDC_LOCAL_MAX_ROWS"] = "0"
    r = run_dag("cdc_snapshot", conf, fxs["env"], logs, "fixedspark")
    R["fixed_cost_spark_s"] = r.seconds
    R["fixed_cost_spark_cpu_s"] = r.cpu_s
    R["fixed_spark_tasks"] = r.task_seconds()
    _say(f"{src.kind}: the same round through spark-submit: {r.seconds:.1f}s; tasks {R['fixed_spark_tasks']}")
    # the baseline of the fixed cost: Airflow's own `dags test` of a DAG as long whose tasks do nothing
    r = run_empty_dag(fx["env"], logs, len(R["fixed_tasks"]) or 6)
    R["airflow_floor_s"] = r.seconds
    _say(f"{src.kind}: airflow dags test of an empty {len(R['fixed_tasks']) or 6}-task DAG: {r.seconds:.1f}s")
    # the same round again and again in one warm process (dag.test()): the fixed cost without a process start
    R["fixed_cost_warm_s"] = warm_rounds(conf, src.env("warm", [tiny])["env"])
    _say(f"{src.kind}: the same round in one process, dag.test() run after run: "
         + ", ".join(f"{s:.1f}s" for s in R["fixed_cost_warm_s"]))

    # --- snapshot, idle source
    idle = src.env("idle", [big])
    conf = {"action": "start", "tables": [big.id], "chunk_size": a.chunk_size, "parallelism": a.parallelism}
    r = run_dag("cdc_snapshot", conf, idle["env"], logs, "idle")
    R["snap_idle_s"] = r.seconds
    R["snap_idle_cpu_s"] = r.cpu_s
    R["snap_idle_rps"] = a.rows / r.seconds
    R["snap_idle_ratio"] = R["snap_idle_rps"] / R["raw_dump_rps"]
    R["snap_idle_tasks"] = r.task_seconds()
    R["snap_idle_merge"] = r.merge_summary()
    R["mem_snapshot_airflow_mb"] = r.airflow_peak_mb
    R["mem_merge_spark_mb"] = r.spark_peak_mb
    _say(
        f"{src.kind}: snapshot idle {r.seconds:.1f}s = {R['snap_idle_rps']:,.0f} rows/s, ratio {R['snap_idle_ratio']:.2f}; "
        f"airflow peak {r.airflow_peak_mb:.0f} MB, spark peak {r.spark_peak_mb:.0f} MB; tasks {R['snap_idle_tasks']}"
    )
    if (R["snap_idle_merge"] or {}).get("engine", "spark") == "spark":
        # the same snapshot with the round merged in the worker (CDC_LOCAL_MAX_ROWS above the table)
        il = src.env("idlelocal", [big])
        il["env"]["CDC_LOCAL_MAX_ROWS"] = str(max(a.rows, 1) * 10)
        r = run_dag("cdc_snapshot", conf, il["env"], logs, "idlelocal")
        R["snap_idle_local_s"] = r.seconds
        R["snap_idle_local_rps"] = a.rows / r.seconds
        R["snap_idle_local_ratio"] = R["snap_idle_local_rps"] / R["raw_dump_rps"]
        R["snap_idle_local_tasks"] = r.task_seconds()
        R["mem_snapshot_local_airflow_mb"] = r.airflow_peak_mb
        _say(f"{src.kind}: snapshot idle, merged in the worker: {r.seconds:.1f}s = {R['snap_idle_local_rps']:,.0f} rows/s, "
             f"ratio {R['snap_idle_local_ratio']:.2f}; airflow peak {r.airflow_peak_mb:.0f} MB; tasks {R['snap_idle_local_tasks']}")

    # --- changelog: N changes, capture + apply, against the raw drain and the capture alone
    with src.dialect(idle) as d:
        # stage + apply what the snapshot left (its watermarks): a changelog round with ~nothing to do
        r0 = run_dag("cdc_changelog", None, idle["env"], logs, "catchup")
        R["changelog_small_s"] = r0.seconds
        R["changelog_small_tasks"] = r0.task_seconds()
        pg_copies: list[str] = []
        if src.kind == "postgres":
            import psycopg2

            admin = psycopg2.connect(src.uri)
            admin.autocommit = True
            cur = admin.cursor()
            for i in range(2):
                name = f"{d.slot_name}_c{i}"[:63]
                cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (d.slot_name, name))
                pg_copies.append(name)
            start = None
        else:
            start = d.binlog_end()
        try:
            R["changes_load_s"] = _change_rows(src, big, a.changes)
            # raw decoder drain of the same changes
            t0 = time.monotonic()
            if src.kind == "postgres":
                from bench.bench_postgres import _raw_drain

                raw = _raw_drain(cur, pg_copies[0], d.publication_name)
            else:
                from bench.bench_mysql import _raw_drain

                end = d.binlog_end()
                raw = _raw_drain(src.params, start, end, big.schema, big.name)
            R["raw_drain_s"] = time.monotonic() - t0
            R["raw_drain_events"] = raw
            R["raw_drain_eps"] = raw / R["raw_drain_s"]
            # capture alone, in a child process (throughput and peak memory)
            opts: dict[str, Any] = {}
            arg = {"uri": src.uri, "table": big.id, "source": f"{idle['source']}_probe", "dir": str(src.work / f"capprobe-{src.kind}")}
            if src.kind == "postgres":
                opts = {"slot_name": pg_copies[1], "publication_name": d.publication_name}
            else:
                opts = {"server_id": 2_000_000 + uuid.uuid4().int % 1_000_000_000}
                arg["offset"] = start.to_json()
            arg["options"] = opts
            cap = run_child(_CAPTURE_CHILD, arg)
            R["capture_alone"] = cap
            R["capture_alone_eps"] = cap["events"] / cap["seconds"] if cap["seconds"] else 0.0
            # through the DAG
            r = run_dag("cdc_changelog", None, idle["env"], logs, "changes")
            m = re.search(r"captured (\d+) events \((\d+) watermarks\).*? in ([\d.]+) s", r.text)
            ev = int(m.group(1)) if m else a.changes
            R.update(
                changelog_s=r.seconds,
                changelog_cpu_s=r.cpu_s,
                changelog_events=ev,
                changelog_eps=ev / r.seconds,
                changelog_capture_task_s=float(m.group(3)) if m else None,
                changelog_tasks=r.task_seconds(),
                changelog_ratio=(ev / r.seconds) / R["raw_drain_eps"],
                mem_capture_airflow_mb=r.airflow_peak_mb,
                mem_apply_spark_mb=r.spark_peak_mb,
            )
            _say(
                f"{src.kind}: changelog {ev:,} events in {r.seconds:.1f}s = {R['changelog_eps']:,.0f} ev/s "
                f"(capture alone {R['capture_alone_eps']:,.0f} ev/s, raw drain {raw:,} in {R['raw_drain_s']:.1f}s = "
                f"{R['raw_drain_eps']:,.0f} ev/s); airflow peak {r.airflow_peak_mb:.0f} MB, spark peak {r.spark_peak_mb:.0f} MB"
            )
        finally:
            if src.kind == "postgres":
                for s in pg_copies:
                    cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (s,))
                admin.close()

    # --- snapshot under write load
    if not a.no_load:
        ld = src.env("load", [big])
        # the source's write capacity here (unthrottled, no snapshot): what the offered load is a share of
        probe = BackgroundWriter(src.uri, big, threads=a.writer_threads, rate=None, key_max=a.rows, seed=3).start()
        try:
            time.sleep(2.0)
            R["tps_max_idle"] = _writer_window(probe, 8.0)
        finally:
            probe.stop()
        writer = BackgroundWriter(
            src.uri, big, threads=a.writer_threads, rate=a.writer_tps or None, key_max=a.rows, seed=7
        ).start()
        try:
            time.sleep(2.0)  # connections up, steady state
            before = _writer_window(writer, a.writer_window)
            c0, t0 = writer.committed, time.monotonic()
            r = run_dag("cdc_snapshot", conf, ld["env"], logs, "load")
            during = (writer.committed - c0) / (time.monotonic() - t0)
            after = _writer_window(writer, a.writer_window)
        finally:
            stats = writer.stop()
        base = (before + after) / 2
        R.update(
            snap_load_s=r.seconds,
            snap_load_rps=a.rows / r.seconds,
            snap_load_ratio=a.rows / r.seconds / R["raw_dump_rps"],
            tps_before=before,
            tps_during=during,
            tps_after=after,
            tps_drop_pct=(1 - during / base) * 100 if base > 0 else float("nan"),
            writer=stats.summary(),
            writer_errors=stats.errors[:3],
        )
        _say(
            f"{src.kind}: snapshot under load {r.seconds:.1f}s = {R['snap_load_rps']:,.0f} rows/s (ratio {R['snap_load_ratio']:.2f}); "
            f"writer TPS before {before:.0f}, during {during:.0f}, after {after:.0f}: drop {R['tps_drop_pct']:.1f}%"
        )

    # --- chunk memory against the chunk size (child process)
    sizes = [s for s in a.mem_chunk_sizes if s <= a.rows] or [min(a.rows, a.chunk_size)]
    mem = []
    for size in sizes:  # a fresh process per size: no heap left over from a bigger step
        mem += run_child(
            _CHUNK_CHILD,
            {"uri": src.uri, "table": big.id, "source": f"{idle['source']}_mem", "dir": str(src.work / f"memprobe-{src.kind}"), "sizes": [size]},
        )
    for m in mem:
        m["chunk_bytes"] = m["rows"] * R["row_bytes"]
        m["peak_above_mb"] = max(m["peak"] - m["rss_before"], 0) / 2**20
        m["x_chunk"] = (m["peak"] - m["rss_before"]) / m["chunk_bytes"] if m["chunk_bytes"] else float("nan")
    R["chunk_mem"] = mem
    _say(
        f"{src.kind}: chunk peak above baseline: "
        + ", ".join(f"{m['rows']:,} rows -> {m['peak_above_mb']:.0f} MB ({m['x_chunk']:.1f}x)" for m in mem)
    )
    if not a.keep:
        from tools.workload import drop_table

        drop_table(src.uri, big)
        drop_table(src.uri, tiny)
    return R


# --------------------------------------------------------------------------- report
def _f(v: Any, fmt: str = ",.0f") -> str:
    if v is None:
        return "-"
    try:
        return format(v, fmt)
    except (TypeError, ValueError):
        return str(v)


def _ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v >= 0.1 else f"{v:.3f}"


def _net(r: dict) -> str:
    """Rows/s of the idle snapshot once the fixed cost of a round is taken off: what the
    data-proportional part (chunk reads, merge, sink writes) achieves."""
    net = r["snap_idle_s"] - r["fixed_cost_s"]
    if net <= 0:
        return "- (within the fixed cost)"
    rps = r["rows"] / net
    return f"{_f(rps)} ({_ratio(rps / r['raw_dump_rps'])})"


def _net_changelog(r: dict) -> str:
    """Events/s of the changelog run once the time of a run with ~nothing to do (the same
    DAG, its harness and every task's start) is taken off: what capture + apply achieve on
    the data, against the raw drain."""
    net = r["changelog_s"] - r["changelog_small_s"]
    if net <= 0:
        return "- (within the fixed cost)"
    eps = r["changelog_events"] / net
    return f"{_f(eps)} ({_ratio(eps / r['raw_drain_eps'])})"


def _tasks(t: dict | None) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in (t or {}).items()) or "-"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "**MISSED**")


def render(results: list[dict], a: argparse.Namespace, mach: dict, load_end: str, started: str) -> str:
    cols = [r["kind"] for r in results]
    head = "| | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols) + "\n"

    def row(label: str, fn) -> str:
        return f"| {label} | " + " | ".join(fn(r) for r in results) + " |\n"

    out = [
        f"# bench e2e, {started}\n",
        f"Machine: {mach['cpus']} cores, {mach['mem_gib']} GiB, {mach['os']}, Python {mach['python']}; "
        f"load average at start {mach['load_start']}, at end: `{load_end}`.\n",
        f"Table: {a.rows:,} rows (demo table, 8 mixed columns); chunk size {a.chunk_size:,}, parallelism {a.parallelism}; "
        f"write load {a.writer_threads} connections at {'max' if not a.writer_tps else f'{a.writer_tps:.0f} offered'} TPS; "
        f"{a.changes:,} changes for the changelog.\n",
        "\n## Snapshot\n\n",
        head,
        row("avg row on the source (bytes)", lambda r: _f(r["row_bytes"])),
        row("raw dump to Parquet (rows/s)", lambda r: f"{_f(r['raw_dump_rps'])} ({r['raw_dump_s']:.1f} s)"),
        row("snapshot via DAGs, idle (rows/s)", lambda r: f"{_f(r['snap_idle_rps'])} ({r['snap_idle_s']:.1f} s)"),
        row("**ratio snapshot / raw dump, idle**", lambda r: f"**{_ratio(r['snap_idle_ratio'])}**"),
        row("snapshot net of the fixed cost (rows/s, ratio)", lambda r: _net(r)),
        row("snapshot idle, round merged in the worker (CDC_LOCAL_MAX_ROWS above the table; rows/s, ratio)",
            lambda r: f"{_f(r.get('snap_idle_local_rps'))} ({_f(r.get('snap_idle_local_s'), '.1f')} s), {_f(r.get('snap_idle_local_ratio'), '.3f')}"),
        row("tasks of that run (s); peak of its Airflow process",
            lambda r: f"{_tasks(r.get('snap_idle_local_tasks'))}; {_f(r.get('mem_snapshot_local_airflow_mb'), '.0f')} MB"),
        row("snapshot under write load (rows/s)", lambda r: f"{_f(r.get('snap_load_rps'))} ({_f(r.get('snap_load_s'), '.1f')} s)"),
        row("ratio under load / raw dump idle", lambda r: _ratio(r.get("snap_load_ratio"))),
        row("source write capacity, unthrottled, no snapshot (TPS)", lambda r: _f(r.get("tps_max_idle"))),
        row("writer TPS before / during / after", lambda r: f"{_f(r.get('tps_before'))} / {_f(r.get('tps_during'))} / {_f(r.get('tps_after'))}"),
        row("**write TPS drop while snapshotting**", lambda r: f"**{_f(None if r.get('tps_drop_pct') is None else r['tps_drop_pct'] + 0.0, '.1f')}%**"),
        row("**fixed cost of a round (1,000 rows)**", lambda r: f"**{r['fixed_cost_s']:.1f} s**"),
        row("Airflow's own `dags test` of an empty DAG with as many tasks (s); fixed cost above it",
            lambda r: "-" if r.get("airflow_floor_s") is None else
            f"{r['airflow_floor_s']:.1f}; {r['fixed_cost_s'] - r['airflow_floor_s']:.1f} s"),
        row("the same round run after run in one warm process, `dag.test()` (s): first, then the best of the rest",
            lambda r: "-" if not r.get("fixed_cost_warm_s") else
            f"{r['fixed_cost_warm_s'][0]:.1f}, then {min(r['fixed_cost_warm_s'][1:] or r['fixed_cost_warm_s']):.1f}"),
        row("client CPU s: raw dump / fixed-cost run / idle snapshot run", lambda r: f"{_f(r.get('raw_dump_cpu_s'), '.1f')} / {_f(r.get('fixed_cost_cpu_s'), '.1f')} / {_f(r.get('snap_idle_cpu_s'), '.1f')}"),
        row("tasks of the fixed-cost run (s)", lambda r: _tasks(r.get("fixed_tasks"))),
        row("tasks of the idle snapshot run (s)", lambda r: _tasks(r.get("snap_idle_tasks"))),
        row("fixed cost with the merge forced through spark-submit (s)", lambda r: _f(r.get("fixed_cost_spark_s"), ".1f")),
        row("tasks of that run (s)", lambda r: _tasks(r.get("fixed_spark_tasks"))),
        row("merge engine: fixed / idle", lambda r: f"{(r.get('fixed_merge') or {}).get('engine', 'spark')} / {(r.get('snap_idle_merge') or {}).get('engine', 'spark')}"),
        row("merge job seconds (after Spark start): fixed / idle", lambda r: f"{_f((r.get('fixed_merge') or {}).get('seconds'), '.1f')} / {_f((r.get('snap_idle_merge') or {}).get('seconds'), '.1f')}"),
        "\n## Changelog\n\n",
        head,
        row("changes (UPDATE rows)", lambda r: _f(r["changes"])),
        row("raw decoder drain (events/s)", lambda r: f"{_f(r['raw_drain_eps'])} ({r['raw_drain_events']:,} in {r['raw_drain_s']:.1f} s)"),
        row("capture alone, child process (events/s)", lambda r: _f(r["capture_alone_eps"])),
        row("capture + apply via cdc_changelog (events/s)", lambda r: f"{_f(r['changelog_eps'])} ({r['changelog_events']:,} in {r['changelog_s']:.1f} s)"),
        row("**ratio DAG / raw drain**", lambda r: f"**{_ratio(r['changelog_ratio'])}**"),
        row("ratio capture alone / raw drain", lambda r: _ratio(r["capture_alone_eps"] / r["raw_drain_eps"])),
        row("changelog net of a run with ~nothing to do (events/s, ratio)", _net_changelog),
        row("client CPU s of the changes run (Airflow + Spark)", lambda r: _f(r.get("changelog_cpu_s"), ".1f")),
        row("capture task inside the DAG (s)", lambda r: _f(r.get("changelog_capture_task_s"), ".1f")),
        row("cdc_changelog run with ~nothing to do (s)", lambda r: _f(r["changelog_small_s"], ".1f")),
        row("tasks of that run (s)", lambda r: _tasks(r.get("changelog_small_tasks"))),
        row("tasks of the changes run (s)", lambda r: _tasks(r.get("changelog_tasks"))),
        "\n## Memory (peak RSS)\n\n",
        head,
    ]
    sizes = sorted({m["size"] for r in results for m in r["chunk_mem"]})
    for s in sizes:
        def cell(r, s=s):
            m = next((m for m in r["chunk_mem"] if m["size"] == s), None)
            if m is None:
                return "-"
            return f"{m['peak_above_mb']:.1f} MB = {m['x_chunk']:.1f}x chunk ({m['chunk_bytes'] / 2**20:.1f} MB)"

        out.append(row(f"chunk step, {s:,} rows (above RSS before)", cell))
    out += [
        row("capture step, child (above RSS before)", lambda r: f"{(r['capture_alone']['peak'] - r['capture_alone']['rss_before']) / 2**20:.0f} MB for {r['capture_alone']['events']:,} events"),
        row("airflow dags test process, snapshot run", lambda r: f"{r['mem_snapshot_airflow_mb']:.0f} MB"),
        row("airflow dags test process, changelog run", lambda r: f"{r['mem_capture_airflow_mb']:.0f} MB"),
        row("Spark (JVM + Python driver), merge", lambda r: f"{r['mem_merge_spark_mb']:.0f} MB"),
        row("Spark (JVM + Python driver), apply", lambda r: f"{r['mem_apply_spark_mb']:.0f} MB"),
        "\n## Targets\n\n",
        head,
        row(f"snapshot >= {TARGETS['snapshot_ratio']}x raw dump (idle)", lambda r: _met(r["snap_idle_ratio"] >= TARGETS["snapshot_ratio"])),
        row(f"changelog DAG >= {TARGETS['changelog_ratio']}x raw decoder drain",
            lambda r: _met(None if r.get("changelog_ratio") is None else r["changelog_ratio"] >= TARGETS["changelog_ratio"])),
        row(f"write-TPS drop < {TARGETS['tps_drop_pct']:.0f}%", lambda r: _met(None if r.get("tps_drop_pct") is None else r["tps_drop_pct"] < TARGETS["tps_drop_pct"])),
        row(f"chunk peak < {TARGETS['chunk_mem_x']:.0f}x chunk size (chunk size {a.chunk_size:,})", lambda r: _met(_chunk_x(r, a.chunk_size) < TARGETS["chunk_mem_x"])),
        row(f"fixed cost per round < {TARGETS['fixed_cost_s']:.0f} s", lambda r: _met(r["fixed_cost_s"] < TARGETS["fixed_cost_s"])),
        "\nMeasured by `python -m bench e2e` (bench/bench_e2e.py): wall time of each `airflow dags test` subprocess; "
        "chunk/capture memory = VmHWM after resetting the peak (/proc/self/clear_refs) minus RSS before the step, in a child "
        "process; DAG-run memory = psutil samples every 0.2 s. Chunk size in bytes = rows x average stored row size.\n",
    ]
    return "".join(out)


def _chunk_x(r: dict, chunk_size: int) -> float:
    mem = r["chunk_mem"]
    m = min(mem, key=lambda m: abs(m["size"] - chunk_size))
    return m["x_chunk"]


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    sys.path.insert(0, str(ROOT))
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    mach = machine()
    _say(f"start {started}: {uptime()}")
    u = uuid.uuid4().hex[:6]
    work = ROOT / ".cdc-local" / f"bench-e2e-{u}"
    work.mkdir(parents=True, exist_ok=True)
    results, failed = [], []
    for kind in a.dialects:
        src = Src(kind, a.pg_uri if kind == "postgres" else a.mysql_uri, u, work, local_max_rows=a.local_max_rows)
        try:
            results.append(bench_source(src, a))
        except Exception as exc:  # noqa: BLE001 - the other dialect still runs; reported at the end
            import traceback

            traceback.print_exc()
            failed.append(f"{kind}: {exc}".splitlines()[0])
        finally:
            if not a.keep:
                src.cleanup()
    load_end = uptime()
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    if not results:
        print("no results; failed: " + "; ".join(failed), file=sys.stderr)
        return 1
    md = render(results, a, mach, load_end, started)
    if failed:
        md += "\nFailed: " + "; ".join(failed) + "\n"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{started}.md").write_text(md)
    (out / f"{started}.json").write_text(
        json.dumps({"args": {k: v for k, v in vars(a).items()}, "machine": mach, "load_end": load_end, "results": results},
                   indent=1, default=str)
    )
    print()
    print(md)
    print(f"written: {out / (started + '.md')} and .json")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
