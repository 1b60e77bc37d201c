"""The snapshot's own steps without Airflow or Spark, each against a raw dump of the same table.

Where does a snapshot's time go once the fixed cost of Airflow and spark-submit is off?
For each database this loads the demo table (tools/workload.py), dumps it
raw to Parquet (the baseline of bench_e2e: COPY / a streaming SELECT into pyarrow), then
runs the snapshot's steps in this process, in order, on the same rows:

1. chunks: low watermark -> keyset SELECT -> high watermark, chunk after chunk, each
   staged as Parquet (snapshot.snapshot_chunk, as the chunk task runs it);
2. capture: drain the changelog that holds the watermarks (dialect.capture);
3. merge: the in-process engine (local_jobs.merge_round) into the event log and the
   Delta mirror, and separately into the event log only.

Each step prints rows/s and its ratio to the raw dump; ``--profile`` adds cProfile's top
functions of the chunk and merge steps (the per-row Python work that bounds them).

    python -m bench snapshot_steps [--rows 200000] [--chunk-size 50000] [--dialects postgres,mysql] [--profile]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_cdc.pipeline.capture import stage_changelog
from bench.profiling import profiled

DEFAULT_PG = "postgresql://postgres@127.0.0.1:55432/postgres"
DEFAULT_MY = "mysql://root@127.0.0.1:53306/cdc_test"


def read_all_chunks(d, schema, *, data_dir: str, chunk_size: int) -> list:
    from airflow_provider_cdc.core.ranges import ChunkRange
    from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk

    chunks, after, seq = [], None, 0
    while True:
        seq += 1
        c = snapshot_chunk(d, schema, ChunkRange(), data_dir=data_dir, snapshot_id="bench", seq=seq,
                           limit=chunk_size, after_key=after)
        chunks.append(c)
        if c.exhausted:
            return chunks
        after = c.last_key


def bench_one(kind: str, uri: str, a: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
    from airflow_provider_cdc.pipeline.arrow_engine import merge_round
    from airflow_provider_cdc.pipeline.spark.common import build_sinks
    from airflow_provider_cdc.storage.layout import schema_path
    from bench.bench_e2e import raw_dump_mysql, raw_dump_pg
    from tools.workload import create_demo_table, default_table, quote_table

    u = uuid.uuid4().hex[:6]
    table = default_table(uri, f"bench_steps_{u}")
    work = Path(tempfile.mkdtemp(prefix=f"bench-steps-{kind}-"))
    source = f"bsteps_{u}"
    R: dict[str, Any] = {"kind": kind}
    params = ConnectionParams.from_uri(uri)
    d = get_dialect(params, source=source, tables=[table], watermark_schema="cdc", watermark_table=f"wm_{u}")
    try:
        R["rows"] = create_demo_table(uri, table, a.rows)
        t0 = time.perf_counter()
        n = (raw_dump_pg if kind == "postgres" else raw_dump_mysql)(uri, quote_table(params, table), work / "raw.parquet")
        R["raw_s"] = time.perf_counter() - t0
        assert n == a.rows, (n, a.rows)

        data_dir = str(work / "data")
        d.ensure_watermark_table()
        d.load_offset(data_dir)
        schema = d.describe_table(table)
        p = Path(schema_path(data_dir, source, table))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(schema.to_json())

        t0 = time.perf_counter()
        chunks, R["chunk_profile"] = profiled(a.profile, read_all_chunks, d, schema, data_dir=data_dir,
                                               chunk_size=a.chunk_size)
        R["chunk_s"] = time.perf_counter() - t0
        R["chunks"] = len(chunks)
        assert sum(c.rows for c in chunks) == a.rows
        t0 = time.perf_counter()
        stage_changelog(d, data_dir)
        R["capture_s"] = time.perf_counter() - t0

        for label, sinks in (("merge_events", "events"), ("merge", "events,mirror")):
            out = str(work / f"out-{label}")
            shutil.copytree(data_dir, out)  # the same staged inputs, a fresh output
            built = build_sinks(sinks, data_dir=out, source=source, database=None, require_schema=True)
            moved = [c.__class__(**{**{f: getattr(c, f) for f in c.__dataclass_fields__},
                                    "path": c.path.replace(data_dir, out, 1)}) for c in chunks]
            t0 = time.perf_counter()
            summary, prof = profiled(a.profile and label == "merge", merge_round, moved, data_dir=out, source=source,
                                      sinks=built)
            R[f"{label}_s"] = time.perf_counter() - t0
            if prof:
                R["merge_profile"] = prof
            assert summary["emitted"] == a.rows, summary
    finally:
        try:
            if kind == "postgres":
                d.drop_slot()
                d.drop_publication()
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(table)}")
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
        finally:
            d.close()
            shutil.rmtree(work, ignore_errors=True)
    return R


def report(results: list[dict[str, Any]], a: argparse.Namespace) -> str:
    kinds = [r["kind"] for r in results]
    lines = [f"Rows: {a.rows:,} (demo table); chunk size {a.chunk_size:,}; load average {os.getloadavg()[0]:.2f}", "",
             "| step | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]

    def row(name: str, key: str) -> None:
        cells = []
        for r in results:
            rps = r["rows"] / r[key]
            cells.append(f"{rps:,.0f} rows/s = **{rps * r['raw_s'] / r['rows']:.2f}x** raw" if key != "raw_s"
                         else f"{rps:,.0f} rows/s ({r[key]:.1f} s)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("raw dump to Parquet (baseline)", "raw_s")
    row("chunks: lw -> SELECT -> hw, staged", "chunk_s")
    row("capture of the watermarks", "capture_s")
    row("in-process merge, event log only", "merge_events_s")
    row("in-process merge, event log + Delta mirror", "merge_s")
    for r in results:
        r["steps_s"] = r["chunk_s"] + r["capture_s"] + r["merge_s"]
    row("**chunks + capture + merge, in sequence**", "steps_s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench snapshot_steps", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--chunk-size", type=int, default=50_000)
    ap.add_argument("--dialects", default="postgres,mysql")
    ap.add_argument("--pg-uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--mysql-uri", default=os.environ.get("CDC_TEST_MYSQL_URI", DEFAULT_MY))
    ap.add_argument("--profile", action="store_true", help="cProfile's top functions of the chunk and merge steps")
    a = ap.parse_args(argv)
    results = []
    for kind in [k.strip() for k in a.dialects.split(",") if k.strip()]:
        results.append(bench_one(kind, a.pg_uri if kind == "postgres" else a.mysql_uri, a))
    print(report(results, a))
    if a.profile:
        for r in results:
            print(f"\n--- {r['kind']}: chunk step, top functions by own time ---\n{r['chunk_profile']}")
            print(f"--- {r['kind']}: merge step (events + mirror), top functions by own time ---\n{r['merge_profile']}")
    return 0
