"""A large snapshot through the DAGs (issue 19's 50M-row run), on the local PostgreSQL.

One demo table of ``--rows`` rows (tools/workload.create_demo_table: 8 mixed columns), then,
one after the other on an idle source:

* the raw dump baseline (bench_e2e.raw_dump_pg: COPY -> CSV reader -> one Parquet file);
* ``airflow dags test cdc_snapshot`` (plan, chunk tasks, high-watermark sensor, spark-submit
  merge into the event log and the Delta mirror, commit): wall time, the Airflow process's
  peak RSS (every task runs inside it under ``dags test``) and the Spark processes' peak
  (JVM + Python driver + workers), sampled every 0.2 s, and seconds per task;
* the chunk step alone in a child process at ``--chunk-size`` (peak RSS above its baseline);
* ``airflow cdc verify`` of the mirror against the source (range digests computed in the source and
  over the mirror, pipeline/verify.py): its exit status, summary, time and the source's CPU seconds
  during it (the PostgreSQL backends serving the verify and their parallel workers, sampled with
  psutil); then one row changed in the source behind the capture's back (an UPDATE no capture
  applies) and verify again: it must name exactly that key.

Results: Markdown on stdout and in ``bench/results/large-<UTC time>.md`` (+ ``.json``).

    python -m bench large --rows 50000000
    python -m bench large --rows 200000          # a quick check of the harness
"""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from bench.bench_e2e import (
    _CHUNK_CHILD,
    DEFAULT_PG,
    RESULTS,
    ROOT,
    Src,
    TreeSampler,
    _rows_bytes,
    _say,
    machine,
    raw_dump_pg,
    run_child,
    run_dag,
    uptime,
)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench large", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5_000_000, help="rows of the demo table (the issue's run: 50,000,000)")
    ap.add_argument("--chunk-size", type=int, default=50_000, help="rows per chunk (0: adaptive, CDC_CHUNK_TARGET_*)")
    ap.add_argument("--parallelism", type=int, default=2, help="snapshot ranges read at once")
    ap.add_argument("--uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--keep", action="store_true", help="keep the table, slot and staged data")
    ap.add_argument("--serial", action="store_true",
                    help="run the snapshot's tasks one after the other in one process (`dags test` without "
                         "--use-executor): no chunk task runs beside another or beside merge_while_reading")
    ap.add_argument("--merge-while-reading-rows", type=int, default=None,
                    help="CDC_MERGE_WHILE_READING_ROWS for the snapshot (default: the setting's; 0: merge after reading)")
    return ap.parse_args(argv)


class SourceCpu:
    """CPU seconds the PostgreSQL server spends for one client process tree: its backends (found by
    the client's TCP ports in their process titles, ``postgres: user db 127.0.0.1(port) ...``) and
    their parallel workers (``parallel worker for PID n``), sampled with psutil every ``interval``
    (a backend that ends between two samples loses at most that much). Other sessions on the same
    server (other engineers' tests) are not counted."""

    def __init__(self, uri: str, client_pid: int, interval: float = 0.25) -> None:
        import psutil
        import psycopg2

        with psycopg2.connect(uri) as c, c.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            self.postmaster = psutil.Process(cur.fetchone()[0]).parent()  # (while the backend lives)
        c.close()
        self.client = psutil.Process(client_pid)
        self.interval = interval
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _ports(self) -> set[int]:
        import psutil

        ports: set[int] = set()
        for p in [self.client, *self.client.children(recursive=True)]:
            try:
                ports.update(c.laddr.port for c in p.net_connections(kind="tcp") if c.laddr)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return ports

    def _sample(self) -> None:
        import psutil

        ports = self._ports()
        ours: set[int] = set()
        kids = self.postmaster.children()
        for ch in kids:
            try:
                title = " ".join(ch.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            m = re.search(r"\((\d+)\)", title)
            if m and int(m.group(1)) in ports:
                ours.add(ch.pid)
        for ch in kids:
            try:
                title = " ".join(ch.cmdline())
                m = re.search(r"parallel worker for PID (\d+)", title)
                if ch.pid in ours or (m and int(m.group(1)) in ours):
                    t = ch.cpu_times()
                    self.cpu[ch.pid] = max(self.cpu.get(ch.pid, 0.0), t.user + t.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - the client ended between two looks
                pass
            self._stop.wait(self.interval)

    @property
    def seconds(self) -> float:
        return sum(self.cpu.values())

    def __enter__(self) -> SourceCpu:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _verify(src: Src, rec: dict, table, *, json_out: bool = False) -> dict:
    """``airflow cdc verify`` of ``table``: exit status, output, seconds, its peak RSS and the
    source's CPU seconds spent for it."""
    from tools.demo import airflow_bin

    cmd = [airflow_bin(), "cdc", "verify", "--conn-id", rec["env"]["CDC_SOURCE_CONN_ID"], "--table", table.id,
           "--data-dir", str(rec["data"]), "--source", rec["source"], *(["--json"] if json_out else [])]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=rec["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    with TreeSampler(proc.pid, interval=1.0) as s, SourceCpu(src.uri, proc.pid) as cpu:
        out, err = proc.communicate(timeout=7200)
    return {"rc": proc.returncode, "out": out.strip(), "err": err.strip()[-2000:], "s": time.monotonic() - t0,
            "peak_mb": s.airflow_peak / 2**20, "source_cpu_s": cpu.seconds}


def _verify_one_changed_row(src: Src, rec: dict, table, rows: int) -> dict:
    """Change one row in the source directly (no capture runs: the mirror keeps the old row),
    verify again and check it names exactly that key."""
    import psycopg2

    key = rows // 2 + 7 if rows > 20 else 1
    with psycopg2.connect(src.uri) as c, c.cursor() as cur:
        cur.execute(f"UPDATE {src.qtable(table)} SET note = %s WHERE id = %s", ("changed behind the capture", key))
    c.close()
    v = _verify(src, rec, table, json_out=True)
    try:
        doc = json.loads(v["out"])
    except ValueError:
        doc = {}
    named = [e.split(":")[0] for e in doc.get("examples", [])]
    v.update(key=key, doc={k: doc.get(k) for k in ("rows_checked", "mismatched", "missing", "extra", "different",
                                                   "examples", "repair_conf", "method")},
             exact=doc.get("mismatched") == 1 and doc.get("different") == 1 and named == [f"key [{key}]"])
    return v


#: the tasks that read chunks and merge them: the rest of a snapshot run's time is its fixed cost
WORK_TASKS = ("read_chunks", "merge_while_reading", "merge")


def fixed_cost(seconds: float, spans: dict[str, list[float]]) -> tuple[float, float]:
    """(seconds of the run covered by the reading and merging tasks, the rest): the rest is
    what any snapshot run costs whatever its rows (the trigger's wait, plan, task start-ups,
    the round file, the sensor, commit)."""
    covered, end = 0.0, float("-inf")
    for a, b in sorted(tuple(spans[t]) for t in WORK_TASKS if t in spans):
        if b > end:
            covered += b - max(a, end)
            end = b
    return covered, max(seconds - covered, 0.0)


def _deployed_snapshot(src: Src, rec: dict, conf: dict, work: Path, extra: dict[str, str]) -> dict:
    """``cdc_snapshot`` triggered in a real deployment (tools/deployment.py: scheduler,
    LocalExecutor, api-server, dag-processor, triggerer), where tasks run side by side as in
    production: seconds from trigger to success, per-task spans from the REST API, and the
    Spark processes' peak RSS under the scheduler."""
    from tools.deployment import launch

    dags = work / "deploy-dags"
    dags.mkdir(exist_ok=True)
    (dags / "cdc_snapshot.py").symlink_to(ROOT / "dags" / "cdc_snapshot.py")
    env = {k: v for k, v in rec["env"].items() if k.startswith(("CDC_", "AIRFLOW_CONN_"))}
    env.update(extra)
    with launch(src.uri, work / "deploy", dags, env=env, dags=("cdc_snapshot",)) as dep:
        with TreeSampler(dep.procs["scheduler"].pid, interval=0.5) as sampler:
            t0 = time.monotonic()
            run_id = dep.trigger("cdc_snapshot", conf, tag="large")
            dep.wait_run("cdc_snapshot", run_id, timeout=6 * 3600)
            took = time.monotonic() - t0
        tis = dep.tis("cdc_snapshot", run_id)
    spans = [(t["task_id"], dt.datetime.fromisoformat(t["start_date"]).timestamp(),
              dt.datetime.fromisoformat(t["end_date"]).timestamp()) for t in tis if t.get("start_date") and t.get("end_date")]
    first = min((a for _, a, _ in spans), default=0.0)
    tasks: dict[str, list[float]] = {}
    for task, a, b in spans:  # first start and last end of each task's instances, from the run's first task
        lo, hi = tasks.get(task, [a, b])
        tasks[task] = [min(lo, a), max(hi, b)]
    return {"seconds": took, "spans": {k: [round(a - first, 1), round(b - first, 1)] for k, (a, b) in tasks.items()},
            "spark_peak_mb": sampler.spark_peak / 2**20, "task_peak_mb": sampler.task_peak / 2**20}


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    sys.path.insert(0, str(ROOT))
    from tools.workload import create_demo_table, drop_table

    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    mach = machine()
    u = uuid.uuid4().hex[:6]
    work = ROOT / ".cdc-local" / f"bench-large-{u}"
    work.mkdir(parents=True, exist_ok=True)
    src = Src("postgres", a.uri, u, work)
    big = src.table("large")
    R: dict = {"rows": a.rows, "chunk_size": a.chunk_size, "parallelism": a.parallelism, "load_start": uptime()}
    try:
        t0 = time.monotonic()
        R["rows_loaded"] = create_demo_table(src.uri, big, a.rows)
        R["load_s"] = time.monotonic() - t0
        R["row_bytes"] = _rows_bytes(src, big)
        _say(f"loaded {R['rows_loaded']:,} rows (~{R['row_bytes']:.0f} B/row) in {R['load_s']:.0f}s")

        dump = work / "raw.parquet"
        t0 = time.monotonic()
        n = raw_dump_pg(src.uri, src.qtable(big), dump)
        R["raw_dump_s"] = time.monotonic() - t0
        R["raw_dump_rps"] = n / R["raw_dump_s"]
        dump.unlink()
        _say(f"raw dump {n:,} rows in {R['raw_dump_s']:.0f}s = {R['raw_dump_rps']:,.0f} rows/s")

        rec = src.env("large", [big])
        conf = {"action": "start", "tables": [big.id], "parallelism": a.parallelism,
                **({"chunk_size": a.chunk_size} if a.chunk_size else {})}  # 0: chunks that size themselves
        extra = {} if a.merge_while_reading_rows is None else {
            "CDC_MERGE_WHILE_READING_ROWS": str(a.merge_while_reading_rows)}
        if a.serial:
            r = run_dag("cdc_snapshot", conf, dict(rec["env"], **extra), work / "logs", "large", timeout=6 * 3600)
            R.update(snap_s=r.seconds, airflow_peak_mb=r.airflow_peak_mb, spark_peak_mb=r.spark_peak_mb,
                     tasks=r.task_seconds(), merge=r.merge_summary(), snap_cpu_s=r.cpu_s, task_memory=r.task_memory())
        else:
            d = _deployed_snapshot(src, rec, conf, work, extra)
            R.update(snap_s=d["seconds"], spark_peak_mb=d["spark_peak_mb"], task_peak_mb=d["task_peak_mb"],
                     spans=d["spans"],
                     tasks={k: b - a for k, (a, b) in d["spans"].items()})
        R.update(snap_mode="serial (airflow dags test)" if a.serial else "deployment (scheduler + LocalExecutor)",
                 snap_rps=a.rows / R["snap_s"], snap_ratio=a.rows / R["snap_s"] / R["raw_dump_rps"])
        if R.get("spans"):
            R["work_s"], R["fixed_s"] = fixed_cost(R["snap_s"], R["spans"])
            R["work_ratio"] = a.rows / R["work_s"] / R["raw_dump_rps"] if R["work_s"] else 0.0
            _say(f"fixed cost of the run {R['fixed_s']:.0f} s; reads and merges {R['work_s']:.0f} s "
                 f"({R['work_ratio']:.2f}x the raw dump without the fixed cost)")
        _say(f"snapshot ({R['snap_mode']}) {R['snap_s']:.0f}s = {R['snap_rps']:,.0f} rows/s "
             f"({R['snap_ratio']:.2f}x the raw dump); spark peak {R['spark_peak_mb']:.0f} MB; "
             f"largest task process {R.get('task_peak_mb', 0):.0f} MB; task spans {R.get('spans') or R['tasks']}")

        (m,) = run_child(_CHUNK_CHILD, {"uri": src.uri, "table": big.id, "source": f"{rec['source']}_mem",
                                        "dir": str(work / "memprobe"), "sizes": [a.chunk_size or 50_000]})
        R["chunk_peak_mb"] = max(m["peak"] - m["rss_before"], 0) / 2**20
        R["chunk_x"] = (m["peak"] - m["rss_before"]) / (m["rows"] * R["row_bytes"])
        _say(f"chunk step of {m['rows']:,} rows: {R['chunk_peak_mb']:.0f} MB above its baseline ({R['chunk_x']:.1f}x)")

        v = _verify(src, rec, big)
        R.update(verify_rc=v["rc"], verify_s=v["s"], verify_out=(v["out"] + "\n" + v["err"]).strip()[-2000:],
                 verify_peak_mb=v["peak_mb"], verify_source_cpu_s=v["source_cpu_s"], verify_rps=a.rows / v["s"])
        _say(f"verify exit {v['rc']} in {v['s']:.1f}s ({R['verify_rps']:,.0f} rows/s), source CPU "
             f"{v['source_cpu_s']:.1f} s, peak RSS {v['peak_mb']:,.0f} MB:\n{R['verify_out'][-1500:]}")
        c = _verify_one_changed_row(src, rec, big, a.rows)
        R.update(verify2_rc=c["rc"], verify2_s=c["s"], verify2_source_cpu_s=c["source_cpu_s"], verify2_key=c["key"],
                 verify2_exact=c["exact"], verify2_doc=c["doc"], verify2_err=c["err"][-1000:])
        _say(f"one row changed behind the capture (id {c['key']}): verify exit {c['rc']} in {c['s']:.1f}s, source CPU "
             f"{c['source_cpu_s']:.1f} s; named exactly that key: {c['exact']}; {c['doc']}")
        R["load_end"] = uptime()
    finally:
        if not a.keep:
            src.cleanup()
            drop_table(src.uri, big)
            shutil.rmtree(work, ignore_errors=True)
    md = render(R, mach, started)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"large-{started}.md").write_text(md)
    (out / f"large-{started}.json").write_text(json.dumps({"args": vars(a), "machine": mach, "results": R},
                                                          indent=1, default=str))
    print()
    print(md)
    return 0 if R.get("verify_rc") == 0 and R.get("verify2_exact") else 1


def render(R: dict, mach: dict, started: str) -> str:
    tasks = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(R.get("tasks", {}).items(), key=lambda kv: -kv[1]))
    lines = [
        f"# bench large ({started})",
        "",
        f"Machine: {mach}. Load at start: {R.get('load_start')}; at end: {R.get('load_end')}.",
        "",
        "| | |",
        "|---|---|",
        f"| rows (demo table, ~{R.get('row_bytes', 0):.0f} B/row) | {R['rows']:,} (loaded in {R.get('load_s', 0):.0f} s) |",
        f"| raw dump to Parquet | {R.get('raw_dump_s', 0):.0f} s = {R.get('raw_dump_rps', 0):,.0f} rows/s |",
        f"| snapshot through the DAGs ({R.get('snap_mode', '?')}) | {R.get('snap_s', 0):.0f} s = "
        f"{R.get('snap_rps', 0):,.0f} rows/s, **{R.get('snap_ratio', 0):.2f}x** the raw dump |",
        *([f"| fixed cost of the run (trigger to success outside {', '.join(WORK_TASKS)}: the trigger's "
           f"wait, plan, task start-ups, round, sensor, commit) | {R['fixed_s']:.0f} s; reads and merges "
           f"{R['work_s']:.0f} s = {R['work_ratio']:.2f}x the raw dump without it |"] if "fixed_s" in R else []),
        f"| seconds per task | {tasks} |",
        *(["| task spans (first start, last end; seconds from the run's first task) | "
           + ", ".join(f"{k} {a:.0f}-{b:.0f}" for k, (a, b) in sorted(R['spans'].items(), key=lambda kv: kv[1][0]))
           + " |"] if R.get("spans") else []),
        f"| merge engine and its job's own seconds | {(R.get('merge') or {}).get('engine', '?')}, "
        f"{(R.get('merge') or {}).get('job_seconds', (R.get('merge') or {}).get('seconds', '?'))} |",
        f"| peak RSS: Airflow process (plan, chunk tasks, sensor, commit) | {R.get('airflow_peak_mb', 0):,.0f} MB |",
        *(f"| peak RSS while `{task}` ran: Airflow process (its rise during the task); Spark | "
          f"{m['airflow_peak_mb']:,.0f} MB (+{m['rise_mb']:,.0f} MB); {m['spark_peak_mb']:,.0f} MB |"
          for task, m in R.get("task_memory", {}).items()),
        f"| peak RSS: Spark (JVM + Python driver + workers) | {R.get('spark_peak_mb', 0):,.0f} MB |",
        *([f"| peak RSS: the largest task process (a merge in the worker runs there) | "
           f"{R['task_peak_mb']:,.0f} MB |"] if "task_peak_mb" in R else []),
        f"| peak RSS: one chunk step of {R['chunk_size']:,} rows, above its baseline | "
        f"{R.get('chunk_peak_mb', 0):,.0f} MB ({R.get('chunk_x', 0):.1f}x the chunk's source size) |",
        f"| `airflow cdc verify` (range digests) | exit {R.get('verify_rc')} in **{R.get('verify_s', 0):.1f} s** "
        f"({R.get('verify_rps', 0):,.0f} rows/s), source CPU {R.get('verify_source_cpu_s', 0):.1f} s, "
        f"peak RSS {R.get('verify_peak_mb', 0):,.0f} MB |",
        f"| verify after one row changed in the source (id {R.get('verify2_key')}, not captured) | exit "
        f"{R.get('verify2_rc')} in {R.get('verify2_s', 0):.1f} s, source CPU {R.get('verify2_source_cpu_s', 0):.1f} s; "
        f"named exactly that key: **{R.get('verify2_exact')}** |",
        "",
        "verify said:",
        "",
        "```",
        str(R.get("verify_out", ""))[-1500:],
        "```",
        "",
        "verify after the change said (--json):",
        "",
        "```",
        json.dumps(R.get("verify2_doc"), indent=1)[-1500:],
        "```",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
