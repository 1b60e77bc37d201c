"""A versioned register at a location with compare-and-set: a one-row Delta table whose version is
the register's; a write commits on exactly the version it read or raises :class:`ConflictError`
(docs/DESIGN.md, "Snapshot state"). Version 0: never written.
"""

from __future__ import annotations

import logging
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from ..core.errors import StateError
from . import delete, delta_storage_options, filesystem, join, makedirs

log = logging.getLogger(__name__)

SCHEMA = pa.schema([pa.field("value", pa.large_string(), nullable=False)])
#: a register's Delta log: a checkpoint every 10 writes, entries a checkpoint covers kept a day
PROPERTIES = {
    "delta.checkpointInterval": "10",
    "delta.enableExpiredLogCleanup": "true",
    "delta.logRetentionDuration": "interval 24 hours",
}
_READ_ATTEMPTS = 5


class ConflictError(StateError):
    """The register moved past the version a write expected: read it again and redo the change."""


class Register:
    """One versioned value at ``location`` (a local path or URI through the storage layer)."""

    def __init__(self, location: str) -> None:
        self.location = location

    def _open(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.location, storage_options=delta_storage_options(self.location))
        except TableNotFoundError:
            return None

    def read(self) -> tuple[str | None, int]:
        """(value, version); (None, 0) when never written."""
        for attempt in range(_READ_ATTEMPTS):
            dt = self._open()
            if dt is None:
                return None, 0
            # relative paths joined onto the location as given: file_uris() percent-encodes the
            # location (a data dir named "data dir é" is not at "data%20dir%20%C3%A9")
            rels = pa.table(dt.get_add_actions(flatten=True))["path"].to_pylist()
            if len(rels) != 1:
                raise StateError(
                    f"register {self.location} holds {len(rels)} files at version {dt.version()}, not 1; "
                    "it was written by something else: move it away to start over"
                )
            fs, path = filesystem(join(self.location, *rels[0].split("/")))
            try:
                values = pq.read_table(path, filesystem=fs, columns=["value"])["value"]
            except FileNotFoundError:  # a writer replaced it after we listed it: read again
                if attempt == _READ_ATTEMPTS - 1:
                    raise
                continue
            return values[0].as_py(), dt.version() + 1
        raise AssertionError("unreachable")

    def write(self, value: str, expect: int) -> int:
        """Store ``value`` if the register is still at version ``expect`` (0: never written);
        returns the new version. :class:`ConflictError` when another write came first."""
        rows = pa.table({"value": pa.array([value], pa.large_string())}, schema=SCHEMA)
        if expect == 0:
            try:
                write_deltalake(
                    self.location,
                    rows,
                    mode="error",
                    configuration=PROPERTIES,
                    storage_options=delta_storage_options(self.location),
                )
            except (DeltaError, CommitFailedError, OSError) as exc:
                if self._open() is not None:
                    raise ConflictError(f"register {self.location}: created by another writer first") from exc
                raise
            return 1
        dt = self._open()
        have = 0 if dt is None else dt.version() + 1
        if have != expect:
            raise ConflictError(f"register {self.location} is at version {have}, not {expect}")
        old = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        name = f"value-{expect + 1:020d}-{uuid.uuid4().hex}.parquet"
        target = join(self.location, name)
        makedirs(self.location)
        fs, path = filesystem(target)
        pq.write_table(rows, path, filesystem=fs)
        size = fs.get_file_info(path).size
        now = int(time.time() * 1000)
        actions: list = [
            RemoveAction(p, True, now, s, {}) for p, s in zip(old["path"], old["size_bytes"], strict=True)
        ]
        actions.append(AddAction(name, int(size), {}, now, True, '{"numRecords":1}'))
        try:
            dt.create_write_transaction(
                actions,
                mode="append",
                schema=dt.schema(),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError as exc:
            _quiet_delete(target)
            raise ConflictError(
                f"register {self.location}: another write committed version {expect + 1} first"
            ) from exc
        except BaseException:
            _quiet_delete(target)
            raise
        for p in old["path"]:  # readers of the version before retry (read())
            _quiet_delete(join(self.location, *p.split("/")))
        return expect + 1


def _quiet_delete(location: str) -> None:
    try:
        delete(location)
    except OSError:
        log.warning("could not delete %s (a register's replaced or uncommitted value); harmless", location)
