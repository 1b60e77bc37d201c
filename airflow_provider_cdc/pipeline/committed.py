"""What a commit covered, per table: the content of the Asset events the Airflow glue emits
after a snapshot round or a changelog batch (airflow_provider_cdc/assets.py).

Computed from staged inputs and the sinks' markers, not from the job's output, so it is the
same whichever engine ran the job (in the worker, or Spark with the summary left in its log).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .. import storage
from ..core.chunk import ChunkResult
from ..core.events import WATERMARK_OP
from ..core.position import Position
from ..core.schema import TableName
from ..sinks import registry
from ..sinks.base import read_marker
from ..storage.layout import changelog_dir
from ..storage.staged import list_segments, staged_watermarks


def table_extra(data_dir: str, source: str, table_id: str, kind: str, **fields) -> dict:
    """The extra of one table's Asset event: who and where, plus ``fields`` (a ``position``
    among them gets its readable form too)."""
    extra = {"source": source, "table": table_id, "kind": kind, **fields}
    if "position" in fields:
        extra["readable_position"] = _readable(fields["position"])
    if "from_position" in fields:
        extra["readable_from_position"] = _readable(fields["from_position"])
    location = registry.table_location(kind, data_dir, source, TableName.parse(table_id))
    if location is not None:
        extra["location"] = location
    return extra


def round_tables(chunks: Sequence[ChunkResult], data_dir: str, source: str, kinds: Iterable[str]) -> dict:
    """kind -> table id -> extra, for a merged snapshot round: the snapshot, its chunks and
    chunk rows in this round, and the newest high-watermark position among them (the
    position the table's output is complete up to for these key ranges)."""
    staged = staged_watermarks(changelog_dir(data_dir, source), [c.high_watermark for c in chunks])
    per: dict[str, dict] = {}
    for c in chunks:
        t = per.setdefault(
            c.table, {"snapshot_id": c.snapshot_id, "chunks": 0, "chunk_rows": 0, "position": None}
        )
        t["chunks"] += 1
        t["chunk_rows"] += c.rows
        hit = staged.get(c.high_watermark)
        if hit is not None and (t["position"] is None or hit[0] > t["position"]):
            t["position"] = hit[0]
    return {
        kind: {tid: table_extra(data_dir, source, tid, kind, **e) for tid, e in per.items()} for kind in kinds
    }


def _readable(encoded: str | None) -> str | None:
    return None if encoded is None else str(Position.decode(encoded))


def markers(data_dir: str, source: str, kinds: Iterable[str]) -> dict[str, Position | None]:
    return {k: read_marker(data_dir, source, k) for k in kinds}


def applied_tables(
    data_dir: str, source: str, before: dict[str, Position | None], skip: dict[str, set[str]] | None = None
) -> dict:
    """kind -> table id -> extra, for a changelog apply: the change events each table got
    between each sink's marker ``before`` and its marker now; that range (``from_position``,
    exclusive, None from the start, to ``position``, inclusive); and the source commit time of
    the table's newest change in it (``committed_at``, epoch seconds, and ``committed_at_iso``),
    so a consumer knows how fresh its input is. Reads only the table/op/position/ts_ms columns
    of the segments in between, batch by batch."""
    out: dict[str, dict] = {}
    for kind, old in before.items():
        new = read_marker(data_dir, source, kind)
        if new is None or (old is not None and new <= old):
            continue
        counts, newest = _table_counts(data_dir, source, old, new)
        excluded = (skip or {}).get(kind, set())
        out[kind] = {
            tid: table_extra(
                data_dir,
                source,
                tid,
                kind,
                events=n,
                position=new.encode(),
                from_position=None if old is None else old.encode(),
                **_commit_time(newest.get(tid)),
            )
            for tid, n in counts.items()
            if tid not in excluded
        }
    return out


def _commit_time(ts_ms: int | None) -> dict:
    if ts_ms is None:
        return {"committed_at": None, "committed_at_iso": None}
    at = ts_ms / 1000
    return {"committed_at": at, "committed_at_iso": datetime.fromtimestamp(at, UTC).isoformat()}


def _table_counts(data_dir: str, source: str, after: Position | None, upto: Position) -> tuple[Counter, dict]:
    """(table id -> change events, table id -> newest commit time in ms) between the positions."""
    segments = [
        p
        for first, last, p in list_segments(changelog_dir(data_dir, source))
        if (after is None or last > after) and first <= upto
    ]
    counts: Counter = Counter()
    newest: dict[str, int] = {}
    if not segments:
        return counts, newest
    fs, _ = storage.filesystem(segments[0])
    rows = (pc.field("op") != WATERMARK_OP) & (pc.field("position") <= upto.encode())
    if after is not None:
        rows &= pc.field("position") > after.encode()
    dataset = ds.dataset([storage.filesystem(p)[1] for p in segments], filesystem=fs, format="parquet")
    # one batch at a time (pyarrow reads ahead 16 batches of 4 files by default: ~100 MB for a
    # 3M-row transaction's segments)
    for batch in dataset.to_batches(
        columns=["table", "ts_ms"], filter=rows, batch_readahead=0, fragment_readahead=0
    ):
        if not batch.num_rows:
            continue
        per = (
            pa.Table.from_batches([batch]).group_by("table").aggregate([("table", "count"), ("ts_ms", "max")])
        )
        for tid, n, ts in zip(
            per.column("table").to_pylist(),
            per.column("table_count").to_pylist(),
            per.column("ts_ms_max").to_pylist(),
            strict=True,
        ):
            counts[tid] += n
            if ts is not None:
                newest[tid] = max(ts, newest.get(tid, ts))
    return counts, newest
