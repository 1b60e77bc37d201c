"""Debezium export: the envelope (source block, transaction) and the records of a table's event log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from ...core.errors import ConfigurationError
from ...core.position import Position
from ...core.schema import TableName, TableSchema
from ...dialects.registry import profile_for_debezium
from .fields import Conv, field_schema
from .options import (
    _SNAPSHOT_ENUM,
    DebeziumOptions,
    connector_of,
    schema_prefix,
)


# --- envelope -----------------------------------------------------------------------------------
def _source_schema(connector: str) -> dict:
    def f(type_: str, name: str, optional: bool) -> dict:
        return {"type": type_, "optional": optional, "field": name}

    common = [
        f("string", "version", False),
        f("string", "connector", False),
        f("string", "name", False),
        f("int64", "ts_ms", False),
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": _SNAPSHOT_ENUM},
            "default": "false",
            "field": "snapshot",
        },
        f("string", "db", False),
        f("string", "sequence", True),
        f("int64", "ts_us", True),
        f("int64", "ts_ns", True),
    ]
    tail = [
        f(type_, name, optional)
        for type_, name, optional in profile_for_debezium(connector).debezium_source_fields
    ]
    return {
        "type": "struct",
        "fields": common + tail,
        "optional": False,
        "name": f"io.debezium.connector.{connector}.Source",
        "version": 1,
        "field": "source",
    }


def _pg_source(t: TableName, meta: dict, pos: Position, snapshot: str) -> dict:
    """The PostgreSQL connector's part of ``source`` (its fields: the profile's debezium_source_fields)."""
    lsn, commit, tx = meta.get("lsn"), meta.get("last_commit_lsn"), meta.get("tx")
    seq = (
        None
        if lsn is None
        else json.dumps([None if commit is None else str(commit), str(lsn)], separators=(",", ":"))
    )
    return {
        "sequence": seq,
        "schema": t.schema,
        "table": t.name,
        "txId": None if tx is None else int(tx),
        "lsn": lsn,
        "xmin": None,
        "origin": None,
        "origin_lsn": None,
    }


def _my_source(t: TableName, meta: dict, pos: Position, snapshot: str) -> dict:
    """The MySQL and MariaDB connectors' part of ``source``: the binlog coordinates of a streamed
    change (0 for a snapshot read, as Debezium writes them)."""
    streamed = snapshot == "false"
    return {
        "table": t.name,
        "server_id": int(meta.get("server_id") or 0),
        "gtid": meta.get("tx"),
        "file": meta.get("file") or "",
        "pos": pos.minor if streamed else 0,
        "row": pos.index if streamed else 0,
        "thread": meta.get("thread"),
        "query": None,
    }


#: Debezium's type mapping and ``source`` values of each database (by its profile's name): format
#: rules of this module, built on its value helpers, so they live here and not in the dialect
_SOURCE_VALUES = {"postgres": _pg_source, "mysql": _my_source}


_TRANSACTION = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": False, "field": "id"},
        {"type": "int64", "optional": False, "field": "total_order"},
        {"type": "int64", "optional": False, "field": "data_collection_order"},
    ],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


@dataclass
class TableExport:
    """One table's schemas and value converters, built once per schema."""

    schema: TableSchema
    opts: DebeziumOptions

    def __post_init__(self) -> None:
        self.connector = connector_of(self.schema, self.opts)
        self.profile = profile_for_debezium(self.connector)
        self.prefix = schema_prefix(self.schema.table, self.opts)
        fields = []
        self.columns: list[tuple[str, Conv]] = []
        enums = json.loads(self.schema.extra.get("enum_labels") or "{}")
        for col in self.schema.columns:
            got = field_schema(col, self.connector, enums.get(col.name))
            if got is not None:
                fields.append(got[0])
                self.columns.append((col.name, got[1]))
        value = {"type": "struct", "fields": fields, "optional": True, "name": f"{self.prefix}.Value"}
        self.envelope_schema = {
            "type": "struct",
            "fields": [
                value | {"field": "before"},
                value | {"field": "after"},
                _source_schema(self.connector),
                _TRANSACTION,
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
            ],
            "optional": False,
            "name": f"{self.prefix}.Envelope",
            "version": 2,
        }
        by_name = {f["field"]: (f, conv) for f, (_, conv) in zip(fields, self.columns, strict=True)}
        keys = [by_name[k] for k in self.schema.primary_key if k in by_name]  # in primary-key order
        self.key_schema = {
            "type": "struct",
            "fields": [f | {"optional": False} for f, _ in keys],
            "optional": False,
            "name": f"{self.prefix}.Key",
        }
        self._key_convs = [(f["field"], conv) for f, conv in keys]

    def image(self, row: dict | None) -> dict | None:
        return None if row is None else {n: conv(row.get(n)) for n, conv in self.columns}

    def key(self, key_values: list) -> dict:
        return {
            "schema": self.key_schema,
            "payload": {n: conv(v) for (n, conv), v in zip(self._key_convs, key_values, strict=True)},
        }

    def source(self, event: dict, database: str) -> dict:
        ts_ms = int(event["ts_ms"] or 0)
        snapshot = "incremental" if event["op"] == "r" else "false"
        meta = event.get("meta") or {}
        t = self.schema.table
        if self.profile.schema_is_database:
            database = t.schema  # MySQL's db is the table's database
        elif self.opts.database:
            database = self.opts.database
        common = {
            "version": self.opts.version,
            "connector": self.connector,
            "name": self.opts.topic_prefix,
            "ts_ms": ts_ms,
            "snapshot": snapshot,
            "db": database,
            "sequence": None,
            "ts_us": ts_ms * 1000,
            "ts_ns": ts_ms * 1_000_000,
        }
        return common | _SOURCE_VALUES[self.profile.name](
            t, meta, Position.decode(event["position"]), snapshot
        )

    def records(self, event: dict, database: str) -> list[dict]:
        """The Kafka records (key document, value document or None) of one event; in the
        "value" form each is the value document alone (no tombstones)."""
        op = event["op"]
        if (op == "t" and not self.opts.truncates) or op == "g":  # (Debezium has no gap record)
            return []
        ts_ms = int(event["ts_ms"] or 0)
        value = {
            "schema": self.envelope_schema,
            "payload": {
                "before": self.image(event["before"]),
                "after": self.image(event["after"]),
                "source": self.source(event, database),
                "transaction": None,
                "op": op,
                "ts_ms": ts_ms,
                "ts_us": ts_ms * 1000,
                "ts_ns": ts_ms * 1_000_000,
            },
        }
        if self.opts.form == "value":
            return [value]
        key = None if op == "t" else self.key(json.loads(event["key"]))
        out = [{"key": key, "value": value}]
        if op == "d" and self.opts.tombstones:
            out.append({"key": key, "value": None})
        return out


def file_records(
    t: pa.Table, opts: DebeziumOptions, *, exports: dict | None = None, skipped: list | None = None
) -> Iterator[tuple[str, str, list]]:
    """The records of one event-log file (sinks/event_log.py), in its order, as (position, key,
    the event's records). ``skipped`` collects the positions of TRUNCATEs left out."""
    from ...sinks.event_log import canonical_images, file_schema

    schema, _ = file_schema(t)
    if schema is None:
        raise ConfigurationError(
            "an event log file without its cdc.schema metadata (written before typed events): "
            "re-run the apply or snapshot that wrote it to export it"
        )
    cache = exports if exports is not None else {}
    exp = cache.get(schema.to_json())
    if exp is None:
        exp = cache[schema.to_json()] = TableExport(schema, opts)
    before = canonical_images(t, "before", keep_nulls=True)
    after = canonical_images(t, "after", keep_nulls=True)
    src = t["source"].to_pylist()
    for i, (op, key, ts) in enumerate(
        zip(t["op"].to_pylist(), t["key"].to_pylist(), t["ts_ms"].to_pylist(), strict=True)
    ):
        event = {
            "op": op,
            "key": key,
            "ts_ms": ts,
            "before": before[i],
            "after": after[i],
            "position": src[i]["position"],
            "meta": src[i],
        }
        if op == "t" and not opts.truncates and skipped is not None:
            skipped.append(src[i]["position"])
        yield src[i]["position"], key or "", exp.records(event, src[i]["db"])


def _first_position(name: str) -> str:
    """The first position of an event-log file from its name (``c-{first}-{last}``, ``r-{hw}-{id}``);
    "" (open it first) for a name of another form."""
    from ...core.position import ENCODED_LENGTH

    parts = name.split("-")
    first = parts[1] if len(parts) >= 3 else ""
    return first if len(first) == ENCODED_LENGTH else ""


def export_table(
    data_dir: str,
    source: str,
    table: TableName,
    out: str,
    opts: DebeziumOptions,
    *,
    batch_rows: int = 4096,
    skipped_truncates: list | None = None,
    replace: bool = True,
) -> int:
    """Every event of ``table`` in the event log, in (position, key) order, as Debezium JSON
    lines at ``out`` (a location: local path or URI; written whole or not at all). Returns the
    number of records; ``skipped_truncates`` collects the positions of TRUNCATEs left out
    (without ``opts.truncates``), which a consumer rebuilding the table never learns of.

    Streaming: files are read ``batch_rows`` rows at a time and merged by position, a file
    opened only once the merge reaches its first position (files cover ranges that barely
    overlap: a chunk's rows sit at its high watermark, inside one changelog batch), so memory
    stays at a few batches whatever the table's size."""
    import heapq
    import itertools

    import pyarrow.parquet as pq

    from ... import storage
    from ...sinks.event_log import event_files, table_dir

    d = table_dir(data_dir, source, table)
    exports: dict = {}

    def events(name: str) -> Iterator[tuple[str, str, list]]:
        fs, path = storage.filesystem(storage.join(d, name))
        with fs.open_input_file(path) as fh:
            pf = pq.ParquetFile(fh)
            meta = pf.schema_arrow.metadata
            for batch in pf.iter_batches(batch_size=batch_rows):
                yield from file_records(
                    pa.Table.from_batches([batch]).replace_schema_metadata(meta),
                    opts,
                    exports=exports,
                    skipped=skipped_truncates,
                )

    # the files of the table's Delta log (never a compaction's inputs beside its output)
    names = sorted(event_files(d), key=lambda n: (_first_position(n), n))
    if not names:
        raise ConfigurationError(
            f"no event log for table {table} of source {source!r} at {d}: check the table name "
            "(schema.table), "
            "the source and the data location; nothing was written"
        )
    waiting = iter(names)
    pending = next(waiting, None)
    heap: list = []
    order = itertools.count()

    def push(gen: Iterator) -> None:
        head = next(gen, None)
        if head is not None:
            heapq.heappush(heap, (head[0], head[1], next(order), head[2], gen))

    n = 0
    # ``replace`` False: an existing file at ``out`` is never replaced (airflow-cdc export-debezium
    # without --force); a local file is its owner's alone (0600): it holds row values
    with storage.atomic_output(out, replace=replace) as (fs, tmp), fs.open_output_stream(tmp) as f:
        while heap or pending is not None:
            while pending is not None and (not heap or _first_position(pending) <= heap[0][0]):
                push(events(pending))
                pending = next(waiting, None)
            if not heap:
                continue
            _, _, _, records, gen = heapq.heappop(heap)
            for rec in records:
                f.write(json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
                n += 1
            push(gen)
    return n
