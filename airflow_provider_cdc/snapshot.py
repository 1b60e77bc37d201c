"""DBLog's chunk step in one place: low watermark -> chunk SELECT -> high watermark.

Used by the snapshot chunk operator and by tests. ``gap_hooks`` lets a test force a
write into exactly the gap after the low watermark or before the high watermark.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .core.chunk import ChunkResult
from .core.ranges import ChunkRange
from .core.schema import TableSchema
from .core.staging import chunk_path
from .dialects.base import Dialect


@dataclass
class GapHooks:
    after_low_watermark: Callable[[], None] | None = None
    before_high_watermark: Callable[[], None] | None = None


def snapshot_chunk(
    dialect: Dialect,
    schema: TableSchema,
    rng: ChunkRange,
    *,
    data_dir: str,
    snapshot_id: str,
    seq: int,
    chunk_size: int,
    after_key: Sequence | None = None,
    where: str | None = None,
    upper_bound: Sequence | None = None,
    gap_hooks: GapHooks | None = None,
) -> ChunkResult:
    """Read one chunk between a fresh pair of watermarks.

    Every attempt writes new watermark ids, so a retried task never reuses the window of
    a failed attempt; the failed attempt's watermarks stay in the log as orphans that the
    merge ignores (no chunk result names them).
    """
    hooks = gap_hooks or GapHooks()
    low, high = str(uuid.uuid4()), str(uuid.uuid4())
    path = chunk_path(data_dir, dialect.source, schema.table, snapshot_id, seq, high)
    dialect.write_watermark(low)  # step 1
    if hooks.after_low_watermark:
        hooks.after_low_watermark()
    res = dialect.read_chunk(  # step 2
        schema, rng, after_key=after_key, limit=chunk_size, path=path, where=where, upper_bound=upper_bound
    )
    if hooks.before_high_watermark:
        hooks.before_high_watermark()
    dialect.write_watermark(high)  # step 3
    return ChunkResult(
        source=dialect.source,
        table=schema.table.id,
        snapshot_id=snapshot_id,
        seq=seq,
        low_watermark=low,
        high_watermark=high,
        path=path,
        range=rng,
        after_key=None if after_key is None else tuple(after_key),
        last_key=res.last_key,
        rows=res.rows,
        exhausted=res.rows < chunk_size,
    )
