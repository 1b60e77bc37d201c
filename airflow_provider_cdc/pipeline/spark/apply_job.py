"""Spark apply job: staged changelog segments -> the sinks, from each sink's last applied position.

Each sink keeps an applied-position marker (sinks/base.py), written only after the sink
committed a batch, at the end of the batch's last segment. A crash between the commit and
the marker replays that batch, which the sinks absorb (the event log rewrites the same
files, the mirror's position guard ignores what it already has). Watermark rows are not
table events and are not applied.

    spark-submit --master local[2] airflow_provider_cdc/pipeline/spark/apply_job.py \\
        --data-dir DIR --source SRC [--sinks events,mirror]
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

from airflow_provider_cdc.core.position import Position  # noqa: E402
from airflow_provider_cdc.pipeline.arrow_engine import DEFAULT_APPLY_BATCH_ROWS, apply_segments  # noqa: E402
from airflow_provider_cdc.pipeline.spark import common, distributed  # noqa: E402
from airflow_provider_cdc.sinks.base import Sink  # noqa: E402

log = logging.getLogger("airflow_provider_cdc.pipeline.spark.apply_job")

#: staged rows per apply batch on Spark: the events stay on the executors, so a batch is
#: bounded by what a marker move should cover, not by the driver's memory (each batch is a
#: few Spark stages of fixed cost)
SPARK_APPLY_BATCH_ROWS = 2_000_000


def changelog_events(spark, segments, *, after: Position | None, upto: Position | None):
    """Table events (no watermarks) of the staged segments in ``(after, upto]``, with
    ``batch = c-{first}-{last}`` of the segment that holds them (deterministic file names)."""
    from pyspark.sql import functions as F

    df = distributed.read_changelog(spark, segments, after=after, upto=upto).where(F.col("op") != "w")
    return df.select(
        "position", "table", "op", "key", "before", "after", "ts_ms", "watermark",
        F.lit(False).alias("snapshot"),
        F.regexp_replace(F.col("segment"), r"^seg-(.*)\.parquet$", "c-$1").alias("batch"),
    )


def apply_changelog(
    spark,
    data_dir: str,
    source: str,
    sinks: Sequence[Sink],
    *,
    changelog_dir: str | None = None,
    max_segments_per_batch: int = 64,
    max_batch_rows: int = DEFAULT_APPLY_BATCH_ROWS,
) -> dict:
    """Apply every staged segment past each sink's marker; returns counts. The loop (markers,
    batches of segments) is arrow_engine.apply_segments, shared with the in-process engine;
    here the events of a batch never leave the executors."""

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    def read(segments, after, upto):  # read once per batch, kept on the executors until released
        return changelog_events(spark, segments, after=after, upto=upto).persist(StorageLevel.MEMORY_AND_DISK)

    # the events stay on the executors: each sink is written from there (distributed.py)
    return apply_segments(read, data_dir, source, sinks, changelog_dir=changelog_dir,
                          max_segments_per_batch=max_segments_per_batch, max_batch_rows=max_batch_rows,
                          after_mark=lambda df, mark: df.where(F.col("position") > mark.encode()),
                          write=lambda group, df: distributed.write_sinks(spark, df, group),
                          count=lambda df: df.count(), release=lambda df: df.unpersist())


def _parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="apply_job", description="Apply staged changelog segments to the sinks.")
    common.add_common_arguments(p)
    p.add_argument("--max-segments-per-batch", type=int, default=1024, help="segments per apply batch (one marker move)")
    p.add_argument("--max-batch-rows", type=int, default=SPARK_APPLY_BATCH_ROWS,
                   help="staged rows per apply batch (whole segments; a bigger one alone)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    common.configure_logging()
    args = _parse_arguments(argv)
    sinks = common.build_sinks(
        args.sinks, data_dir=args.data_dir, source=args.source, database=args.database,
        pg_uri=args.pg_uri, pg_schema=args.pg_schema, require_schema=False,
    )
    spark = common.get_session("cdc-apply")
    t0 = time.monotonic()
    try:
        summary = apply_changelog(
            spark, args.data_dir, args.source, sinks,
            changelog_dir=args.changelog_dir, max_segments_per_batch=args.max_segments_per_batch,
            max_batch_rows=args.max_batch_rows,
        )
    finally:
        for s in sinks:
            s.close()
    summary = {"engine": "spark", **summary, "seconds": round(time.monotonic() - t0, 3)}
    log.info("apply done: %s", summary)
    print("CDC_APPLY_RESULT " + json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    common.die_with_parent()  # under spark-submit: the Python driver ends with its JVM
    main()
