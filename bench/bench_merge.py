"""Spark merge job throughput: a round of ``--rows`` chunk rows (default 1M, in ``--chunks``
chunks) against ``--events`` changelog events inside their windows (default 50k), compared
with a plain Spark Parquet read + write of the same chunk files in the same run.

Every Spark side runs through spark-submit with the same master; the rates use the time
measured inside each job after its session started, and the fixed spark-submit overhead
(an empty job: JVM + session start and stop) is printed separately. Also measured, without
Spark: the Delta mirror's write method (delta-rs MERGE with the position guard) against
read-modify-write (read the table, combine in Arrow, overwrite) for one batch of updates.

    python -m bench merge [--rows 1000000] [--events 50000] [--chunks 20] [--mirror] [--master local[2]]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.pipeline.spark.common import spark_submit_command
from airflow_provider_cdc.storage.layout import changelog_dir, chunk_path, schema_path
from airflow_provider_cdc.storage.staged import CHUNK_SCHEMA, atomic_write_table, write_segment

SOURCE = "bench"
TABLE = TableName("public", "orders")
SCHEMA = TableSchema(
    TABLE,
    (Column("id", "int64"), Column("customer", "string"), Column("amount", "decimal(12,2)"), Column("ts", "timestamptz")),
    ("id",),
)
CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g"}

EMPTY_JOB = """
import time
from pyspark.sql import SparkSession
s = SparkSession.builder.appName("bench-empty").getOrCreate()
s.range(1).count()
s.stop()
"""
COPY_JOB = """
import json, sys, time
from pyspark.sql import SparkSession
s = SparkSession.builder.appName("bench-parquet-copy").getOrCreate()
paths, out = json.load(open(sys.argv[1])), sys.argv[2]
t0 = time.monotonic()
df = s.read.parquet(*paths)
df.write.mode("overwrite").parquet(out)
n = s.read.parquet(out).count()
print("BENCH_COPY " + json.dumps({"rows": n, "seconds": time.monotonic() - t0}), flush=True)
s.stop()
"""


def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m bench merge", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="chunk rows in the round")
    ap.add_argument("--events", type=int, default=50_000, help="change events inside the windows")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--mirror", action="store_true", help="also run the merge with the Delta mirror sink")
    ap.add_argument("--mirror-rows", type=int, default=200_000, help="table size for the mirror write-method comparison")
    ap.add_argument("--keep", action="store_true", help="keep the generated data folder")
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_known_args(argv)[0]  # ignore options meant for other benchmarks


def _row(i: int) -> dict:
    return {"id": i, "customer": f"c{i % 977}", "amount": f"{i % 100000}.25", "ts": "2026-11-21T10:00:00.000000Z"}


def build(data_dir: str, rows: int, events: int, n_chunks: int, seed: int) -> list[ChunkResult]:
    """Chunks of consecutive keys; windows overlap pairwise; about half of the window
    events hit a key of the chunk whose window they fall in."""
    rnd = random.Random(seed)
    p = Path(schema_path(data_dir, SOURCE, TABLE))
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(SCHEMA.to_json())
    per = rows // n_chunks
    chunks, log, pos = [], [], 1000
    per_window = max(1, events // n_chunks)

    def nxt() -> Position:
        nonlocal pos
        pos += 1
        return Position(pos)

    for c in range(n_chunks):
        lo, hi = c * per, rows if c == n_chunks - 1 else (c + 1) * per
        keys = [encode_key([i]) for i in range(lo, hi)]
        afters = [encode_row(_row(i)) for i in range(lo, hi)]
        path = chunk_path(data_dir, SOURCE, TABLE, "bench", c, f"hw{c}")
        atomic_write_table(pa.table({"key": keys, "after": afters}, schema=CHUNK_SCHEMA), path)
        chunks.append(ChunkResult(SOURCE, TABLE.id, "bench", c, f"lw{c}", f"hw{c}", path, ChunkRange((lo,), (hi,)),
                                  None, (hi - 1,), hi - lo, True))
        log.append(WatermarkEvent(f"lw{c}", nxt()))
        if c > 0:
            log.append(WatermarkEvent(f"hw{c - 1}", nxt()))  # windows c-1 and c overlap
        for _ in range(per_window):
            k = rnd.randrange(lo, hi) if rnd.random() < 0.5 else rnd.randrange(0, rows * 2)
            log.append(ChangeEvent(TABLE.id, "u", encode_key([k]), nxt(), None, _row(k)))
    log.append(WatermarkEvent(f"hw{n_chunks - 1}", nxt()))
    for i in range(0, len(log), 10_000):
        write_segment(log[i : i + 10_000], changelog_dir(data_dir, SOURCE), "cdc.watermark")
    return chunks


def _run(cmd: list[str], tag: str | None) -> tuple[float, dict | None]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    if tag is None:
        return wall, None
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag)][-1]
    return wall, json.loads(line[len(tag) + 1 :])


def mirror_methods(rows: int, updates: int, seed: int) -> dict:
    """Delta MERGE with the position guard vs read-modify-write, one batch of updates."""
    from deltalake import DeltaTable, write_deltalake

    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
    from airflow_provider_cdc.sinks.mirror_delta import events_to_mirror_rows, upsert

    rnd = random.Random(seed)

    def events(keys, pos):
        return pa.Table.from_pylist(
            [{"position": Position(pos).encode(), "table": TABLE.id, "op": "u", "key": encode_key([k]), "before": None,
              "after": encode_row(_row(k)), "ts_ms": 0, "watermark": None, "snapshot": False, "batch": "b"} for k in keys],
            schema=EVENT_SCHEMA,
        )

    base = events_to_mirror_rows(SCHEMA, events(range(rows), 10))
    batch = events_to_mirror_rows(SCHEMA, events(sorted(rnd.sample(range(rows), min(updates, rows))), 20))
    out = {}
    with tempfile.TemporaryDirectory() as d:
        write_deltalake(f"{d}/m", base)
        t0 = time.monotonic()
        upsert(f"{d}/m", batch)
        out["merge_s"] = time.monotonic() - t0
        write_deltalake(f"{d}/r", base)
        t0 = time.monotonic()
        cur = DeltaTable(f"{d}/r").to_pyarrow_dataset().to_table()
        keep = pc.invert(pc.is_in(cur["__key"], batch["__key"]))
        # (a full RMW would also compare positions per key; this lower bound skips it)
        write_deltalake(f"{d}/r", pa.concat_tables([cur.filter(keep), batch.cast(cur.schema)]), mode="overwrite")
        out["rmw_s"] = time.monotonic() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    work = tempfile.mkdtemp(prefix="bench_merge_")
    try:
        t0 = time.monotonic()
        chunks = build(work, a.rows, a.events, a.chunks, a.seed)
        print(f"staged {a.rows} chunk rows in {a.chunks} chunks + {a.events} window events in {time.monotonic() - t0:.1f} s")
        round_file = Path(work) / "round.json"
        round_file.write_text(json.dumps([c.to_dict() for c in chunks]))
        jobs = Path(work) / "jobs"
        jobs.mkdir()
        (jobs / "empty_job.py").write_text(textwrap.dedent(EMPTY_JOB))
        (jobs / "parquet_copy_job.py").write_text(textwrap.dedent(COPY_JOB))
        (jobs / "paths.json").write_text(json.dumps([c.path for c in chunks]))
        base = ["spark-submit", "--master", a.master] + [x for k, v in CONF.items() for x in ("--conf", f"{k}={v}")]

        overhead, _ = _run([*base, str(jobs / "empty_job.py")], None)
        copy_wall, copy = _run([*base, str(jobs / "parquet_copy_job.py"), str(jobs / "paths.json"), f"{work}/copy-out"], "BENCH_COPY")
        args = ["--chunks", str(round_file), "--data-dir", work, "--source", SOURCE]
        merge_wall, merged = _run(spark_submit_command("merge", [*args, "--sinks", "events"], master=a.master, conf=CONF),
                                  "CDC_MERGE_RESULT")
        if merged["emitted"] <= 0 or merged["emitted"] + merged["dropped"] != a.rows or copy["rows"] != a.rows:
            raise RuntimeError(f"implausible result, not timing it: merge {merged}, copy {copy}")
        copy_rate = copy["rows"] / copy["seconds"]
        merge_rate = merged["rows_in"] / merged["seconds"]
        print(f"spark-submit fixed overhead (empty job, wall):   {overhead:8.1f} s")
        print(f"plain Parquet read+write:  {copy['rows']:>9} rows in {copy['seconds']:6.1f} s = {copy_rate:10,.0f} rows/s"
              f"  (wall {copy_wall:.1f} s)")
        print(f"merge job (event log):     {merged['rows_in']:>9} rows in {merged['seconds']:6.1f} s = {merge_rate:10,.0f} rows/s"
              f"  (wall {merge_wall:.1f} s; {merged['dropped']} rows dropped by windows, {merged['emitted']} emitted)")
        print(f"ratio merge / plain copy: {merge_rate / copy_rate:.2f}")
        result = {"rows": a.rows, "events": a.events, "chunks": a.chunks, "overhead_s": overhead, "copy": copy,
                  "merge_events": merged, "ratio": merge_rate / copy_rate}
        if a.mirror:
            shutil.rmtree(f"{work}/output", ignore_errors=True)
            mw, mm = _run(spark_submit_command("merge", [*args, "--sinks", "events,mirror"], master=a.master, conf=CONF),
                          "CDC_MERGE_RESULT")
            rate = mm["rows_in"] / mm["seconds"]
            print(f"merge job (events+mirror): {mm['rows_in']:>9} rows in {mm['seconds']:6.1f} s = {rate:10,.0f} rows/s"
                  f"  (wall {mw:.1f} s); ratio to plain copy {rate / copy_rate:.2f}")
            result["merge_mirror"] = mm
        mm = mirror_methods(min(a.mirror_rows, a.rows), a.events, a.seed)
        print(f"mirror write of {min(a.events, a.mirror_rows)} updates into {min(a.mirror_rows, a.rows)} rows: "
              f"delta MERGE {mm['merge_s']:.2f} s, read-modify-write {mm['rmw_s']:.2f} s "
              f"(MERGE/RMW time ratio {mm['merge_s'] / mm['rmw_s']:.2f})")
        result["mirror_methods"] = mm
        print("BENCH_MERGE " + json.dumps(result))
        return 0
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
