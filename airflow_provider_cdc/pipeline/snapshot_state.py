"""The one authority for a snapshot's state: a store of SnapshotProgress per (source, table)
with compare-and-set, and the one way to change it (:func:`update`: read, change, write with the
version read, again on a conflict; docs/DESIGN.md, "Snapshot state"). :class:`RegisterProgressStore`
is the package's store, :class:`MemoryProgressStore` the model tests' reference. No Airflow here.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..core.errors import StateError
from ..core.progress import SnapshotProgress
from ..core.schema import TableName
from ..storage import join
from ..storage.register import ConflictError, Register

__all__ = [
    "ConflictError",
    "MemoryProgressStore",
    "ProgressStore",
    "RegisterProgressStore",
    "SourceProgress",
    "Versioned",
    "progress_location",
    "update",
]

#: attempts of one update before it gives up (each conflict means another writer got through)
UPDATE_ATTEMPTS = 50


class Versioned(NamedTuple):
    progress: SnapshotProgress | None  # None: this table has no snapshot (version 0)
    version: int


class ProgressStore(Protocol):
    def read(self, source: str, table_id: str) -> Versioned: ...

    def write(self, source: str, table_id: str, progress: SnapshotProgress, expect: int) -> int:
        """Store ``progress`` if the stored version is still ``expect``; the new version.
        :class:`ConflictError` otherwise, and nothing is written."""
        ...


#: a change: the current progress (None: none yet) -> the new one, or None to leave it as is.
#: It may raise (StateError for a transition the current state refuses): nothing is written.
Change = Callable[[SnapshotProgress | None], SnapshotProgress | None]


def update(
    store: ProgressStore,
    source: str,
    table_id: str,
    change: Change,
    *,
    attempts: int = UPDATE_ATTEMPTS,
    between: Callable[[], None] | None = None,
    written: Callable[[SnapshotProgress], None] | None = None,
) -> SnapshotProgress | None:
    """Apply ``change`` to the current progress of ``(source, table_id)`` with compare-and-set,
    again on a fresh read after each conflict. Returns the progress stored after it (the
    current one when the change left it as is). ``between`` runs between the read and the
    write (tests force interleavings there); ``written`` after a write."""
    for attempt in range(attempts):
        current = store.read(source, table_id)
        # the change gets its own copy: a retry must start from what is stored, not a half-changed object
        mine = None if current.progress is None else SnapshotProgress.from_json(current.progress.to_json())
        new = change(mine)
        if new is None:
            return current.progress
        if between is not None:
            between()
        try:
            store.write(source, table_id, new, current.version)
        except ConflictError:
            if attempt == attempts - 1:
                raise
            time.sleep(min(0.5, 0.005 * 2 ** min(attempt, 7)) * random.random())  # noqa: S311 - jitter only
            continue
        if written is not None:
            written(new)
        return new
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class SourceProgress:
    """The snapshots of one source as their writers see them: :meth:`load` to decide, and
    :meth:`update` (compare-and-set) to change. ``published(table_id, progress)`` runs after
    each write (the glue copies the progress to a Variable there; never read back)."""

    store: ProgressStore
    source: str
    published: Callable[[str, SnapshotProgress], None] | None = None

    def load(self, table_id: str) -> SnapshotProgress | None:
        return self.store.read(self.source, table_id).progress

    def update(
        self, table_id: str, change: Change, *, between: Callable[[], None] | None = None
    ) -> SnapshotProgress | None:
        published = self.published
        written = None if published is None else (lambda p: published(table_id, p))
        return update(self.store, self.source, table_id, change, between=between, written=written)


class MemoryProgressStore:
    """The reference: a dict under a lock, the version a counter per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[tuple[str, str], tuple[str, int]] = {}

    def read(self, source: str, table_id: str) -> Versioned:
        with self._lock:
            raw, version = self._data.get((source, table_id), (None, 0))
        return Versioned(None if raw is None else SnapshotProgress.from_json(raw), version)

    def write(self, source: str, table_id: str, progress: SnapshotProgress, expect: int) -> int:
        _check_names(source, table_id, progress)
        with self._lock:
            have = self._data.get((source, table_id), (None, 0))[1]
            if have != expect:
                raise ConflictError(f"progress of {table_id} ({source}) is at version {have}, not {expect}")
            self._data[(source, table_id)] = (progress.to_json(), expect + 1)
            return expect + 1


def progress_location(data_dir: str, source: str, table_id: str) -> str:
    """``{data_dir}/control/{source}/snapshots/{table.path_segment}``: outside ``staging``,
    which retention prunes, and outside ``output``, which consumers read."""
    return join(data_dir, "control", source, "snapshots", TableName.parse(table_id).path_segment)


class RegisterProgressStore:
    """The package's store: one register (storage/register.py) a table, in the data directory."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir

    def read(self, source: str, table_id: str) -> Versioned:
        location = progress_location(self.data_dir, source, table_id)
        raw, version = Register(location).read()
        if raw is None:
            return Versioned(None, version)
        progress = SnapshotProgress.from_json(raw, f"the snapshot register {location}")
        _check_names(source, table_id, progress)
        return Versioned(progress, version)

    def write(self, source: str, table_id: str, progress: SnapshotProgress, expect: int) -> int:
        _check_names(source, table_id, progress)
        return Register(progress_location(self.data_dir, source, table_id)).write(progress.to_json(), expect)


def _check_names(source: str, table_id: str, progress: SnapshotProgress) -> None:
    if progress.source != source or list(progress.tables) != [table_id]:
        raise StateError(
            f"progress of source {progress.source!r} tables {sorted(progress.tables)} cannot be stored "
            f"as that of table {table_id} of source {source!r}"
        )
