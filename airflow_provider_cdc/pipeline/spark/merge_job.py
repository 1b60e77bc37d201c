"""Spark merge job: DBLog steps 4 and 5 for a round of many chunks in one spark-submit.

For every chunk of the round: find its low and high watermark in the staged changelog
(the first position of an id wins when a capture re-delivered it), drop the chunk keys
that a change of the same table touched strictly between them (all of them after a TRUNCATE
there), and emit the survivors as
``r`` events at the high watermark's position. A range join of window bounds against
change positions narrows the log to each chunk's window; then each chunk's rows meet its
log rows on an executor (a cogroup by chunk) and core.window's window_survivors and
read_events, the one implementation of steps 4-5, emit its events.
tests/integration/test_engine_conformance.py runs both engines on the same inputs.

A chunk whose watermarks are not staged yet is an error (NotReadyError) that names the
chunk: the high-watermark sensor should have waited. Nothing is ever emitted early.

    spark-submit --master local[2] airflow_provider_cdc/pipeline/spark/merge_job.py \\
        --chunks round.json --data-dir DIR --source SRC [--sinks events,mirror]

``round.json`` is the list of ChunkResult dicts the chunk tasks returned through XCom
(nested lists from mapped tasks are flattened).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script by spark-submit: import the package from its checkout
    sys.path.append(str(Path(__file__).resolve().parents[3]))

from airflow_provider_cdc.core.chunk import ChunkResult  # noqa: E402
from airflow_provider_cdc.core.errors import ConfigurationError  # noqa: E402
from airflow_provider_cdc.core.position import Position  # noqa: E402
from airflow_provider_cdc.pipeline.spark import common, distributed  # noqa: E402
from airflow_provider_cdc.pipeline.windows import (  # noqa: E402
    DEFAULT_BATCH_ROWS,
    ChunkWindow,
    describe,
    load_chunks,
    locate_windows,
)
from airflow_provider_cdc.storage.layout import changelog_dir as staged_changelog_dir  # noqa: E402
from airflow_provider_cdc.storage.staged import CHUNK_SCHEMA, list_segments  # noqa: E402

log = logging.getLogger("airflow_provider_cdc.pipeline.spark.merge_job")


def _chunk_rows(spark, windows: Sequence[ChunkWindow]):
    """(cidx, key, after) of every chunk file, read on the executors; checks each file holds
    the rows its result says (counts per file come back to the driver, not rows)."""
    from pyspark.sql import functions as F

    with_rows = [w for w in windows if w.chunk.rows > 0]
    if not with_rows:
        return spark.createDataFrame([], "cidx int, key string, after string")
    rows = distributed.read_files(spark, [w.chunk.path for w in with_rows], CHUNK_SCHEMA)
    counts = {r[distributed.FILE_COLUMN]: r["count"] for r in rows.groupBy(distributed.FILE_COLUMN).count().collect()}
    for w in with_rows:
        n = counts.get(w.chunk.path, 0)
        if n != w.chunk.rows:
            raise ConfigurationError(
                f"{describe(w.chunk)}: file {w.chunk.path} holds {n} rows but the chunk result says {w.chunk.rows}; "
                "the file was replaced by another attempt: re-run the chunk task"
            )
    map_df = spark.createDataFrame([(w.chunk.path, w.index) for w in with_rows], f"{distributed.FILE_COLUMN} string, cidx int")
    return rows.join(F.broadcast(map_df), distributed.FILE_COLUMN).select("cidx", "key", "after")


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
        distributed.read_changelog(spark, segments, after=lo, upto=hi)
        .where(F.col("op") != "w")
        .select("table", "key", "position", "op")
    )
    bounds = F.broadcast(win_df.select("cidx", "wtable", "lw", "hw"))
    # narrow the log to each chunk's window (a range join: which change can touch which
    # chunk); the rule itself runs per chunk on the executors, in core.window
    hits = changes.join(
        bounds,
        (changes["table"] == bounds["wtable"]) & (changes["position"] > bounds["lw"]) & (changes["position"] < bounds["hw"]),
    ).select("cidx", "table", "op", "key", "position")
    rows = _chunk_rows(spark, windows)
    info = {w.index: (w.chunk.table, w.low, w.high, w.high_ts_ms, w.chunk.high_watermark, w.batch) for w in windows}
    return rows.groupBy("cidx").cogroup(hits.groupBy("cidx")).applyInArrow(
        functools.partial(_merge_chunk, info), schema=common.spark_event_schema()
    )


def _merge_chunk(info: dict, key: tuple, rows, hits):
    """On an executor: DBLog steps 4-5 of one chunk (core.window, the one implementation)."""
    from airflow_provider_cdc.core.window import read_events, window_survivors
    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA

    if rows.num_rows == 0:
        return EVENT_SCHEMA.empty_table()
    table, low, high, ts_ms, watermark, batch = info[key[0].as_py()]
    survivors = window_survivors(rows, hits, table=table, low=low, high=high) if hits.num_rows else rows
    return read_events(survivors, EVENT_SCHEMA, table=table, high=high, high_ts_ms=ts_ms, watermark=watermark, batch=batch)


def write_round(spark, events_df, sinks, *, timings: dict | None = None) -> int:
    """Write the round's events to every sink from the executors (distributed.write_sinks:
    the driver only commits file metadata). Returns the number of ``r`` events."""
    timings = {} if timings is None else timings
    t0 = time.monotonic()
    counts = distributed.write_sinks(spark, events_df, sinks)
    timings["sinks_s"] = time.monotonic() - t0
    return counts["events_in"]


def _parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="merge_job", description="Merge a round of snapshot chunks with their watermark windows.")
    p.add_argument("--chunks", required=True, help="JSON file with the round's ChunkResult dicts")
    common.add_common_arguments(p)
    p.add_argument("--max-batch-rows", type=int, default=DEFAULT_BATCH_ROWS,
                   help="unused since the sinks are written from the executors (kept for old callers)")
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
        emitted = write_round(spark, df, sinks, timings=timings)
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
