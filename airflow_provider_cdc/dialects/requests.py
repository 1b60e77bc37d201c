"""What a caller asks a dialect to read, one form each: a :class:`ChunkRead` (DBLog step 2), a
:class:`TableScan` (a whole table in one snapshot) and a :class:`LogRead` (capture). A request
travels whole from the caller through the dialect to the collaborator that reads
(``dialects/<db>/chunks.py``, ``log_reader.py``): an option added to a read is written in its
request and where it is used, not in every signature along the way."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.ranges import ChunkRange
from ..core.schema import TableSchema
from .results import SegmentSink


@dataclass(frozen=True)
class ChunkRead:
    """The next chunk of ``rng`` after ``after_key`` (None: from the range's start), at most
    ``limit`` rows in key order, staged as typed Parquet at ``path``; ``where``: the snapshot's
    row filter (validated SQL); ``upper_bound``: the snapshot's largest key (rows past it reach
    the sinks through the changelog)."""

    schema: TableSchema
    rng: ChunkRange
    after_key: Sequence | None
    limit: int
    path: str
    where: str | None = None
    upper_bound: Sequence | None = None


@dataclass(frozen=True)
class TableScan:
    """Every row of ``schema``'s table (described with ``keyed=False``: no key needed) in one
    consistent snapshot, staged as typed chunk files of about ``rows_per_file`` rows each at
    ``path_of(0)``, ``path_of(1)``...; ``progress`` is called with the rows read so far."""

    schema: TableSchema
    path_of: Callable[[int], str]
    rows_per_file: int
    progress: Callable[[int], None] | None = None


@dataclass(frozen=True)
class LogRead:
    """The log from ``offset`` (opaque text, from ``load_offset`` or a batch's ``end_offset``).
    ``max_events`` stops the read at the first transaction boundary at or past that many
    events; with ``on_segment``, the events read are handed over a segment at a time once they
    reach ``segment_max_events`` (see :meth:`Dialect.read_log`)."""

    offset: str
    max_events: int | None = None
    segment_max_events: int | None = None
    on_segment: SegmentSink | None = None
