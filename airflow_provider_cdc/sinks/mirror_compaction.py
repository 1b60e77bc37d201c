"""Background maintenance of the mirror: compaction of key buckets (change files folded into
a resolved base, oversized buckets split below the unit, tombstones removed behind the
horizon, sinks/mirror_fencing.py) within a budget per round, and vacuum of unreferenced
files past the retention. Storage layout: sinks/delta_buckets.py."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from .. import storage
from ..core.arrow_types import (
    DELETED_COLUMN,
    KEY_COLUMN,
    POSITION_COLUMN,
    release_memory,
)
from ..core.errors import ConfigurationError
from ..core.schema import TableName
from ..storage.layout import mirror_dir
from . import deletion_vectors as dvs
from . import key_index
from .base import read_marker
from .bucket_fold import fold_bucket
from .delta_buckets import (
    MirrorVersion,
    any_dropped,
    change_version,
    crc_of,
    level_of,
    node_id,
    node_of,
    read_bucket,
    read_resolved_keys,
    read_version,
    resolve,
    write_bucket_file,
)
from .delta_log import log_state
from .mirror_table import (
    DEFAULT_LOG_RETENTION_HOURS,
    DEFAULT_RETENTION_HOURS,
    HORIZON_PROPERTY,
    _commit_with_retries,
    _delta,
    _open,
    _position_literal,
    _properties,
    _raise_horizon,
    _rows,
    _version,
    bucket_unit,
    ensure_log_properties,
    mirror_tables,
)
from .multiset import is_multiset

log = logging.getLogger(__name__)


#: rows one maintenance round may rewrite per table (the due buckets with most change first)
DEFAULT_COMPACT_BUDGET_ROWS = 4_000_000


#: a bucket's change files are folded into its base when their rows reach this share of the
#: base's: a fold rewrites about the base, so a changed row costs about 1/CHANGE_SHARE rows of
#: folding, against up to 1 + CHANGE_SHARE stored row versions per live row for readers
CHANGE_SHARE = 1.0
#: change files of one size tier merged into one change file (never the base) once this many
#: follow each other: a changed row is rewritten about log_CHANGE_FILES(rounds between folds)
#: times, and a bucket holds at most about CHANGE_FILES files a tier (docs/DESIGN.md, "The mirror").
#: 12, not 8: with deletion vectors a reader pays nothing for a superseded row, while every merge
#: also rewrites the vectors of the files it leaves (python -m bench storage: 3.09x at 8, 2.88x at 12)
CHANGE_FILES = 12
#: a bucket of at most this many rows whose base holds tombstones the horizon lets go is
#: rewritten without them (reading its key columns each round is cheap)
SMALL_BUCKET_ROWS = 100_000


def _spread(path: str, budget_rows: int | None = None) -> int:
    """Split the buckets whose stored rows exceed twice the unit (rows appended while nothing
    compacted them, a large snapshot's merges) into as many descendants as it takes, a file
    at a time: each file's rows become change files of the descendants, so no step holds more
    than one file. The largest go first, within ``budget_rows`` stored rows (at least one
    bucket). The descendants are compacted as usual. Returns the buckets spread."""

    def build(adds: list):
        v = read_version(_delta(path), path)
        if not v.bucketed:
            return v, [], 0
        unit = bucket_unit(v)
        big = {b: _rows(v, f) for b, f in v.files.items() if f and _rows(v, f) > 2 * unit}
        spent = 0
        for b, n in sorted(big.items(), key=lambda item: -item[1]):
            if spent and budget_rows is not None and spent + n > budget_rows:
                del big[b]
            else:
                spent += n
        removed: list[str] = []
        for b, n in sorted(big.items()):
            depth = max(1, math.ceil(math.log2(n / unit)))
            level = level_of(b, v.buckets)
            below = v.buckets * 2 ** (level + depth)
            for rel in v.files[b]:  # base first, then change files in commit order: kept so
                rows = read_bucket(v.table_uri, [rel], v.schema)
                node = node_of(crc_of(rows[KEY_COLUMN]), below) + node_id(level + depth, 0, v.buckets)
                version = change_version(rel)
                for c in np.unique(node).tolist():
                    adds.append(
                        write_bucket_file(
                            v.table_uri,
                            int(c),
                            rows.filter(pa.array(node == c)),
                            change=0 if version is None else version,
                        )
                    )
                removed.append(rel)
        if big:
            log.info(
                "mirror %s: %d oversized bucket(s) split below the unit of %d rows", path, len(big), unit
            )
        return v, removed, len(big)

    return _commit_with_retries(path, build, operation="split")


def due_buckets(v: MirrorVersion, *, budget_rows: int | None = None) -> list[int]:
    """The buckets background compaction should fold now, most change first, within
    ``budget_rows`` stored rows (at least one bucket): a bucket whose change rows reach
    CHANGE_SHARE of its base rows (a bucket without a base: of its oldest change file); a bucket of several
    base files (written before merge-on-read); one over ``unit`` rows. Change files short of
    that are merged among themselves (:func:`change_run`), not folded: a fold rewrites the
    whole bucket, so folding on every change would make a round's writes follow the table."""
    unit = bucket_unit(v)
    scored = []
    for b, paths in v.files.items():
        if not paths:
            continue
        base = [p for p in paths if not v.info[p].change]
        change = [p for p in paths if v.info[p].change]
        if not base:  # the oldest change file holds resolved rows too (a first write): the base
            base, change = change[:1], change[1:]
        base_rows, change_rows = _rows(v, base), _rows(v, change)
        total = base_rows + change_rows
        due = (
            (len(base) > 1 and not change)
            or (total > unit and v.bucketed)
            or (bool(change) and change_rows >= CHANGE_SHARE * base_rows)
        )
        if due:
            scored.append((-(change_rows / max(1, base_rows)), -len(paths), b, total))
    picked, spent = [], 0
    for _score, _files, b, total in sorted(scored):
        if picked and budget_rows is not None and spent + total > budget_rows:
            break
        picked.append(b)
        spent += total
    return picked


def change_run(v: MirrorVersion, paths: Sequence[str]) -> list[str]:
    """The newest change files of a bucket (``paths`` in read order) to merge into one, or
    none: walking back from the newest, a file joins while its rows are at most those of the
    newer files already in (the newest always), and the run is merged once it holds
    CHANGE_FILES files. Files of one size tier so merge into one of the next, as a counter in
    base CHANGE_FILES carries. The run is contiguous and ends at the newest file, so the
    merged file (named for the run's first version) keeps the read order resolve() relies on;
    a run whose first version an older file shares is left (the order between them would be
    the names' random part)."""
    change = [p for p in paths if v.info[p].change]
    run: list[str] = []
    rows = 0
    for p in reversed(change):
        n = _rows(v, [p])
        if run and n > rows:
            break
        run.insert(0, p)
        rows += n
    if len(run) < CHANGE_FILES:
        return []
    first = change_version(run[0])
    older = change[: len(change) - len(run)]
    if older and change_version(older[-1]) == first:
        return []
    return run


def merge_change_runs(path: str, *, skip: Iterable[int] = (), budget_rows: int | None = None) -> int:
    """Merge each bucket's :func:`change_run` (buckets in ``skip`` left: they are folded)
    into one change file of resolved rows, tombstones kept, within ``budget_rows`` rows (at
    least one bucket). Its cost follows the change files, never the base. Returns the
    buckets merged."""
    skipped = frozenset(skip)

    def build(adds: list):
        v = read_version(_delta(path), path)
        removed: list[str] = []
        spent = merged = 0
        for b in sorted(v.files):
            if b in skipped:
                continue
            run = change_run(v, v.files[b])
            if not run:
                continue
            n = _rows(v, run)
            if merged and budget_rows is not None and spent + n > budget_rows:
                break
            rows = resolve(read_bucket(v.table_uri, run, v.schema))
            adds.append(
                write_bucket_file(
                    v.table_uri, b, rows, bucketed=v.bucketed, change=change_version(run[0]) or 0
                )
            )
            removed.extend(run)
            spent += n
            merged += 1
        return v, removed, merged

    return _commit_with_retries(path, build, operation="merge changes")


def compact_buckets(
    path: str,
    *,
    tombstones_upto: str | None = None,
    budget_rows: int | None = DEFAULT_COMPACT_BUDGET_ROWS,
    everything: bool = False,
) -> dict[str, int]:
    """Background compaction of the mirror at ``path``: oversized buckets are spread below
    the unit, then the due buckets (:func:`due_buckets`; with ``everything`` each bucket of
    several files or over the unit, or with tombstones to remove) are rewritten as resolved
    base files, their tombstones at or before ``tombstones_upto`` removed behind the horizon
    (raised first, module docstring). Returns counts: buckets rewritten, tombstones removed,
    buckets split."""
    out = {"buckets": 0, "tombstones": 0, "split": 0, "merged": 0}
    if _open(path) is None:
        return out
    out["split"] = _spread(path, budget_rows)
    v = read_version(_delta(path), path)
    if everything:
        picks = [
            b
            for b, paths in v.files.items()
            if len(paths) > 1
            or _rows(v, paths) > bucket_unit(v)
            or any_dropped(v.table_uri, paths, tombstones_upto=tombstones_upto)
        ]
    else:
        picks = due_buckets(v, budget_rows=budget_rows)
        if tombstones_upto is not None:  # small buckets whose base holds removable tombstones: cheap to check
            picks += [
                b
                for b, paths in v.files.items()
                if paths
                and b not in picks
                and not any(v.info[p].change for p in paths)
                and _rows(v, paths) <= SMALL_BUCKET_ROWS
                and any_dropped(v.table_uri, paths, tombstones_upto=tombstones_upto)
            ]
        out["merged"] = merge_change_runs(path, skip=picks, budget_rows=budget_rows)
    if not picks:
        return out
    target = None
    if tombstones_upto is not None:
        newest = None
        for b in picks:  # the newest current tombstone at or before the bound among them
            keys = read_resolved_keys(v.table_uri, v.files.get(b, ()))
            gone = keys.filter(
                pc.and_(keys[DELETED_COLUMN], pc.less_equal(keys[POSITION_COLUMN], tombstones_upto))
            )
            top = pc.max(gone[POSITION_COLUMN]).as_py() if gone.num_rows else None
            newest = top if newest is None or (top is not None and top > newest) else newest
        if newest is not None:
            target = _raise_horizon(path, newest)
    removed = [0]

    def build(adds: list):
        # each bucket folded a key range at a time (sinks/bucket_fold.py): memory follows the
        # slice, not the bucket
        v_ = read_version(_delta(path), path)
        replaced: list[str] = []
        removed[0] = 0
        unit = bucket_unit(v_)
        for b in sorted(b for b in picks if v_.files.get(b)):
            new, dropped = fold_bucket(v_, b, tombstones_upto=target, unit=unit)
            adds.extend(new)
            replaced.extend(v_.files[b])
            removed[0] += dropped
        return v_, replaced, v_

    _commit_with_retries(path, build, operation="compact")
    out.update(buckets=len(picks), tombstones=removed[0])
    log.info(
        "mirror %s: %d bucket(s) compacted, %d tombstone(s) removed, %d split",
        path,
        len(picks),
        removed[0],
        out["split"],
    )
    return out


def compact(
    data_dir: str,
    source: str,
    table: str | TableName,
    *,
    upto_position: str | None = None,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
) -> int:
    """Compact every bucket of the mirror that is not one resolved base file, removing its
    tombstones (all, or those at or before ``upto_position``), then vacuum files no version
    younger than ``retention_hours`` references. Returns the number of tombstones removed.
    Used when a snapshot finishes; rounds use the budgeted :func:`compact_buckets`.

    Safe at any time, against any writer in flight: it first commits the horizon (the
    newest position of the tombstones it removes) and then deletes them; a writer that read
    an older version conflicts and re-reads the horizon (module docstring). Idempotent, and
    retried on commit conflicts."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    path = mirror_dir(data_dir, source, t)
    bound = "f" * 40 if upto_position is None else _position_literal(upto_position)
    if _open(path) is None:
        return 0
    removed = compact_buckets(path, tombstones_upto=bound, everything=True)["tombstones"]
    vacuum(path, retention_hours)
    if removed:
        log.info(
            "mirror %s: %d tombstone(s) removed up to horizon %s",
            path,
            removed,
            _properties(_open(path)).get(HORIZON_PROPERTY),
        )
    return removed


def vacuum(path: str, retention_hours: float = DEFAULT_RETENTION_HOURS) -> int:
    """Delete the data files of the mirror at ``path`` that the current version does not
    reference and no version of the last ``retention_hours`` did (replaced by merges,
    compaction, deletes), and likewise its deletion-vector files (:func:`vacuum_vectors`).
    Readers that follow the Delta log never need them. Returns the number of files removed."""
    if retention_hours < 0:
        raise ConfigurationError(f"mirror retention must be >= 0 hours, got {retention_hours}")
    dt = _open(path)
    if dt is None:
        return 0
    # the retention also covers writers in flight: a file written but not committed yet is
    # as young as its writer, so it is never older than the retention (keep it >= 1 h)
    gone: list = []
    try:
        hours = math.ceil(retention_hours)
        # a dry run first: a vacuum commits twice (START, END) even when it removes nothing.
        # delta-rs's lite vacuum only: its full vacuum deletes deletion vectors still in use
        if dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=True):
            gone = dt.vacuum(retention_hours=hours, enforce_retention_duration=False, dry_run=False)
    except CommitFailedError as exc:  # an optimisation: a concurrent commit only postpones it
        log.warning("mirror %s: vacuum postponed after a commit conflict (%s)", path, exc)
        return 0
    vectors = vacuum_vectors(path, retention_hours)
    if gone or vectors:
        log.info(
            "mirror %s: vacuum removed %d data and %d deletion-vector file(s) unreferenced for %s h",
            path,
            len(gone),
            vectors,
            retention_hours,
        )
    return len(gone) + vectors


def _retained(path: str, retention_hours: float) -> tuple[list[dict], float] | None:
    """The add and remove actions of the files a version of the last ``retention_hours`` of the
    mirror at ``path`` references (the log keeps removes twice as long,
    mirror_table.log_properties), and that horizon in ms; None without a table."""
    dt = _open(path)
    if dt is None:
        return None
    state = log_state(path, dt.version(), dt.metadata().id)
    horizon_ms = (time.time() - retention_hours * 3600) * 1000
    actions = list(state.adds.values())
    for removes in state.removes.values():
        actions += [r for r in removes if int(r.get("deletionTimestamp") or 0) >= horizon_ms]
    return actions, horizon_ms


def vacuum_vectors(path: str, retention_hours: float = DEFAULT_RETENTION_HOURS) -> int:
    """Delete the deletion-vector files of the mirror at ``path`` that neither the current
    version nor a version of the last ``retention_hours`` references (delta-rs's vacuum never
    removes them), and that are older than that themselves (a writer in flight has not
    committed its own yet), and likewise the key indexes of data files no such version
    references (sinks/key_index.py). Returns the number of files removed."""
    retained = _retained(path, retention_hours)
    if retained is None:
        return 0
    actions, horizon_ms = retained
    referenced = dvs.referenced_files([a.get("deletionVector") for a in actions])
    removed = 0
    for info in storage.list_dir(path):
        name = storage.basename(info.path)
        if not (name.startswith(dvs.PREFIX) and name.endswith(".bin")) or name in referenced:
            continue
        mtime = info.mtime.timestamp() * 1000 if info.mtime is not None else time.time() * 1000
        if mtime >= horizon_ms:
            continue
        try:
            storage.delete(storage.join(path, name))
            removed += 1
        except OSError:  # noqa: PERF203 - the next vacuum tries again
            log.warning("mirror %s: could not delete unreferenced %s", path, name)
    return removed + key_index.sweep(path, {a["path"] for a in actions}, horizon_ms)


def tombstone_count(data_dir: str, source: str, table: str | TableName) -> int:
    """How many keys of the mirror of ``table`` are deleted but still held as tombstones (a
    bucket at a time)."""
    v = _version(data_dir, source, table)
    if v is None:
        return 0
    return sum(
        pc.sum(read_resolved_keys(v.table_uri, paths)[DELETED_COLUMN]).as_py() or 0
        for paths in v.files.values()
        if paths
    )


#: snapshot statuses under which a table's chunks may still be merged: no compaction then
ACTIVE_SNAPSHOT = ("running", "paused", "failed")


def compact_inactive(
    data_dir: str,
    source: str,
    status_of: Callable[[str], str | None],
    *,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    budget_rows: int | None = DEFAULT_COMPACT_BUDGET_ROWS,
    log_retention_hours: float = DEFAULT_LOG_RETENTION_HOURS,
) -> dict[str, int]:
    """A changelog round's maintenance of every mirror table: the Delta log's bounds set, the
    due buckets compacted within ``budget_rows`` (:func:`compact_buckets`), and unreferenced
    files vacuumed once past the retention. Tombstones go only from tables whose snapshot is
    not active, up to the position the mirror has applied. Returns removed tombstones per
    table.

    The applied position is read BEFORE the snapshot statuses: a snapshot that starts after
    the check reads its chunks after that position, so its chunk rows are newer than the
    horizon and insert normally."""
    applied = read_marker(data_dir, source, "mirror")
    removed: dict[str, int] = {}
    release_memory()  # what the round's capture and apply left in Arrow's pool, before the folds
    for table in mirror_tables(data_dir, source):
        path = mirror_dir(data_dir, source, table)
        ensure_log_properties(path, retention_hours, log_retention_hours)
        upto = None if applied is None or status_of(table.id) in ACTIVE_SNAPSHOT else applied.encode()
        if is_multiset(path):  # no key buckets, no tombstones: its replaced files only (sinks/multiset.py)
            vacuum(path, retention_hours)
            continue
        try:
            got = compact_buckets(path, tombstones_upto=upto, budget_rows=budget_rows)
        except CommitFailedError as exc:  # a writer kept committing first: the next round goes on
            log.warning("mirror %s: compaction postponed after commit conflicts (%s)", path, exc)
            got = {"tombstones": 0}
        if got["tombstones"]:
            removed[table.id] = got["tombstones"]
        vacuum(path, retention_hours)
    return removed


def after_snapshot(
    data_dir: str, source: str, table: TableName, *, budget_rows: int, retention_hours: float
) -> int:
    """Once a snapshot of ``table`` is done: its mirror's tombstones up to what the mirror has
    applied are folded away, within ``budget_rows`` (a large snapshot's buckets are folded over
    the next rounds), and its replaced files vacuumed. The tombstones removed."""
    applied = read_marker(data_dir, source, "mirror")
    if applied is None:
        return 0
    path = mirror_dir(data_dir, source, table)
    if is_multiset(path):
        vacuum(path, retention_hours)
        return 0
    removed = compact_buckets(path, tombstones_upto=applied.encode(), budget_rows=budget_rows)["tombstones"]
    vacuum(path, retention_hours)
    log.info("table %s: snapshot done, %d mirror tombstone(s) compacted away", table, removed)
    return removed
