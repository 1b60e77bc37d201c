"""A round's chunk windows: each chunk with its low and high watermark located in the staged
changelog (DBLog steps 1-3 happened in the chunk task; this finds where they landed), and
the groups of windows each sink write gets. Both engines (arrow_engine, spark.merge_job)
start from here, so they see the same windows, refuse the same inputs and name their
output batches the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .. import storage
from ..core.chunk import ChunkResult, flatten_chunk_results
from ..core.errors import ConfigurationError, NotReadyError, WatermarkError
from ..core.position import Position, marked_position
from ..core.visibility import PgSnapshot, parse_visibility
from ..core.window import lowered_low
from ..storage.staged import staged_transactions, staged_watermarks

#: chunk rows per sink write, in both engines: what the Spark driver collects at once. 500,000
#: rows of the bench's demo table overflowed spark-submit's default 1 GB driver heap (toArrow)
DEFAULT_BATCH_ROWS = 100_000


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
    return (
        f"chunk {chunk.seq} of table {chunk.table} (snapshot {chunk.snapshot_id}, high watermark "
        f"{chunk.high_watermark})"
    )


def load_chunks(path: str) -> list[ChunkResult]:
    """ChunkResult dicts from a JSON file: a list, nested lists, or {"chunks": [...]}."""
    data = json.loads(storage.read_text(path))
    if isinstance(data, dict):
        data = data.get("chunks", [data])
    try:
        flat = flatten_chunk_results(data)
    except TypeError as exc:
        raise ConfigurationError(f"--chunks file {path}: {exc}") from None
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


def staged_log(changelog_dir: str, visibilities: Sequence[str | None], upto: str):
    """``lowered_low``'s log for any number of chunk snapshots, read from the staged changelog
    once (on first use): the events below ``upto`` in the segments that may hold a transaction
    newer than the oldest of the snapshots' xmin (storage.staged.staged_transactions)."""
    snaps = [s for s in (parse_visibility(v) for v in visibilities if v) if isinstance(s, PgSnapshot)]
    read: list = []

    def log(_before: str):
        if not read:
            read.append(staged_transactions(changelog_dir, upto, min(s.xmin for s in snaps) & 0xFFFFFFFF))
        return read[0]

    return log


def locate_windows(spark, chunks: Sequence[ChunkResult | dict], changelog_dir: str) -> list[ChunkWindow]:
    """Find each chunk's lw/hw positions; NotReadyError if any is not staged yet.
    (``spark`` is unused: the lookup reads only watermark rows, on the driver.)"""
    chunks = _unique_chunks(chunks)
    if not chunks:
        return []
    ids = {c.low_watermark for c in chunks} | {c.high_watermark for c in chunks}
    found = staged_watermarks(changelog_dir, ids)
    windows, missing = [], []
    highs = [found[c.high_watermark][0] for c in chunks if c.high_watermark in found]
    log = staged_log(changelog_dir, [c.visibility for c in chunks], max(highs, default=""))
    for i, c in enumerate(sorted(chunks, key=lambda c: (c.table, c.snapshot_id, c.seq, c.high_watermark))):
        lo, hi = found.get(c.low_watermark), found.get(c.high_watermark)
        if hi is None:
            missing.append(
                f"{describe(c)}: high watermark {c.high_watermark!r} (low watermark "
                f"{'staged' if lo is not None else 'not staged either'})"
            )
            continue
        if lo is None:
            raise WatermarkError(
                f"{describe(c)}: the high watermark is staged at {Position.decode(hi[0])} but the low "
                "watermark "
                f"{c.low_watermark!r} is not; the staged changelog at {changelog_dir} must start "
                "before the chunk's "
                "low watermark (was a segment removed?). Re-read this chunk"
            )
        if lo[0] > hi[0] or (lo[0] == hi[0] and marked_position(c.low_watermark) is None):
            raise WatermarkError(
                f"{describe(c)}: low watermark at {Position.decode(lo[0])} is not before the high "
                "watermark at "
                f"{Position.decode(hi[0])}; the watermark ids are mixed up. Re-read this chunk"
            )
        low = lowered_low(c.visibility, lo[0], hi[0], log)  # one read of the log for the whole round
        windows.append(ChunkWindow(i, c, low, hi[0], int(hi[1] or 0)))
    if missing:
        raise NotReadyError(
            f"{len(missing)} chunk(s) of the round have a high watermark that is not in the staged "
            "changelog at "
            f"{changelog_dir} yet: "
            + "; ".join(missing[:10])
            + (" ..." if len(missing) > 10 else "")
            + ". The high-watermark sensor should have waited for them; capture the changelog and "
            "retry the merge."
        )
    return windows


def window_groups(windows: Sequence, max_batch_rows: int) -> list[list]:
    """Windows in groups of at most ``max_batch_rows`` chunk rows (a bigger chunk alone):
    the unit each sink write gets, the same in both engines."""
    groups: list[list] = [[]]
    size = 0
    for w in windows:
        if groups[-1] and size + w.chunk.rows > max_batch_rows:
            groups.append([])
            size = 0
        groups[-1].append(w)
        size += w.chunk.rows
    return groups if groups[0] else []
