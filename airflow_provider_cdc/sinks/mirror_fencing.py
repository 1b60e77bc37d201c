"""Who may commit to a mirror (docs/DESIGN.md, "Fencing"): the compaction horizon and the merge
epoch, kept in the Delta table's own properties so that a concurrent change of either is a
commit conflict; also schema stops (a mirror waiting for a re-snapshot) and the schema
reconciliation at a snapshot's start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import pyarrow as pa
from deltalake.exceptions import CommitFailedError

from .. import storage
from ..core.arrow_types import mirror_schema
from ..core.errors import ConfigurationError, FencedError
from ..core.schema import TableName, TableSchema
from ..storage.layout import mirror_dir
from .base import SchemaCache
from .delta_buckets import (
    BUCKET_COLUMN,
    BUCKETS_PROPERTY,
    DEFAULT_BUCKETS,
    MirrorVersion,
    read_version,
)
from .mirror_table import (
    _STOPPED_KEPT,
    EPOCH_PROPERTY,
    SCHEMA_STOP_PROPERTY,
    STOPPED_PROPERTY,
    _arrow_schema,
    _create,
    _delta,
    _open,
    _properties,
    _set_properties,
    add_columns,
    commit_attempts,
    mirror_tables,
    type_conflicts,
)

log = logging.getLogger(__name__)


def _check_epoch(path: str, props: Mapping[str, str], epoch: int | None) -> None:
    if epoch is not None and props.get(EPOCH_PROPERTY) != str(epoch):
        raise FencedError(
            f"mirror {path}: this merge holds epoch {epoch} but the table's {EPOCH_PROPERTY} is "
            f"{props.get(EPOCH_PROPERTY)!r}: a newer merge attempt claimed the table, or its snapshot was "
            "stopped. This writer is superseded and committed nothing; the newer attempt writes the round"
        )


def open_for_write(path: str, schema: pa.Schema, epoch: int | None = None) -> MirrorVersion:
    """The preamble of every write of new rows (both engines): the mirror at ``path`` (created
    with ``schema`` when absent), its new columns added, its current version read, and the
    writer's merge ``epoch`` checked against the table's (:class:`FencedError` when fenced
    out)."""
    dt = _open(path) or _create(path, schema)[0]
    v = read_version(add_columns(dt, schema), path)
    _check_epoch(path, v.props, epoch)
    return v


def schema_stopped(path: str) -> str | None:
    """Why the mirror at ``path`` waits for a re-snapshot (None: it does not)."""
    dt = _open(path)
    return None if dt is None else _properties(dt).get(SCHEMA_STOP_PROPERTY) or None


def stop_for_schema(path: str, reason: str) -> bool:
    """Mark the mirror as waiting for a re-snapshot (False when there is no mirror yet)."""
    dt = _open(path)
    if dt is None:
        return False
    if _properties(dt).get(SCHEMA_STOP_PROPERTY) != reason:
        _set_properties(dt, {SCHEMA_STOP_PROPERTY: reason})
        log.error("mirror %s stopped: %s", path, reason)
    return True


def needs_rebuild(path: str, table_schema: TableSchema) -> str | None:
    """Why the mirror at ``path`` cannot take the table's schema in place (None: it can, or
    is absent): a schema change stopped it, or a column it has changed type."""
    dt = _open(path)
    if dt is None:
        return None
    stopped = _properties(dt).get(SCHEMA_STOP_PROPERTY)
    return stopped or "; ".join(type_conflicts(dt, mirror_schema(table_schema))) or None


def reconcile_schema(path: str, table_schema: TableSchema, *, whole_table: bool) -> str:
    """At a snapshot's start: bring the mirror to the source's current ``schema``. Columns it
    lacks are added ("evolved"); when a column's type changed, or a schema change stopped the
    table, a whole-table snapshot rebuilds it: emptied, with the new schema, its fencing
    properties kept ("rebuilt"), and its chunks fill it again (the convergence sweep at DONE
    removes anything older). A snapshot of some keys, ranges or a filter cannot rebuild:
    ConfigurationError. Returns "none", "evolved" or "rebuilt"."""
    dt = _open(path)
    if dt is None:
        return "none"
    table_id, schema = table_schema.table.id, mirror_schema(table_schema)
    why = needs_rebuild(path, table_schema)
    if why is None:
        before = set(_arrow_schema(dt).names)
        return "evolved" if set(_arrow_schema(add_columns(dt, schema)).names) != before else "none"
    if not whole_table:
        raise ConfigurationError(
            f"table {table_id}: its mirror cannot take the source's current schema ({why}); snapshot "
            "the whole "
            "table (no 'keys', 'key_ranges' or 'where') to rebuild it"
        )
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    from .delta_buckets import WRITER_APP_ID

    bucketed = pa.schema([*schema, pa.field(BUCKET_COLUMN, pa.int32(), False)])
    for _attempt in commit_attempts(f"mirror {path}: rebuild"):
        v = read_version(_delta(path), path)
        try:  # one commit: no rows, the new columns, in buckets; a writer in flight conflicts
            write_deltalake(
                path,
                bucketed.empty_table(),
                mode="overwrite",
                schema_mode="overwrite",
                partition_by=[BUCKET_COLUMN],
                storage_options=storage.delta_storage_options(path),
                commit_properties=CommitProperties(
                    max_commit_retries=0, app_transactions=[Transaction(WRITER_APP_ID, v.txn + 1)]
                ),
            )
            break
        except CommitFailedError:
            continue
    if BUCKETS_PROPERTY not in _properties(_delta(path)):
        _set_properties(_delta(path), {BUCKETS_PROPERTY: str(DEFAULT_BUCKETS)})
    _set_properties(_delta(path), {SCHEMA_STOP_PROPERTY: ""})
    log.warning(
        "mirror of %s rebuilt with the source's current schema (%s); the snapshot fills it", table_id, why
    )
    return "rebuilt"


def schema_stopped_tables(data_dir: str, source: str) -> dict[str, str]:
    """Table id -> reason, for every mirror of ``source`` waiting for a re-snapshot."""
    out = {}
    for t in mirror_tables(data_dir, source):
        reason = schema_stopped(mirror_dir(data_dir, source, t))
        if reason:
            out[t.id] = reason
    return out


def _stopped(props: dict[str, str]) -> list[str]:
    return [x for x in props.get(STOPPED_PROPERTY, "").split(",") if x]


def claim_epoch(
    path: str, schema: pa.Schema | None, *, snapshots: Iterable[str] = (), stop: str | None = None
) -> int | None:
    """Claim a new merge epoch on the mirror at ``path`` (creating the table with ``schema``
    when it does not exist; with ``schema=None`` an absent table is left alone and None
    returned). Every earlier epoch is fenced out from the next commit on.

    A merge passes the ``snapshots`` its round belongs to: the claim is refused
    (:class:`FencedError`) when one of them was stopped, so a stop that lands between the
    merge task's own check and this claim still wins. ``stop`` (a snapshot id) records that
    snapshot as stopped in the same commit."""
    wanted = set(snapshots)
    for _attempt in commit_attempts(f"mirror {path}: a merge epoch"):
        dt = _open(path)
        if dt is None:
            if schema is None:
                return None
            first = {EPOCH_PROPERTY: "1", **({STOPPED_PROPERTY: stop} if stop else {})}
            if _create(path, schema, first)[1]:
                return 1
            continue  # another writer created it: claim on top of theirs
        props = _properties(dt)
        stopped = _stopped(props)
        refused = sorted(wanted & set(stopped))
        if refused:
            raise FencedError(
                f"mirror {path}: snapshot(s) {', '.join(refused)} were stopped; their merge may not start. "
                "Start a new snapshot to read the table again"
            )
        epoch = int(props.get(EPOCH_PROPERTY, "0")) + 1
        update = {EPOCH_PROPERTY: str(epoch)}
        if stop and stop not in stopped:
            update[STOPPED_PROPERTY] = ",".join([*stopped, stop][-_STOPPED_KEPT:])
        try:
            _set_properties(dt, update)
            return epoch
        except CommitFailedError:
            continue
    raise AssertionError("unreachable")


#: Tests only: a folder. While a file named after a table's id is in it, a merge that claimed the
#: table's epoch waits (up to HOLD_SECONDS) before it reads or writes, so a deployment scenario
#: sends its stop while the merge is surely in flight, whatever the speed of the Spark job
#: (tests/deployment/test_scenarios.py). Unset, as in every real deployment: nothing waits.
HOLD_DIR_ENV = "CDC_TEST_MERGE_HOLD_DIR"
HOLD_SECONDS = 600.0


def _hold_for_a_test(table_id: str) -> None:
    import os
    import time

    folder = os.environ.get(HOLD_DIR_ENV)
    if not folder:
        return
    hold = os.path.join(folder, table_id)
    deadline = time.monotonic() + HOLD_SECONDS
    if os.path.exists(hold):
        log.info("mirror %s: held after its claim while %s exists (%s)", table_id, hold, HOLD_DIR_ENV)
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.2)


class MergeFence:
    """The merge epochs one snapshot merge claimed, per table (module docstring, Fencing).

    Claimed once when the merge starts, before it reads chunks; every mirror commit then
    requires its epoch (atomically, in :func:`upsert`) and :meth:`check` lets the other
    sinks refuse a superseded writer before they write."""

    def __init__(self, data_dir: str, source: str) -> None:
        self.data_dir, self.source = data_dir, source
        self.epochs: dict[str, int] = {}

    def claim(
        self, schemas: Iterable[TableSchema], snapshots: Mapping[str, Iterable[str]] | None = None
    ) -> MergeFence:
        """Claim an epoch on each table's mirror; ``snapshots`` (table id -> the snapshot ids
        of the round's chunks) makes the claim fail for a snapshot that was stopped."""
        for schema in schemas:
            path = mirror_dir(self.data_dir, self.source, schema.table)
            wanted = (snapshots or {}).get(schema.table.id, ())
            epoch = claim_epoch(path, mirror_schema(schema), snapshots=wanted)
            assert epoch is not None
            self.epochs[schema.table.id] = epoch
            log.info("mirror %s: merge epoch %d claimed", schema.table, epoch)
            _hold_for_a_test(schema.table.id)
        return self

    def epoch(self, table_id: str) -> int | None:
        return self.epochs.get(table_id)

    def check(self, table_id: str) -> None:
        """Raise FencedError when a newer merge or a stop took the table from this writer."""
        epoch = self.epochs.get(table_id)
        if epoch is None:
            return
        path = mirror_dir(self.data_dir, self.source, TableName.parse(table_id))
        dt = _open(path)
        current = None if dt is None else _properties(dt).get(EPOCH_PROPERTY)
        if current != str(epoch):
            raise FencedError(
                f"table {table_id}: this merge holds epoch {epoch} but the mirror's is {current!r}; a "
                "newer merge "
                "attempt or a stop superseded it. It writes nothing more"
            )


def fence_out_merges(
    data_dir: str, source: str, table: str | TableName, snapshot_id: str | None = None
) -> int | None:
    """``stop``: bump the merge epoch of ``table``'s mirror so no merge in flight commits
    again, and record ``snapshot_id`` as stopped so no merge of it can claim later. The
    mirror is created for that when its schema is staged (a first snapshot stopped before
    its first merge). Returns the new epoch, None when there is no mirror and no schema."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    staged = SchemaCache(data_dir, source).get(t.id) if snapshot_id else None
    schema = None if staged is None else mirror_schema(staged)
    return claim_epoch(mirror_dir(data_dir, source, t), schema, stop=snapshot_id)
