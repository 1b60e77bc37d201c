"""Spark merge job: DBLog steps 4 and 5 for a round of many chunks in one spark-submit.

For every chunk of the round: find its low and high watermark in the staged changelog
(the first position of an id wins when a capture re-delivered it), drop the chunk keys
that a change of the same table touched strictly between them (all of them after a TRUNCATE
there), and emit the survivors as
``r`` events at the high watermark's position. This is core.window.merge_window's rule,
vectorised (a range join of window bounds against change positions, then an anti-join);
tests/integration/test_spark_jobs.py runs both on the same inputs and compares them.

A chunk whose watermarks are not staged yet is an error (NotReadyError) that names the
chunk: the high-watermark sensor should have waited. Nothing is ever emitted early.

    spark-submit --master local[2] airflow_provider_cdc/spark/merge_job.py \\
        --chunks round.json --data-dir DIR --source SRC [--sinks events,mirror]

``round.json`` is the list of ChunkResult dicts the chunk tasks returned through XCom
(nested lists from mapped tasks are flattened).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":  # run as a script by spark-submit: import the package from its checkout
    sys.path.append(str(Path(__file__).resolve().parent.parent.parent))

from airflow_provider_cdc import storage  # noqa: E402
from airflow_provider_cdc.core.chunk import ChunkResult  # noqa: E402
from airflow_provider_cdc.core.errors import ConfigurationError, NotReadyError, WatermarkError  # noqa: E402
from airflow_provider_cdc.core.position import Position  # noqa: E402
from airflow_provider_cdc.core.staging import changelog_dir as staged_changelog_dir  # noqa: E402
from airflow_provider_cdc.local_jobs import DEFAULT_BATCH_ROWS, window_groups  # noqa: E402
from airflow_provider_cdc.spark import common  # noqa: E402
from airflow_provider_cdc.staging_io import list_segments  # noqa: E402

log = logging.getLogger("airflow_provider_cdc.spark.merge_job")


@dataclass(frozen=True)
class ChunkWindow:
    """A chunk with its watermark positions located in the staged changelog."""

    index: int
    chunk: ChunkResult
    low: str  # encoded position of the low watermark
    high: str  # encoded position of the high watermark
    high_ts_ms: int

    @property
    def batch(self) -> str:
        """Deterministic output name: the same chunk always writes the same event file."""
        return f"r-{self.high}-{self.chunk.high_watermark}"


def describe(chunk: ChunkResult) -> str:
    return f"chunk {chunk.seq} of table {chunk.table} (snapshot {chunk.snapshot_id}, high watermark {chunk.high_watermark})"


def load_chunks(path: str) -> list[ChunkResult]:
    """ChunkResult dicts from a JSON file: a list, nested lists, or {"chunks": [...]}."""
    data = json.loads(storage.read_text(path))
    if isinstance(data, dict):
        data = data.get("chunks", [data])
    flat: list[dict] = []

    def walk(x):
        if isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            flat.append(x)
        elif x is not None:
            raise ConfigurationError(f"--chunks file {path}: expected ChunkResult objects, found {type(x).__name__}")

    walk(data)
    return [ChunkResult.from_dict(d) for d in flat]


def _unique_chunks(chunks: Sequence[ChunkResult | dict]) -> list[ChunkResult]:
    out: dict[str, ChunkResult] = {}
    for c in chunks:
        c = c if isinstance(c, ChunkResult) else ChunkResult.from_dict(c)
        prev = out.get(c.path)
        if prev is not None and prev != c:
            raise ConfigurationError(f"{describe(c)} and {describe(prev)} name the same chunk file {c.path}")
        out[c.path] = c
    return list(out.values())


def locate_windows(spark, chunks: Sequence[ChunkResult | dict], changelog_dir: str) -> list[ChunkWindow]:
    """Find each chunk's lw/hw positions; NotReadyError if any is not staged yet.
    (``spark`` is unused: the lookup reads only watermark rows, on the driver.)"""
    chunks = _unique_chunks(chunks)
    if not chunks:
        return []
    ids = {c.low_watermark for c in chunks} | {c.high_watermark for c in chunks}
    found = common.find_watermarks(list_segments(changelog_dir), ids)
    windows, missing = [], []
    for i, c in enumerate(sorted(chunks, key=lambda c: (c.table, c.snapshot_id, c.seq, c.high_watermark))):
        lo, hi = found.get(c.low_watermark), found.get(c.high_watermark)
        if hi is None:
            missing.append(f"{describe(c)}: high watermark {c.high_watermark!r} (low watermark "
                           f"{'staged' if lo is not None else 'not staged either'})")
            continue
        if lo is None:
            raise WatermarkError(
                f"{describe(c)}: the high watermark is staged at {Position.decode(hi[0])} but the low watermark "
                f"{c.low_watermark!r} is not; the staged changelog at {changelog_dir} must start before the chunk's "
                "low watermark (was a segment removed?). Re-read this chunk"
            )
        if lo[0] >= hi[0]:
            raise WatermarkError(
                f"{describe(c)}: low watermark at {Position.decode(lo[0])} is not before the high watermark at "
                f"{Position.decode(hi[0])}; the watermark ids are mixed up. Re-read this chunk"
            )
        windows.append(ChunkWindow(i, c, lo[0], hi[0], int(hi[1] or 0)))
    if missing:
        raise NotReadyError(
            f"{len(missing)} chunk(s) of the round have a high watermark that is not in the staged changelog at "
            f"{changelog_dir} yet: " + "; ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
            + ". The high-watermark sensor should have waited for them; capture the changelog and retry the merge."
        )
    return windows


def _chunk_rows(spark, windows: Sequence[ChunkWindow]):
    """(cidx, key, after) of every chunk file; checks each file holds the rows its result says."""
    from pyspark.sql import functions as F

    with_rows = [w for w in windows if w.chunk.rows > 0]
    if not with_rows:
        return spark.createDataFrame([], "cidx int, key string, after string")
    rows = spark.read.schema("key string, after string").parquet(*[w.chunk.path for w in with_rows])
    rows = rows.withColumn("file", F.col("_metadata.file_path"))
    counts = {r["file"]: r["count"] for r in rows.groupBy("file").count().collect()}
    by_path = {common.normalise_path(w.chunk.path): w for w in with_rows}
    mapping = []
    seen = set()
    for file, n in counts.items():
        w = by_path.get(common.normalise_path(file))
        if w is None:
            raise ConfigurationError(f"Spark read chunk file {file} that matches no chunk of the round")
        if n != w.chunk.rows:
            raise ConfigurationError(
                f"{describe(w.chunk)}: file {w.chunk.path} holds {n} rows but the chunk result says {w.chunk.rows}; "
                "the file was replaced by another attempt: re-run the chunk task"
            )
        mapping.append((file, w.index))
        seen.add(w.index)
    for w in with_rows:
        if w.index not in seen:
            raise ConfigurationError(f"{describe(w.chunk)}: file {w.chunk.path} holds no rows but the chunk result says {w.chunk.rows}")
    map_df = spark.createDataFrame(mapping, "file string, cidx int")
    return rows.join(F.broadcast(map_df), "file").select("cidx", "key", "after")


def merge_chunks(spark, chunks: Sequence[ChunkResult | dict], changelog_dir: str, *, windows: Sequence[ChunkWindow] | None = None):
    """DataFrame of the round's ``r`` events (sinks/base.py EVENT_SCHEMA columns)."""
    from pyspark.sql import functions as F

    if windows is None:
        windows = locate_windows(spark, chunks, changelog_dir)
    if not windows:
        return spark.createDataFrame([], common.spark_event_schema())
    win_df = spark.createDataFrame(
        [(w.index, w.chunk.table, w.low, w.high, w.chunk.high_watermark, w.high_ts_ms, w.batch) for w in windows],
        "cidx int, wtable string, lw string, hw string, hw_id string, hw_ts long, batch string",
    )
    lo = Position.decode(min(w.low for w in windows))
    hi = Position.decode(max(w.high for w in windows))
    segments = list_segments(changelog_dir)
    changes = (
        common.read_changelog(spark, segments, after=lo, upto=hi)
        .where(F.col("op") != "w")
        .select("table", "key", "position", "op")
    )
    bounds = F.broadcast(win_df.select("cidx", "wtable", "lw", "hw"))
    hits = changes.join(
        bounds,
        (changes["table"] == bounds["wtable"]) & (changes["position"] > bounds["lw"]) & (changes["position"] < bounds["hw"]),
    )
    conflicts = hits.where(F.col("op") != "t").select("cidx", "key").distinct()
    truncated = hits.where(F.col("op") == "t").select("cidx").distinct()  # the whole chunk goes
    rows = _chunk_rows(spark, windows)
    survivors = (
        rows.join(conflicts, ["cidx", "key"], "left_anti")
        .join(truncated, "cidx", "left_anti")
        .join(F.broadcast(win_df), "cidx")
    )
    return survivors.select(
        F.col("hw").alias("position"),
        F.col("wtable").alias("table"),
        F.lit("r").alias("op"),
        "key",
        F.lit(None).cast("string").alias("before"),
        "after",
        F.col("hw_ts").alias("ts_ms"),
        F.col("hw_id").alias("watermark"),
        F.lit(True).alias("snapshot"),
        "batch",
    )


def write_round(
    events_df, windows: Sequence[ChunkWindow], sinks, *, max_batch_rows: int = DEFAULT_BATCH_ROWS, timings: dict | None = None
) -> int:
    """Collect the round to the driver in groups of chunks (bounded memory) and write every
    group to every sink. Returns the number of ``r`` events written; ``timings`` (if given)
    gets the seconds spent in Spark and in the sinks."""
    timings = {} if timings is None else timings
    timings.setdefault("spark_s", 0.0)
    timings.setdefault("sinks_s", 0.0)
    from pyspark.sql import functions as F

    groups = [[w.batch for w in g] for g in window_groups(windows, max_batch_rows)]
    if len(groups) > 1:
        events_df = events_df.persist()
    if not groups:
        return 0
    total = 0
    try:
        for g in groups:
            part = events_df if len(groups) == 1 else events_df.where(F.col("batch").isin(g))
            t0 = time.monotonic()
            table = common.to_event_table(part.toArrow())
            t1 = time.monotonic()
            common.write_to_sinks(sinks, table)
            timings["spark_s"] += t1 - t0
            timings["sinks_s"] += time.monotonic() - t1
            total += table.num_rows
    finally:
        if len(groups) > 1:
            events_df.unpersist()
    return total


def _parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="merge_job", description="Merge a round of snapshot chunks with their watermark windows.")
    p.add_argument("--chunks", required=True, help="JSON file with the round's ChunkResult dicts")
    common.add_common_arguments(p)
    p.add_argument("--changelog-dir", default=None, help="staged changelog (default: from --data-dir/--source)")
    p.add_argument("--max-batch-rows", type=int, default=DEFAULT_BATCH_ROWS,
                   help="chunk rows collected to the driver per sink write (bounds the driver's memory)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    common.configure_logging()
    args = _parse_arguments(argv)
    chunks = load_chunks(args.chunks)
    changelog = args.changelog_dir or staged_changelog_dir(args.data_dir, args.source)
    sinks = common.build_sinks(
        args.sinks, data_dir=args.data_dir, source=args.source, database=args.database,
        pg_uri=args.pg_uri, pg_schema=args.pg_schema, require_schema=True,
        fence_tables=[(c.table, c.snapshot_id) for c in chunks],  # claimed before anything is read
    )
    spark = common.get_session("cdc-merge", rows=sum(c.rows for c in chunks))
    t0 = time.monotonic()
    try:
        windows = locate_windows(spark, chunks, changelog)
        timings = {"locate_s": time.monotonic() - t0}
        t1 = time.monotonic()
        df = merge_chunks(spark, chunks, changelog, windows=windows)  # includes the chunk row-count check
        timings["check_s"] = time.monotonic() - t1
        emitted = write_round(df, windows, sinks, max_batch_rows=args.max_batch_rows, timings=timings)
    finally:
        for s in sinks:
            s.close()
    rows_in = sum(w.chunk.rows for w in windows)
    summary = {
        "engine": "spark", "chunks": len(windows), "rows_in": rows_in, "emitted": emitted, "dropped": rows_in - emitted,
        "seconds": round(time.monotonic() - t0, 3), "sinks": [s.name for s in sinks],
        "shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")),
        **{k: round(v, 3) for k, v in timings.items()},
    }
    log.info("merge round done: %s", summary)
    print("CDC_MERGE_RESULT " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    common.die_with_parent()  # under spark-submit: the Python driver ends with its JVM
    main()
