"""Spark apply job: staged changelog segments -> the sinks, from each sink's applied-position
marker (docs/DESIGN.md, "Components": apply).

    spark-submit --master local[2] airflow_provider_cdc/pipeline/spark/apply_job.py \
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
from airflow_provider_cdc.pipeline.arrow_engine import (  # noqa: E402
    DEFAULT_APPLY_BATCH_ROWS,
    apply_segments,
    segment_events,
    segment_units,
)
from airflow_provider_cdc.pipeline.spark import common, distributed  # noqa: E402
from airflow_provider_cdc.sinks.base import Sink  # noqa: E402

log = logging.getLogger("airflow_provider_cdc.pipeline.spark.apply_job")

#: staged rows per apply batch on Spark: the events stay on the executors, so a batch is
#: bounded by what a marker move should cover, not by the driver's memory (each batch is a
#: few Spark stages of fixed cost)
SPARK_APPLY_BATCH_ROWS = 2_000_000


class Batch:
    """One apply batch as the Spark engine holds it: not the events, only the segments and
    the range ``(after, upto]`` the executors read them in (arrow_engine.segment_events);
    ``count`` is the batch's events once a write counted them."""

    def __init__(
        self, segments, after: Position | None, upto: Position | None, root: Batch | None = None
    ) -> None:
        self.segments, self.after, self.upto, self.root = segments, after, upto, root or self
        self.count: int | None = None

    def past(self, mark: Position) -> Batch:
        """The same batch without the events at or before ``mark`` (a sink already has them)."""
        after = mark if self.after is None or mark > self.after else self.after
        return Batch(self.segments, after, self.upto, self.root)

    def units(self) -> list[tuple]:
        """One unit per segment that can hold events of the range (arrow_engine.segment_units)."""
        return segment_units(self.segments, self.after, self.upto)

    def record(self, counts: dict) -> None:
        if self.after == self.root.after:  # the whole batch: its event count
            self.root.count = counts["events_in"]


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
    here the events of a batch are produced and written on the executors, segment by segment
    (distributed.write_sinks)."""

    def write(group, batch: Batch) -> None:
        batch.record(distributed.write_sinks(spark, batch.units(), segment_events, group))

    def count(batch: Batch) -> int:
        if batch.count is None:  # no write covered the whole batch (cannot happen: the lowest marker's does)
            batch.count = distributed.unit_events(spark, batch.units(), segment_events).count()
        return batch.count

    return apply_segments(
        lambda segments, after, upto: Batch(segments, after, upto),
        data_dir,
        source,
        sinks,
        changelog_dir=changelog_dir,
        max_segments_per_batch=max_segments_per_batch,
        max_batch_rows=max_batch_rows,
        after_mark=lambda b, mark: b.past(mark),
        write=write,
        count=count,
    )


def _parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="apply_job", description="Apply staged changelog segments to the sinks.")
    common.add_common_arguments(p)
    p.add_argument(
        "--max-segments-per-batch", type=int, default=1024, help="segments per apply batch (one marker move)"
    )
    p.add_argument(
        "--max-batch-rows",
        type=int,
        default=SPARK_APPLY_BATCH_ROWS,
        help="staged rows per apply batch (whole segments; a bigger one alone)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    common.configure_logging()
    args = _parse_arguments(argv)
    options = common.apply_job_arguments(args)
    sinks = common.build_sinks(
        args.sinks,
        data_dir=args.data_dir,
        source=args.source,
        database=args.database,
        options=options,
        require_schema=False,
    )
    spark = common.get_session("cdc-apply")
    t0 = time.monotonic()
    try:
        summary = apply_changelog(
            spark,
            args.data_dir,
            args.source,
            sinks,
            changelog_dir=args.changelog_dir,
            max_segments_per_batch=args.max_segments_per_batch,
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
