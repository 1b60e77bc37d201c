"""Memory of a whole changelog round's process for one large transaction (issue 59).

``python -m bench capture_memory --whole-round``: the capture alone stays flat with the
transaction's size (``bench capture_memory``); this measures what a user meets, the process of
``airflow dags test cdc_changelog``, in which every task of the round runs (capture, the
apply's bookkeeping or the apply itself, the log retention and compaction follow-ups). Per
database:

* a demo table of max(--rows) rows and a fresh source on it (own slot or binlog offset,
  staging and mirror), snapshotted whole by ``airflow dags test cdc_snapshot`` (the mirror's
  rounds then write and compact a mirror of the table's size), then a ``cdc_changelog`` run
  that applies what the snapshot left;
* for each N of --rows: one ``UPDATE`` of ids 1..N in ONE transaction, then one
  ``airflow dags test cdc_changelog`` sampled every 0.2 s (bench_e2e.TreeSampler): the
  process's peak RSS, how far each task raised it, the Spark processes' peak.

Target (met / MISSED): the largest transaction's peak within 250 MB of the smallest's (the
issue's sizes: 500,000 and 3,000,000 rows).

    python -m bench capture_memory --whole-round                                  # 0.5M and 3M rows
    python -m bench capture_memory --whole-round --rows 100000,500000 --dialects mysql
    python -m bench capture_memory --whole-round --schedule @continuous           # the one-task round
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

TARGET_MB = 250.0
DEFAULT_ROWS = "500000,3000000"


def _say(msg: str) -> None:
    print(f"[round_memory {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def bench_rounds(kind: str, uri: str, a: argparse.Namespace) -> dict[str, Any]:
    from bench.bench_e2e import Src, run_dag
    from tools.workload import create_demo_table, drop_table, update_in_one_transaction

    work = Path(tempfile.mkdtemp(prefix=f"bench-roundmem-{kind}-"))
    src = Src(kind, uri, uuid.uuid4().hex[:6], work)
    table = src.table("round")
    out: dict[str, Any] = {"kind": kind, "schedule": a.schedule or "none", "rounds": []}
    try:
        t0 = time.monotonic()
        create_demo_table(uri, table, max(a.rows))
        _say(f"{kind}: {table.id} loaded with {max(a.rows):,} rows in {time.monotonic() - t0:.0f}s")
        rec = src.env("round", [table])
        if a.schedule:
            rec["env"]["CDC_CHANGELOG_SCHEDULE"] = a.schedule
        logs = work / "logs"
        if not a.no_snapshot:
            r = run_dag("cdc_snapshot", {"action": "start", "tables": [table.id], "parallelism": 2}, rec["env"], logs, "snap")
            _say(f"{kind}: snapshot of the table: {r.seconds:.1f}s, process peak {r.airflow_peak_mb:.0f} MB")
        r = run_dag("cdc_changelog", None, rec["env"], logs, "start")
        out["start_peak_mb"] = r.airflow_peak_mb
        _say(f"{kind}: first round (what the snapshot left): {r.seconds:.1f}s, process peak {r.airflow_peak_mb:.0f} MB")
        for n in a.rows:
            took = update_in_one_transaction(uri, table, n)
            _say(f"{kind}: one UPDATE of {n:,} rows committed in {took:.1f}s; running cdc_changelog")
            r = run_dag("cdc_changelog", None, rec["env"], logs, f"r{n}")
            m = re.search(r"captured (\d+) events", r.text)
            at, rss, line = _peak_line(r)
            one = {
                "rows": n,
                "events": int(m.group(1)) if m else None,
                "seconds": r.seconds,
                "peak_mb": r.airflow_peak_mb,
                "spark_peak_mb": r.spark_peak_mb,
                "tasks": r.task_memory(),
                "log": str(r.log),
                "peak_after": line,
            }
            out["rounds"].append(one)
            rises = ", ".join(f"{t} +{m['rise_mb']:.0f}" for t, m in one["tasks"].items())
            _say(f"{kind}: {n:,}-row transaction: round {r.seconds:.1f}s, process peak {r.airflow_peak_mb:.0f} MB "
                 f"(tasks: {rises}), Spark peak {r.spark_peak_mb:.0f} MB; the peak came after: {line}")
    finally:
        src.cleanup()
        drop_table(uri, table)
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return out


def _peak_line(r) -> tuple[float, int, str]:
    """When the process's peak was sampled, and the last line its log wrote before then (what
    it was doing)."""
    import datetime as dt

    if not r.samples:
        return 0.0, 0, "-"
    at, rss, _spark = max(r.samples, key=lambda s: s[1])
    last = "-"
    for text in r.text.splitlines():
        m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z (.*)", text)
        if not m:
            continue
        if dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.UTC).timestamp() > at:
            break
        last = m.group(2)[:160]
    return at, rss, last


def verdict(res: dict[str, Any]) -> tuple[float, bool] | None:
    rounds = res.get("rounds") or []
    if len(rounds) < 2:
        return None
    growth = rounds[-1]["peak_mb"] - rounds[0]["peak_mb"]
    return growth, growth <= TARGET_MB


def render(results: list[dict[str, Any]]) -> str:
    lines = ["", "## A whole changelog round's process (`airflow dags test cdc_changelog`, peak RSS)", "",
             "| database | schedule | rows updated | events | round (s) | process peak (MB) | largest task rise (MB) | Spark peak (MB) |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for res in results:
        for r in res.get("rounds") or []:
            task, m = max(r["tasks"].items(), key=lambda kv: kv[1]["rise_mb"], default=("-", {"rise_mb": 0.0}))
            ev = "-" if r["events"] is None else f"{r['events']:,}"
            lines.append(f"| {res['kind']} | {res['schedule']} | {r['rows']:,} | {ev} | {r['seconds']:.1f} | "
                         f"{r['peak_mb']:.0f} | {task} +{m['rise_mb']:.0f} | {r['spark_peak_mb']:.0f} |")
    lines += ["", "| database | target | figure | verdict |", "| --- | --- | ---: | --- |"]
    for res in results:
        v = verdict(res)
        if v is None:
            continue
        lo, hi = res["rounds"][0]["rows"], res["rounds"][-1]["rows"]
        lines.append(f"| {res['kind']} | {hi:,}-row round's peak within {TARGET_MB:.0f} MB of the {lo:,}-row round's | "
                     f"{v[0]:+,.0f} MB | {'met' if v[1] else '**MISSED**'} |")
    return "\n".join(lines)
