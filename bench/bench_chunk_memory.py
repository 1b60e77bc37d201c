"""Memory of the chunk step and of the capture, with the speed they cost.

Uses the memory probe of ``bench_e2e`` (the step runs in a fresh child process; its peak
is VmHWM after resetting it through ``/proc/self/clear_refs``, minus the RSS just before
the step) on the demo table (``tools/workload.py``), for each database:

* chunk step (low watermark, SELECT, Parquet, high watermark) at 10k / 50k / 200k rows:
  peak above the baseline, as a multiple of the chunk's staged Parquet size and of its
  size on the source (rows x average row bytes, what ``bench_e2e`` divides by); one
  process per size, after a 100-row warm-up chunk (imports, connections), as in
  ``bench_e2e``; plus a *cold* 50k step (no warm-up: the imports the first chunk
  of a task pays count too) and whether pandas got imported;
* chunk read speed: rows/s of repeated 50k-row steps in one process, for each variant
  (``new`` = the dialect defaults, ``old`` = the batch sizes before this change:
  PostgreSQL COPY batches of 20,000 rows, MariaDB fetches of 10,000 rows), interleaved,
  best of ``--repeat``; printed as the ratio new / old of the same run;
* capture of N changes (UPDATEs with full before-images, 10k rows per transaction):
  peak above the baseline and events/s, ``new`` (segments of ``segment_max_events``)
  against ``old`` (``segment_max_events=0``: the whole drained batch in one segment),
  each from its own copy of the slot (PostgreSQL) / the same binlog start (MariaDB).

    python -m bench chunk_memory                       # both databases, 200k rows, 50k changes
    python -m bench chunk_memory --dialects postgres --repeat 5
"""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.bench_e2e import (
    _CAPTURE_CHILD,
    _CHILD_PRELUDE,
    DEFAULT_MY,
    DEFAULT_PG,
    Src,
    _change_rows,
    _rows_bytes,
    run_child,
)

# the batch sizes before the memory work (and "no segment limit" for the capture)
OLD = {"copy_batch_rows": 20_000, "fetch_batch_rows": 10_000}
OLD_CAPTURE = {"segment_max_events": 0}

_CHUNK_CHILD = _CHILD_PRELUDE + r"""
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
a = json.loads(sys.argv[1])
params = ConnectionParams.from_uri(a["uri"])
out = []
opts = {**a["options"], **a["attrs"]}  # the variant's batch sizes: options, read when the dialect is built
with get_dialect(params, source=a["source"], tables=[TableName.parse(a["table"])], **opts) as d:
    schema = d.describe_table(TableName.parse(a["table"]))
    d.ensure_watermark_table()
    d.write_watermark("warm")  # connections
    if a["warm"]:
        snapshot_chunk(d, schema, FULL_RANGE, data_dir=a["dir"], snapshot_id="warm", seq=0, limit=100)
    pandas_before = "pandas" in sys.modules
    for i, size in enumerate(a["sizes"]):
        before = rss(); ok = reset_peak()
        t = time.perf_counter(); c = time.process_time()
        r = snapshot_chunk(d, schema, FULL_RANGE, data_dir=a["dir"], snapshot_id="probe", seq=i + 1, limit=size)
        out.append({"size": size, "rows": r.rows, "seconds": time.perf_counter() - t, "cpu": time.process_time() - c,
                    "rss_before": before, "peak": hwm(), "reset": ok, "parquet_bytes": os.path.getsize(r.path),
                    "pandas_before": pandas_before, "pandas_after": "pandas" in sys.modules})
print("RESULT " + json.dumps(out))
"""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench chunk_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dialects", default="postgres,mysql")
    ap.add_argument("--pg-uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--mysql-uri", default=os.environ.get("CDC_TEST_MYSQL_URI", DEFAULT_MY))
    ap.add_argument("--rows", type=int, default=200_000, help="rows of the demo table")
    ap.add_argument("--sizes", default="10000,50000,200000", help="chunk sizes of the memory probe")
    ap.add_argument("--speed-size", type=int, default=50_000, help="chunk size of the speed comparison")
    ap.add_argument("--repeat", type=int, default=3, help="speed repeats per variant (best counts)")
    ap.add_argument("--changes", type=int, default=50_000, help="row changes for the capture probe (0: skip)")
    ap.add_argument("--capture-repeat", type=int, default=2, help="capture runs per variant (best speed counts)")
    ap.add_argument("--no-old", action="store_true", help="measure only the current defaults")
    a = ap.parse_args(argv)
    a.dialects = [d.strip() for d in a.dialects.split(",") if d.strip()]
    a.sizes = sorted({int(x) for x in a.sizes.split(",") if x.strip()})
    return a


def _say(msg: str) -> None:
    print(f"[chunk_memory {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _chunk_probe(src: Src, table, work: Path, sizes: list[int], attrs: dict, *, warm: bool = True) -> list[dict]:
    arg = {
        "uri": src.uri,
        "table": table.id,
        "source": f"bcm_{src.u}_{src.kind[:2]}",
        "dir": str(work / f"chunks-{uuid.uuid4().hex[:6]}"),
        "sizes": sizes,
        "attrs": attrs,
        "options": {},
        "warm": warm,
    }
    try:
        return run_child(_CHUNK_CHILD, arg)
    finally:
        shutil.rmtree(arg["dir"], ignore_errors=True)


def _mem_line(m: dict, row_bytes: float) -> str:
    above = max(m["peak"] - m["rss_before"], 0)
    src_bytes = m["rows"] * row_bytes
    return (
        f"{m['rows']:>7,} rows: peak {above / 2**20:6.1f} MB above baseline = {above / m['parquet_bytes']:5.1f}x Parquet "
        f"({m['parquet_bytes'] / 2**20:.1f} MB), {above / src_bytes:5.1f}x source size ({src_bytes / 2**20:.1f} MB); "
        f"{m['rows'] / m['seconds']:,.0f} rows/s; pandas imported: before {m['pandas_before']}, after {m['pandas_after']}"
    )


def bench_chunks(src: Src, table, work: Path, a: argparse.Namespace, row_bytes: float) -> dict[str, Any]:
    variants = {"new": {}} if a.no_old else {"new": {}, "old": dict(OLD)}
    out: dict[str, Any] = {}
    for name, attrs in variants.items():
        _say(f"{src.kind}: chunk memory, {name} batch sizes {attrs or '(defaults)'}")
        mem = []
        for size in a.sizes:  # one fresh process per size, as bench_e2e
            mem += _chunk_probe(src, table, work, [size], attrs)
        for m in mem:
            print("   warm " + _mem_line(m, row_bytes), flush=True)
        (cold,) = _chunk_probe(src, table, work, [a.speed_size], attrs, warm=False)
        print("   cold " + _mem_line(cold, row_bytes), flush=True)
        out[name] = {"mem": mem, "cold": cold}
    # speed: interleaved variants, several steps per process, best of all
    rates: dict[str, list[float]] = {n: [] for n in variants}
    for _ in range(a.repeat):
        for name, attrs in variants.items():
            steps = _chunk_probe(src, table, work, [a.speed_size] * 2, attrs)
            rates[name] += [s["rows"] / s["seconds"] for s in steps]
    for name in variants:
        out[name]["rps_best"] = max(rates[name])
        out[name]["rps_median"] = statistics.median(rates[name])
        _say(f"{src.kind}: chunk read {name}: best {max(rates[name]):,.0f} rows/s, median {statistics.median(rates[name]):,.0f}")
    if "old" in variants:
        _say(
            f"{src.kind}: RATIO chunk rows/s new/old = {out['new']['rps_best'] / out['old']['rps_best']:.2f} (best), "
            f"{out['new']['rps_median'] / out['old']['rps_median']:.2f} (median)"
        )
    return out


def bench_capture(src: Src, table, work: Path, a: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_cdc.dialects import get_dialect

    variants = {"new": {}} if a.no_old else {"new": {}, "old": dict(OLD_CAPTURE)}
    runs = [(n, r) for r in range(a.capture_repeat) for n in variants]
    source = f"bcm_{src.u}_{src.kind[:2]}_cap"
    copies: list[str] = []
    admin = None
    d = get_dialect(src.params, source=source, tables=[table])
    try:
        if src.kind == "postgres":
            import psycopg2

            d.load_offset(str(work / "cap-origin"))  # slot + publication before the changes
            admin = psycopg2.connect(src.uri)
            admin.autocommit = True
            cur = admin.cursor()
            for i in range(len(runs)):
                name = f"{d.slot_name}_c{i}"[:63]
                cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (d.slot_name, name))
                copies.append(name)
            start = None
        else:
            start = d.binlog_end()
        took = _change_rows(src, table, a.changes)
        _say(f"{src.kind}: {a.changes:,} changes in {took:.1f}s")
        res: dict[str, list[dict]] = {n: [] for n in variants}
        for i, (name, _r) in enumerate(runs):
            arg: dict[str, Any] = {"uri": src.uri, "table": table.id, "source": f"{source}_{i}", "dir": str(work / f"cap-{i}")}
            opts: dict[str, Any] = dict(variants[name])
            if src.kind == "postgres":
                opts.update(slot_name=copies[i], publication_name=d.publication_name)
            else:
                opts["server_id"] = 2_000_000 + uuid.uuid4().int % 1_000_000_000
                arg["offset"] = start.to_json()
            arg["options"] = opts
            r = run_child(_CAPTURE_CHILD, arg)
            segs = sorted(Path(arg["dir"]).rglob("seg-*.parquet"))
            r["segments"] = len(segs)
            r["staged_bytes"] = sum(p.stat().st_size for p in segs)
            shutil.rmtree(arg["dir"], ignore_errors=True)
            res[name].append(r)
            above = max(r["peak"] - r["rss_before"], 0) / 2**20
            _say(
                f"{src.kind}: capture {name}: {r['events']:,} events in {r['segments']} segment(s) "
                f"({r['staged_bytes'] / 2**20:.1f} MB staged), peak {above:.1f} MB above baseline "
                f"({above * 2**20 / max(r['events'], 1) / 1024:.2f} KB/event), {r['events'] / r['seconds']:,.0f} events/s"
            )
        best = {n: max(x["events"] / x["seconds"] for x in res[n]) for n in variants}
        if "old" in variants:
            _say(f"{src.kind}: RATIO capture events/s new/old = {best['new'] / best['old']:.2f} (best of {a.capture_repeat} each)")
        return {"runs": res, "eps_best": best}
    finally:
        if admin is not None:
            for s in copies:
                admin.cursor().execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (s,)
                )
            admin.close()
        if src.kind == "postgres":
            d.drop_slot()
            d.drop_publication()
        d.close()


def main(argv: list[str] | None = None) -> int:
    from tools.workload import create_demo_table, drop_table

    a = _parse(argv)
    results: dict[str, Any] = {}
    for kind in a.dialects:
        uri = a.pg_uri if kind == "postgres" else a.mysql_uri
        work = Path(tempfile.mkdtemp(prefix=f"bench-chunkmem-{kind}-"))
        src = Src(kind, uri, uuid.uuid4().hex[:6], work)
        table = src.table("mem")
        try:
            t0 = time.monotonic()
            n = create_demo_table(uri, table, a.rows)
            row_bytes = _rows_bytes(src, table)
            _say(f"{kind}: {table.id} loaded with {n:,} rows (~{row_bytes:.0f} B/row) in {time.monotonic() - t0:.0f}s")
            results[kind] = {"chunks": bench_chunks(src, table, work, a, row_bytes)}
            if a.changes:
                results[kind]["capture"] = bench_capture(src, table, work, a)
        finally:
            drop_table(uri, table)
            shutil.rmtree(work, ignore_errors=True)
    print("RESULT " + json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
