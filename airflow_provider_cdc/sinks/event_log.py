"""The event log: append-only Parquet with a Debezium-style envelope, partitioned by table.

Layout: ``{events_dir}/table={table.path_segment}/{batch}.parquet``. The file name is the
batch name (``c-{first}-{last}`` for a staged segment, ``r-{hw position}-{hw id}`` for a
merged chunk), so a retried task rewrites the same files instead of adding copies (I3).
Each file is written to a temporary name and renamed: readers never see half a file.

Columns: ``op``; ``before`` and ``after``, structs of the table's typed columns (the
mirror's types, sinks/arrow_types.py; null where the event has no such image, and a column
the event did not carry reads null); ``source`` struct ``{connector, db, schema, table, position,
snapshot, watermark, tx, lsn, last_commit_lsn, server_id, thread, file, pos, row}`` (tx to
file: where the source logged the change, null for snapshot rows; pos and row: the binlog
offset and row of MariaDB/MySQL positions); ``ts_ms``; plus ``key`` (canonical key JSON) so consumers can
de-duplicate by (table, key, position) without reading rows.

Which columns: the table's log schema (capture follows it for every table it stages events
of: storage/layout.py), else its staged schema (a snapshotted table capture has not met),
else text columns named by the rows. Each file says what it was typed with in its Parquet
metadata: ``cdc.schema`` (TableSchema JSON: logical and source types, primary key) and
``cdc.text_columns`` (columns kept as canonical text in this file because a value did not
fit its type, e.g. events from before a column changed type). Files of one table may
differ in columns (ADD/DROP COLUMN); readers merge them by name (Spark ``mergeSchema``,
``pyarrow.dataset`` with a unified schema, :func:`read_events`).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core.position import ENCODED_LENGTH
from ..core.schema import Column, TableName, TableSchema
from ..storage.layout import events_dir, log_schema_path
from ..storage.staged import atomic_write_table
from .arrow_types import json_rows_to_struct
from .base import SchemaCache, Sink

log = logging.getLogger(__name__)

SOURCE_TYPE = pa.struct(
    [
        ("connector", pa.string()),  # postgresql, mysql or mariadb (Debezium's names); null when unknown
        ("db", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("position", pa.string()),
        ("snapshot", pa.bool_()),
        ("watermark", pa.string()),
        # where the source logged the change (staging's origin, core/events.py ORIGIN_FIELDS)
        ("tx", pa.string()),
        ("lsn", pa.int64()),
        ("last_commit_lsn", pa.int64()),
        ("server_id", pa.int64()),
        ("thread", pa.int64()),
        ("file", pa.string()),
        # MariaDB/MySQL: the binlog offset of the rows event and the row in it (from position)
        ("pos", pa.int64()),
        ("row", pa.int32()),
    ]
)
#: the envelope's columns; ``before`` and ``after`` are structs whose fields depend on the table
ENVELOPE_COLUMNS = ("op", "key", "before", "after", "source", "ts_ms")
SCHEMA_META = b"cdc.schema"
TEXT_COLUMNS_META = b"cdc.text_columns"


def inferred_schema(table: TableName, events: pa.Table) -> TableSchema:
    """Text columns named by the rows themselves (a table with neither a log nor a staged
    schema: its columns were never described). Every column is ``string``, so canonical values
    are kept as their text."""
    names: dict[str, None] = {}
    key_cols: list[str] = []
    for col in ("after", "before"):
        for text in events[col].drop_null().to_pylist():
            names.update(dict.fromkeys(json.loads(text)))
    for text in events["key"].drop_null().to_pylist()[:1]:
        key_cols = [f"key{i}" for i in range(len(json.loads(text)))]
    cols = tuple(Column(n, "string") for n in names) or tuple(Column(k, "string") for k in key_cols) or (Column("key0", "string"),)
    pk = tuple(c.name for c in cols[: max(1, len(key_cols))])
    return TableSchema(table, cols, pk)


def _origin_fields(events: pa.Table) -> list[pa.Array]:
    from ..storage.staged import ORIGIN_TYPE

    n = events.num_rows
    if "origin" not in events.column_names:
        return [pa.nulls(n, f.type) for f in ORIGIN_TYPE]
    origin = events["origin"].combine_chunks() if n else pa.nulls(0, ORIGIN_TYPE)
    # a null origin (snapshot rows) reads null in every field
    return [pc.if_else(origin.is_valid(), origin.field(f.name), pa.scalar(None, f.type)) for f in ORIGIN_TYPE]


def _binlog_fields(positions: pa.ChunkedArray | pa.Array, connector: str | None) -> list[pa.Array]:
    """``pos`` and ``row`` of binlog sources: the middle and last part of each position
    (core/position.py: fixed-width hex), decoded from the string buffer at once; null for
    other sources."""
    import numpy as np

    n = len(positions)
    if connector not in ("mysql", "mariadb") or n == 0:
        return [pa.nulls(n, pa.int64()), pa.nulls(n, pa.int32())]
    arr = positions.combine_chunks() if isinstance(positions, pa.ChunkedArray) else positions
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    chars = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(n, ENCODED_LENGTH)
    digits = np.where(chars >= ord("a"), chars - (ord("a") - 10), chars - ord("0")).astype(np.uint64)

    def number(first: int, last: int) -> np.ndarray:
        shifts = np.arange(last - first - 1, -1, -1, dtype=np.uint64) * np.uint64(4)
        return (digits[:, first:last] << shifts).sum(axis=1, dtype=np.uint64).astype(np.int64)

    pos, row = number(16, 32), number(32, 40).astype(np.int32)
    return [pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(pos)]),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(row)])]


def table_dir(data_dir: str, source: str, table: TableName) -> str:
    return storage.join(events_dir(data_dir, source), f"table={table.path_segment}")


class EventLogSink(Sink):
    name = "events"

    def __init__(self, data_dir: str, source: str, database: str | None = None, *, fence=None) -> None:
        self.data_dir, self.source = data_dir, source
        self.database = database or source
        self.fence = fence  # a merge's MergeFence: no file once a newer merge or a stop took the table
        self.staged = SchemaCache(data_dir, source)
        self._log_schemas: dict[str, TableSchema | None] = {}

    def schema(self, table: TableName) -> TableSchema | None:
        """The columns events of ``table`` are typed with (see the module docstring): its log
        schema, plus any column of its staged schema the log schema lacks (a column added
        while no change of the table was captured, which a snapshot's chunks already read)."""
        if table.id not in self._log_schemas:
            path = log_schema_path(self.data_dir, self.source, table)
            self._log_schemas[table.id] = TableSchema.from_json(storage.read_text(path)) if storage.exists(path) else None
        logged, staged = self._log_schemas[table.id], self.staged.get(table.id)
        if logged is None or staged is None:
            return logged or staged
        known = set(logged.column_names)
        missing = tuple(c for c in staged.columns if c.name not in known)
        if not missing:
            return logged
        return TableSchema(logged.table, logged.columns + missing, logged.primary_key, dict(logged.extra))

    def envelope(self, events: pa.Table, table: TableName) -> pa.Table:
        n = events.num_rows
        schema = self.schema(table) or inferred_schema(table, events)
        before, text_b, extra_b = json_rows_to_struct(schema, events["before"])
        after, text_a, extra_a = json_rows_to_struct(schema, events["after"])
        extra = list(dict.fromkeys([*extra_b, *extra_a]))
        if extra:
            log.warning("event log of %s: column(s) %s are in the events but not in the table's log schema; kept as "
                        "canonical text in this file", table, extra)
            schema = TableSchema(schema.table, schema.columns + tuple(Column(c, "string") for c in extra),
                                 schema.primary_key, dict(schema.extra))
        as_text = sorted((set(text_b) | set(text_a)) - set(extra))
        if as_text:
            log.warning("event log of %s: column(s) %s hold values their type (%s) cannot, kept as canonical text "
                        "in this file (a column that changed type at the source?)", table, as_text,
                        ", ".join(schema.column(c).type for c in as_text))
        if as_text or extra:
            # the same columns, as text alike, in both images: one file has one type per column
            before, _, _ = json_rows_to_struct(schema, events["before"], as_text=as_text)
            after, _, _ = json_rows_to_struct(schema, events["after"], as_text=as_text)
        src = pa.StructArray.from_arrays(
            [
                pa.repeat(pa.scalar(schema.connector, pa.string()), n),
                pa.repeat(pa.scalar(self.database, pa.string()), n),
                pa.repeat(pa.scalar(table.schema, pa.string()), n),
                pa.repeat(pa.scalar(table.name, pa.string()), n),
                events["position"].combine_chunks(),
                events["snapshot"].combine_chunks(),
                events["watermark"].combine_chunks(),
                *_origin_fields(events),
                *_binlog_fields(events["position"], schema.connector),
            ],
            fields=list(SOURCE_TYPE),
        )
        out = pa.table([events["op"], events["key"], before, after, src, events["ts_ms"]], names=list(ENVELOPE_COLUMNS))
        return out.replace_schema_metadata(
            {SCHEMA_META: schema.to_json().encode(), TEXT_COLUMNS_META: json.dumps(as_text).encode()}
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



# --- reading -------------------------------------------------------------------------------------
def file_schema(t: pa.Table) -> tuple[TableSchema | None, list[str]]:
    """The schema an event log file was typed with and its text columns (module docstring);
    (None, []) for a file without them."""
    meta = t.schema.metadata or {}
    if SCHEMA_META not in meta:
        return None, []
    return TableSchema.from_json(meta[SCHEMA_META].decode()), json.loads(meta.get(TEXT_COLUMNS_META, b"[]"))


def canonical_images(t: pa.Table, column: str, *, keep_nulls: bool = False) -> list[dict | None]:
    """``before`` or ``after`` of an event log file as canonical rows (core/schema.py), a
    column that is null left out (unless ``keep_nulls``): the typed struct cannot tell a
    column the event did not carry (added later, a key-only before-image) from a null, so
    neither is claimed."""
    from .arrow_types import arrow_canonical

    schema, text = file_schema(t)
    images = t[column].combine_chunks()
    logical = {c.name: ("string" if c.name in text else c.type) for c in schema.columns} if schema else {}
    names = [f.name for f in images.type]
    cols = [arrow_canonical(images.field(i), logical.get(n, "string")) for i, n in enumerate(names)]
    valid = images.is_valid().to_pylist()
    if keep_nulls:
        return [{n: col[i] for n, col in zip(names, cols, strict=True)} if valid[i] else None for i in range(len(images))]
    return [
        {n: col[i] for n, col in zip(names, cols, strict=True) if col[i] is not None} if valid[i] else None
        for i in range(len(images))
    ]


def read_events(data_dir: str, source: str, table: TableName) -> pa.Table:
    """Every event log file of ``table`` as one Arrow table: op, key, position, before and
    after (canonical row JSON, see :func:`canonical_images`), file. For checks and tests;
    consumers read the typed files."""
    from ..core.schema import encode_row
    from ..storage.staged import read_table

    d = table_dir(data_dir, source, table)
    parts = []
    for name in storage.list_names(d, suffix=".parquet"):
        t = read_table(storage.join(d, name))
        images = {c: [None if r is None else encode_row(r) for r in canonical_images(t, c)] for c in ("before", "after")}
        parts.append(pa.table({
            "op": t["op"], "key": t["key"],
            "before": pa.array(images["before"], pa.string()), "after": pa.array(images["after"], pa.string()),
            "position": t["source"].combine_chunks().field("position"),
            "file": pa.array([name] * t.num_rows, pa.string()),
        }))
    if not parts:
        return pa.table({n: pa.array([], pa.string()) for n in ("op", "key", "before", "after", "position", "file")})
    return pa.concat_tables(parts)
