"""The write rate a source sustains before the mirror falls behind for good (issue 59).

For each of ``--databases`` (postgres, mysql), a deployment (tools/deployment.py: api-server,
scheduler with LocalExecutor, dag-processor, triggerer) runs ``cdc_snapshot`` and ``cdc_changelog``
on ``@log``. The tables are snapshotted, then writers run flat out on the same machine for
``--minutes``:

- PostgreSQL: ``pgbench`` (PostgreSQL's own tool, its TPC-B-like script: three updates and an
  insert a transaction) with ``--clients`` clients on a database of its own (``pgbench -i -s
  --scale``); pgbench_accounts, _tellers and _branches are captured, pgbench_history has no key
  and stays out of the scope;
- MariaDB: ``tools.workload.BackgroundWriter`` unthrottled, ``--clients`` threads, on a demo table.

Every ``--poll`` seconds the bench reads the sinks' applied marker (``sinks/base.read_marker``: the
last staged position both the event log and the mirror committed). Afterwards it reads the
staged changelog's positions and commit times (staging keeps them for CDC_STAGING_RETENTION_HOURS)
and prints per minute: the source's row changes per second (committed in that minute), the
changes per second the mirror applied, lag p50/p99 (at each poll, the age of the oldest
committed change not applied yet) and the backlog; over the whole run the lag's least-squares
slope (s per minute, the first minute left out) and whether the mirror kept up (lag p99 <= 15 s and
a slope <= 1 s/min). The rounds' task medians say what bounds it. Then the writers stop, the
changelog catches up (seconds printed) and ``airflow-cdc verify`` compares every table.

MariaDB's binlog stamps events with whole seconds: its lags are +-1 s.

    python -m bench sustained                                   # both, 10 minutes each
    python -m bench sustained --databases postgres --minutes 2  # a quick look
"""

# ruff: noqa: S603 - pgbench with fixed arguments, no shell
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
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from bench.bench_e2e import DEFAULT_MY, DEFAULT_PG, RESULTS, ROOT, Src, _say, machine

KEEPS_UP_P99_S = 15.0
KEEPS_UP_SLOPE_S_PER_MIN = 1.0
PGBENCH_TABLES = ("pgbench_accounts", "pgbench_tellers", "pgbench_branches")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench sustained", description=__doc__.split("\n\n")[0])
    ap.add_argument("--databases", default="postgres,mysql", help="postgres, mysql or both (comma list)")
    ap.add_argument("--minutes", type=float, default=10.0, help="minutes of writes flat out")
    ap.add_argument("--clients", type=int, default=4, help="pgbench clients / MariaDB writer threads")
    ap.add_argument("--scale", type=int, default=4, help="pgbench -s (100,000 accounts each)")
    ap.add_argument("--rows", type=int, default=100_000, help="rows of the MariaDB demo table")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between two readings of the marker")
    ap.add_argument("--pg-uri", default=DEFAULT_PG, help="PostgreSQL server (pgbench gets a database of its own)")
    ap.add_argument("--mysql-uri", default=DEFAULT_MY, help="MariaDB source")
    ap.add_argument("--set", action="append", default=[], metavar="CDC_NAME=VALUE",
                    help="a setting of the deployment's source (repeatable), e.g. CDC_CAPTURE_MAX_EVENTS=100000")
    ap.add_argument("--keep", action="store_true", help="keep the tables, slot and work folder")
    ap.add_argument("--out", default=str(RESULTS), help="folder of the Markdown and JSON results")
    return ap.parse_args(argv)


# --- the figures, from the staged changelog and the marker's readings ------------------------
@dataclass
class Reading:
    t: float  # poll time (s, epoch)
    lag_s: float  # age of the oldest committed change not applied then (0: none)
    applied: int  # changes applied by then
    committed: int  # changes committed by then


def readings(positions: np.ndarray, ts_ms: np.ndarray, polls: list[tuple[float, bytes | None]]) -> list[Reading]:
    """Each poll ``(time, applied marker)`` as a :class:`Reading`. ``positions`` are the staged
    change events' encoded positions (fixed width: they sort as bytes as they sort as positions),
    ``ts_ms`` their commit times; a marker of None has applied nothing."""
    order = np.argsort(positions, kind="stable")
    pos, ts = positions[order], ts_ms[order].astype(np.int64)
    n = len(pos)
    # the oldest commit time at or after each place in position order (+inf past the end)
    suffix_min = np.full(n + 1, np.iinfo(np.int64).max, dtype=np.int64)
    if n:
        suffix_min[:n] = np.minimum.accumulate(ts[::-1])[::-1]
    by_time = np.sort(ts)
    out = []
    for t, marker in polls:
        k = 0 if marker is None else int(np.searchsorted(pos, marker, side="right"))
        now_ms = int(t * 1000)
        oldest = int(suffix_min[k])
        lag = max(0.0, (now_ms - oldest) / 1000) if oldest <= now_ms else 0.0
        out.append(Reading(t, lag, k, int(np.searchsorted(by_time, now_ms, side="right"))))
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def per_minute(rs: list[Reading], t0: float, t1: float) -> list[dict]:
    """The phase [t0, t1) by minute: changes/s committed and applied, lag p50/p99/max, backlog."""
    out = []
    start = t0
    while start < t1 - 1e-9:
        end = min(start + 60.0, t1)
        inside = [r for r in rs if start <= r.t < end]
        if len(inside) >= 2:
            a, b = inside[0], inside[-1]
            span = max(b.t - a.t, 1e-9)
            lags = [r.lag_s for r in inside]
            out.append({
                "minute": len(out) + 1,
                "committed_per_s": (b.committed - a.committed) / span,
                "applied_per_s": (b.applied - a.applied) / span,
                "lag_p50_s": _pct(lags, 0.5), "lag_p99_s": _pct(lags, 0.99), "lag_max_s": max(lags),
                "backlog": b.committed - b.applied,
            })
        start = end
    return out


def trend(rs: list[Reading], t0: float, t1: float) -> dict:
    """Lag over [t0 + 60 s, t1): p99 and least-squares slope (s per minute); kept up or not."""
    late = [r for r in rs if t0 + 60 <= r.t < t1]
    inside = late if len(late) >= 3 else [r for r in rs if t0 <= r.t < t1]
    lags = [r.lag_s for r in inside]
    slope = 0.0
    if len(inside) >= 3:
        x = np.array([r.t for r in inside]) / 60.0
        slope = float(np.polyfit(x - x[0], np.array(lags), 1)[0])
    p99 = _pct(lags, 0.99)
    return {"lag_p99_s": p99, "slope_s_per_min": slope,
            "kept_up": p99 is not None and p99 <= KEEPS_UP_P99_S and slope <= KEEPS_UP_SLOPE_S_PER_MIN}


def staged_changes(data_dir: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(encoded positions, commit ms) of every staged change event (watermarks left out)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from airflow_provider_cdc import storage
    from airflow_provider_cdc.core.position import ENCODED_LENGTH
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.staged import list_segments

    pos: list[np.ndarray] = [np.array([], dtype=f"S{ENCODED_LENGTH}")]
    ts: list[np.ndarray] = [np.array([], dtype=np.int64)]
    for _first, _last, path in list_segments(changelog_dir(data_dir, source)):
        fs, local = storage.filesystem(path)
        t = pq.read_table(local, columns=["position", "op", "ts_ms"], filesystem=fs)
        t = t.filter(pc.not_equal(t["op"], "w"))
        # the positions' fixed-width texts viewed as one numpy array (no Python string a row)
        col = pa.concat_arrays(t["position"].chunks) if t.num_rows else pa.array([], pa.string())
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset : col.offset + len(col) + 1]
        if len(col) and not (np.diff(offsets) == ENCODED_LENGTH).all():
            raise ValueError(f"{path}: a position is not {ENCODED_LENGTH} characters")
        data = np.frombuffer(col.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]] if len(col) else []
        pos.append(np.asarray(data, dtype=np.uint8).view(f"S{ENCODED_LENGTH}"))
        ts.append(t["ts_ms"].to_numpy(zero_copy_only=False).astype(np.int64))
    return np.concatenate(pos), np.concatenate(ts)


_CAPTURED = re.compile(r"captured (\d+) events .* in ([\d.]+) s")
_APPLIED = re.compile(r"CDC_APPLY_RESULT (\{.*\})")


def round_split(log: Path) -> dict | None:
    """From a round task's log: events captured, the capture's seconds, the apply's seconds and
    engine ("arrow" in the worker, "spark" through spark-submit; its seconds are the job's own,
    without the JVM's start). None when the log has no capture line."""
    try:
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    except (OSError, ValueError):
        return None
    out: dict = {}
    stamps = [x["timestamp"] for x in lines if x.get("timestamp")]
    if stamps:
        out["started"] = dt.datetime.fromisoformat(stamps[0].replace("Z", "+00:00")).timestamp()
    for x in lines:
        event = str(x.get("event", ""))
        m = _CAPTURED.search(event)
        if m and "events" not in out:
            out.update(events=int(m.group(1)), capture_s=float(m.group(2)))
        m = _APPLIED.search(event)
        if m:
            try:
                doc = json.loads(m.group(1))
            except ValueError:
                continue
            out.update(apply_s=doc.get("seconds"), engine=doc.get("engine"))
    return out if "events" in out else None


def split_medians(home: Path, t0: float = 0.0, t1: float = float("inf")) -> dict:
    """Medians over the changelog's round tasks of the deployment at ``home`` that started in
    [t0, t1): events a round, capture and apply seconds; rounds by apply engine."""
    import statistics

    logs = sorted((home / "logs" / "dag_id=cdc_changelog").glob("run_id=*/task_id=round/attempt=*.log"))
    got = [x for f in logs if (x := round_split(f)) is not None and t0 <= x.get("started", t0) < t1]
    if not got:
        return {}

    def med(k: str) -> float | None:
        v = [x[k] for x in got if isinstance(x.get(k), (int, float))]
        return round(statistics.median(v), 2) if v else None

    engines: dict[str, int] = {}
    for x in got:
        engines[str(x.get("engine"))] = engines.get(str(x.get("engine")), 0) + 1
    capture_rate = sum(x["events"] for x in got) / max(1e-9, sum(x["capture_s"] for x in got))
    return {"rounds_with_events": len(got), "events": med("events"), "capture_s": med("capture_s"),
            "apply_s": med("apply_s"), "engines": engines, "capture_events_per_s": round(capture_rate)}


class MarkerPoller:
    """Reads the applied marker (the lower of the event log's and the mirror's) every
    ``interval`` seconds."""

    def __init__(self, data_dir: str, source: str, interval: float) -> None:
        self.data_dir, self.source, self.interval = data_dir, source, interval
        self.polls: list[tuple[float, bytes | None]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def read(self) -> bytes | None:
        from airflow_provider_cdc.sinks.base import read_marker

        marks = [read_marker(self.data_dir, self.source, s) for s in ("events", "mirror")]
        if any(m is None for m in marks):
            return None
        return min(marks).encode().encode()

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.time()
            try:
                self.polls.append((t, self.read()))
            except Exception as exc:  # noqa: BLE001 - a read racing a marker's rewrite: next poll
                _say(f"poll: {type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def __enter__(self) -> MarkerPoller:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


# --- the writers ---------------------------------------------------------------------------
def _pg_env(uri: str) -> dict:
    """pgbench's connection, from the environment of its own process only (never its command line)."""
    u = urlsplit(uri)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(PGHOST=u.hostname or "127.0.0.1", PGPORT=str(u.port or 5432), PGUSER=u.username or "postgres",
               PGDATABASE=u.path.lstrip("/"))
    if u.password:
        env["PGPASSWORD"] = u.password
    return env


def _pgbench() -> str:
    found = shutil.which("pgbench") or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    if found is None:
        raise SystemExit("pgbench is not installed (Debian: postgresql-contrib or postgresql-15)")
    return found


def _with_database(uri: str, database: str) -> str:
    u = urlsplit(uri)
    return urlunsplit((u.scheme, u.netloc, "/" + database, u.query, u.fragment))


class Pgbench:
    """``pgbench -n -c clients -j 2 -T seconds`` in the background; ``result()`` its summary."""

    def __init__(self, uri: str, clients: int, seconds: float) -> None:
        self.seconds = seconds
        self.proc = subprocess.Popen(
            [_pgbench(), "-n", "-c", str(clients), "-j", "2", "-T", str(int(seconds))],
            env=_pg_env(uri), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def result(self) -> str:
        out, _ = self.proc.communicate(timeout=self.seconds + 300)
        lines = [ln.strip() for ln in out.splitlines() if ln.startswith(("tps", "number of transactions actually",
                                                                          "number of failed"))]
        return "; ".join(lines) or out[-500:]


# --- one database --------------------------------------------------------------------------
def run_one(kind: str, a: argparse.Namespace) -> dict:
    from airflow_provider_cdc.core.schema import TableName
    from tools.deployment import launch
    from tools.workload import BackgroundWriter, create_demo_table, drop_table

    from .bench_freshness import _wait_applied, rounds_between, wait_first_round

    u = uuid.uuid4().hex[:6]
    work = ROOT / ".cdc-local" / f"bench-sustained-{kind}-{u}"
    work.mkdir(parents=True, exist_ok=True)
    R: dict = {"database": kind}
    db = f"bench_sustained_{u}"
    if kind == "postgres":
        import psycopg2

        admin = psycopg2.connect(a.pg_uri)
        admin.autocommit = True
        admin.cursor().execute(f'CREATE DATABASE "{db}"')
        admin.close()
        uri = _with_database(a.pg_uri, db)
        t0 = time.monotonic()
        subprocess.run([_pgbench(), "-i", "-q", "-s", str(a.scale)], env=_pg_env(uri), check=True,
                       capture_output=True, text=True)
        _say(f"pgbench -i -s {a.scale}: {time.monotonic() - t0:.0f} s")
        tables = [TableName("public", t) for t in PGBENCH_TABLES]
        src = Src("postgres", uri, u, work)
    else:
        uri = a.mysql_uri
        src = Src("mysql", uri, u, work)
        tables = [src.table("sustained")]
        create_demo_table(uri, tables[0], a.rows)
    rec = src.env("sustained", tables)
    data, source = str(rec["data"]), rec["source"]
    try:
        dags = work / "dags"
        dags.mkdir()
        for name in ("cdc_snapshot.py", "cdc_changelog.py"):
            (dags / name).symlink_to(ROOT / "dags" / name)
        env = {k: v for k, v in rec["env"].items() if k.startswith(("CDC_", "AIRFLOW_CONN_"))}
        env["CDC_CHANGELOG_SCHEDULE"] = "@log"
        for item in a.set:
            name, sep, value = item.partition("=")
            if not sep or not name.startswith("CDC_"):
                raise SystemExit(f"--set {item!r}: want CDC_NAME=VALUE")
            env[name] = value
        with launch(a.pg_uri, work / "deploy", dags, env=env, dags=("cdc_snapshot", "cdc_changelog")) as dep:
            wait_first_round(dep)
            _wait_applied(dep, src, rec)
            t0 = time.monotonic()
            run_id = dep.trigger("cdc_snapshot", {"action": "start", "tables": [t.id for t in tables]}, tag="snap")
            dep.wait_run("cdc_snapshot", run_id, timeout=3600)
            R["snapshot_s"] = time.monotonic() - t0
            _say(f"{kind}: snapshot of {', '.join(t.id for t in tables)} in {R['snapshot_s']:.0f} s")
            _wait_applied(dep, src, rec)
            seconds = a.minutes * 60
            with MarkerPoller(data, source, a.poll) as poller:
                w0 = time.time()
                if kind == "postgres":
                    pgb = Pgbench(uri, a.clients, seconds)
                    R["writer"] = pgb.result()
                else:
                    writer = BackgroundWriter(uri, tables[0], threads=a.clients, rate=None).start()
                    time.sleep(seconds)
                    R["writer"] = writer.stop().summary()
                w1 = time.time()
                _say(f"{kind}: writers done: {R['writer']}")
                R["catch_up_s"] = _wait_applied(dep, src, rec, timeout=3600)
                _say(f"{kind}: caught up {R['catch_up_s']:.0f} s after the writers stopped")
            R["rounds"] = rounds_between(dep, w0, w1)
            R["split"] = split_medians(work / "deploy", w0, w1)
            R["verify_rc"], R["verify_out"] = 0, []
            for t in tables:
                proc = dep.cdc("verify", "--conn-id", rec["env"]["CDC_SOURCE_CONN_ID"], "--table", t.id,
                               "--data-dir", data)
                R["verify_rc"] = max(R["verify_rc"], proc.returncode)
                R["verify_out"].append((proc.stdout + proc.stderr)[-400:])
                _say(f"{kind}: verify {t.id}: exit {proc.returncode}")
        positions, ts_ms = staged_changes(data, source)
        rs = readings(positions, ts_ms, poller.polls)
        R["minutes"] = per_minute(rs, w0, w1)
        R["trend"] = trend(rs, w0, w1)
        R["changes"] = int(len(positions))
        R["phase_s"] = w1 - w0
        return R
    finally:
        if not a.keep:
            src.cleanup()
            if kind == "postgres":
                import psycopg2

                admin = psycopg2.connect(a.pg_uri)
                admin.autocommit = True
                admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                admin.close()
            else:
                drop_table(uri, tables[0])
            shutil.rmtree(work, ignore_errors=True)


def _f(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(results: list[dict], mach: dict, started: str, a: argparse.Namespace) -> str:
    lines = [f"# Sustained writes ({started})", "",
             f"{a.minutes:g} minutes flat out, {a.clients} clients, cdc_changelog on @log; machine: {mach}", ""]
    for R in results:
        tr = R["trend"]
        lines += [f"## {R['database']}", "",
                  f"Writer: {R['writer']}. Snapshot {R['snapshot_s']:.0f} s; {R['changes']:,} row changes staged; "
                  f"caught up {R['catch_up_s']:.0f} s after the writers stopped; verify exit {R['verify_rc']}.", "",
                  "| minute | source changes/s | applied changes/s | lag p50 s | lag p99 s | lag max s | backlog |",
                  "|---|---|---|---|---|---|---|"]
        for m in R["minutes"]:
            lines.append(f"| {m['minute']} | {m['committed_per_s']:,.0f} | {m['applied_per_s']:,.0f} | "
                         f"{_f(m['lag_p50_s'])} | {_f(m['lag_p99_s'])} | {_f(m['lag_max_s'])} | {m['backlog']:,} |")
        r = R["rounds"]
        lines += ["", f"- lag p99 {_f(tr['lag_p99_s'])} s, slope {tr['slope_s_per_min']:+.2f} s/min (first minute "
                      f"left out): **{'kept up' if tr['kept_up'] else 'fell behind'}** (rule: p99 <= "
                      f"{KEEPS_UP_P99_S:g} s and slope <= {KEEPS_UP_SLOPE_S_PER_MIN:g} s/min)",
                  f"- rounds: {r['runs']} ({r['failed']} failed), median {_f(r['median_length_s'])} s, gap "
                  f"{_f(r['median_gap_s'])} s; task medians (s) {r['task_median_s']}; (parse, execute) "
                  f"{r.get('task_parse_execute_median_s')}",
                  f"- a round with events, medians: {_f(R['split'].get('events'), '{:,.0f}')} events, capture "
                  f"{_f(R['split'].get('capture_s'))} s, apply {_f(R['split'].get('apply_s'))} s (engines: "
                  f"{R['split'].get('engines')}); capture read {_f(R['split'].get('capture_events_per_s'), '{:,.0f}')} "
                  "events/s over all rounds", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    sys.path.insert(0, str(ROOT))
    kinds = [k.strip() for k in a.databases.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ("postgres", "mysql")]
    if bad:
        raise SystemExit(f"--databases: {', '.join(bad)} unknown; give postgres, mysql or both")
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M%SZ")
    mach = machine()
    results = [run_one(k, a) for k in kinds]
    md = render(results, mach, started, a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"sustained-{started}.md").write_text(md)
    (out / f"sustained-{started}.json").write_text(
        json.dumps({"machine": mach, "args": vars(a), "results": results}, indent=1, default=str))
    print()
    print(md)
    return 0 if all(R["verify_rc"] == 0 for R in results) else 1
