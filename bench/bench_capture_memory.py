"""Memory of the capture for one large transaction and of rows holding one large value.

Issue 32's "memory does not depend on transaction size nor on value size": every step runs in
a fresh child process (``bench_e2e``'s probe: peak = VmHWM after resetting it through
``/proc/self/clear_refs``, minus the RSS just before the step, after the imports and the
connections), on each database:

* one transaction of N updated rows (``UPDATE`` of ids 1..N of the demo table,
  ``tools/workload.py``, in ONE transaction), then the capture step
  (``pipeline.capture.stage_changelog``) of just that transaction: peak above the baseline
  for each N (default 100,000 / 1,000,000 / 5,000,000), events/s, segments staged;
* rows holding one large value (default 64 MB of random bytes: ``bytea`` / ``LONGBLOB``,
  one row per transaction): the capture of those inserts, and one snapshot chunk
  (``pipeline.snapshot.snapshot_chunk``) of the table: peak above the baseline as a
  multiple of the value size.

Targets (met / MISSED): the largest transaction's peak within 250 MB of the smallest's
(5M rows against 100k rows at the default sizes); a large value's peak within 4x the value.

    python -m bench capture_memory                                  # the issue's sizes (long)
    python -m bench capture_memory --rows 20000,200000 --value-mb 16 --dialects mysql
    python -m bench capture_memory --no-values                      # transactions only
    python -m bench capture_memory --whole-round                    # a whole round's process (bench_round_memory)
"""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_e2e import _CAPTURE_CHILD, _CHILD_PRELUDE, DEFAULT_MY, DEFAULT_PG, run_child

MB = 2**20
TARGETS = {
    "flat_mb": 250.0,  # the largest transaction's peak - the smallest's, MB
    "value_x": 4.0,  # a large value's peak above the baseline, as a multiple of the value
}

_VALUE_CHUNK_CHILD = _CHILD_PRELUDE + r"""
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
import pyarrow.parquet  # noqa: F401 - imported before the peak is reset
a = json.loads(sys.argv[1])
params = ConnectionParams.from_uri(a["uri"])
small, big = TableName.parse(a["warm_table"]), TableName.parse(a["table"])
with get_dialect(params, source=a["source"], tables=[small, big], **a["options"]) as d:
    d.ensure_watermark_table()
    # warm-up on a table of the same columns holding small values: imports, connections,
    # the code paths of the column types (not the large values: their buffers are measured)
    snapshot_chunk(d, d.describe_table(small), FULL_RANGE, data_dir=a["dir"], snapshot_id="warm", seq=0, limit=100)
    schema = d.describe_table(big)
    before = rss(); ok = reset_peak()
    t = time.perf_counter()
    r = snapshot_chunk(d, schema, FULL_RANGE, data_dir=a["dir"], snapshot_id="probe", seq=1, limit=a["chunk_size"])
    took = time.perf_counter() - t
print("RESULT " + json.dumps({"rows": r.rows, "seconds": took, "rss_before": before, "peak": hwm(), "reset": ok,
                              "parquet_bytes": os.path.getsize(r.path)}))
"""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench capture_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dialects", default="postgres,mysql", help="comma list of postgres, mysql")
    ap.add_argument("--pg-uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--mysql-uri", default=os.environ.get("CDC_TEST_MYSQL_URI", DEFAULT_MY))
    ap.add_argument("--rows", default=None,
                    help="rows updated by the one transaction, one capture per size (comma list; default "
                         "100000,1000000,5000000, with --whole-round 500000,3000000)")
    ap.add_argument("--whole-round", action="store_true",
                    help="measure a whole `airflow dags test cdc_changelog` process per transaction instead "
                         "(bench/bench_round_memory.py)")
    ap.add_argument("--schedule", default=None,
                    help="with --whole-round: CDC_CHANGELOG_SCHEDULE of the runs (default none: the task DAG; "
                         "@continuous: the one-task round)")
    ap.add_argument("--keep", action="store_true", help="with --whole-round: keep the work folder (logs)")
    ap.add_argument("--no-snapshot", action="store_true",
                    help="with --whole-round: no snapshot first (the rounds write the event log only: the "
                         "mirror takes changes once its table is snapshotted)")
    ap.add_argument("--value-mb", type=float, default=64.0, help="size of each large value, MB")
    ap.add_argument("--value-rows", type=int, default=2, help="rows holding one large value each")
    ap.add_argument("--no-values", action="store_true", help="skip the large-value probes")
    ap.add_argument("--no-transactions", action="store_true", help="skip the large-transaction probes")
    ap.add_argument("--capture-option", action="append", default=[], metavar="KEY=VALUE",
                    help="a dialect option of the capture and chunk children (repeatable), e.g. segment_max_events=0")
    a = ap.parse_args(argv)
    a.dialects = [d.strip() for d in a.dialects.split(",") if d.strip()]
    for d in a.dialects:
        if d not in ("postgres", "mysql"):
            ap.error(f"unknown dialect {d!r}; known: postgres, mysql")
    if a.rows is None:
        from bench.bench_round_memory import DEFAULT_ROWS

        a.rows = DEFAULT_ROWS if a.whole_round else "100000,1000000,5000000"
    a.rows = sorted({int(x) for x in a.rows.split(",") if x.strip()})
    if any(n <= 0 for n in a.rows):
        ap.error("--rows: sizes must be > 0")
    a.value_bytes = int(a.value_mb * MB)
    opts: dict[str, Any] = {}
    for kv in a.capture_option:
        k, sep, v = kv.partition("=")
        if not sep:
            ap.error(f"--capture-option {kv!r}: expected KEY=VALUE")
        opts[k.strip()] = int(v) if v.strip().lstrip("-").isdigit() else v
    a.options = opts
    return a


def _say(msg: str) -> None:
    print(f"[capture_memory {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def above_mb(r: dict) -> float:
    """A child's peak above its baseline, MB."""
    return max(r["peak"] - r["rss_before"], 0) / MB


# --------------------------------------------------------------------------- sources
def _connect(uri: str):
    from tools.workload import connect

    return connect(uri)


def _capture_options(kind: str, source: str, extra: dict) -> dict:
    o = dict(extra)
    if kind == "postgres":
        o.update(slot_name=source, publication_name=source)
    else:
        o["server_id"] = 2_000_000 + uuid.uuid4().int % 1_000_000_000
    return o


class Capture:
    """A capture scope on one table whose start is taken now (PostgreSQL: a fresh slot and
    publication; MariaDB: the binlog end), captured later in a child process."""

    def __init__(self, kind: str, uri: str, table, work: Path, extra: dict) -> None:
        from airflow_provider_cdc.dialects import ConnectionParams, get_dialect

        self.kind, self.uri, self.table = kind, uri, table
        self.source = f"bcapm_{uuid.uuid4().hex[:8]}"
        self.dir = work / self.source
        self.options = _capture_options(kind, self.source, extra)
        self.dialect = get_dialect(ConnectionParams.from_uri(uri), source=self.source, tables=[table], **self.options)
        self.offset = None
        if kind == "postgres":
            self.dialect.load_offset(str(self.dir))  # the slot: its start is now
        else:
            self.offset = self.dialect.binlog_end().to_json()

    def run(self) -> dict:
        arg = {"uri": self.uri, "table": self.table.id, "source": self.source, "dir": str(self.dir),
               "options": self.options, "offset": self.offset}
        r = run_child(_CAPTURE_CHILD, arg, timeout=7200)
        r["staged_bytes"] = sum(p.stat().st_size for p in self.dir.rglob("seg-*.parquet"))
        return r

    def close(self) -> None:
        try:
            if self.kind == "postgres":
                self.dialect.drop_slot()
                self.dialect.drop_publication()
        finally:
            self.dialect.close()
            shutil.rmtree(self.dir, ignore_errors=True)


def bench_transactions(kind: str, uri: str, work: Path, a: argparse.Namespace) -> list[dict]:
    from tools.workload import create_demo_table, default_table, drop_table, update_in_one_transaction

    table = default_table(uri, f"bcapm_txn_{uuid.uuid4().hex[:6]}")
    out = []
    try:
        t0 = time.monotonic()
        create_demo_table(uri, table, max(a.rows))
        _say(f"{kind}: {table.id} loaded with {max(a.rows):,} rows in {time.monotonic() - t0:.0f}s")
        for n in a.rows:
            cap = Capture(kind, uri, table, work, a.options)
            try:
                took = update_in_one_transaction(uri, table, n)
                _say(f"{kind}: one UPDATE of {n:,} rows committed in {took:.1f}s; capturing it")
                r = cap.run()
            finally:
                cap.close()
            r["rows"] = n
            out.append(r)
            _say(f"{kind}: {n:,}-row transaction: {r['events']:,} events, {r['segments']} segment(s), "
                 f"peak {above_mb(r):,.1f} MB above baseline ({above_mb(r) * MB / max(r['events'], 1):,.0f} B/event), "
                 f"{r['events'] / max(r['seconds'], 1e-9):,.0f} events/s")
    finally:
        drop_table(uri, table)
    return out


def _value_tables(kind: str, uri: str, n_rows: int, value_bytes: int):
    """Two tables (id, v bytea/LONGBLOB): the probe's, empty (rows come later), and a
    warm-up table of the same columns with small values."""
    from airflow_provider_cdc.dialects import ConnectionParams
    from tools.workload import default_table, quote_table

    p = ConnectionParams.from_uri(uri)
    u = uuid.uuid4().hex[:6]
    big, small = default_table(uri, f"bcapm_val_{u}"), default_table(uri, f"bcapm_valw_{u}")
    blob = "bytea" if kind == "postgres" else "LONGBLOB"
    conn = _connect(uri)
    try:
        cur = conn.cursor()
        for t in (big, small):
            cur.execute(f"DROP TABLE IF EXISTS {quote_table(p, t)}")
            cur.execute(f"CREATE TABLE {quote_table(p, t)} (id BIGINT PRIMARY KEY, v {blob})")
        cur.execute(f"INSERT INTO {quote_table(p, small)} VALUES (1, %s), (2, %s), (3, NULL)", (b"\x00\x01", b"abc"))
        conn.commit()
    finally:
        conn.close()
    return big, small


def _insert_values(kind: str, uri: str, table, n_rows: int, value_bytes: int) -> None:
    from airflow_provider_cdc.dialects import ConnectionParams
    from tools.workload import quote_table

    p = ConnectionParams.from_uri(uri)
    conn = _connect(uri)
    try:
        cur = conn.cursor()
        for i in range(n_rows):
            blob = os.urandom(value_bytes)  # incompressible: the worst case of every buffer
            if kind == "postgres":
                import psycopg2

                cur.execute(f"INSERT INTO {quote_table(p, table)} VALUES (%s, %s)", (i + 1, psycopg2.Binary(blob)))
            else:
                cur.execute(f"INSERT INTO {quote_table(p, table)} VALUES (%s, %s)", (i + 1, blob))
            conn.commit()
            del blob
    finally:
        conn.close()


class _MaxPacket:
    """MariaDB: a 64 MB value needs max_allowed_packet above it (for the INSERT, the chunk
    SELECT and the binlog dump); raised for the probe, put back after."""

    def __init__(self, uri: str, need: int) -> None:
        self.uri, self.need, self.old = uri, need, None

    def __enter__(self) -> _MaxPacket:
        conn = _connect(self.uri)
        try:
            cur = conn.cursor()
            cur.execute("SELECT @@global.max_allowed_packet")
            old = int(cur.fetchone()[0])
            if old < self.need:
                cur.execute(f"SET GLOBAL max_allowed_packet = {int(self.need)}")
                self.old = old
                _say(f"mysql: max_allowed_packet {old:,} -> {self.need:,} for the probe")
        finally:
            conn.close()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.old is not None:
            conn = _connect(self.uri)
            try:
                conn.cursor().execute(f"SET GLOBAL max_allowed_packet = {int(self.old)}")
            finally:
                conn.close()


def bench_values(kind: str, uri: str, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    import contextlib

    from tools.workload import drop_table

    # the INSERT sends the value as hex text: twice its size, plus the statement
    guard = _MaxPacket(uri, 2 * a.value_bytes + 8 * MB) if kind == "mysql" else contextlib.nullcontext()
    out: dict[str, Any] = {"value_bytes": a.value_bytes, "rows": a.value_rows}
    with guard:
        big, small = _value_tables(kind, uri, a.value_rows, a.value_bytes)
        cap = None
        try:
            cap = Capture(kind, uri, big, work, a.options)
            t0 = time.monotonic()
            _insert_values(kind, uri, big, a.value_rows, a.value_bytes)
            _say(f"{kind}: {a.value_rows} row(s) of one {a.value_bytes / MB:.0f} MB value inserted in "
                 f"{time.monotonic() - t0:.0f}s; capturing them")
            r = cap.run()
            out["capture"] = r
            _say(f"{kind}: capture of {r['events']} large-value row(s): peak {above_mb(r):,.1f} MB above baseline = "
                 f"{above_mb(r) * MB / a.value_bytes:.2f}x the value, {r['segments']} segment(s)")
            cap.close()
            cap = None
            chunk_dir = work / f"chunks-{uuid.uuid4().hex[:6]}"
            arg = {"uri": uri, "table": big.id, "warm_table": small.id, "source": f"bcapm_chunk_{uuid.uuid4().hex[:6]}",
                   "dir": str(chunk_dir), "options": dict(a.options), "chunk_size": max(a.value_rows, 1) * 10}
            try:
                c = run_child(_VALUE_CHUNK_CHILD, arg, timeout=3600)
            finally:
                shutil.rmtree(chunk_dir, ignore_errors=True)
            out["chunk"] = c
            _say(f"{kind}: snapshot chunk of {c['rows']} large-value row(s): peak {above_mb(c):,.1f} MB above baseline = "
                 f"{above_mb(c) * MB / a.value_bytes:.2f}x the value")
        finally:
            if cap is not None:
                cap.close()
            drop_table(uri, big)
            drop_table(uri, small)
    return out


# --------------------------------------------------------------------------- report
def verdicts(result: dict[str, Any]) -> list[tuple[str, str, float | None, bool | None]]:
    """(database, target, figure, met) of one database's results (None: not measured)."""
    kind = result["kind"]
    out: list[tuple[str, str, float | None, bool | None]] = []
    txn = result.get("transactions") or []
    if len(txn) >= 2:
        lo, hi = txn[0], txn[-1]
        growth = above_mb(hi) - above_mb(lo)
        out.append((kind, f"{hi['rows']:,}-row peak within {TARGETS['flat_mb']:.0f} MB of the {lo['rows']:,}-row peak",
                    growth, growth <= TARGETS["flat_mb"]))
    vals = result.get("values")
    if vals:
        for step in ("capture", "chunk"):
            r = vals.get(step)
            if r is None:
                continue
            x = above_mb(r) * MB / vals["value_bytes"]
            out.append((kind, f"{vals['value_bytes'] / MB:.0f} MB value through the {step}: peak within "
                              f"{TARGETS['value_x']:.0f}x the value", x, x <= TARGETS["value_x"]))
    return out


def render(results: list[dict[str, Any]]) -> str:
    lines = ["", "## Capture of one transaction (peak RSS above the baseline, child process)", "",
             "| database | rows updated | events | segments | peak above baseline (MB) | bytes/event | events/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for res in results:
        for r in res.get("transactions") or []:
            lines.append(f"| {res['kind']} | {r['rows']:,} | {r['events']:,} | {r['segments']} | {above_mb(r):,.1f} | "
                         f"{above_mb(r) * MB / max(r['events'], 1):,.0f} | {r['events'] / max(r['seconds'], 1e-9):,.0f} |")
    lines += ["", "## Rows holding one large value", "",
              "| database | step | rows | value (MB) | peak above baseline (MB) | x value | seconds |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for res in results:
        vals = res.get("values")
        if not vals:
            continue
        for step in ("capture", "chunk"):
            r = vals.get(step)
            if r is None:
                continue
            n = r.get("events", r.get("rows"))
            lines.append(f"| {res['kind']} | {step} | {n} | {vals['value_bytes'] / MB:.0f} | {above_mb(r):,.1f} | "
                         f"{above_mb(r) * MB / vals['value_bytes']:.2f} | {r['seconds']:.1f} |")
    lines += ["", "## Targets", "", "| database | target | figure | verdict |", "| --- | --- | ---: | --- |"]
    for res in results:
        for kind, what, fig, ok in verdicts(res):
            shown = "-" if fig is None else (f"{fig:,.1f} MB" if "MB of" in what else f"{fig:.2f}x")
            lines.append(f"| {kind} | {what} | {shown} | {'-' if ok is None else ('met' if ok else '**MISSED**')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    if a.whole_round:
        return _whole_round(a)
    results: list[dict[str, Any]] = []
    failed = False
    for kind in a.dialects:
        uri = a.pg_uri if kind == "postgres" else a.mysql_uri
        work = Path(tempfile.mkdtemp(prefix=f"bench-capmem-{kind}-"))
        res: dict[str, Any] = {"kind": kind}
        try:
            if not a.no_transactions:
                res["transactions"] = bench_transactions(kind, uri, work, a)
            if not a.no_values:
                res["values"] = bench_values(kind, uri, work, a)
        except Exception as exc:  # noqa: BLE001 - report the other database too
            import traceback

            traceback.print_exc()
            res["error"] = repr(exc)
            failed = True
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append(res)
    print(render(results), flush=True)
    print("RESULT " + json.dumps(results, default=str))
    return 1 if failed else 0


def _whole_round(a: argparse.Namespace) -> int:
    from bench import bench_round_memory

    results, failed = [], False
    for kind in a.dialects:
        try:
            results.append(bench_round_memory.bench_rounds(kind, a.pg_uri if kind == "postgres" else a.mysql_uri, a))
        except Exception as exc:  # noqa: BLE001 - report the other database too
            import traceback

            traceback.print_exc()
            results.append({"kind": kind, "error": repr(exc)})
            failed = True
    print(bench_round_memory.render(results), flush=True)
    print("RESULT " + json.dumps(results, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
