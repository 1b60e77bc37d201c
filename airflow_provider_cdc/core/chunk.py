"""The result of one snapshot chunk task, as carried in XCom and read by the merge job."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .ranges import ChunkRange


@dataclass(frozen=True, slots=True)
class ChunkResult:
    source: str
    table: str  # TableName.id
    snapshot_id: str
    seq: int  # chunk number inside the snapshot (ordering and file names)
    low_watermark: str
    high_watermark: str
    path: str  # staged chunk Parquet
    range: ChunkRange  # the planned range this chunk read from
    after_key: tuple | None  # keyset start (exclusive) inside the range; None = from range start
    last_key: tuple | None  # last key read; None when the chunk was empty
    rows: int
    exhausted: bool  # True when the range has no rows after last_key (fewer than chunk_size read)
    #: PostgreSQL: the snapshot the chunk's SELECT read (core/visibility.py): the window also
    #: drops keys of transactions before it that this snapshot did not see
    visibility: str | None = None
    #: where the source's log stood just after the high watermark row was committed (encoded
    #: position; "table" watermarks): once capture has staged the log past it without the
    #: watermark, the watermark's transaction is on no server any more (a failover lost it) and
    #: the chunk is re-read (pipeline/snapshot.py lost_chunks). None: unknown (older results)
    high_position: str | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["range"] = json.loads(self.range.to_json())
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ChunkResult:
        d = dict(d)
        d["range"] = ChunkRange.from_json(json.dumps(d["range"]))
        for k in ("after_key", "last_key"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)


def flatten_chunk_results(value: Any) -> list[dict]:
    """ChunkResult dicts from an XCom value: one dict, a list of them, or the lazy
    sequence of lists that a mapped chunk task returns (None entries are skipped)."""
    out: list[dict] = []

    def walk(v: Any) -> None:
        if v is None:
            return
        if isinstance(v, dict):
            out.append(v)
        elif isinstance(v, (str, bytes)):
            raise TypeError(f"expected ChunkResult dicts, got a string: {v[:80]!r}")
        elif hasattr(v, "__len__") and hasattr(v, "__getitem__"):
            for i in range(len(v)):  # by index: a lazy XCom sequence is not probed past its end
                walk(v[i])
        elif isinstance(v, Iterable):
            for item in v:
                walk(item)
        else:
            raise TypeError(f"expected ChunkResult dicts, got {type(v).__name__}")

    walk(value)
    return out
