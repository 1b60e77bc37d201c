"""The event log: append-only Parquet with a Debezium-style envelope, partitioned by table.

Layout: ``{events_dir}/table={table.path_segment}/{batch}.parquet``. The file name is the
batch name (``c-{first}-{last}`` for a staged segment, ``r-{hw position}-{hw id}`` for a
merged chunk), so a retried task rewrites the same files instead of adding copies (I3).
Each file is written to a temporary name and renamed: readers never see half a file.

Columns: ``op, before, after`` (canonical row JSON), ``source`` struct
``{db, schema, table, position, snapshot, watermark}``, ``ts_ms``, plus ``key`` (canonical
key JSON) so consumers can de-duplicate by (table, key, position) without parsing rows.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core.schema import TableName
from ..storage.layout import events_dir
from ..storage.staged import atomic_write_table
from .base import Sink

log = logging.getLogger(__name__)

SOURCE_TYPE = pa.struct(
    [
        ("db", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("position", pa.string()),
        ("snapshot", pa.bool_()),
        ("watermark", pa.string()),
    ]
)
ENVELOPE_SCHEMA = pa.schema(
    [
        ("op", pa.string()),
        ("key", pa.string()),
        ("before", pa.string()),
        ("after", pa.string()),
        ("source", SOURCE_TYPE),
        ("ts_ms", pa.int64()),
    ]
)


def table_dir(data_dir: str, source: str, table: TableName) -> str:
    return storage.join(events_dir(data_dir, source), f"table={table.path_segment}")


class EventLogSink(Sink):
    name = "events"

    def __init__(self, data_dir: str, source: str, database: str | None = None, *, fence=None) -> None:
        self.data_dir, self.source = data_dir, source
        self.database = database or source
        self.fence = fence  # a merge's MergeFence: no file once a newer merge or a stop took the table

    def envelope(self, events: pa.Table, table: TableName) -> pa.Table:
        n = events.num_rows
        src = pa.StructArray.from_arrays(
            [
                pa.array([self.database] * n, pa.string()),
                pa.array([table.schema] * n, pa.string()),
                pa.array([table.name] * n, pa.string()),
                events["position"].combine_chunks(),
                events["snapshot"].combine_chunks(),
                events["watermark"].combine_chunks(),
            ],
            fields=list(SOURCE_TYPE),
        )
        return pa.table(
            [events["op"], events["key"], events["before"], events["after"], src, events["ts_ms"]],
            schema=ENVELOPE_SCHEMA,
        )

    def write(self, events: pa.Table) -> None:
        if events.num_rows == 0:
            return
        groups = events.group_by(["table", "batch"]).aggregate([]).to_pylist()
        for g in groups:
            part = events.filter(pc.and_(pc.equal(events["table"], g["table"]), pc.equal(events["batch"], g["batch"])))
            # (position, key): the same file content whatever order the engine delivered the rows in
            part = part.sort_by([("position", "ascending"), ("key", "ascending")])
            table = TableName.parse(g["table"])
            if self.fence is not None:
                self.fence.check(g["table"])
            path = storage.join(table_dir(self.data_dir, self.source, table), f"{g['batch']}.parquet")
            atomic_write_table(self.envelope(part, table), path)
            log.info("event log: %d events of %s -> %s", part.num_rows, table, path)
