"""Changelog capture without Airflow: drain the source's log to staging, then commit the
offset (I6), one capture per source at a time (the capture lock)."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from .. import storage
from ..core.events import LogEvent, WatermarkEvent
from ..core.position import Position
from ..dialects.base import CaptureResult, ConnectionParams, Dialect
from ..storage.layout import changelog_dir
from ..storage.staged import list_segments, write_segment
from .locks import capture_lock
from .schema_changes import follow_schema_changes

log = logging.getLogger(__name__)


class SourceHandle(Protocol):
    """What a capture needs of a source (hooks.cdc_source.CdcSourceHook is one)."""

    source: str

    def connection_params(self) -> ConnectionParams: ...

    def get_dialect(self) -> Dialect: ...


def stage_changelog(
    dialect: Dialect, data_dir: str, *, max_events: int | None = None, segment_max_events: int | None = None
) -> CaptureResult:
    """Drain the changelog to staging, streaming: a segment is written every
    ``segment_max_events`` events (default: the dialect option, 20,000; 0 = one
    segment per run), each ending at a transaction boundary and named by its position
    range. I6: the offset is committed once, after every segment of the run is durably
    written; a capture that dies before re-reads the whole run from the old offset,
    rewriting the same segment names (the cuts depend only on the start offset and
    the segment size), and any other segment inside the run's range is removed."""
    t0 = time.monotonic()
    directory = changelog_dir(data_dir, dialect.source)
    seg_max = dialect.segment_max_events if segment_max_events is None else int(segment_max_events)
    offset = dialect.load_offset(data_dir)
    paths: list[str] = []
    bounds: list[Position] = []  # first and last position of the run
    counts = [0, 0]  # events, watermarks

    def stage(events: list[LogEvent]) -> None:
        paths.append(write_segment(events, directory, dialect.watermark_table.id))
        if not bounds:
            bounds.append(events[0].position)
        bounds[1:] = [events[-1].position]
        counts[0] += len(events)
        counts[1] += sum(1 for e in events if isinstance(e, WatermarkEvent))

    batch = dialect.read_log(
        offset, max_events=max_events, segment_max_events=seg_max or None, on_segment=stage if seg_max else None
    )
    if batch.events:
        stage(batch.events)
    if paths:
        first, last = bounds[0], bounds[-1]
        mine = set(paths)
        for f_first, f_last, f_path in list_segments(directory):
            # a segment left by a capture that crashed before committing: this run
            # re-read the same events (and maybe more), so it supersedes the orphan
            if f_path not in mine and f_first >= first and f_last <= last:
                storage.delete(f_path)
    dialect.commit_offset(batch.end_offset, data_dir)
    return CaptureResult(
        counts[0],
        counts[1],
        paths[-1] if paths else None,
        batch.start_offset,
        batch.end_offset,
        time.monotonic() - t0,
        tuple(paths),
    )


def run_capture(
    hook: SourceHandle,
    data_dir: str,
    *,
    max_events: int | None = None,
    segment_max_events: int | None = None,
) -> CaptureResult | None:
    """One capture under the source's capture lock; None when another capture holds it.

    The dialect stages segments first (one every ``segment_max_events`` events, ending
    at transaction boundaries; default: the connection's ``segment_max_events`` extra or
    20,000) and commits the offset after the last one, so a capture killed anywhere
    re-delivers its events on the next run and loses nothing (I6).
    """
    params = hook.connection_params()
    with capture_lock(params, hook.source) as acquired:
        if not acquired:
            return None
        with hook.get_dialect() as dialect:
            result = stage_changelog(dialect, data_dir, max_events=max_events, segment_max_events=segment_max_events)
            # after the events, so a column they carry is in the staged schema before apply runs
            stopped = follow_schema_changes(dialect, data_dir, hook.source)
    for tid, why in sorted(stopped.items()):
        log.error("table %s changed in a way its mirror cannot follow (%s): it waits for a re-snapshot", tid, why)
    rate = result.events / result.seconds if result.seconds > 0 else 0.0
    log.info(
        "captured %d events (%d watermarks) of source %r in %.2f s (%.0f events/s), offset %s -> %s, "
        "%d segment(s), last %s",
        result.events,
        result.watermarks,
        hook.source,
        result.seconds,
        rate,
        result.start_offset,
        result.end_offset,
        len(result.segments),
        result.segment,
    )
    return result
