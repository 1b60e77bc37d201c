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
    ap.add_argument("--chunk-size", type=int, default=50_000)
    ap.add_argument("--parallelism", type=int, default=2, help="snapshot ranges read at once")
    ap.add_argument("--uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--keep", action="store_true", help="keep the table, slot and staged data")
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
            backend = cur.fetchone()[0]
        c.close()
        self.postmaster = psutil.Process(backend).parent()
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
