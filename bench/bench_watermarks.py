"""Watermark strategies side by side: a whole-table snapshot of ``--rows`` rows read chunk by
chunk (DBLog steps 1-3, pipeline.snapshot.snapshot_chunk) under writers that commit as fast as
the source lets them, once with watermark rows (``table``) and once without writes (``log``),
on PostgreSQL and MariaDB, in one run; then once more under ``log`` with the chunks read from
a replica (PostgreSQL's hot standby; for MariaDB, the whole source is the replica), writers
still on the primary.

Reported per database and strategy: the snapshot's rows/s and the writers' transactions/s
while it ran, each as a ratio: the snapshot against ``table`` on the same database, the
writers against themselves with no snapshot running (measured in the same run, just before).
The merge is not part of it (it does not touch the source).

    python -m bench watermarks [--rows 200000] [--chunk-size 5000] [--writers 2] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
from bench.bench_e2e import DEFAULT_MY, DEFAULT_PG
from tools import workload as w


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench watermarks", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--chunk-size", type=int, default=5_000)
    ap.add_argument("--writers", type=int, default=2, help="writer threads (no rate limit)")
    ap.add_argument("--seconds", type=float, default=5.0, help="how long the writers run alone first")
    ap.add_argument("--pg-uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--mysql-uri", default=os.environ.get("CDC_TEST_MYSQL_URI", DEFAULT_MY))
    ap.add_argument("--pg-standby-uri", default=os.environ.get("CDC_TEST_PG_STANDBY_URI"))
    ap.add_argument("--mysql-replica-uri", default=os.environ.get("CDC_TEST_MYSQL_REPLICA_URI"))
    ap.add_argument("--only", choices=["pg", "mysql"], default=None)
    return ap.parse_known_args(argv)[0]  # ignore options meant for other benchmarks


def _snapshot(uri: str, table: TableName, strategy: str, chunk_size: int, work: str,
              **options) -> tuple[int, float]:
    """Read the whole table chunk by chunk; (rows, seconds)."""
    with get_dialect(ConnectionParams.from_uri(uri), source=f"bench_wm_{strategy}", tables=[table],
                     watermark_table="bench_wm", watermark_strategy=strategy, **options) as d:
        d.prepare_watermarks()
        schema = d.describe_table(table)
        rows, after, seq, t0 = 0, None, 0, time.perf_counter()
        while True:
            res = snapshot_chunk(d, schema, FULL_RANGE, data_dir=work, snapshot_id="bench", seq=seq,
                                 limit=chunk_size, after_key=after)
            rows, seq = rows + res.rows, seq + 1
            if res.exhausted:
                return rows, time.perf_counter() - t0
            after = res.last_key


def _writers(uri: str, table: TableName, n: int, rows: int) -> w.BackgroundWriter:
    return w.BackgroundWriter(uri, table, threads=n, rate=None, key_max=rows, seed=7,
                              mix={"update": 80, "multi": 20})


def run_db(name: str, uri: str, args: argparse.Namespace, replica: str | None = None) -> list[str]:
    table = w.default_table(uri, "bench_watermarks")
    w.create_demo_table(uri, table, args.rows)
    work = tempfile.mkdtemp(prefix="bench_wm_")
    out = []
    try:
        with _writers(uri, table, args.writers, args.rows) as alone:
            time.sleep(args.seconds)
        base_tps = alone.stats().tps
        results = {}
        for strategy in ("table", "log"):
            with _writers(uri, table, args.writers, args.rows) as busy:
                rows, secs = _snapshot(uri, table, strategy, args.chunk_size, os.path.join(work, strategy))
            results[strategy] = (rows, secs, busy.stats().tps)
        if replica:  # PostgreSQL: chunks from the standby; MariaDB: the source is the replica
            on_pg = name == "postgres"
            source = uri if on_pg else replica
            options = {"read_params": ConnectionParams.from_uri(replica)} if on_pg else {}
            with _writers(uri, table, args.writers, args.rows) as busy:
                rows, secs = _snapshot(source, table, "log", args.chunk_size, os.path.join(work, "replica"), **options)
            results["log, replica"] = (rows, secs, busy.stats().tps)
        t_rate = results["table"][0] / results["table"][1]
        for strategy, (rows, secs, tps) in results.items():
            rate = rows / secs
            out.append(f"{name:8} {strategy:12} {rows:>9,} rows {secs:7.1f} s {rate:>9,.0f} rows/s "
                       f"({rate / t_rate:.2f}x table)  writers {tps:>7,.0f} tx/s ({tps / base_tps:.2f}x alone: "
                       f"{base_tps:,.0f} tx/s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        w.drop_table(uri, table)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    lines = []
    for name, uri, replica in (("postgres", args.pg_uri, args.pg_standby_uri),
                               ("mariadb", args.mysql_uri, args.mysql_replica_uri)):
        if args.only and not name.startswith(args.only.replace("mysql", "maria")):
            continue
        lines += run_db(name, uri, args, replica)
    print(f"snapshot of {args.rows:,} rows in chunks of {args.chunk_size:,} under {args.writers} writer thread(s):")
    for line in lines:
        print("  " + line)
    return 0
