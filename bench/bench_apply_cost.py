"""Apply cost against table size: one changelog round of ``--changes`` random changes applied to
Delta mirrors of ``--rows`` rows (default 1M, 10M and 50M).

Each mirror is built directly in the layout compaction leaves (sinks/delta_buckets.py): resolved
base files in key-hash buckets of at most the unit (``cdc.bucket_rows``, 1M rows), as a long
running pipeline's mirror looks. The round is the apply's real path
(``MirrorDeltaSink.write``: typing the events, one change file per bucket touched, one commit),
run in a fresh process per size so its peak memory (VmHWM) is its own. Printed per size:
seconds, bytes written, peak memory, and each as a ratio to the smallest size; then one
background compaction step (the most changed bucket, what a maintenance round does within its
budget) with the same three figures. Afterwards every changed key is read back and compared.

    python -m bench apply_cost [--rows 1000000,10000000,50000000] [--changes 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.arrow_types import mirror_schema
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import delta_buckets as db
from airflow_provider_cdc.sinks import mirror_compaction, mirror_readers, mirror_table
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

SOURCE = "bench"
T = TableName("public", "orders")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("customer", "string"), Column("amount", "float64"),
                         Column("status", "string")), ("id",))
BUILD_POSITION = 1


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m bench apply_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1000000,10000000,50000000", help="mirror sizes, a comma list")
    ap.add_argument("--changes", type=int, default=10_000, help="changes in the round (updates, inserts, deletes)")
    ap.add_argument("--unit", type=int, default=mirror_table.DEFAULT_BUCKET_ROWS,
                    help="the bucket unit (rows)")
    ap.add_argument("--keep", default=None, help="build the mirrors under this folder and keep them")
    ap.add_argument("--round", nargs=2, metavar=("DATA_DIR", "ROWS"), help=argparse.SUPPRESS)
    ap.add_argument("--compact", metavar="DATA_DIR", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _rows_of(ids: np.ndarray) -> pa.Table:
    """Typed mirror rows of these ids, as a snapshot wrote them."""
    keys = pc.binary_join_element_wise("[", pa.array(ids).cast(pa.string()), "]", "")
    n = len(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "customer": pc.binary_join_element_wise("customer ", pa.array(ids % 100_000).cast(pa.string()), ""),
        "amount": pa.array(ids * 1.5),
        "status": pa.array(np.where(ids % 3 == 0, "shipped", "open")),
        "__key": keys,
        "__position": pc.fill_null(pa.nulls(n, pa.string()), Position(BUILD_POSITION).encode()),
        "__deleted": pa.array(np.zeros(n, dtype=bool)),
    }, schema=mirror_schema(SCHEMA))


def build(data_dir: str, rows: int, unit: int) -> None:
    """A compacted mirror of ``rows`` rows: 8 roots split to the depth that keeps each leaf
    within ``unit``, one base file per leaf."""
    storage.write_text(schema_path(data_dir, SOURCE, T), SCHEMA.to_json())
    path = mirror_dir(data_dir, SOURCE, T)
    schema = mirror_schema(SCHEMA)
    mirror_table._create(path, schema, {mirror_table.BUCKET_ROWS_PROPERTY: str(unit)})
    depth = max(0, math.ceil(math.log2(rows / db.DEFAULT_BUCKETS / unit))) if rows > db.DEFAULT_BUCKETS * unit else 0
    leaves = db.DEFAULT_BUCKETS * 2**depth
    offset = db.node_id(depth, 0, db.DEFAULT_BUCKETS)
    ids = np.arange(1, rows + 1, dtype=np.int64)
    leaf = np.empty(rows, dtype=np.int32)
    for start in range(0, rows, 1_000_000):  # the crc per key, a million at a time
        part = ids[start:start + 1_000_000]
        keys = pc.binary_join_element_wise("[", pa.array(part).cast(pa.string()), "]", "")
        leaf[start:start + len(part)] = db.node_of(db.crc_of(keys), leaves)
    order = np.argsort(leaf, kind="stable")
    bounds = np.searchsorted(leaf[order], np.arange(leaves + 1))
    v = db.read_version(mirror_table._delta(path), path)
    adds = []
    for c in range(leaves):
        mine = ids[order[bounds[c]:bounds[c + 1]]]
        if len(mine):
            adds.append(db.write_bucket_file(v.table_uri, offset + c, _rows_of(mine).sort_by("__key")))
    db.commit(v, adds, (), operation="build")


def _events(rows: int, changes: int, seed: int = 7) -> tuple[list[dict], dict[int, str | None]]:
    rnd = random.Random(seed)
    events, expect, used = [], {}, set()
    pos = 1_000
    while len(events) < changes:
        kind = rnd.random()
        k = rows + 1 + len(events) if kind < 0.1 else rnd.randint(1, rows)
        if k in used:
            continue
        used.add(k)
        pos += 1
        if 0.1 <= kind < 0.2:
            events.append({"position": Position(pos).encode(), "table": T.id, "op": "d", "key": encode_key([k]),
                           "before": None, "after": None, "ts_ms": pos, "watermark": None, "snapshot": False,
                           "batch": "round"})
            expect[k] = None
            continue
        row = {"id": k, "customer": f"changed {pos}", "amount": pos * 0.5, "status": "changed"}
        events.append({"position": Position(pos).encode(), "table": T.id, "op": "c" if kind < 0.1 else "u",
                       "key": encode_key([k]), "before": None, "after": encode_row(row), "ts_ms": pos,
                       "watermark": None, "snapshot": False, "batch": "round"})
        expect[k] = row["customer"]
    return events, expect


def _peak_mb() -> float:
    """This process's peak RSS (VmHWM: reset by exec, unlike ru_maxrss, which a child started
    by a process that built a 50M-row mirror would inherit)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _round(data_dir: str, rows: int, changes: int) -> dict:
    """In a fresh process: one apply round; its seconds, bytes written and peak memory."""
    events, _ = _events(rows, changes)
    table = pa.Table.from_pylist(events, schema=EVENT_SCHEMA)
    path = mirror_dir(data_dir, SOURCE, T)
    before = db.read_version(mirror_table._delta(path), path)
    t0 = time.perf_counter()
    MirrorDeltaSink(data_dir, SOURCE).write(table)
    seconds = time.perf_counter() - t0
    after = db.read_version(mirror_table._delta(path), path)
    new = set(after.sizes) - set(before.sizes)
    return {"seconds": seconds, "bytes": sum(after.sizes[p] for p in new), "files": len(new),
            "peak_mb": _peak_mb()}


def _compact_step(data_dir: str) -> dict:
    """In a fresh process: compaction of the most changed bucket (a budget of one bucket)."""
    path = mirror_dir(data_dir, SOURCE, T)
    before = db.read_version(mirror_table._delta(path), path)
    mirror_compaction.CHANGE_SHARE = 0.0  # any change makes a bucket due: the step's cost is one bucket's
    t0 = time.perf_counter()
    out = mirror_compaction.compact_buckets(path, budget_rows=1)
    seconds = time.perf_counter() - t0
    after = db.read_version(mirror_table._delta(path), path)
    new = set(after.sizes) - set(before.sizes)
    return {"seconds": seconds, "bytes": sum(after.sizes[p] for p in new), "buckets": out["buckets"],
            "peak_mb": _peak_mb()}


def _child(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.bench_apply_cost", *args], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.round:
        print(json.dumps(_round(args.round[0], int(args.round[1]), args.changes)))
        return 0
    if args.compact:
        print(json.dumps(_compact_step(args.compact)))
        return 0
    sizes = [int(x) for x in args.rows.split(",")]
    root = args.keep or tempfile.mkdtemp(prefix="bench_apply_cost_")
    print(f"bench apply_cost: one round of {args.changes:,} random changes (80% updates, 10% inserts, 10% deletes) "
          f"on mirrors of {', '.join(f'{n:,}' for n in sizes)} rows; unit {args.unit:,} rows a bucket", flush=True)
    results, failed = [], 0
    try:
        for n in sizes:
            d = f"{root}/m{n}"
            if not storage.exists(mirror_dir(d, SOURCE, T)):
                t0 = time.perf_counter()
                build(d, n, args.unit)
                print(f"  built {n:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
            v = db.read_version(mirror_table._delta(mirror_dir(d, SOURCE, T)), mirror_dir(d, SOURCE, T))
            r = _child("--round", d, str(n), "--changes", str(args.changes))
            c = _child("--compact", d)
            _, expect = _events(n, args.changes)
            got = mirror_readers.mirror_rows_of(d, SOURCE, T, [encode_key([k]) for k in expect])
            seen = dict(zip(got["id"].to_pylist(), got["customer"].to_pylist(), strict=True))
            wrong = sum(1 for k, want in expect.items() if seen.get(k) != want)
            failed += wrong
            results.append((n, sum(1 for f in v.files.values() if f), r, c, wrong))
            share = 100 * r["bytes"] / max(1, sum(v.sizes.values()))  # of the live data files' bytes
            print(f"  {n:>11,} rows, {results[-1][1]:>3} buckets: apply {r['seconds']:6.2f} s, "
                  f"{r['bytes'] / 1e6:7.2f} MB in {r['files']} files ({share:.2f}% of the mirror's "
                  f"{sum(v.sizes.values()) / 1e6:,.0f} MB), peak {r['peak_mb']:6.0f} MB | "
                  f"compaction step {c['seconds']:6.2f} s, {c['bytes'] / 1e6:7.1f} MB, peak {c['peak_mb']:6.0f} MB | "
                  f"{wrong} wrong", flush=True)
        base = results[0]
        print(f"\n  ratio to {base[0]:,} rows   apply: seconds  bytes  peak    compaction step: seconds  bytes  peak")
        for n, _b, r, c, _w in results:
            print(f"  {n:>11,} rows          {r['seconds'] / base[2]['seconds']:6.2f}x {r['bytes'] / base[2]['bytes']:5.2f}x "
                  f"{r['peak_mb'] / base[2]['peak_mb']:5.2f}x                    {c['seconds'] / base[3]['seconds']:6.2f}x "
                  f"{c['bytes'] / max(1, base[3]['bytes']):5.2f}x {c['peak_mb'] / base[3]['peak_mb']:5.2f}x")
        worst = max(max(r["seconds"] / base[2]["seconds"], r["bytes"] / base[2]["bytes"],
                        r["peak_mb"] / base[2]["peak_mb"]) for _n, _b, r, _c, _w in results)
        print(f"\n  largest apply ratio {worst:.2f}x (target: within 3x); {failed} changed key(s) read back wrong")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
