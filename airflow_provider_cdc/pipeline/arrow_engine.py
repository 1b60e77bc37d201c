"""The merge and apply jobs in one Python process (pyarrow), for rounds too small to pay a
spark-submit (~20 s before it reads a byte); the operators choose by ``local_max_rows``.

Both engines locate windows, call core.window's steps 4-5, de-duplicate segments and name
batches the same way and write through the same sinks, so their outputs are identical (I8,
tests/integration/test_engine_conformance.py). The apply loop (:func:`apply_segments`) is
shared: the Spark apply job calls it with a reader of Spark's rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.arrow_types import release_memory
from ..core.chunk import ChunkResult
from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.window import read_events, window_survivors
from ..sinks.base import (
    Sink,
    TableEvents,
    join_table_events,
    read_marker,
    to_json_events,
    typed_event_schema,
    typed_events_table,
    write_marker,
    write_to_sinks,
)
from ..storage.layout import changelog_dir as staged_changelog_dir
from ..storage.layout import parse_segment_name
from ..storage.segment_index import read_index
from ..storage.staged import (
    CHANGELOG_SCHEMA,
    SEGMENT_SCHEMA,
    list_segments,
    read_chunk,
    read_table,
    segment_images,
    segment_lower_bounds,
)
from .windows import DEFAULT_BATCH_ROWS, describe, locate_windows, window_groups

log = logging.getLogger(__name__)

Segments = Sequence[tuple[Position, Position, str]]
#: an apply batch (whole segments; a bigger segment alone) holds at most this many staged bytes,
#: uncompressed (the segments' Parquet footers): what a batch costs in memory on its way into the
#: mirror follows its events' bytes, not their count. 100,000 wide events (full before and after
#: images) in one batch once took the worker to ~1 GB, so batches held 20,000 events whatever
#: their width; every batch is a commit per table, each 0.1-0.5 s whatever its rows, so narrow
#: events (pgbench's: 161 bytes) paid five commits per table for a 91,560-event round (6.4 s;
#: in one batch 2.9 s, +60 MB). 16 MB: a one-task round's capped capture of narrow events (90,000
#: of pgbench's, 14.5 MB) is one batch; at 8 MB it was two, and the second commit per table took
#: 1.6 of the round's 9.6 s under ``bench sustained``
DEFAULT_APPLY_BATCH_BYTES = 16 * 2**20
#: and at most this many rows
DEFAULT_APPLY_BATCH_ROWS = 100_000
#: (segments, after, upto) -> table events of the segments in (after, upto] (the in-process
#: engine: a TableEvents per table; the Spark apply job: its own batch description)
EventReader = Callable[[Segments, Position | None, Position | None], object]


# --- reading staged files ----------------------------------------------------------------------
def _read_parquet(path: str, columns: Sequence[str]) -> pa.Table:
    """``columns`` of a staged file; a staged-changelog column the file predates (``origin``,
    added later) reads null."""
    fs, p = storage.filesystem(path)
    with fs.open_input_file(p) as fh:
        f = pq.ParquetFile(fh)
        have = set(f.schema_arrow.names)
        t = f.read(columns=[c for c in columns if c in have])
    for c in columns:
        if c not in have and c in CHANGELOG_SCHEMA.names:
            t = t.append_column(
                CHANGELOG_SCHEMA.field(c), pa.nulls(t.num_rows, CHANGELOG_SCHEMA.field(c).type)
            )
    return t.select(list(columns))


def segment_table(
    path: str,
    *,
    lower: str = "",
    after: Position | None = None,
    upto: Position | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """One staged segment's events with ``lower < position`` (its de-duplication bound,
    storage.staged.segment_lower_bounds) and ``after < position <= upto``, in ``columns``
    (position always included)."""
    cols = list(columns or SEGMENT_SCHEMA.names)
    if "position" not in cols:
        cols.insert(0, "position")
    t = _read_parquet(path, cols).cast(pa.schema([CHANGELOG_SCHEMA.field(c) for c in cols]))
    return t.filter(
        _in_range(
            t["position"],
            lower,
            None if after is None else after.encode(),
            None if upto is None else upto.encode(),
        )
    )


def _in_range(positions, lower: str, after: str | None, upto: str | None):
    """The mask of encoded ``positions`` with ``lower < p``, ``after < p`` and ``p <= upto``
    (None: open)."""
    mask = pc.greater(positions, lower)
    if after is not None:
        mask = pc.and_(mask, pc.greater(positions, after))
    if upto is not None:
        mask = pc.and_(mask, pc.less_equal(positions, upto))
    return mask


def segment_units(segments: Segments, after: Position | None, upto: Position | None) -> list[tuple]:
    """One unit per staged segment that can hold events in ``(after, upto]``: ``(path, lower,
    after, upto)`` with encoded positions (None: open), ``lower`` the segment's
    de-duplication bound judged over every segment (storage.staged.segment_lower_bounds: an
    event in overlapping segments counts in the first). Both engines read these."""
    bounds = segment_lower_bounds(segments)
    a, u = (None if p is None else p.encode() for p in (after, upto))
    return [
        (path, bounds[path.rsplit("/", 1)[-1]], a, u)
        for first, last, path in segments
        if (after is None or last > after) and (upto is None or first <= upto)
    ]


def read_changelog(
    segments: Segments,
    *,
    after: Position | None = None,
    upto: Position | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Staged events with ``after < position <= upto`` without duplicates, as one Arrow table
    in segment order."""
    cols = list(columns or SEGMENT_SCHEMA.names)
    if "position" not in cols:
        cols.insert(0, "position")
    parts = [
        segment_table(path, lower=lower, after=after, upto=upto, columns=cols)
        for path, lower, _a, _u in segment_units(segments, after, upto)
    ]
    return (
        pa.concat_tables(parts)
        if parts
        else pa.schema([CHANGELOG_SCHEMA.field(c) for c in cols]).empty_table()
    )


def changelog_events(segments: Segments, after: Position | None, upto: Position | None) -> list[TableEvents]:
    """Table events (no watermarks) in ``(after, upto]``, one TableEvents per table (images
    typed at different positions joined, sinks/base.py join_table_events), ``batch`` =
    ``c-{first}-{last}`` of the segment that holds them."""
    return join_table_events(p for unit in segment_units(segments, after, upto) for p in segment_events(unit))


def segment_events(unit: tuple) -> list[TableEvents]:
    """The table events of one staged segment (a :func:`segment_units` unit), a TableEvents
    per table with the images as staged (typed), ``batch`` = ``c-{first}-{last}`` of the
    segment. What one Spark task produces."""
    path, lower, after, upto = unit
    t = read_table(path)  # every column: the log columns and each table's typed images
    t = t.filter(_in_range(t["position"], lower, after, upto))  # segment_images leaves watermarks out
    return _segment_table_events(t, batch_name(path, t["position"], lower, after, upto))


def batch_name(path: str, positions: pa.ChunkedArray | pa.Array, *bounds: str | None) -> str:
    """``c-{first}-{last}``: the staged segment's range, narrowed to the ``positions`` it keeps
    where a bound (a de-duplication bound, a marker, ``upto``) cuts it. An event-log file
    claims its name's range (sinks/event_log_table.superseded): a segment re-read after a
    failover from before the applied mark, named for all of it, claimed events other files hold."""
    first, last = parse_segment_name(path.rsplit("/", 1)[-1])
    lo, hi = first.encode(), last.encode()
    cut_low = any(b is not None and b >= lo for b in bounds[:2])
    cut_high = bounds[2] is not None and bounds[2] < hi
    if (cut_low or cut_high) and len(positions):
        kept_lo, kept_hi = (x.as_py() for x in pc.min_max(positions).values())
        lo = kept_lo if cut_low else lo
        hi = kept_hi if cut_high else hi
    return f"c-{lo}-{hi}"


def _segment_table_events(t: pa.Table, batch: str) -> list[TableEvents]:
    out = []
    for table, schema, text, part in segment_images(t):
        n = part.num_rows
        cols = {
            **{c: part[c] for c in part.column_names},
            "snapshot": pa.repeat(pa.scalar(False), n),
            "batch": pa.repeat(pa.scalar(batch, pa.string()), n),
        }
        out.append(
            TableEvents(table, schema, tuple(text), typed_events_table(cols, part["before"], part["after"]))
        )
    return out


def _segment_rows(path: str) -> int:
    return _segment_size(path)[0]


def _segment_size(path: str) -> tuple[int, int]:
    """A staged segment's rows and uncompressed bytes, from its Parquet footer."""
    fs, p = storage.filesystem(path)
    with fs.open_input_file(p) as fh:
        meta = pq.ParquetFile(fh).metadata
    return meta.num_rows, sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


def pending_rows(
    data_dir: str, source: str, sink_names: Sequence[str], *, changelog_dir: str | None = None
) -> int:
    """Rows of the staged segments the apply job would read (past the oldest applied marker),
    from Parquet footers only: an upper bound (a segment is counted whole)."""
    changelog = changelog_dir or staged_changelog_dir(data_dir, source)
    markers = [read_marker(data_dir, source, s) for s in sink_names]
    start = None if not markers or any(m is None for m in markers) else min(markers)
    from ..storage.segment_index import staged_segments

    total = 0
    for s in staged_segments(changelog):  # rows from the index; a segment it does not name, from its footer
        if start is None or s.last > start:
            total += s.info.rows if s.info is not None else _segment_rows(s.path)
    return total


# --- merge ---------------------------------------------------------------------------------------
def window_events(w, changes: pa.Table) -> TableEvents:
    """The ``r`` events of one located chunk window (merge_job.ChunkWindow): the chunk's rows
    minus the keys of its table changed strictly between its watermarks; none at all when a
    TRUNCATE of its table (``t``) lies between them. The after-images as the chunk staged
    them (typed)."""
    if w.chunk.rows == 0:
        return TableEvents(w.chunk.table, None, (), typed_event_schema(pa.struct([])).empty_table())
    rows, schema, text = read_chunk(w.chunk.path, w.chunk.table)
    if rows.num_rows != w.chunk.rows:
        raise ConfigurationError(
            f"{describe(w.chunk)}: file {w.chunk.path} holds {rows.num_rows} rows but the chunk result says "
            f"{w.chunk.rows}; the file was replaced by another attempt: re-run the chunk task"
        )
    survivors = window_survivors(rows, changes, table=w.chunk.table, low=w.low, high=w.high)  # step 4
    events = read_events(
        survivors,
        typed_event_schema(rows.schema.field("after").type),
        table=w.chunk.table,
        high=w.high,
        high_ts_ms=w.high_ts_ms,
        watermark=w.chunk.high_watermark,
        batch=w.batch,
    )  # step 5
    return TableEvents(w.chunk.table, schema, tuple(text), events)


def chunk_units(windows: Sequence, segments: Segments) -> list[tuple]:
    """One unit per located chunk window: ``(window, the segments that can hold its window's
    changes)``; :func:`chunk_events` turns one into its events (one Spark task's work)."""
    units = []
    for w in windows:
        low, high = Position.decode(w.low), Position.decode(w.high)
        units.append((w, [s for s in segments if s[1] > low and s[0] <= high]))
    return units


def chunk_events(unit: tuple) -> list[TableEvents]:
    """The ``r`` events of one chunk window (see :func:`chunk_units`), reading only its
    window's changes: every key changed there drops, whichever segment copy holds it."""
    w, segments = unit
    changes = read_changelog(
        segments,
        after=Position.decode(w.low),
        upto=Position.decode(w.high),
        columns=["position", "table", "op", "key"],
    )
    return [window_events(w, changes)]


def merge_chunks(
    chunks: Sequence[ChunkResult | dict], changelog_dir: str, *, windows: Sequence | None = None
) -> pa.Table:
    """The round's ``r`` events in the canonical-JSON form (EVENT_SCHEMA), like
    merge_job.merge_chunks but in Arrow: for checks against core's reference; a round's
    write (:func:`merge_round`) hands the typed events to the sinks."""
    if windows is None:
        windows = locate_windows(None, chunks, changelog_dir)
    changes = _window_changes(windows, changelog_dir)
    return to_json_events(join_table_events(window_events(w, changes) for w in windows))


def _window_changes(windows: Sequence, changelog_dir: str) -> pa.Table:
    if not windows:
        return read_changelog([], columns=["position", "table", "op", "key"])
    lo = Position.decode(min(w.low for w in windows))
    hi = Position.decode(max(w.high for w in windows))
    changes = read_changelog(
        list_segments(changelog_dir), after=lo, upto=hi, columns=["position", "table", "op", "key"]
    )
    return changes.filter(pc.not_equal(changes["op"], "w"))


def merge_round(
    chunks: Sequence[ChunkResult | dict],
    *,
    data_dir: str,
    source: str,
    sinks: Sequence[Sink],
    changelog_dir: str | None = None,
    max_batch_rows: int = DEFAULT_BATCH_ROWS,
) -> dict:
    """Merge a round in this process and write it to ``sinks``; the same summary as the
    Spark merge job (plus ``engine``)."""
    changelog = changelog_dir or staged_changelog_dir(data_dir, source)
    t0 = time.monotonic()
    windows = locate_windows(None, chunks, changelog)
    timings = {"locate_s": time.monotonic() - t0, "merge_s": 0.0, "sinks_s": 0.0}
    t1 = time.monotonic()
    changes = _window_changes(windows, changelog)
    timings["merge_s"] += time.monotonic() - t1
    emitted = 0
    groups = window_groups(windows, max_batch_rows)
    for i, group in enumerate(groups, 1):
        t1 = time.monotonic()
        events = join_table_events(window_events(w, changes) for w in group)
        t2 = time.monotonic()
        write_to_sinks(sinks, events)
        timings["merge_s"] += t2 - t1
        timings["sinks_s"] += time.monotonic() - t2
        n = sum(e.num_rows for e in events)
        emitted += n
        log.info("merge group %d of %d: %d chunk(s), %d events written", i, len(groups), len(group), n)
    rows_in = sum(w.chunk.rows for w in windows)
    return {
        "engine": "local",
        "chunks": len(windows),
        "rows_in": rows_in,
        "emitted": emitted,
        "dropped": rows_in - emitted,
        "seconds": round(time.monotonic() - t0, 3),
        "sinks": [s.name for s in sinks],
        **{k: round(v, 3) for k, v in timings.items()},
    }


# --- apply ---------------------------------------------------------------------------------------
def apply_segments(
    read_events: EventReader,
    data_dir: str,
    source: str,
    sinks: Sequence[Sink],
    *,
    changelog_dir: str | None = None,
    max_segments_per_batch: int = 64,
    max_batch_rows: int = DEFAULT_APPLY_BATCH_ROWS,
    max_batch_bytes: int = DEFAULT_APPLY_BATCH_BYTES,
    after_mark: Callable | None = None,
    write: Callable | None = None,
    count: Callable | None = None,
    release: Callable | None = None,
) -> dict:
    """Apply every staged segment past each sink's marker, in batches of whole segments (at
    most ``max_segments_per_batch``, ``max_batch_rows`` staged rows and ``max_batch_bytes``
    uncompressed staged bytes, a bigger segment alone); a sink's marker moves only after the
    sink wrote the batch (a crash in between replays the batch, which the sinks absorb).
    Returns counts."""
    if max_segments_per_batch < 1:
        raise ConfigurationError(f"max_segments_per_batch must be >= 1, got {max_segments_per_batch}")
    if max_batch_rows < 1:
        raise ConfigurationError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
    if max_batch_bytes < 1:
        raise ConfigurationError(f"max_batch_bytes must be >= 1, got {max_batch_bytes}")
    # the in-process engine's defaults: TableEvents lists; the Spark apply job passes its own
    after_mark = after_mark or (
        lambda ts, mark: [t.filter(pc.greater(t.events["position"], mark.encode())) for t in ts]
    )
    write = write or write_to_sinks  # the sinks side by side, as a merge's
    count = count or (lambda ts: sum(t.num_rows for t in ts))
    release = release or (lambda t: None)
    changelog = changelog_dir or staged_changelog_dir(data_dir, source)
    markers = {s.name: read_marker(data_dir, source, s.name) for s in sinks}
    start = None if not markers or any(m is None for m in markers.values()) else min(markers.values())
    segments = list_segments(changelog)
    index = read_index(changelog)  # each segment's newest commit time, for the markers
    pending = [s for s in segments if start is None or s[1] > start]
    groups = _batches_of(pending, max_segments_per_batch, max_batch_rows, max_batch_bytes)
    applied = batches = 0
    lower = start
    for group in groups:
        upto = max(last for _, last, _ in group)
        infos = [index.get(storage.basename(path)) for _, _, path in group]
        newest_ms = max(
            (i.max_ts_ms for i in infos if i is not None and i.max_ts_ms is not None), default=None
        )
        events = read_events(segments, lower, upto)
        behind: dict = {}  # sinks at the same marker take the same events: one write for them
        for sink in sinks:
            mark = markers[sink.name]
            if mark is None or upto > mark:
                behind.setdefault(mark, []).append(sink)
        for mark, same in behind.items():
            write(same, events if mark is None else after_mark(events, mark))
            for sink in same:
                write_marker(data_dir, source, sink.name, upto, committed_ms=newest_ms)
                markers[sink.name] = upto
        n = count(events)
        release(events)
        applied += n
        batches += 1
        log.info(
            "apply batch %d of %d: %d events from %d segment(s) up to %s",
            batches,
            len(groups),
            n,
            len(group),
            upto,
        )
        lower = upto if lower is None or upto > lower else lower
    return {
        "segments": len(pending),
        "batches": batches,
        "events": applied,
        "markers": {k: (None if v is None else v.encode()) for k, v in markers.items()},
    }


def _batches_of(
    segments: Segments, max_segments: int, max_rows: int, max_bytes: int = DEFAULT_APPLY_BATCH_BYTES
) -> list[list]:
    """Whole segments in order, cut into batches of at most ``max_segments``, ``max_rows``
    staged rows and ``max_bytes`` uncompressed staged bytes (a bigger segment alone)."""
    groups: list[list] = []
    rows_in_group = bytes_in_group = 0
    for seg in segments:
        n, size = _segment_size(seg[2])
        if (
            not groups
            or len(groups[-1]) >= max_segments
            or rows_in_group + n > max_rows
            or bytes_in_group + size > max_bytes
        ):
            groups.append([])
            rows_in_group = bytes_in_group = 0
        groups[-1].append(seg)
        rows_in_group += n
        bytes_in_group += size
    return groups


def apply_changelog(data_dir: str, source: str, sinks: Sequence[Sink], **kwargs) -> dict:
    """The apply job in this process: staged segments past the sinks' markers -> the sinks."""
    t0 = time.monotonic()
    try:
        summary = apply_segments(changelog_events, data_dir, source, sinks, **kwargs)
    finally:
        release_memory()  # (the round's next task, compaction, runs in this process too)
    return {"engine": "local", **summary, "seconds": round(time.monotonic() - t0, 3)}
