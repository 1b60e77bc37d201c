"""Seconds from a source commit to the mirror under a real deployment (issue 49).

Starts a deployment (tools/deployment.py: api-server, scheduler with LocalExecutor,
dag-processor, triggerer; metadata in PostgreSQL) with ``cdc_snapshot``, ``cdc_changelog`` on
``--schedule`` (default ``@log``: rounds start when the source writes) and a consumer DAG
scheduled on the table's mirror Asset. A ``--rows`` demo table is snapshotted, then for each
rate of ``--tps`` a writer commits that many transactions a second for ``--phase-seconds``
while a poller reads the mirror every ``--poll`` seconds. Then ``--idle-seconds`` with no
writes, and ``airflow-cdc verify`` of the table. With ``@log`` or ``@continuous`` the phases
start once the round after the snapshot has folded what the snapshot wrote (its maintenance:
the snapshot's cost, not the changes'); the seconds it took are printed.

Freshness is measured from outside the package: the newest ``updated_at`` (the writer's
commit-time clock) among the mirror's files, read from the Delta log's file statistics, against
the poller's clock. Printed per phase: p50/p90/p99/max freshness; rounds (count, median
length and gap), each task's median duration, and from its log its DAG-file parse and its work
(``execute``), the scheduler's CPU
seconds (its own, and its whole tree with the task processes) scaled to 10 minutes; the bytes
the mirror's folder gained against the bytes of the rows the phase changed (change events x
the live mirror's bytes per row); the folder's size against the live mirror's; and the
consumer's delay (its start against the newest commit in its triggering Asset events).

    python -m bench freshness                               # 200,000 rows, 100 and 1,000 TPS, 5 min each
    python -m bench freshness --rows 5000000
    python -m bench freshness --rows 20000 --tps 50 --phase-seconds 60 --idle-seconds 60   # a quick check
"""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

from bench.bench_e2e import DEFAULT_PG, RESULTS, ROOT, Src, _say, machine

CONSUMER = '''
"""Consumer of one mirror (bench/bench_freshness.py): records when it ran and the newest commit
its triggering Asset events carry."""
import json, time
import pendulum
from airflow.sdk import DAG, Asset, task

with DAG(dag_id="bench_consumer", schedule=[Asset(name={name!r}, uri={uri!r}, group="cdc")],
         start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False, max_active_runs=1):
    @task
    def record(*, triggering_asset_events=None):
        newest = max((ev.extra or {{}}).get("committed_at") or 0
                     for evs in (triggering_asset_events or {{}}).values() for ev in evs)
        with open({out!r}, "a") as f:
            f.write(json.dumps({{"ran_at": time.time(), "committed_at": newest}}) + "\\n")
    record()
'''


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench freshness", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the demo table")
    ap.add_argument("--tps", default="100,1000", help="writer rates, one phase each (comma list)")
    ap.add_argument("--phase-seconds", type=float, default=300.0, help="seconds of writes per rate")
    ap.add_argument("--idle-seconds", type=float, default=600.0, help="seconds without writes at the end")
    ap.add_argument("--warmup-seconds", type=float, default=30.0,
                    help="seconds at the start of a phase left out of its freshness figures")
    ap.add_argument("--schedule", default="@log", help="CDC_CHANGELOG_SCHEDULE of the changelog DAG")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between two readings of the mirror")
    ap.add_argument("--uri", default=DEFAULT_PG, help="the PostgreSQL source (the metadata database goes there too)")
    ap.add_argument("--keep", action="store_true", help="keep the table, slot and work folder")
    ap.add_argument("--out", default=str(RESULTS), help="folder of the Markdown and JSON results")
    return ap.parse_args(argv)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def tree_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of the process itself, of its whole tree): each live process's own time
    plus what its reaped children used (LocalExecutor's workers reap the task processes)."""
    import psutil

    root = psutil.Process(pid)
    t = root.cpu_times()
    own = t.user + t.system
    total = own + t.children_user + t.children_system
    for ch in root.children(recursive=True):
        try:
            c = ch.cpu_times()
            total += c.user + c.system + c.children_user + c.children_system
        except psutil.NoSuchProcess:
            continue
    return own, total


class MirrorPoller:
    """Reads the mirror's newest ``updated_at`` from its Delta log's file statistics every
    ``interval`` seconds, and every file the mirror's folder holds (bytes written)."""

    def __init__(self, path: str, interval: float) -> None:
        self.path, self.interval = path, interval
        self.samples: list[tuple[float, float]] = []  # (poll time, age of the newest visible commit)
        self.seen: dict[str, int] = {}  # every file ever seen in the folder -> its size
        self.file_max: dict[str, float | None] = {}  # data file -> its newest updated_at
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def newest(self) -> float | None:
        """The newest ``updated_at`` among the current version's files (each file read once:
        files never change)."""
        from urllib.parse import unquote

        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from deltalake import DeltaTable

        if not os.path.isdir(os.path.join(self.path, "_delta_log")):
            return None
        paths = pa.table(DeltaTable(self.path).get_add_actions(flatten=True))["path"].to_pylist()
        for p in paths:
            if p not in self.file_max:
                v = pc.max(pq.read_table(os.path.join(self.path, unquote(p)), columns=["updated_at"]).column(0)).as_py()
                self.file_max[p] = None if v is None else v.timestamp()
        values = [self.file_max[p] for p in paths if self.file_max[p] is not None]
        return max(values) if values else None

    def live(self) -> tuple[int, int]:
        """(bytes, rows) of the mirror's current version."""
        import pyarrow as pa
        from deltalake import DeltaTable

        a = pa.table(DeltaTable(self.path).get_add_actions(flatten=True))
        return sum(a["size_bytes"].to_pylist()), sum(n or 0 for n in a["num_records"].to_pylist())

    def folder(self) -> int:
        return sum(f.stat().st_size for f in Path(self.path).rglob("*") if f.is_file())

    def _scan(self) -> None:
        for f in Path(self.path).rglob("*"):
            try:
                if f.is_file() and str(f) not in self.seen:
                    self.seen[str(f)] = f.stat().st_size
            except FileNotFoundError:
                continue

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                n = self.newest()
                if n is not None:
                    self.samples.append((t, t - n))
                self._scan()
            except Exception as exc:  # noqa: BLE001 - a read racing a commit or a vacuum: next poll
                _say(f"poll: {type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def written(self) -> int:
        return sum(self.seen.values())

    def __enter__(self) -> MirrorPoller:
        self._scan()  # what the folder holds before: not written by the phases
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _ts(s: str | None) -> float | None:
    return None if not s else dt.datetime.fromisoformat(s).timestamp()


def _wait_maintained(rec: dict, after: float, timeout: float = 900.0) -> float:
    """Seconds until the source's maintenance (compact_tombstones) finished after ``after``."""
    from airflow_provider_cdc.pipeline.maintenance import last_maintenance

    deadline = time.monotonic() + timeout
    while True:
        at = last_maintenance(str(rec["data"]), rec["source"])
        if at is not None and at > after:
            return at - after
        if time.monotonic() > deadline:
            raise RuntimeError(f"no maintenance of {rec['source']} finished in {timeout:.0f} s after the snapshot")
        time.sleep(1)


def rounds_between(dep, t0: float, t1: float) -> dict:
    """The changelog runs that started in [t0, t1): their count, median length and gap, and
    each task's median duration."""
    runs: list[dict] = []
    offset = 0
    while True:  # newest first, a page of 100 at a time (the API's most), back to t0
        page = dep.api("GET", f"/api/v2/dags/cdc_changelog/dagRuns?limit=100&offset={offset}"
                              "&order_by=-start_date")["dag_runs"]
        runs += [r for r in page if r.get("start_date") and t0 <= _ts(r["start_date"]) < t1]
        if len(page) < 100 or any(r.get("start_date") and _ts(r["start_date"]) < t0 for r in page):
            break
        offset += 100
    runs.sort(key=lambda r: r["start_date"])
    spans = [(_ts(r["start_date"]), _ts(r["end_date"])) for r in runs if r.get("end_date")]
    lengths = [b - a for a, b in spans]
    gaps = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
    tasks: dict[str, list[float]] = {}
    split: dict[str, list[tuple[float, float]]] = {}
    for r in runs[-30:]:  # the last 30 runs' tasks (the REST API per run)
        for ti in dep.tis("cdc_changelog", r["dag_run_id"]):
            if ti.get("start_date") and ti.get("end_date") and ti["state"] == "success":
                tasks.setdefault(ti["task_id"], []).append(_ts(ti["end_date"]) - _ts(ti["start_date"]))
                log = (dep.home / "logs" / "dag_id=cdc_changelog" / f"run_id={r['dag_run_id']}"
                       / f"task_id={ti['task_id']}" / f"attempt={ti.get('try_number') or 1}.log")
                got = parse_and_execute(log)
                if got is not None:
                    split.setdefault(ti["task_id"], []).append(got)
    return {
        "runs": len(runs),
        "failed": sum(1 for r in runs if r["state"] == "failed"),
        "types": sorted({r["run_type"] for r in runs}),
        "median_length_s": statistics.median(lengths) if lengths else None,
        "median_gap_s": statistics.median(gaps) if gaps else None,
        "task_median_s": {k: round(statistics.median(v), 2) for k, v in sorted(tasks.items())},
        # from the task's own log: its first line to the DAG file's parse done, then to "Done"
        "task_parse_execute_median_s": {
            k: (round(statistics.median(p for p, _ in v), 2), round(statistics.median(e for _, e in v), 2))
            for k, v in sorted(split.items())
        },
    }


def parse_and_execute(log: Path) -> tuple[float, float] | None:
    """(seconds from the task process's first log line to "Worker startup parse complete",
    seconds from there to "Done. Returned value" or "Skipping downstream tasks"): the DAG
    file's parse and the task's work,
    as the task's own log times them; None without both lines."""
    try:
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    except (OSError, ValueError):
        return None
    times = [(_ts(x.get("timestamp")), str(x.get("event", ""))) for x in lines if x.get("timestamp")]
    parsed = next((t for t, e in times if e.startswith("Worker startup parse complete")), None)
    # a task that skipped the tasks after it (a one-task round) ends with that line instead
    done = next((t for t, e in times if e.startswith(("Done. Returned value", "Skipping downstream tasks"))), None)
    if not times or parsed is None or done is None:
        return None
    return parsed - times[0][0], done - parsed


def _changed_events(data_dir: str, source: str, t0: float, t1: float) -> int:
    """Change events the source committed in [t0, t1), from the staged changelog."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from airflow_provider_cdc.storage.layout import changelog_dir

    d = changelog_dir(data_dir, source)
    files = [str(p) for p in Path(d).rglob("*.parquet")]
    if not files:
        return 0
    flt = (pc.field("op") != "w") & (pc.field("ts_ms") >= int(t0 * 1000)) & (pc.field("ts_ms") < int(t1 * 1000))
    return ds.dataset(files, format="parquet").count_rows(filter=flt)


def wait_first_round(dep, timeout: float = 300) -> None:
    """Until a cdc_changelog run succeeded (the first creates the slot or the offset)."""
    deadline = time.monotonic() + timeout
    while not any(r["state"] == "success" for r in dep.runs("cdc_changelog")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no cdc_changelog run succeeded in {timeout:.0f} s")
        dep.check_alive()
        time.sleep(1)


def _wait_applied(dep, src: Src, rec: dict, timeout: float = 600) -> float:
    """Write a watermark and wait until the changelog staged and applied it (the @log trigger
    starts the rounds; a run is triggered by hand after 60 s without). Seconds it took."""
    from airflow_provider_cdc.sinks.base import applied_everywhere
    from airflow_provider_cdc.storage.staged import staged_watermark_position

    marker = f"bench-{uuid.uuid4()}"
    with src.dialect(rec) as d:
        d.ensure_watermark_table()  # MariaDB: made by the first snapshot, which has not run yet
        d.write_watermark(marker)
    t0 = time.monotonic()
    nudged = False
    while time.monotonic() - t0 < timeout:
        pos = staged_watermark_position(str(rec["data"]), rec["source"], marker)
        if pos is not None and applied_everywhere(str(rec["data"]), rec["source"], pos):
            return time.monotonic() - t0
        if not nudged and time.monotonic() - t0 > 60:
            dep.trigger("cdc_changelog", tag="nudge")
            nudged = True
        dep.check_alive()
        time.sleep(1)
    raise RuntimeError(f"the changelog did not apply watermark {marker} in {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    sys.path.insert(0, str(ROOT))
    from airflow_provider_cdc.assets import mirror_asset
    from airflow_provider_cdc.storage.layout import mirror_dir
    from tools.deployment import launch
    from tools.workload import BackgroundWriter, create_demo_table, drop_table

    rates = [float(x) for x in a.tps.split(",") if x.strip()]
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    mach = machine()
    u = uuid.uuid4().hex[:6]
    work = ROOT / ".cdc-local" / f"bench-freshness-{u}"
    work.mkdir(parents=True, exist_ok=True)
    src = Src("postgres", a.uri, u, work)
    table = src.table("fresh")
    rec = src.env("fresh", [table])
    R: dict = {"rows": a.rows, "schedule": a.schedule, "phases": [], "args": vars(a)}
    try:
        t0 = time.monotonic()
        create_demo_table(src.uri, table, a.rows)
        _say(f"loaded {a.rows:,} rows in {time.monotonic() - t0:.0f}s")
        dags = work / "dags"
        dags.mkdir()
        for name in ("cdc_snapshot.py", "cdc_changelog.py"):
            (dags / name).symlink_to(ROOT / "dags" / name)
        asset = mirror_asset(rec["source"], table.id)
        consumed = work / "consumer.jsonl"
        (dags / "bench_consumer.py").write_text(CONSUMER.format(name=asset.name, uri=asset.uri, out=str(consumed)))
        env = {k: v for k, v in rec["env"].items() if k.startswith(("CDC_", "AIRFLOW_CONN_"))}
        env["CDC_CHANGELOG_SCHEDULE"] = a.schedule
        mirror = mirror_dir(str(rec["data"]), rec["source"], table)
        with launch(src.uri, work / "deploy", dags, env=env,
                    dags=("cdc_snapshot", "cdc_changelog", "bench_consumer")) as dep:
            if a.schedule in ("none", ""):
                raise SystemExit("--schedule none: nothing would run the changelog")
            # the first round (started by the trigger: no slot yet) creates the slot: the log is
            # captured from there
            wait_first_round(dep)
            _say(f"catch-up after the first round: {_wait_applied(dep, src, rec):.1f}s")
            t0 = time.monotonic()
            run_id = dep.trigger("cdc_snapshot", {"action": "start", "tables": [table.id]}, tag="snap")
            dep.wait_run("cdc_snapshot", run_id, timeout=6 * 3600)
            R["snapshot_s"] = time.monotonic() - t0
            _say(f"snapshot of {a.rows:,} rows in {R['snapshot_s']:.0f}s")
            snapshot_end = time.time()
            _wait_applied(dep, src, rec)
            if a.schedule.lower() in ("@log", "@continuous"):
                # the round after a snapshot compacts what it wrote (pipeline/maintenance.py): the
                # snapshot's cost, done before the phases measure the changes' bytes
                R["snapshot_fold_s"] = _wait_maintained(rec, snapshot_end)
                _say(f"the snapshot's fold by the next round's maintenance: done {R['snapshot_fold_s']:.0f}s later")
            sched = dep.procs["scheduler"].pid
            with MirrorPoller(mirror, a.poll) as poller:
                for rate in rates:
                    ph = {"tps": rate}
                    written0, cpu0, w0 = poller.written(), tree_cpu(sched), time.time()
                    threads = max(2, min(8, int(rate // 100) + 1))
                    writer = BackgroundWriter(src.uri, table, threads=threads, rate=rate).start()
                    time.sleep(a.phase_seconds)
                    stats = writer.stop()
                    w1 = time.time()
                    ph["writer"] = stats.summary()
                    ph["catch_up_s"] = _wait_applied(dep, src, rec)
                    time.sleep(3 * a.poll)
                    cpu1, t_end = tree_cpu(sched), time.time()
                    ages = [age for t, age in poller.samples if w0 + a.warmup_seconds <= t < w1]
                    ph.update({f"p{q}": _pct(ages, q / 100) for q in (50, 90, 99)})
                    ph["max"] = max(ages) if ages else None
                    ph["samples"] = len(ages)
                    ph["rounds"] = rounds_between(dep, w0, t_end)
                    scale = 600 / (t_end - w0)
                    ph["scheduler_cpu_per_10min"] = (cpu1[0] - cpu0[0]) * scale
                    ph["scheduler_tree_cpu_per_10min"] = (cpu1[1] - cpu0[1]) * scale
                    live_bytes, live_rows = poller.live()
                    changed = _changed_events(str(rec["data"]), rec["source"], w0, w1)
                    row_bytes = live_bytes / max(1, live_rows)
                    ph["changed_events"] = changed
                    ph["written_mb"] = (poller.written() - written0) / 2**20
                    ph["changed_mb"] = changed * row_bytes / 2**20
                    ph["written_over_changed"] = ph["written_mb"] / ph["changed_mb"] if changed else None
                    ph["live_mb"] = live_bytes / 2**20
                    ph["folder_mb"] = poller.folder() / 2**20
                    ph["folder_over_live"] = ph["folder_mb"] / ph["live_mb"] if live_bytes else None
                    R["phases"].append(ph)
                    _say(json.dumps(ph, default=str))
                # idle: no writes; the rounds it costs
                i0 = time.time()
                cpu0 = tree_cpu(sched)
                time.sleep(a.idle_seconds)
                cpu1 = tree_cpu(sched)
                R["idle"] = {"seconds": a.idle_seconds, "rounds": rounds_between(dep, i0, time.time()),
                             "scheduler_tree_cpu": cpu1[1] - cpu0[1]}
                _say(f"idle: {json.dumps(R['idle'], default=str)}")
            cons = [json.loads(x) for x in consumed.read_text().splitlines()] if consumed.exists() else []
            delays = [c["ran_at"] - c["committed_at"] for c in cons if c.get("committed_at")]
            R["consumer"] = {"runs": len(cons), "p50": _pct(delays, 0.5), "p99": _pct(delays, 0.99),
                             "max": max(delays) if delays else None}
            proc = dep.cdc("verify", "--conn-id", rec["env"]["CDC_SOURCE_CONN_ID"], "--table", table.id,
                           "--data-dir", str(rec["data"]))
            R["verify_rc"] = proc.returncode
            R["verify_out"] = (proc.stdout + proc.stderr)[-1500:]
            _say(f"verify exit {proc.returncode}: {R['verify_out'][-600:]}")
    finally:
        if not a.keep:
            src.cleanup()
            drop_table(src.uri, table)
            shutil.rmtree(work, ignore_errors=True)
    md = render(R, mach, started)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"freshness-{started}.md").write_text(md)
    (out / f"freshness-{started}.json").write_text(json.dumps({"machine": mach, "results": R}, indent=1, default=str))
    print()
    print(md)
    return 0 if R.get("verify_rc") == 0 else 1


def _f(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(R: dict, mach: dict, started: str) -> str:
    lines = [f"# Freshness under a deployment ({started})", "",
             f"{R['rows']:,} rows, CDC_CHANGELOG_SCHEDULE={R['schedule']}, machine: {mach}", "",
             f"Snapshot: {_f(R.get('snapshot_s'), '{:.0f}')} s; the next round's maintenance folded it "
             f"{_f(R.get('snapshot_fold_s'), '{:.0f}')} s after it ended (before the phases).", "",
             "| TPS | p50 s | p90 s | p99 s | max s | rounds | round s (median) | gap s | scheduler CPU s / 10 min "
             "(own / tree) | written / changed | folder / live |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ph in R["phases"]:
        r = ph["rounds"]
        lines.append(
            f"| {ph['tps']:.0f} | {_f(ph['p50'])} | {_f(ph['p90'])} | {_f(ph['p99'])} | {_f(ph['max'])} | {r['runs']} "
            f"({r['failed']} failed) | {_f(r['median_length_s'])} | {_f(r['median_gap_s'])} | "
            f"{ph['scheduler_cpu_per_10min']:.0f} / {ph['scheduler_tree_cpu_per_10min']:.0f} | "
            f"{_f(ph['written_over_changed'], '{:.2f}x')} ({ph['written_mb']:.1f} / {ph['changed_mb']:.1f} MB) | "
            f"{_f(ph['folder_over_live'], '{:.2f}x')} ({ph['folder_mb']:.1f} / {ph['live_mb']:.1f} MB) |")
    lines.append("")
    for ph in R["phases"]:
        lines.append(f"- {ph['tps']:.0f} TPS: writer {ph['writer']}; catch-up after the writer stopped "
                     f"{ph['catch_up_s']:.1f} s; task medians (s) {ph['rounds']['task_median_s']}; "
                     f"(parse, execute) medians (s) {ph['rounds'].get('task_parse_execute_median_s')}")
    idle = R.get("idle")
    if idle:
        lines.append(f"- idle {idle['seconds']:.0f} s: {idle['rounds']['runs']} round(s) "
                     f"({idle['rounds']['types']}), scheduler tree {idle['scheduler_tree_cpu']:.0f} CPU s")
    c = R.get("consumer") or {}
    lines.append(f"- consumer on the mirror Asset: {c.get('runs')} runs, delay from the newest commit in its "
                 f"events p50 {_f(c.get('p50'))} s, p99 {_f(c.get('p99'))} s, max {_f(c.get('max'))} s")
    lines.append(f"- verify exit {R.get('verify_rc')}")
    return "\n".join(lines) + "\n"
