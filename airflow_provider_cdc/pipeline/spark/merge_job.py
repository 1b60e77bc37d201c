"""Spark merge job: DBLog steps 4 and 5 for a round of many chunks in one spark-submit, each
chunk a unit on an executor calling core.window's one implementation (docs/DESIGN.md, "Scale").
A chunk whose watermarks are not staged yet raises NotReadyError naming it.

    spark-submit --master local[2] airflow_provider_cdc/pipeline/spark/merge_job.py \
        --chunks round.json --data-dir DIR --source SRC [--sinks events,mirror]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__":  # run as a script by spark-submit: import the package from its checkout
    sys.path.append(str(Path(__file__).resolve().parents[3]))

from airflow_provider_cdc.core.chunk import ChunkResult  # noqa: E402
from airflow_provider_cdc.pipeline.arrow_engine import chunk_events, chunk_units  # noqa: E402
from airflow_provider_cdc.pipeline.merge_while_reading import write_receipt  # noqa: E402
from airflow_provider_cdc.pipeline.spark import common, distributed  # noqa: E402
from airflow_provider_cdc.pipeline.windows import (  # noqa: E402
    DEFAULT_BATCH_ROWS,
    ChunkWindow,
    load_chunks,
    locate_windows,
)
from airflow_provider_cdc.storage.layout import changelog_dir as staged_changelog_dir  # noqa: E402
from airflow_provider_cdc.storage.staged import list_segments  # noqa: E402

log = logging.getLogger("airflow_provider_cdc.pipeline.spark.merge_job")


def merge_chunks(
    spark,
    chunks: Sequence[ChunkResult | dict],
    changelog_dir: str,
    *,
    windows: Sequence[ChunkWindow] | None = None,
):
    """DataFrame of the round's ``r`` events (sinks/base.py EVENT_SCHEMA columns), each
    chunk's produced on an executor (arrow_engine.chunk_events)."""
    if windows is None:
        windows = locate_windows(spark, chunks, changelog_dir)
    return distributed.unit_events(spark, chunk_units(windows, list_segments(changelog_dir)), chunk_events)


def write_round(
    spark, windows: Sequence[ChunkWindow], changelog_dir: str, sinks, *, timings: dict | None = None
) -> int:
    """Merge the round and write its events to every sink from the executors: each chunk's
    event-log file by the task that merged it, the mirror's buckets after one shuffle
    (distributed.write_sinks: the driver only commits file metadata). Returns the number of
    ``r`` events."""
    timings = {} if timings is None else timings
    t0 = time.monotonic()
    units = chunk_units(windows, list_segments(changelog_dir))
    counts = distributed.write_sinks(
        spark, units, chunk_events, sinks, tables=sorted({w.chunk.table for w in windows})
    )
    timings["sinks_s"] = time.monotonic() - t0
    return counts["events_in"]


def _parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="merge_job", description="Merge a round of snapshot chunks with their watermark windows."
    )
    p.add_argument("--chunks", required=True, help="JSON file with the round's ChunkResult dicts")
    common.add_common_arguments(p)
    p.add_argument(
        "--max-batch-rows",
        type=int,
        default=DEFAULT_BATCH_ROWS,
        help="unused since the sinks are written from the executors (kept for old callers)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    common.configure_logging()
    args = _parse_arguments(argv)
    options = common.apply_job_arguments(args)
    chunks = load_chunks(args.chunks)
    changelog = args.changelog_dir or staged_changelog_dir(args.data_dir, args.source)
    sinks = common.build_sinks(
        args.sinks,
        data_dir=args.data_dir,
        source=args.source,
        database=args.database,
        options=options,
        require_schema=True,
        fence_tables=[(c.table, c.snapshot_id) for c in chunks],  # claimed before anything is read
    )
    spark = common.get_session("cdc-merge", rows=sum(c.rows for c in chunks))
    t0 = time.monotonic()
    try:
        windows = locate_windows(spark, chunks, changelog)
        timings = {"locate_s": time.monotonic() - t0}
        emitted = write_round(spark, windows, changelog, sinks, timings=timings)
    finally:
        for s in sinks:
            s.close()
    rows_in = sum(w.chunk.rows for w in windows)
    summary = {
        "engine": "spark",
        "chunks": len(windows),
        "rows_in": rows_in,
        "emitted": emitted,
        "dropped": rows_in - emitted,
        "seconds": round(time.monotonic() - t0, 3),
        "sinks": [s.name for s in sinks],
        "shuffle_partitions": int(spark.conf.get("spark.sql.shuffle.partitions")),
        **{k: round(v, 3) for k, v in timings.items()},
    }
    write_receipt(args.chunks, [w.chunk for w in windows])  # after the sinks committed
    log.info("merge round done: %s", summary)
    print("CDC_MERGE_RESULT " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    common.die_with_parent()  # under spark-submit: the Python driver ends with its JVM
    main()
