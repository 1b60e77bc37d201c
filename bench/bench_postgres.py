"""PostgreSQL benchmark: our capture and chunk reads against the server's own drains, same run.

* capture: ``stage_changelog(PostgresDialect)`` (pgoutput stream, canonical values, staged Parquet
  segment, slot confirmation) against a raw drain of the same slot contents by the
  server's SQL function ``pg_logical_slot_peek_binary_changes`` (pgoutput, same
  publication) on a copy of the slot, fetched to the client through a server-side cursor;
* chunk read: ``read_chunk()`` (keyset pages, canonical values, Parquet) against
  ``COPY (SELECT * ... ORDER BY pk) TO STDOUT`` of the same rows into a byte counter.

Each side runs ``--repeat`` times, interleaved, best time kept (the machine is shared);
the ratios (ours / baseline throughput) are printed last.

    python -m bench postgres [--rows 100000] [--chunk-size 50000] [--repeat 2] [--profile]
    python -m bench postgres --ctid [--rows 5000000] [--chunk-size 500000]

``--ctid``: no capture; a whole-table read of the keyless-table refresh (physical ``ctid``
ranges in one transaction, Dialect.read_whole_table) against the snapshot's key-range read
(keyset chunks of ``--chunk-size``) and the raw ``COPY (SELECT *) TO STDOUT``, same table,
same run; both reads stage the same typed Parquet.
    python -m bench.bench_postgres --uri postgresql://postgres@127.0.0.1:55432/cdc_test
"""

# ruff: noqa: S608 - DDL/DML for a generated table name, quoted; values bound
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import psycopg2

from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ChunkRead, ConnectionParams, TableScan, get_dialect
from airflow_provider_cdc.dialects.postgres import PostgresDialect
from airflow_provider_cdc.pipeline.capture import stage_changelog

DEFAULT_URI = "postgresql://postgres@127.0.0.1:55432/cdc_test"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench postgres", description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_URI))
    ap.add_argument("--rows", type=int, default=100_000, help="rows inserted (plus rows/2 updates)")
    ap.add_argument("--chunk-size", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--ctid", action="store_true",
                    help="compare the ctid-range whole-table read with the key-range read and raw COPY")
    ap.add_argument("--profile", action="store_true",
                    help="one more capture of the same changes under cProfile: its top functions (what bounds it)")
    return ap.parse_args(argv)


class _Counter:
    """A file-like sink for COPY TO: counts bytes and rows, keeps nothing."""

    def __init__(self) -> None:
        self.bytes = 0
        self.rows = 0

    def write(self, data) -> int:
        self.bytes += len(data)
        self.rows += data.count(b"\n") if isinstance(data, bytes) else data.count("\n")
        return len(data)


def _raw_drain(cur, slot: str, publication: str) -> int:
    """Every pgoutput message of the slot, decoded by the server, fetched by the client."""
    name = f"raw_{uuid.uuid4().hex[:8]}"
    cur.execute("BEGIN")
    cur.execute(
        f"DECLARE {name} NO SCROLL CURSOR FOR SELECT data FROM pg_logical_slot_peek_binary_changes("
        "%s, NULL, NULL, 'proto_version', '1', 'publication_names', %s)",
        (slot, f'"{publication}"'),
    )
    changes = 0
    while True:
        cur.execute(f"FETCH 10000 FROM {name}")
        rows = cur.fetchall()
        if not rows:
            break
        for (data,) in rows:
            if bytes(data[:1]) in (b"I", b"U", b"D"):
                changes += 1
    cur.execute("COMMIT")
    return changes


def _ctid(args: argparse.Namespace) -> int:
    """``--ctid`` (module docstring)."""
    params = ConnectionParams.from_uri(args.uri)
    u = uuid.uuid4().hex[:8]
    tname = TableName("public", f"bench_ctid_{u}")
    work = Path(tempfile.mkdtemp(prefix="bench_pg_ctid_"))
    admin = psycopg2.connect(args.uri)
    admin.autocommit = True
    cur = admin.cursor()
    d: PostgresDialect = get_dialect(params, source=f"bench_{u}", watermark_table=f"wm_bench_{u}", tables=[tname])
    qtable = d.quote_table(tname)
    try:
        cur.execute(
            f"CREATE TABLE {qtable} (id bigint PRIMARY KEY, a integer, b text, c double precision, "
            "d timestamptz, e numeric(14,2), g boolean)"
        )
        t0 = time.perf_counter()
        cur.execute(
            f"INSERT INTO {qtable} SELECT i, i %% 1000, 'name-' || i, i * 0.5, "
            "'2024-01-01'::timestamptz + i * interval '1 second', i * 1.25, i %% 2 = 0 "
            "FROM generate_series(1, %s) i",
            (args.rows,),
        )
        cur.execute(f"VACUUM ANALYZE {qtable}")
        cur.execute("SELECT pg_relation_size(%s::regclass)", (qtable,))
        size = cur.fetchone()[0]
        print(f"bench postgres --ctid: {args.rows:,} rows, {size / 1e6:,.0f} MB, loaded in {time.perf_counter() - t0:.1f} s")
        keyed = d.describe_table(tname)
        whole = d.describe_table(tname, keyed=False)
        best = {"ctid": float("inf"), "key": float("inf"), "copy": float("inf")}
        rows = {}
        for r in range(args.repeat):
            t = time.perf_counter()
            out = d.read_whole_table(
                TableScan(whole, lambda i, r=r: str(work / f"ctid-{r}-{i:06d}.parquet"), args.chunk_size)
            )
            best["ctid"] = min(best["ctid"], time.perf_counter() - t)
            rows["ctid"] = out.rows
            files = len(out.files)

            t, after, n, seq = time.perf_counter(), None, 0, 0
            while True:
                path = str(work / f"key-{r}-{seq}.parquet")
                res = d.read_chunk(ChunkRead(keyed, FULL_RANGE, after, args.chunk_size, path))
                n, seq, after = n + res.rows, seq + 1, res.last_key
                if res.rows < args.chunk_size:
                    break
            best["key"] = min(best["key"], time.perf_counter() - t)
            rows["key"] = n

            t, sink = time.perf_counter(), _Counter()
            cur.copy_expert(f"COPY (SELECT * FROM {qtable}) TO STDOUT", sink)
            best["copy"] = min(best["copy"], time.perf_counter() - t)
            rows["copy"] = sink.rows
            for f in work.glob("*.parquet"):
                f.unlink()
        rate = {k: rows[k] / best[k] for k in best}
        print(f"  ctid ranges, one transaction ({files} files):    {rows['ctid']:,} rows in {best['ctid']:.2f} s = {rate['ctid']:,.0f} rows/s")
        print(f"  key ranges (keyset chunks of {args.chunk_size:,}):      {rows['key']:,} rows in {best['key']:.2f} s = {rate['key']:,.0f} rows/s")
        print(f"  COPY (SELECT *) TO STDOUT, bytes counted only:  {rows['copy']:,} rows in {best['copy']:.2f} s = {rate['copy']:,.0f} rows/s")
        print(f"RATIO ctid_read/key_read = {rate['ctid'] / rate['key']:.2f}")
        print(f"RATIO ctid_read/copy_to_stdout = {rate['ctid'] / rate['copy']:.2f}")
        print(f"RATIO key_read/copy_to_stdout = {rate['key'] / rate['copy']:.2f}")
        return 0 if rows["ctid"] == rows["key"] == rows["copy"] == args.rows else 1
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {qtable}")
        d.close()
        admin.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.ctid:
        return _ctid(args)
    params = ConnectionParams.from_uri(args.uri)
    u = uuid.uuid4().hex[:8]
    tname = TableName("public", f"bench_{u}")
    work = Path(tempfile.mkdtemp(prefix="bench_pg_"))
    admin = psycopg2.connect(args.uri)
    admin.autocommit = True
    cur = admin.cursor()
    source = f"bench_{u}"
    base: PostgresDialect = get_dialect(
        params, source=source, watermark_table=f"wm_bench_{u}", tables=[tname]
    )
    qtable = base.quote_table(tname)
    slots: list[str] = []
    try:
        cur.execute(
            f"CREATE TABLE {qtable} (id bigint PRIMARY KEY, a integer, b text, c double precision, "
            "d timestamptz, e numeric(14,2), f bytea, g boolean)"
        )
        print(f"bench postgres: {args.rows} inserts + {args.rows // 2} updates into {tname}")
        base.load_offset(str(work / "origin"))  # publication + slot, positioned before the load
        t0 = time.perf_counter()
        cur.execute(
            f"INSERT INTO {qtable} SELECT i, i %% 1000, 'name-' || i, i * 0.5, "
            "'2024-01-01'::timestamptz + i * interval '1 second', i * 1.25, decode(md5(i::text), 'hex'), i %% 2 = 0 "
            "FROM generate_series(1, %s) i",
            (args.rows,),
        )
        for lo in range(1, args.rows + 1, 20_000):  # updates in a few transactions
            cur.execute(
                f"UPDATE {qtable} SET a = a + 1, b = b || '!' WHERE id %% 2 = 0 AND id >= %s AND id < %s",
                (lo, lo + 20_000),
            )
        print(f"  load: {time.perf_counter() - t0:.1f} s")
        # copies of the slot at the same position: one per capture repeat, one for the raw drain
        for r in range(args.repeat + 1 + int(args.profile)):
            name = f"{base.slot_name}_c{r}"
            cur.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (base.slot_name, name))
            slots.append(name)
        schema = base.describe_table(tname)

        cap_best = raw_best = chunk_best = copy_best = float("inf")
        cap_cpu = chunk_cpu = 0.0  # our process's CPU seconds in the best run (the rest is waiting)
        events = raw_changes = chunk_rows = copy_rows = 0
        for r in range(args.repeat):
            t = time.perf_counter()
            raw_changes = _raw_drain(cur, slots[-1], base.publication_name)
            raw_best = min(raw_best, time.perf_counter() - t)

            with get_dialect(
                params, source=source, watermark_table=f"wm_bench_{u}", tables=[tname], slot_name=slots[r]
            ) as d:
                t, cpu = time.perf_counter(), time.process_time()
                res = stage_changelog(d, str(work / f"cap-{r}"))
                if time.perf_counter() - t < cap_best:
                    cap_best, cap_cpu = time.perf_counter() - t, time.process_time() - cpu
                events = res.events

            t, cpu = time.perf_counter(), time.process_time()
            after, chunk_rows, seq = None, 0, 0
            while True:
                path = str(work / f"chunk-{r}-{seq}.parquet")
                out = base.read_chunk(ChunkRead(schema, FULL_RANGE, after, args.chunk_size, path))
                chunk_rows += out.rows
                seq += 1
                if out.rows < args.chunk_size:
                    break
                after = out.last_key
            if time.perf_counter() - t < chunk_best:
                chunk_best, chunk_cpu = time.perf_counter() - t, time.process_time() - cpu

            t = time.perf_counter()
            sink = _Counter()
            cur.copy_expert(f"COPY (SELECT * FROM {qtable} ORDER BY id) TO STDOUT", sink)
            copy_rows = sink.rows
            copy_best = min(copy_best, time.perf_counter() - t)

        if args.profile:  # the last copy but one (the raw drain reads the last)
            from bench.profiling import profiled

            with get_dialect(
                params, source=source, watermark_table=f"wm_bench_{u}", tables=[tname], slot_name=slots[-2]
            ) as d:
                _res, prof = profiled(True, stage_changelog, d, str(work / "cap-profile"))
            print(f"  capture under cProfile (top functions by own time):\n{prof}")
        if events != raw_changes:
            print(f"  note: capture saw {events} events, the raw drain {raw_changes} row changes")
        cap_rate, raw_rate = events / cap_best, raw_changes / raw_best
        chunk_rate, copy_rate = chunk_rows / chunk_best, copy_rows / copy_best
        print(
            f"  capture (COPY of the slot + canonical + Parquet + confirm): {events} events in {cap_best:.2f} s = {cap_rate:,.0f} ev/s"
        )
        print(
            f"  raw drain pg_logical_slot_peek_binary_changes, same slot: {raw_changes} changes in {raw_best:.2f} s = {raw_rate:,.0f} ev/s"
        )
        print(
            f"  chunk read (keyset pages of {args.chunk_size}, Parquet):          {chunk_rows} rows in {chunk_best:.2f} s = {chunk_rate:,.0f} rows/s"
        )
        print(
            f"  COPY (SELECT ... ORDER BY id) TO STDOUT, same rows:        {copy_rows} rows in {copy_best:.2f} s = {copy_rate:,.0f} rows/s"
        )
        print(
            f"  our process CPU in those runs: capture {cap_cpu:.2f} s ({events / max(cap_cpu, 1e-9):,.0f} ev per CPU-s), "
            f"chunk read {chunk_cpu:.2f} s ({chunk_rows / max(chunk_cpu, 1e-9):,.0f} rows per CPU-s)"
        )
        print(f"RATIO capture/raw_drain = {cap_rate / raw_rate:.2f}")
        print(f"RATIO chunk_read/copy_to_stdout = {chunk_rate / copy_rate:.2f}")
        return 0
    finally:
        for s in slots:
            cur.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (s,),
            )
        base.drop_slot()
        base.drop_publication()
        cur.execute(f"DROP TABLE IF EXISTS {qtable}")
        cur.execute(f"DROP TABLE IF EXISTS {base.quote_table(base.watermark_table)}")
        base.close()
        admin.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
