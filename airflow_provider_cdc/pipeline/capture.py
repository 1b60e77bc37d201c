"""Changelog capture without Airflow: drain the source's log to staging, then commit the
offset (I6), one capture per source at a time (the capture lock)."""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from .. import storage
from ..core.arrow_types import release_memory
from ..core.event_batch import EventBatch, events_to_batch
from ..core.events import LogEvent
from ..core.position import Position
from ..dialects.base import CaptureResult, ConnectionParams, Dialect, LogRead, LogRetention
from ..storage.layout import changelog_dir
from ..storage.segment_index import record_through, refresh_index
from ..storage.staged import list_segments, write_segment
from .locks import capture_lock, lock_key
from .retention import PruneResult, RetentionPolicy, prune_staging
from .schema_changes import follow_log_schemas, follow_schema_changes

log = logging.getLogger(__name__)


class SegmentWriter:
    """Writes a capture's segments on one thread of its own, in order, one at a time, while
    the capture decodes the next: a segment's Parquet encoding and its fsyncs release the GIL
    (they took a quarter of a PostgreSQL capture's own time). At most one segment is written
    while the next is built (:meth:`submit` waits for the one before), so memory holds two
    segments, as a capture that wrote each in turn held one being built and one being written.
    :meth:`written` waits for every segment submitted and returns their locations in order, or
    raises the first write's error: the caller commits its offset only after it (I6). Each
    write runs in the submitter's context (the storage settings of a task, storage.scoped_settings).
    ``pause``: a hook a test sets to hold each write before it starts (a forced interleaving)."""

    def __init__(self, write: Callable[..., str], pause: Callable[[], None] | None = None) -> None:
        self._write = write
        self._pause = pause
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._done: list[str] = []

    def submit(self, *args: Any) -> None:
        self._collect()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cdc-segment-writer")
        self._pending = self._pool.submit(contextvars.copy_context().run, self._run, *args)

    def _run(self, *args: Any) -> str:
        if self._pause is not None:
            self._pause()
        return self._write(*args)

    def _collect(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._done.append(pending.result())

    def written(self) -> list[str]:
        """The locations of every segment submitted since the last call, in order."""
        self._collect()
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Waits for a write still running (its error, if any, is the caller's to have seen or
        not: a capture that failed already re-reads from its offset) and stops the thread."""
        pending, self._pending = self._pending, None
        if pending is not None:
            wait([pending])
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


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
    range. I6: the offset is committed after every segment of a read is durably written (a
    run is one read, or several bounded ones when the dialect reads in steps, see
    ``LogBatch.more``); a capture that dies before re-reads from the old offset, rewriting
    the same segment names (the cuts depend only on the start offset and the segment
    size), and any other segment inside the read's range is removed."""
    t0 = time.monotonic()
    directory = changelog_dir(data_dir, dialect.source)
    seg_max = dialect.segment_max_events if segment_max_events is None else int(segment_max_events)
    offset = dialect.load_offset(data_dir)
    paths: list[str] = []
    spans: list[tuple[Position, Position]] = []  # first and last position of each staged segment
    counts = [0, 0, None]  # events, watermarks, newest commit time (ms)
    # the tables this run staged events of: their log schemas followed once per run, before
    # their first segment, which is typed with them (storage/staged.py)
    schemas: dict = {}

    writer = SegmentWriter(write_segment, pause=_segment_write_pause)

    def stage(events: list[LogEvent] | EventBatch) -> None:
        batch = (
            events if isinstance(events, EventBatch) else events_to_batch(events, dialect.watermark_table.id)
        )
        new = set(batch.tables) - schemas.keys()
        if new:
            schemas.update(follow_log_schemas(dialect, data_dir, dialect.source, new))
        mine = {t: schemas[t] for t in batch.tables if t in schemas}  # this segment's, as they are now
        writer.submit(batch, directory, dialect.watermark_table.id, mine)
        spans.append((batch.first, batch.last))
        counts[0] += len(batch)
        counts[1] += batch.watermarks
        newest = batch.newest_ts_ms
        if newest is not None:
            counts[2] = max(newest, counts[2] or 0)

    start_offset = offset
    try:
        while True:
            # one read of the dialect (a PostgreSQL read is one bounded step: ``more`` says there is
            # more up to the end the run aims at), staged, then committed before the next
            mark = len(paths)
            remaining = None if max_events is None else max_events - counts[0]
            batch = dialect.read_log(
                LogRead(
                    offset,
                    max_events=remaining,
                    segment_max_events=seg_max or None,
                    on_segment=stage if seg_max else None,
                )
            )
            if batch.events:
                stage(batch.events)
            paths.extend(writer.written())  # every segment of the read is durable before its offset moves
            if len(paths) > mark:
                _remove_superseded(directory, spans[mark][0], spans[-1][1], set(paths[mark:]))
            dialect.commit_offset(batch.end_offset, data_dir)
            through = dialect.offset_position(batch.end_offset)
            if through is not None:  # position marks up to here are found (watermark strategy "log")
                record_through(directory, through, int(time.time() * 1000))
            offset = batch.end_offset
            if not batch.more or (max_events is not None and counts[0] >= max_events):
                break
    finally:
        writer.close()
        release_memory()
    return CaptureResult(
        counts[0],
        counts[1],
        paths[-1] if paths else None,
        start_offset,
        offset,
        time.monotonic() - t0,
        tuple(paths),
        counts[2],
    )


def _remove_superseded(directory: str, first: Position, last: Position, mine: set[str]) -> None:
    """Segments left by a capture that crashed before committing, inside the range a read just
    staged again (``first`` .. ``last``, its own segments ``mine``): this read re-read the same
    events (and maybe more), so it supersedes them."""
    for f_first, f_last, f_path in list_segments(directory):
        if f_path not in mine and f_first >= first and f_last <= last:
            storage.delete(f_path)


#: a test's hook: called on the segment writer's thread before each segment is written
_segment_write_pause: Callable[[], None] | None = None


#: the share of the source's log retention limit that may be used before capture warns
DEFAULT_MIN_HEADROOM = 0.25


@dataclass(frozen=True)
class Lag:
    """Where a capture stands against its source's log after a run."""

    source: str
    holder: str  # what keeps the log for it (a replication slot, a binlog file)
    bytes: int  # log written past the committed offset
    seconds: float  # age of the oldest change not captured yet (0: the run read to the end of the log)
    risk: str | None  # why the source may soon drop log the capture needs, and what to do (None: fine)
    # (bytes, seconds) the replica chunks are read from is behind its primary (Dialect.replica_lag)
    replica: tuple[int, float] | None = None
    #: nothing bounds the log the holder may keep (LogRetention.unbounded): not a failure of the
    #: run like ``risk``, a standing warning in status, the page and a metric (None: bounded)
    warning: str | None = None

    def describe(self) -> str:
        return (
            f"source {self.source!r}: {self.bytes:,} bytes and {self.seconds:,.0f} s behind ({self.holder})"
            + (f"; {describe_replica_lag(*self.replica)}" if self.replica else "")
            + (f"; AT RISK: {self.risk}" if self.risk else "")
            + (f"; WARNING: {self.warning}" if self.warning else "")
        )

    def record(self, at: float) -> dict:
        """The JSON the capture task stores for ``airflow cdc status`` (airflow_variables.save_lag)."""
        out = {
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "holder": self.holder,
            "risk": self.risk,
            "warning": self.warning,
            "at": round(at, 3),
        }
        if self.replica is not None:
            behind, seconds = self.replica
            out["replica"] = {
                "bytes": behind,
                "seconds": None if seconds == float("inf") else round(seconds, 3),
            }
        return out


def describe_replica_lag(behind: int, seconds: float | None) -> str:
    """The replica lag in words; ``seconds`` None or infinite: it does not replicate."""
    if seconds is None or seconds == float("inf"):
        return "the replica chunks are read from is not replicating"
    return f"the replica chunks are read from is {behind:,} bytes, {seconds:,.0f} s behind its primary"


def capture_lag(
    source: str,
    reading: LogRetention,
    result: CaptureResult,
    *,
    drained: bool,
    min_headroom: float = DEFAULT_MIN_HEADROOM,
    now_ms: int | None = None,
    replica: tuple[int, float] | None = None,
) -> Lag:
    """The lag after a capture run and the retention risk. ``drained``: the run read to the end
    of the log (not stopped by ``max_events``): nothing older than now is left behind.
    At risk: the log is lost already, or less than ``min_headroom`` of the source's size limit
    is left (PostgreSQL max_slot_wal_keep_size), or the capture is behind by more than
    ``1 - min_headroom`` of its age limit (MariaDB binlog expiry)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    seconds = (
        0.0 if drained or result.newest_ts_ms is None else max(0.0, (now_ms - result.newest_ts_ms) / 1000)
    )
    risk = None
    mb = 1024 * 1024
    if reading.lost:
        risk = (
            f"{reading.holder} is lost: the source already dropped log the capture needs ("
            f"{reading.setting}); "
            f"{reading.fix}"
        )
    elif (
        reading.limit_bytes
        and reading.safe_bytes is not None
        and reading.safe_bytes < min_headroom * reading.limit_bytes
    ):
        risk = (
            f"{reading.holder} can take {reading.safe_bytes / mb:,.0f} MB more WAL before {reading.setting} "
            f"({reading.limit_bytes / mb:,.0f} MB) makes the server drop log it needs; {reading.fix}"
        )
    elif reading.limit_seconds and seconds > (1 - min_headroom) * reading.limit_seconds:
        risk = (
            f"the capture is {seconds:,.0f} s behind and the server purges binlog files older than "
            f"{reading.limit_seconds:,.0f} s ({reading.setting}); {reading.holder} holds the next "
            f"change; {reading.fix}"
        )
    return Lag(
        source,
        reading.holder,
        reading.lag_bytes,
        seconds,
        risk,
        replica,
        warning=getattr(reading, "unbounded", "") or None,
    )


def replica_lag(dialect: Dialect) -> tuple[int, float] | None:
    """The replica lag shown with the capture's (``airflow cdc status``); a replica that cannot
    be asked is logged, not a failed capture: its snapshot chunks fail on their own."""
    try:
        return dialect.replica_lag()
    except Exception as exc:  # noqa: BLE001 - shown, never in the way of the capture
        log.warning("source %r: the replica lag could not be read: %s", dialect.source, exc)
        return None


def maintain_staging(data_dir: str, source: str, retention: RetentionPolicy | None) -> PruneResult | None:
    """(Under the capture lock.) The segment index refreshed, then staging retention; never
    raises: the capture before it has committed already."""
    try:
        if retention is None:
            refresh_index(changelog_dir(data_dir, source))
            return None
        return prune_staging(data_dir, source, retention)
    except Exception:  # noqa: BLE001 - maintenance: the next run tries again
        log.warning(
            "source %r: the staged changelog's index or retention failed this run", source, exc_info=True
        )
        return None


def run_capture(
    hook: SourceHandle,
    data_dir: str,
    *,
    max_events: int | None = None,
    segment_max_events: int | None = None,
    min_headroom: float = DEFAULT_MIN_HEADROOM,
    retention: RetentionPolicy | None = None,
) -> tuple[CaptureResult, Lag | None] | None:
    """One capture under the source's capture lock; None when another capture holds it.

    The dialect stages segments first (one every ``segment_max_events`` events, ending
    at transaction boundaries; default: the connection's ``segment_max_events`` extra or
    20,000) and commits the offset after the last one, so a capture killed anywhere
    re-delivers its events on the next run and loses nothing (I6). Returns the result and the
    source's lag after it (:func:`capture_lag`; None when the dialect cannot tell).

    Still under the lock, the staged changelog's index is brought up to date and, with a
    ``retention`` policy, staging retention removes what nothing holds (pipeline/retention.py);
    a failure there is logged and leaves the capture's result standing.
    """
    params = hook.connection_params()
    source_dialect = hook.get_dialect()  # not connected yet: its options name the slot the lock keys on
    with capture_lock(params, lock_key(source_dialect, data_dir), source_dialect.source) as acquired:
        if not acquired:
            return None
        with source_dialect as dialect:
            result = stage_changelog(
                dialect, data_dir, max_events=max_events, segment_max_events=segment_max_events
            )
            # after the events, so a column they carry is in the staged schema before apply runs
            stopped = follow_schema_changes(dialect, data_dir, hook.source)
            reading = dialect.log_retention(result.end_offset)
            replica = replica_lag(dialect)
        maintain_staging(data_dir, hook.source, retention)
    drained = max_events is None or result.events < max_events
    lag = (
        None
        if reading is None
        else capture_lag(
            hook.source, reading, result, drained=drained, min_headroom=min_headroom, replica=replica
        )
    )
    if lag is not None and lag.warning:
        log.warning("source %r: %s", hook.source, lag.warning)
    for tid, why in sorted(stopped.items()):
        log.error(
            "table %s changed in a way its mirror cannot follow (%s): it waits for a re-snapshot", tid, why
        )
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
    if lag is not None:
        (log.error if lag.risk else log.info)("%s", lag.describe())
    return result, lag
