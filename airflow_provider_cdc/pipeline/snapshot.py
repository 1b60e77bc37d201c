"""A snapshot without Airflow: its plan (``plan.json``), DBLog's chunk step (:func:`snapshot_chunk`:
low watermark, SELECT, high watermark) and the chunk commits: a sidecar next to each staged chunk,
written after its high watermark, is the one record that a chunk is done and later merged, and
where a resumed range continues (:func:`range_state`, I4). ``gap_hooks`` let a test force a
write into the gap after the low or before the high watermark.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from .. import storage
from ..core.chunk import ChunkResult
from ..core.errors import ChunkStraddledFailoverError, ConfigurationError, StateError
from ..core.formats import PLAN
from ..core.planning import SnapshotRequest, check_ranges_ranked
from ..core.planning import plan_ranges as core_plan_ranges
from ..core.plans import SnapshotPlan
from ..core.ranges import FULL_RANGE, ChunkRange
from ..core.schema import TableName, TableSchema
from ..dialects.base import ChunkRead, Dialect
from ..storage.layout import chunk_path, plan_path, snapshot_dir

log = logging.getLogger(__name__)

#: chunk seq = range index * SEQ_STRIDE + chunk number inside the range (unique per snapshot)
SEQ_STRIDE = 1_000_000


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
    limit: int,
    after_key: Sequence | None = None,
    where: str | None = None,
    upper_bound: Sequence | None = None,
    gap_hooks: GapHooks | None = None,
) -> ChunkResult:
    """Read one chunk of at most ``limit`` rows (its sizer's) between a fresh pair of watermarks.

    Every attempt writes new watermark ids, so a retried task never reuses the window of
    a failed attempt; the failed attempt's watermarks stay in the log as orphans that the
    merge ignores (no chunk result names them).
    """
    hooks = gap_hooks or GapHooks()
    low, high = str(uuid.uuid4()), str(uuid.uuid4())
    path = chunk_path(data_dir, dialect.source, schema.table, snapshot_id, seq, high)
    dialect.bind_data_dir(data_dir)  # MariaDB: the committed offset gives the log position's epoch
    window = dialect.watermarks  # "table": watermark rows; "log": the read's snapshot position
    rows_written = window.writes_rows
    server = dialect.server_identity() if rows_written else None
    window.open(low)  # step 1
    if hooks.after_low_watermark:
        hooks.after_low_watermark()
    res = dialect.read_chunk(  # step 2
        ChunkRead(schema, rng, after_key, limit, path, where=where, upper_bound=upper_bound)
    )
    if hooks.before_high_watermark:
        hooks.before_high_watermark()
    low, high = window.close(low, high, res, schema.table)  # step 3
    high_position = dialect.mark_position().encode() if rows_written else None
    if rows_written and (now := dialect.server_identity()) != server:
        # a promotion between the watermarks: the low one may be on no server any more, and
        # the read may have seen transactions the new primary never had. Read it again
        storage.delete(path)
        raise ChunkStraddledFailoverError(
            f"{schema.table}: the server of source {dialect.source!r} changed while chunk {seq} was "
            f"read (from {server} to {now}: a failover); the chunk is discarded and the retry reads it "
            "again on the new server"
        )
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
        exhausted=res.rows < limit,
        visibility=res.visibility,
        high_position=high_position,
    )


def staged_bytes(chunk_parquet: str) -> int | None:
    """The bytes a staged chunk's rows take uncompressed (its row groups' sizes in the Parquet
    footer, one small read): what the adaptive chunk size holds to its bytes target, the same
    for any compression. None when the footer cannot be read (the chunk is committed already;
    only its size is unknown, and the next chunk is sized by its duration)."""
    import pyarrow.parquet as pq

    try:
        fs, path = storage.filesystem(chunk_parquet)
        with fs.open_input_file(path) as f:
            meta = pq.ParquetFile(f).metadata
        return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        log.warning("could not read the size of staged chunk %s: %s", chunk_parquet, exc)
        return None


# --------------------------------------------------------------------- sidecars
def sidecar_path(chunk_parquet: str) -> str:
    return chunk_parquet + ".json"


def write_sidecar(result: ChunkResult, range_index: int, merged: bool = False) -> None:
    """Commit a chunk: written after its high watermark, atomically (storage.atomic_output)."""
    storage.write_text(
        sidecar_path(result.path),
        json.dumps({"result": result.to_dict(), "range_index": range_index, "merged": merged}),
    )


def read_sidecars(data_dir: str, source: str, table: TableName, snapshot_id: str) -> list[dict]:
    """Committed chunks of a snapshot, ordered by seq: ``{"result", "range_index", "merged"}``."""
    d = snapshot_dir(data_dir, source, table, snapshot_id)
    out = [
        json.loads(storage.read_text(storage.join(d, n)))
        for n in storage.list_names(d, suffix=".parquet.json")
        if n.startswith("chunk-")
    ]
    return sorted(out, key=lambda s: s["result"]["seq"])


@dataclass
class RangeState:
    """Where one planned range stands, from its committed chunks."""

    next_seq: int
    after_key: tuple | None
    exhausted: bool
    unmerged: list[dict]
    rows: int
    chunks: int


def key_reached(last_key: Sequence | None, upper_bound: Sequence | None) -> bool:
    """True once the keyset passed the snapshot's upper bound (the max key when it started),
    so rows inserted above it later cannot make the snapshot endless. Equality works for
    any type; ordering is only trusted for numbers (text order depends on the collation)."""
    if last_key is None or upper_bound is None:
        return False
    lk, ub = tuple(last_key), tuple(upper_bound)
    if lk == ub:
        return True
    if len(lk) == len(ub) and all(
        isinstance(a, (int, float)) and not isinstance(a, bool) and isinstance(b, (int, float))
        for a, b in zip(lk, ub, strict=False)
    ):
        return lk > ub
    return False


def lost_watermarks(
    data_dir: str, source: str, positions: Mapping[str, str], missing: Iterable[str] | None = None
) -> list[str]:
    """Of the high watermarks ``positions`` names (id -> where the source's log stood just after
    it was committed: ChunkResult.high_position), those on no server any more: not staged,
    although capture has staged the log complete past that position (a failover lost the
    transaction). ``missing``: the ids the caller found not staged already (not read again)."""
    from ..storage.layout import changelog_dir
    from ..storage.segment_index import staged_through
    from ..storage.staged import staged_watermarks

    known = {w: p for w, p in positions.items() if p}
    if missing is not None:
        known = {w: known[w] for w in set(missing) & known.keys()}
    if not known:
        return []
    changelog = changelog_dir(data_dir, source)
    through = staged_through(changelog)
    if through is None:
        return []
    past = sorted(w for w, p in known.items() if p <= through[0].encode())
    if not past or missing is not None:
        return past
    found = staged_watermarks(changelog, past)
    return [w for w in past if w not in found]


def lost_chunks(
    data_dir: str, source: str, chunks: Iterable[dict], missing: Iterable[str] | None = None
) -> list[dict]:
    """Of ``chunks`` (ChunkResult dicts), those whose high watermark is lost
    (:func:`lost_watermarks`). Chunks without ``high_position`` (older results, "log"
    watermarks) are never called lost."""
    chunks = list(chunks)
    lost = set(
        lost_watermarks(
            data_dir, source, {c["high_watermark"]: c.get("high_position") for c in chunks}, missing
        )
    )
    return [c for c in chunks if c["high_watermark"] in lost]


def lost_message(named: Sequence[str], what_now: str) -> str:
    """What a lost high watermark means, naming the chunks or watermarks (at most five)."""
    return (
        f"{len(named)} chunk(s) have a high watermark that is on no server any more: {', '.join(named[:5])}"
        f"{' ...' if len(named) > 5 else ''}. Capture has staged the source's log past where each was "
        "written without finding it: a failover lost the transaction that wrote it. " + what_now
    )


def chunk_names(chunks: Iterable[dict]) -> list[str]:
    """How :func:`lost_message` names chunks."""
    return [f"{c['table']} chunk {c['seq']} (high watermark {c['high_watermark']})" for c in chunks]


def discard_lost(data_dir: str, source: str, sidecars: list[dict], range_index: int) -> list[dict]:
    """The committed chunks of a snapshot (``read_sidecars``) without those of ``range_index``
    from its first chunk whose high watermark was lost (:func:`lost_chunks`) on: their files
    and sidecars are deleted, so the range is read again after its last chunk that holds."""
    mine = [s for s in sidecars if s["range_index"] == range_index and not s["merged"]]
    lost = lost_chunks(data_dir, source, [s["result"] for s in mine])
    if not lost:
        return sidecars
    first = min(c["seq"] for c in lost)
    merged_after = [
        s for s in sidecars if s["range_index"] == range_index and s["merged"] and s["result"]["seq"] > first
    ]
    if merged_after:  # merges go in key order within a range: never after an unmerged chunk
        raise StateError(
            f"{lost[0]['table']}: chunk {first} lost its high watermark but later chunks of its range "
            "are merged already; stop this snapshot and start the table's anew"
        )
    gone = [s for s in mine if s["result"]["seq"] >= first]
    log.warning(
        "%s",
        lost_message(
            chunk_names(lost),
            f"Discarding {len(gone)} chunk(s) of range {range_index + 1} from the first of them "
            "on, to read them again on the server the source is now.",
        ),
    )
    for s in gone:
        storage.delete(sidecar_path(s["result"]["path"]))
        storage.delete(s["result"]["path"])
    return [s for s in sidecars if s not in gone]


def range_state(sidecars: list[dict], range_index: int, upper_bound: Sequence | None) -> RangeState:
    mine = [s for s in sidecars if s["range_index"] == range_index]
    after_key: tuple | None = None
    exhausted = False
    for s in mine:
        r = s["result"]
        if r["last_key"] is not None:
            after_key = tuple(r["last_key"])
        elif r["after_key"] is not None:
            after_key = tuple(r["after_key"])
        exhausted = exhausted or r["exhausted"] or key_reached(r["last_key"], upper_bound)
    next_seq = (mine[-1]["result"]["seq"] + 1) if mine else range_index * SEQ_STRIDE
    return RangeState(
        next_seq=next_seq,
        after_key=after_key,
        exhausted=exhausted,
        unmerged=[s["result"] for s in mine if not s["merged"]],
        rows=sum(s["result"]["rows"] for s in mine),
        chunks=len(mine),
    )


# ------------------------------------------------------------------- planning
def plan_table_ranges(dialect: Dialect, schema: TableSchema, request: SnapshotRequest) -> list[ChunkRange]:
    """The requested key space (chosen ranges/keys, or the whole table), split for
    ``parallelism`` chunk tasks at keys the database sampled (core.planning), so skewed,
    text and composite keys split as well as integers."""
    request.check_schema(schema)
    where = request.where_for(schema.table)
    if where:  # its columns must be the table's, in the source's dialect (core/filters.py)
        dialect.render_filter(where, schema)
    requested = request.requested_ranges(schema.table)
    if schema.table.id in request.ranges:  # ordered and disjoint in the database's own order
        bounds = list(dict.fromkeys(tuple(b) for r in requested for b in (r.start, r.end) if b is not None))
        rank_of = dict(zip(bounds, dialect.key_ranks(schema, bounds), strict=True))
        check_ranges_ranked(schema.table.id, requested, lambda b: rank_of[tuple(b)])
    if request.throttle.parallelism <= 1 or requested != (FULL_RANGE,):
        return list(requested)
    sample = dialect.sample_keys(schema, request.throttle.parallelism * 16)
    if sample:
        return core_plan_ranges(request.throttle.parallelism, sample=sample)
    # no sample (e.g. the table is tiny or its statistics are empty): an even split of a
    # single integer key between its smallest and largest value, else one range
    if len(schema.primary_key) == 1 and schema.column(schema.primary_key[0]).type in (
        "int16",
        "int32",
        "int64",
        "uint64",
    ):
        lo, hi = min_key(dialect, schema), dialect.max_key(schema)
        if lo is not None and hi is not None:
            return core_plan_ranges(request.throttle.parallelism, min_max=(lo, hi))
    log.info("table %s: no key sample to split on; reading it as one range", schema.table)
    return [FULL_RANGE]


def min_key(dialect: Dialect, schema: TableSchema) -> tuple | None:
    """The smallest primary key, through the dialect's own keyset SELECT (LIMIT 1)."""
    sql, params = dialect.chunk_query(schema, FULL_RANGE, after_key=None, limit=1, columns=schema.primary_key)
    for batch in dialect.stream_query(sql, params):
        for raw in batch:
            pk_schema = TableSchema(
                schema.table, tuple(schema.column(k) for k in schema.primary_key), schema.primary_key
            )
            row = dialect.row_to_canonical(pk_schema, raw)
            return tuple(row[k] for k in schema.primary_key)
    return None


def read_plan(data_dir: str, source: str, table: TableName, snapshot_id: str) -> dict:
    p = plan_path(data_dir, source, table, snapshot_id)
    if not storage.exists(p):
        raise StateError(
            f"table {table}: the plan of snapshot {snapshot_id} is missing ({p}); the staging folder "
            "was changed or "
            "CDC_DATA_DIR points elsewhere. Stop the snapshot and start a new one"
        )
    return PLAN.read(
        json.loads(storage.read_text(p)), f"table {table}: the plan of snapshot {snapshot_id} ({p})"
    )


def load_plan(data_dir: str, source: str, table: TableName, snapshot_id: str) -> SnapshotPlan:
    """The stored plan of a snapshot, typed (:func:`read_plan` is its JSON)."""
    return SnapshotPlan.from_dict(read_plan(data_dir, source, table, snapshot_id))


def write_plan(data_dir: str, source: str, plan: SnapshotPlan) -> None:
    storage.write_text(
        plan_path(data_dir, source, TableName.parse(plan.table), plan.snapshot_id),
        json.dumps(PLAN.stamp(plan.to_dict())),
    )


def new_snapshot_id() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def mirror_needs_rebuild(data_dir: str, source: str, schema: TableSchema) -> str | None:
    from ..sinks.mirror_fencing import needs_rebuild
    from ..storage.layout import mirror_dir

    return needs_rebuild(mirror_dir(data_dir, source, schema.table), schema)


def reconcile_mirror(data_dir: str, source: str, schema: TableSchema, *, whole_table: bool) -> str:
    from ..sinks.mirror_fencing import reconcile_schema
    from ..storage.layout import mirror_dir

    return reconcile_schema(mirror_dir(data_dir, source, schema.table), schema, whole_table=whole_table)


def check_advanced(
    dialect: Dialect, schema: TableSchema, label: str, after: Sequence, last: Sequence
) -> None:
    """Every chunk ends at a key strictly after the previous chunk's last key (keyset reads
    under the snapshot's fixed upper bound): so a range ends, whatever the filter or the data.
    A chunk that did not advance is a bug, stopped here rather than read forever."""
    after, last = tuple(after), tuple(last)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in after + last):
        advanced = last > after
    else:
        advanced = last != after and (lambda r: r[1] > r[0])(dialect.key_ranks(schema, [after, last]))
    if not advanced:
        raise StateError(
            f"{label}: a chunk read after key {list(after)} ended at key {list(last)}, not after it; "
            "the range "
            "would never end. Stop this snapshot and report this (the chunk query or its filter is wrong)"
        )


def converges_in_ranges(request: SnapshotRequest, table: TableName, schema: TableSchema) -> bool:
    """A snapshot of key ranges only (no chosen keys, no filter) of a table whose key is one
    integer column: once done, every live row inside its ranges was re-emitted or changed after
    its convergence mark, so mirror rows there older than the mark are ghosts; the mirror
    compares such keys as the database orders them (core/ranges.ranges_by_key_order)."""
    from ..core.ranges import ranges_by_key_order

    return (
        table.id in request.ranges
        and table.id not in request.keys
        and not request.where_for(table)
        and ranges_by_key_order(schema)
    )


def covers_every_key(ranges: Sequence[ChunkRange]) -> bool:
    """Whether plan ranges (ordered) join into the whole key space (a whole-table plan)."""
    if not ranges or ranges[0].start is not None or ranges[-1].end is not None:
        return False
    return all(a.end is not None and a.end == b.start for a, b in zip(ranges, ranges[1:], strict=False))


def is_partial(request: SnapshotRequest, table: TableName) -> bool:
    """A snapshot of chosen keys, key ranges or a filter: it re-emits only what it reads."""
    return bool(request.where_for(table) or table.id in request.keys or table.id in request.ranges)


def check_multiset_request(request: SnapshotRequest, table: TableName) -> TableName:
    """``table`` (captured as a multiset: no key) when the request snapshots it whole, which for
    such a table is a load (pipeline/multiset.py); ConfigurationError for chosen keys, key
    ranges or a filter, which it has no key to choose by."""
    if is_partial(request, table):
        raise ConfigurationError(
            f"table {table} has no key and is captured as a multiset: its snapshot loads it whole; "
            "remove its 'keys', 'key_ranges' and 'where' from the run's conf"
        )
    return table


def plan_tables(
    dialect, tables: Sequence[TableName], request: SnapshotRequest, sinks, data_dir: str, source: str
) -> tuple[list, list]:
    """(table, schema, ranges) of each table a snapshot chunks, and the tables without a key it
    loads whole instead (pipeline/multiset.py); read-only, every table checked first."""
    from ..sinks import registry

    plans, multisets = [], []
    for table in tables:
        schema = dialect.describe_table(table)
        registry.check_schema(sinks, schema)  # a table a sink cannot hold fails here, named
        if schema.multiset:
            multisets.append(check_multiset_request(request, table))
            continue
        ranges = plan_table_ranges(dialect, schema, request)
        why = mirror_needs_rebuild(data_dir, source, schema)
        if why and is_partial(request, table):
            raise ConfigurationError(
                f"table {table}: its mirror cannot take the source's current schema ({why}); snapshot "
                "the whole table (no 'keys', 'key_ranges' or 'where') to rebuild it"
            )
        plans.append((table, schema, ranges))
    return plans, multisets
