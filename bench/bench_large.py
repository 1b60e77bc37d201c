"""A large snapshot through the DAGs (issue 19's 50M-row run), on the local PostgreSQL.

One demo table of ``--rows`` rows (tools/workload.create_demo_table: 8 mixed columns), then,
one after the other on an idle source:

* the raw dump baseline (bench_e2e.raw_dump_pg: COPY -> CSV reader -> one Parquet file);
* ``airflow dags test cdc_snapshot`` (plan, chunk tasks, high-watermark sensor, spark-submit
  merge into the event log and the Delta mirror, commit): wall time, the Airflow process's
  peak RSS (every task runs inside it under ``dags test``) and the Spark processes' peak
  (JVM + Python driver + workers), sampled every 0.2 s, and seconds per task;
* the chunk step alone in a child process at ``--chunk-size`` (peak RSS above its baseline);
* ``airflow cdc verify`` of the mirror against the source (chunked checksums): its exit status,
  summary and time.

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
import shutil
import subprocess
import sys
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
    ap.add_argument("--chunk-size", type=int, default=50_000)
    ap.add_argument("--parallelism", type=int, default=2, help="snapshot ranges read at once")
    ap.add_argument("--uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--keep", action="store_true", help="keep the table, slot and staged data")
    return ap.parse_args(argv)


def _verify(src: Src, rec: dict, table) -> tuple[int, str, float, float]:
    from tools.demo import airflow_bin

    cmd = [airflow_bin(), "cdc", "verify", "--conn-id", rec["env"]["CDC_SOURCE_CONN_ID"], "--table", table.id,
           "--data-dir", str(rec["data"]), "--source", rec["source"]]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=rec["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    with TreeSampler(proc.pid, interval=1.0) as s:
        out, _ = proc.communicate(timeout=7200)
    return proc.returncode, out.strip(), time.monotonic() - t0, s.airflow_peak / 2**20


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
        conf = {"action": "start", "tables": [big.id], "chunk_size": a.chunk_size, "parallelism": a.parallelism}
        r = run_dag("cdc_snapshot", conf, rec["env"], work / "logs", "large", timeout=6 * 3600)
        R.update(snap_s=r.seconds, snap_rps=a.rows / r.seconds, snap_ratio=a.rows / r.seconds / R["raw_dump_rps"],
                 airflow_peak_mb=r.airflow_peak_mb, spark_peak_mb=r.spark_peak_mb, tasks=r.task_seconds(),
                 merge=r.merge_summary(), snap_cpu_s=r.cpu_s, task_memory=r.task_memory())
        _say(f"snapshot {r.seconds:.0f}s = {R['snap_rps']:,.0f} rows/s ({R['snap_ratio']:.2f}x the raw dump); "
             f"airflow peak {r.airflow_peak_mb:.0f} MB, spark peak {r.spark_peak_mb:.0f} MB; tasks {R['tasks']}")

        (m,) = run_child(_CHUNK_CHILD, {"uri": src.uri, "table": big.id, "source": f"{rec['source']}_mem",
                                        "dir": str(work / "memprobe"), "sizes": [a.chunk_size]})
        R["chunk_peak_mb"] = max(m["peak"] - m["rss_before"], 0) / 2**20
        R["chunk_x"] = (m["peak"] - m["rss_before"]) / (m["rows"] * R["row_bytes"])
        _say(f"chunk step of {m['rows']:,} rows: {R['chunk_peak_mb']:.0f} MB above its baseline ({R['chunk_x']:.1f}x)")

        rc, out, took, peak = _verify(src, rec, big)
        R.update(verify_rc=rc, verify_s=took, verify_out=out[-2000:], verify_peak_mb=peak)
        _say(f"verify exit {rc} in {took:.0f}s, peak RSS {peak:,.0f} MB:\n{out[-1500:]}")
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
    return 0 if R.get("verify_rc") == 0 else 1


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
        f"| snapshot through the DAGs (`airflow dags test cdc_snapshot`) | {R.get('snap_s', 0):.0f} s = "
        f"{R.get('snap_rps', 0):,.0f} rows/s, **{R.get('snap_ratio', 0):.2f}x** the raw dump |",
        f"| seconds per task | {tasks} |",
        f"| merge engine and its job's own seconds | {(R.get('merge') or {}).get('engine', '?')}, "
        f"{(R.get('merge') or {}).get('job_seconds', (R.get('merge') or {}).get('seconds', '?'))} |",
        f"| peak RSS: Airflow process (plan, chunk tasks, sensor, commit) | {R.get('airflow_peak_mb', 0):,.0f} MB |",
        *(f"| peak RSS while `{task}` ran: Airflow process (its rise during the task); Spark | "
          f"{m['airflow_peak_mb']:,.0f} MB (+{m['rise_mb']:,.0f} MB); {m['spark_peak_mb']:,.0f} MB |"
          for task, m in R.get("task_memory", {}).items()),
        f"| peak RSS: Spark (JVM + Python driver + workers) | {R.get('spark_peak_mb', 0):,.0f} MB |",
        f"| peak RSS: one chunk step of {R['chunk_size']:,} rows, above its baseline | "
        f"{R.get('chunk_peak_mb', 0):,.0f} MB ({R.get('chunk_x', 0):.1f}x the chunk's source size) |",
        f"| `airflow cdc verify` | exit {R.get('verify_rc')} in {R.get('verify_s', 0):.0f} s, "
        f"peak RSS {R.get('verify_peak_mb', 0):,.0f} MB |",
        "",
        "verify said:",
        "",
        "```",
        str(R.get("verify_out", ""))[-1500:],
        "```",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
