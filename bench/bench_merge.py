"""Spark merge job throughput: rounds of 1M and 5M chunk rows (``--sizes``; in ``--chunks``
chunks) against ``--events`` changelog events inside their windows (default 50k), compared
with a plain Spark Parquet read + write of the same chunk files in the same run, on a
standalone cluster of two 1-core workers with a 512 MB driver (``--no-cluster``: ``--master``).

Every Spark side runs through spark-submit with the same master; the rates use the time
measured inside each job after its session started, and the fixed spark-submit overhead
(an empty job: JVM + session start and stop) is printed separately. With ``--mirror`` the
round also goes to the Delta mirror and the apply job applies the window events after it
(the default; ``--no-mirror``):
merge + apply rows/s against the plain copy. Every spark-submit's driver peak RSS (the
spark-submit JVM and its Python driver, sampled every 0.2 s) is printed; with ``--cluster``
the jobs run on a standalone cluster of two 1-core workers started for the run, so that
figure is the driver alone (in local mode the executors live in the driver's JVM).
The round is repeated for each size: the driver's peak must stay flat. Also measured, without Spark: the mirror's upsert (merge-on-read change files) against whole-table
read-modify-write for one batch of updates.

    python -m bench merge [--sizes 1000000,5000000] [--events 50000] [--chunks 20] [--no-mirror]
                          [--no-cluster --master local[2]] [--sizes '' --rows 1000000]
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

from airflow_provider_cdc.core.arrow_types import string_array
from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.pipeline.spark.common import spark_submit_command
from airflow_provider_cdc.storage.layout import changelog_dir, chunk_path, schema_path
from airflow_provider_cdc.storage.staged import ChunkWriter, write_segment

SOURCE = "bench"
TABLE = TableName("public", "orders")
SCHEMA = TableSchema(
    TABLE,
    (Column("id", "int64"), Column("customer", "string"), Column("amount", "decimal(12,2)"), Column("ts", "timestamptz")),
    ("id",),
)
CONF = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8", "spark.driver.memory": "2g",
        "spark.executor.memory": "768m"}
#: on a cluster the driver gets what the distributed issue allows it: nothing proportional to the round
CLUSTER_DRIVER = {"spark.driver.memory": "512m", "spark.driver.maxResultSize": "4m"}

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
    ap.add_argument("--rows", type=int, default=1_000_000, help="chunk rows in the round (with --sizes '')")
    ap.add_argument("--events", type=int, default=50_000, help="change events inside the windows")
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--master", default="local[2]", help="the master with --no-cluster")
    ap.add_argument("--mirror", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the merge with the Delta mirror sink, and the apply (default: yes)")
    ap.add_argument("--mirror-rows", type=int, default=200_000, help="table size for the mirror write-method comparison")
    ap.add_argument("--keep", action="store_true", help="keep the generated data folder")
    ap.add_argument("--sizes", default="1000000,5000000",
                    help="comma list of round sizes to run one after the other (driver peak); '' for --rows")
    ap.add_argument("--cluster", action=argparse.BooleanOptionalAction, default=True,
                    help="run on a standalone cluster of two 1-core workers (default: yes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="rounds of 200,000 and 1,000,000 rows")
    a = ap.parse_known_args(argv)[0]  # ignore options meant for other benchmarks
    if a.quick and a.sizes == ap.get_default("sizes"):
        a.sizes = "200000,1000000"
    return a


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
        with ChunkWriter(SCHEMA, path) as writer:  # typed, as a chunk task stages it
            writer.add(string_array(keys), string_array(afters))
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
        write_segment(log[i : i + 10_000], changelog_dir(data_dir, SOURCE), "cdc.watermark", {TABLE.id: SCHEMA})
    return chunks


def _run(cmd: list[str], tag: str | None) -> tuple[float, dict | None]:
    """Run a spark-submit; (wall seconds, the tagged result line with ``driver_peak_mb``)."""
    import threading

    import psutil

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]

    def sample() -> None:  # the driver: spark-submit's JVM and the Python driver it starts
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
                peak[0] = max(peak[0], sum(p.memory_info().rss for p in procs if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join(timeout=2)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... failed ({proc.returncode}):\n{err[-3000:]}")
    if tag is None:
        return wall, {"driver_peak_mb": round(peak[0] / 2**20)}
    line = [ln for ln in out.splitlines() if ln.startswith(tag)][-1]
    return wall, {**json.loads(line[len(tag) + 1 :]), "driver_peak_mb": round(peak[0] / 2**20)}


def mirror_methods(rows: int, updates: int, seed: int) -> dict:
    """The mirror's upsert (change files appended to the buckets it touches) vs whole-table
    read-modify-write, one batch of updates."""
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
        upsert(f"{d}/m", base)  # a bucketed mirror table, as the sinks create it
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


def one_size(a, rows: int, master: str) -> dict:
    work = tempfile.mkdtemp(prefix="bench_merge_")
    try:
        t0 = time.monotonic()
        chunks = build(work, rows, a.events, a.chunks, a.seed)
        print(f"staged {rows} chunk rows in {a.chunks} chunks + {a.events} window events in {time.monotonic() - t0:.1f} s")
        round_file = Path(work) / "round.json"
        round_file.write_text(json.dumps([c.to_dict() for c in chunks]))
        jobs = Path(work) / "jobs"
        jobs.mkdir()
        (jobs / "empty_job.py").write_text(textwrap.dedent(EMPTY_JOB))
        (jobs / "parquet_copy_job.py").write_text(textwrap.dedent(COPY_JOB))
        (jobs / "paths.json").write_text(json.dumps([c.path for c in chunks]))
        base = ["spark-submit", "--master", master] + [x for k, v in CONF.items() for x in ("--conf", f"{k}={v}")]

        overhead, empty = _run([*base, str(jobs / "empty_job.py")], None)
        copy_wall, copy = _run([*base, str(jobs / "parquet_copy_job.py"), str(jobs / "paths.json"), f"{work}/copy-out"],
                               "BENCH_COPY")
        args = ["--chunks", str(round_file), "--data-dir", work, "--source", SOURCE]
        merge_wall, merged = _run(spark_submit_command("merge", [*args, "--sinks", "events"], master=master, conf=CONF),
                                  "CDC_MERGE_RESULT")
        if merged["emitted"] <= 0 or merged["emitted"] + merged["dropped"] != rows or copy["rows"] != rows:
            raise RuntimeError(f"implausible result, not timing it: merge {merged}, copy {copy}")
        copy_rate = copy["rows"] / copy["seconds"]
        merge_rate = merged["rows_in"] / merged["seconds"]
        print(f"spark-submit fixed overhead (empty job, wall):   {overhead:8.1f} s (driver peak {empty['driver_peak_mb']} MB)")
        print(f"plain Parquet read+write:  {copy['rows']:>9} rows in {copy['seconds']:6.1f} s = {copy_rate:10,.0f} rows/s"
              f"  (wall {copy_wall:.1f} s, driver peak {copy['driver_peak_mb']} MB)")
        print(f"merge job (event log):     {merged['rows_in']:>9} rows in {merged['seconds']:6.1f} s = {merge_rate:10,.0f} rows/s"
              f"  (wall {merge_wall:.1f} s, driver peak {merged['driver_peak_mb']} MB; {merged['dropped']} rows dropped "
              f"by windows, {merged['emitted']} emitted)")
        print(f"ratio merge / plain copy: {merge_rate / copy_rate:.2f}")
        result = {"rows": rows, "events": a.events, "chunks": a.chunks, "master": master, "overhead_s": overhead,
                  "copy": copy, "merge_events": merged, "ratio": merge_rate / copy_rate}
        if a.mirror:
            shutil.rmtree(f"{work}/output", ignore_errors=True)
            mw, mm = _run(spark_submit_command("merge", [*args, "--sinks", "events,mirror"], master=master, conf=CONF),
                          "CDC_MERGE_RESULT")
            aw, ap = _run(spark_submit_command("apply", ["--data-dir", work, "--source", SOURCE, "--sinks", "events,mirror"],
                                               master=master, conf=CONF), "CDC_APPLY_RESULT")
            rate = mm["rows_in"] / mm["seconds"]
            both = (mm["rows_in"] + ap["events"]) / (mm["seconds"] + ap["seconds"])
            print(f"merge job (events+mirror): {mm['rows_in']:>9} rows in {mm['seconds']:6.1f} s = {rate:10,.0f} rows/s"
                  f"  (wall {mw:.1f} s, driver peak {mm['driver_peak_mb']} MB); ratio to plain copy {rate / copy_rate:.2f}")
            print(f"apply job (events+mirror): {ap['events']:>9} events in {ap['seconds']:6.1f} s"
                  f"  (wall {aw:.1f} s, driver peak {ap['driver_peak_mb']} MB)")
            print(f"merge + apply round: {both:10,.0f} rows/s; ratio to plain copy {both / copy_rate:.2f}")
            result.update(merge_mirror=mm, apply=ap, round_ratio=both / copy_rate)
        return result
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [a.rows]
    cluster = None
    try:
        master = a.master
        if a.cluster:
            cluster = StandaloneCluster(workers=2).start()
            master = cluster.url
            CONF.update(CLUSTER_DRIVER)
            print(f"standalone cluster {master}: 2 workers of 1 core and 1 GB")
        results = [one_size(a, rows, master) for rows in sizes]
    finally:
        if cluster is not None:
            cluster.stop()
    if len(results) > 1:
        peaks = ", ".join(f"{r['rows']:,} rows: {r['merge_events']['driver_peak_mb']} MB" for r in results)
        print(f"driver peak of the merge job by round size: {peaks}")
    mm = mirror_methods(min(a.mirror_rows, sizes[0]), a.events, a.seed)
    print(f"mirror write of {min(a.events, a.mirror_rows)} updates into {min(a.mirror_rows, sizes[0])} rows: "
          f"upsert {mm['merge_s']:.2f} s, whole-table read-modify-write {mm['rmw_s']:.2f} s "
          f"(time ratio {mm['merge_s'] / mm['rmw_s']:.2f})")
    print("BENCH_MERGE " + json.dumps({"sizes": results, "mirror_methods": mm}))
    return 0


class StandaloneCluster:
    """A master and workers from the pyspark package on 127.0.0.1 (as the tests start them)."""

    def __init__(self, workers: int = 2) -> None:
        self.workers, self.procs, self.url = workers, [], ""
        self.dir = tempfile.mkdtemp(prefix="bench_cluster_")

    def start(self) -> StandaloneCluster:
        import socket

        def port() -> int:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                return sock.getsockname()[1]

        spark_class = shutil.which("spark-class")
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
        p = port()
        self.url = f"spark://127.0.0.1:{p}"
        self._launch([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(p),
                      "--webui-port", str(port())], "master", "I have been elected leader", env)
        for i in range(self.workers):
            self._launch([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--webui-port",
                          str(port()), "-c", "1", "-m", "1g", "--work-dir", f"{self.dir}/work{i}", self.url],
                         f"worker{i}", "Successfully registered with master", env)
        return self

    def _launch(self, cmd: list[str], name: str, ready: str, env: dict) -> None:
        log = Path(self.dir) / f"{name}.log"
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env))
        deadline = time.monotonic() + 180
        while ready not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                raise RuntimeError(f"{name} did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
