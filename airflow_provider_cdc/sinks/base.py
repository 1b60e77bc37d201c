"""What every sink receives, and the applied-position markers of the apply job.

A sink gets an Arrow table of events (:data:`EVENT_SCHEMA`): the staged changelog
columns plus ``snapshot`` (True for ``r`` rows) and ``batch``, a deterministic name of the
unit the events came from (the staged segment for log events, the chunk's high watermark
for snapshot rows). Sinks are idempotent: writing the same batch again changes nothing
(I3), so a retried Spark task may simply run again.

Sinks are written from the Spark driver, one job at a time per table (Airflow pools and
``max_active_runs=1``): a single-writer design. The Delta mirror still retries a commit
that lost a race, but it is not built for many concurrent writers.
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence

import pyarrow as pa

from .. import storage
from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.schema import TableName, TableSchema
from ..storage.layout import schema_path
from ..storage.staged import CHANGELOG_SCHEMA

log = logging.getLogger(__name__)

# the staged changelog columns, plus the snapshot flag and the batch that wrote the event
EVENT_SCHEMA = pa.schema([*CHANGELOG_SCHEMA, pa.field("snapshot", pa.bool_()), pa.field("batch", pa.string())])
EVENT_COLUMNS = tuple(EVENT_SCHEMA.names)


class Sink(ABC):
    """Receives event batches; ``write`` must be idempotent per batch."""

    name: str

    @abstractmethod
    def write(self, events: pa.Table) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional
        pass


class SchemaCache:
    """Table schemas staged by the snapshot planner (storage/layout.py schema_path)."""

    def __init__(self, data_dir: str, source: str) -> None:
        self.data_dir, self.source = data_dir, source
        self._cache: dict[str, TableSchema | None] = {}

    def get(self, table_id: str) -> TableSchema | None:
        if table_id not in self._cache:
            path = schema_path(self.data_dir, self.source, TableName.parse(table_id))
            self._cache[table_id] = TableSchema.from_json(storage.read_text(path)) if storage.exists(path) else None
        return self._cache[table_id]

    def require(self, table_id: str) -> TableSchema:
        s = self.get(table_id)
        if s is None:
            path = schema_path(self.data_dir, self.source, TableName.parse(table_id))
            raise ConfigurationError(
                f"no staged schema for table {table_id} at {path}: the snapshot planner writes it; "
                "plan the snapshot of this table first"
            )
        return s


# --- applied-position markers (apply job) -------------------------------------------------
def marker_path(data_dir: str, source: str, sink_name: str) -> str:
    return storage.join(data_dir, "output", source, "_applied", f"{sink_name}.json")


def read_marker(data_dir: str, source: str, sink_name: str) -> Position | None:
    """The last staged position this sink has durably applied (None: nothing yet)."""
    p = marker_path(data_dir, source, sink_name)
    if not storage.exists(p):
        return None
    return Position.decode(json.loads(storage.read_text(p))["position"])


def write_marker(data_dir: str, source: str, sink_name: str, position: Position) -> None:
    """Written only after the sink committed: a crash before it replays the batch (idempotent)."""
    storage.write_text(marker_path(data_dir, source, sink_name),
                       json.dumps({"position": position.encode(), "readable": str(position), "written_at": time.time()}))


def applied_everywhere(data_dir: str, source: str, position: Position, sinks: Sequence[str] = ("events", "mirror")) -> bool:
    """Whether every one of ``sinks`` has applied the staged changelog up to ``position``."""
    marks = [read_marker(data_dir, source, s) for s in sinks]
    return all(m is not None and m >= position for m in marks)
