"""Tables without a key captured as multisets (CDC_KEY_COLUMNS names them with ``*``): their load
and their verify. The mirror itself is sinks/multiset.py; which logged changes a read holds is
core/multiset.py. Design: docs/DESIGN.md, "Tables without a key".

A load reads the whole table in ONE snapshot (PostgreSQL: ``ctid`` ranges in one REPEATABLE READ
transaction; MariaDB: one streamed SELECT WITH CONSISTENT SNAPSHOT), aligned with the log, and
publishes it in one commit together with every staged change the snapshot did not see, so the
changelog's apply goes on from there. It needs capture started first (the table in the
publication, the slot there): a snapshot-time change would otherwise be in neither.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.errors import ConfigurationError, StateError
from ..core.multiset import Alignment
from ..core.position import Position
from ..core.progress import SnapshotProgress
from ..core.ranges import FULL_RANGE
from ..core.schema import TableName, TableSchema
from ..dialects import TableScan
from ..sinks import multiset, refreshed
from ..sinks.base import TableEvents, join_table_events
from ..storage import layout
from ..storage.staged import list_segments
from .snapshot import new_snapshot_id

log = logging.getLogger(__name__)

#: rows per staged file of a load's or a verify's read
FILE_ROWS = 500_000


@dataclass(frozen=True)
class LoadResult:
    table: str
    rows: int
    version: int
    mark: str
    caught_up: str  # the staged position the load applied changes up to
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def require_multiset(schema: TableSchema) -> TableSchema:
    if not schema.multiset:
        raise ConfigurationError(
            f"table {schema.table} is not captured as a multiset: only a table without a key that "
            "CDC_KEY_COLUMNS names with '*' is loaded whole"
        )
    return schema


def staged_table_events(data_dir: str, source: str, table: str, after: str | None = None) -> tuple:
    """(the staged changes of ``table`` past ``after`` as one TableEvents or None, the newest
    staged position or None): what a load catches up with. Reads segment by segment and keeps
    this table's events only."""
    from .arrow_engine import segment_events, segment_units

    segments = list_segments(layout.changelog_dir(data_dir, source))
    if not segments:
        return None, None
    end = max(last for _first, last, _path in segments).encode()
    since = None if after is None else Position.decode(after)
    parts = [
        te
        for unit in segment_units(segments, since, None)
        for te in segment_events(unit)
        if te.table == table
    ]
    joined = join_table_events(parts)
    return (joined[0] if joined else None), end


def load_table(
    dialect,
    data_dir: str,
    source: str,
    table: TableName,
    *,
    retention_hours: float = 1.0,
    before_publish: Callable[[], None] | None = None,
) -> LoadResult:
    """Load the multiset table ``table`` whole: claim an epoch (fencing any load still running),
    wait out the transactions running before (PostgreSQL: one that wrote the table before it
    joined the publication is then in the snapshot), read it in one snapshot aligned with the
    log, and publish it with the staged changes the snapshot did not see, in one commit.
    ``before_publish``: tests only, between writing the files and the commit."""
    started = time.monotonic()
    schema = require_multiset(dialect.describe_table(table))
    storage.write_text(
        layout.schema_path(data_dir, source, table), schema.to_json()
    )  # the apply types with it
    uri = layout.mirror_dir(data_dir, source, table)
    multiset.mark(uri)
    epoch = refreshed.claim(uri, multiset.table_schema(schema), retention_hours)
    dialect.settle_running_transactions()
    staging = layout.refresh_staging_dir(data_dir, source, table, uuid.uuid4().hex)
    try:
        read = dialect.read_whole_table(
            TableScan(schema, lambda i: storage.join(staging, f"part-{i:06d}.parquet"),
                      FILE_ROWS, _progress(table))
        )
        alignment = Alignment.of_read(table.id, read.mark, read.visibility)
        base = multiset.write_base(uri, schema, [p for p, _n in read.files], read.rows)
        if before_publish is not None:
            try:
                before_publish()
            except BaseException:
                refreshed.discard(uri, base[1])  # (publish discards its own on failure)
                raise
        caught: list[str] = []

        def catch_up():
            events, end = staged_table_events(data_dir, source, table.id)
            caught.append(end or "")
            return events, end

        version = multiset.publish(
            uri,
            epoch,
            schema,
            base,
            alignment,
            catch_up,
            {multiset.LOADED_PROPERTY: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        )
    finally:
        storage.delete_dir(staging)
    res = LoadResult(
        table.id,
        read.rows,
        version,
        alignment.mark,
        caught[-1] if caught else "",
        round(time.monotonic() - started, 3),
    )
    log.info(
        "multiset table %s (source %r): %d rows loaded as version %d of %s at %s, changes staged up to "
        "%s applied, in %.1f s",
        table,
        source,
        res.rows,
        version,
        uri,
        Position.decode(alignment.mark),
        Position.decode(res.caught_up) if res.caught_up else "(none)",
        res.seconds,
    )
    return res


def loaded(source: str, res: LoadResult, owner: str | None, logical_date) -> SnapshotProgress:
    """A load as the snapshot progress status and the UI show: one range, done."""
    p = SnapshotProgress.start(source, new_snapshot_id(), {res.table: [FULL_RANGE]}, {res.table: None})
    tp = p.table(res.table)
    tp.rows, tp.chunks, tp.ranges[0].done = res.rows, 1, True
    p.owner, p.logical_date = owner, logical_date
    p.finish()
    return p


def _progress(table: TableName) -> Callable[[int], None]:
    last = [time.monotonic()]

    def progress(rows: int) -> None:
        if time.monotonic() - last[0] >= 10:
            last[0] = time.monotonic()
            log.info("multiset table %s: %d rows read", table, rows)

    return progress


# --- verify ------------------------------------------------------------------------------------
def source_counts(dialect, data_dir: str, source: str, schema: TableSchema) -> tuple[pa.Table, Alignment]:
    """The source table's copies per row (``_cdc_row``, ``copies``), read in one snapshot aligned
    with the log, and that alignment."""
    staging = layout.refresh_staging_dir(data_dir, source, schema.table, f"verify-{uuid.uuid4().hex}")
    try:
        read = dialect.read_whole_table(
            TableScan(schema, lambda i: storage.join(staging, f"part-{i:06d}.parquet"),
                      FILE_ROWS, _progress(schema.table))
        )
        alignment = Alignment.of_read(schema.table.id, read.mark, read.visibility)
        ids = multiset.RowIds(schema)
        parts = []
        try:
            from ..core import arrow_types as at

            cols = pa.schema(list(multiset.table_schema(schema))[:-1])
            for path, _n in read.files:
                fs, p = storage.filesystem(path)
                with fs.open_input_file(p) as f:
                    src = pq.ParquetFile(f)
                    have, text = at.metadata_schema(src.schema_arrow.metadata)
                    for batch in src.iter_batches(batch_size=multiset.ROW_GROUP_ROWS, columns=["after"]):
                        rows = pa.Table.from_arrays(
                            at.struct_columns(batch.column(0), have, text, schema), schema=cols
                        )
                        t = pa.table({multiset.ROW_COLUMN: ids(rows)})
                        parts.append(t.group_by(multiset.ROW_COLUMN).aggregate([([], "count_all")]))
        finally:
            ids.close()
    finally:
        storage.delete_dir(staging)
    if not parts:
        return _counts([], []), alignment
    t = pa.concat_tables(parts).group_by(multiset.ROW_COLUMN).aggregate([("count_all", "sum")])
    return _counts(t[multiset.ROW_COLUMN], t["count_all_sum"]), alignment


def _counts(ids, copies) -> pa.Table:
    return pa.table(
        {multiset.ROW_COLUMN: pa.array(ids, pa.string()), "copies": pa.array(copies, pa.int64())}
        if not isinstance(ids, pa.ChunkedArray)
        else {multiset.ROW_COLUMN: ids.combine_chunks(), "copies": copies.combine_chunks().cast(pa.int64())}
    )


def _deltas(te: TableEvents | None, mask, schema: TableSchema) -> pa.Table:
    """Per ``_cdc_row``, the copies the changes of ``te`` selected by ``mask`` add (negative: remove)."""
    if te is None or not len(mask) or not mask.any():
        return _counts([], [])
    ids = multiset.RowIds(schema)
    try:
        c = multiset.changes_to_copies(te.filter(pa.array(mask)), schema, ids)
    finally:
        ids.close()
    if c.truncated:
        raise StateError(
            f"table {schema.table}: a TRUNCATE lies between the verify's read and the mirror's state; "
            "verify again"
        )
    ids_all = pa.concat_arrays(
        [c.plus[multiset.ROW_COLUMN].combine_chunks(), c.minus[multiset.ROW_COLUMN].combine_chunks()]
    )
    signs = pa.concat_arrays(
        [pa.repeat(pa.scalar(1), c.plus.num_rows), pa.repeat(pa.scalar(-1), c.minus.num_rows)]
    )
    t = pa.table({multiset.ROW_COLUMN: ids_all, "d": signs.cast(pa.int64())})
    g = t.group_by(multiset.ROW_COLUMN).aggregate([("d", "sum")])
    return _counts(g[multiset.ROW_COLUMN], g["d_sum"])


def capture_through(dialect, data_dir: str, mark: str, *, wait_seconds: float = 60.0) -> None:
    """Make sure capture has staged every transaction before ``mark`` (encoded): capture runs
    here, under the source's capture lock (one that holds it now is waited for, at most
    ``wait_seconds``)."""
    from ..storage.segment_index import staged_through
    from .capture import stage_changelog
    from .locks import capture_lock, lock_key

    directory = layout.changelog_dir(data_dir, dialect.source)
    deadline = time.monotonic() + wait_seconds
    while True:
        through = staged_through(directory)
        if through is not None and through[0].encode() >= mark:
            return
        with capture_lock(dialect.params, lock_key(dialect, data_dir), dialect.source) as acquired:
            if acquired:
                stage_changelog(dialect, data_dir)
                continue
        if time.monotonic() >= deadline:
            raise StateError(
                f"source {dialect.source!r}: capture has not staged the log up to the verify's read "
                f"({Position.decode(mark)}) within {wait_seconds:.0f} s; verify again"
            )
        time.sleep(0.5)


def verify_multiset(
    dialect, data_dir: str, source: str, table: TableName, schema: TableSchema, *, capture: bool = True
):
    """Compare the multiset mirror of ``table`` with the source as multisets: each distinct row's
    copies. The two are read at different moments, so the mirror's state is brought to the
    source read's moment with the staged changes between them (core/multiset.py: which the read
    holds, which the mirror applied). Capture must have staged past the read: with ``capture``
    it runs here when it has not (:func:`capture_through`), else verify says so."""
    from .verify.compare import Mismatch, VerifyResult

    uri = layout.mirror_dir(data_dir, source, table)
    if multiset.properties(uri) is None:
        raise StateError(
            f"table {table} is captured as a multiset and has not been loaded: run its snapshot first"
        )
    mirror, props = multiset.read_counts(uri)
    mirror = _counts(mirror[multiset.ROW_COLUMN], mirror["copies"])
    read, alignment = source_counts(dialect, data_dir, source, schema)
    base = Alignment.from_text(props[multiset.BASE_PROPERTY])
    applied = props.get(multiset.APPLIED_PROPERTY) or ""
    if capture:
        capture_through(dialect, data_dir, alignment.mark)
    events, _end = staged_table_events(data_dir, source, table.id)
    if events is not None and events.num_rows:
        ev = events.events
        txs = ev["origin"].combine_chunks().field("tx")
        in_read = alignment.holds(ev["position"], txs)
        in_mirror = base.holds(ev["position"], txs) | pc.less_equal(ev["position"], applied).to_numpy(
            zero_copy_only=False
        ).astype(bool)
        # the mirror as of the read: plus what the read holds and it lacks, minus the converse
        fix = pa.concat_tables(
            [
                _deltas(events, in_read & ~in_mirror, schema),
                _neg(_deltas(events, in_mirror & ~in_read, schema)),
            ]
        )
        mirror = pa.concat_tables([mirror, fix]).group_by(multiset.ROW_COLUMN).aggregate([("copies", "sum")])
        mirror = _counts(mirror[multiset.ROW_COLUMN], mirror["copies_sum"])
    joined = read.join(
        mirror, multiset.ROW_COLUMN, join_type="full outer", left_suffix="_s", right_suffix="_m"
    )
    s = pc.fill_null(joined["copies_s"], 0).to_numpy(zero_copy_only=False)
    m = pc.fill_null(joined["copies_m"], 0).to_numpy(zero_copy_only=False)
    res = VerifyResult(table.id)
    res.method, res.method_note = "multiset", "each distinct row's copies compared (a table without a key)"
    res.rows_checked = int(joined.num_rows)
    res.source_rows, res.mirror_rows = int(s.sum()), int(m.sum())
    res.missing, res.extra = int((s - m).clip(min=0).sum()), int((m - s).clip(min=0).sum())
    bad = (s != m).nonzero()[0][:5]
    ids = joined[multiset.ROW_COLUMN].to_pylist()
    res.examples = [
        Mismatch(
            ids[i],
            "missing" if s[i] > m[i] else "extra",
            ("copies",),
            {"copies": int(s[i])},
            {"copies": int(m[i])},
        )
        for i in bad.tolist()
    ]
    return res


def _neg(t: pa.Table) -> pa.Table:
    return t.set_column(1, "copies", pc.negate(t["copies"]))
