"""Change events, watermark events and the Debezium-style envelope."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .position import Position


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # a snapshot row, emitted at its chunk's high watermark
    TRUNCATE = "t"  # every row of the table older than this position is gone (key, before, after: null)
    GAP = "g"  # event log only: changes before this position may be missing (a resync after a failover)


WATERMARK_OP = "w"  # staged-changelog rows that are watermark writes, not table changes
#: the two outputs of a table, its event log and its mirror: the names of their sinks (EventLogSink,
#: MirrorDeltaSink) and the Asset kinds. Here, not in the sinks, because DAG files parse assets.py.
EVENTS, MIRROR = "events", "mirror"


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One row change (or snapshot read) at a source position.

    ``key`` is the canonical key (:func:`core.schema.encode_key`; None for ``t``, a TRUNCATE
    of the whole table); ``before``/``after`` map column -> canonical value. ``watermark``
    is the high-watermark id for ``r`` events. ``origin`` is where the source logged it, as
    far as its log says (:data:`ORIGIN_FIELDS`; None for snapshot rows): what Debezium's
    ``source`` block carries beyond the position.
    """

    table: str
    op: str
    key: str | None
    position: Position
    before: dict | None
    after: dict | None
    ts_ms: int = 0
    snapshot: bool = False
    watermark: str | None = None
    origin: tuple | None = None


#: the fields of ChangeEvent.origin: the transaction (PostgreSQL xid, MariaDB/MySQL GTID), the
#: change's own WAL position and the commit before its transaction (PostgreSQL), the server id,
#: the thread that ran the transaction and the binlog file name (MariaDB/MySQL); None where the
#: source's log does not say
ORIGIN_FIELDS = ("tx", "lsn", "last_commit_lsn", "server_id", "thread", "file")


@dataclass(frozen=True, slots=True)
class WatermarkEvent:
    """The watermark table's value changed to ``id`` at ``position`` (DBLog steps 1 and 3)."""

    id: str
    position: Position
    ts_ms: int = 0


LogEvent = ChangeEvent | WatermarkEvent


def to_envelope(event: ChangeEvent, database: str) -> dict[str, Any]:
    """Debezium-style envelope: ``op, before, after, source{...}, ts_ms``."""
    from .schema import TableName

    name = TableName.parse(event.table)  # a schema holding a dot is quoted in the id
    schema, table = name.schema, name.name
    return {
        "op": event.op,
        "before": event.before,
        "after": event.after,
        "source": {
            "db": database,
            "schema": schema,
            "table": table,
            "position": event.position.encode(),
            "snapshot": event.snapshot,
            "watermark": event.watermark,
        },
        "ts_ms": event.ts_ms,
    }
