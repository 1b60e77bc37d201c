"""The event log: append-only Parquet with a Debezium-style envelope, partitioned by table.

Files are named by their batch, so a retried task rewrites the same files (I3), and appear
whole (written, then renamed). Columns, their types and the schema each file was typed with:
docs/outputs.md; readers merge files of different columns by name (:func:`read_events`).
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from .. import storage
from ..core.arrow_types import (
    canonical_rows,
    images_metadata,
    metadata_schema,
)
from ..core.position import ENCODED_LENGTH
from ..core.schema import TableName, TableSchema, log_typing_schema
from ..storage.layout import events_dir, log_schema_path
from .base import UNITS, Events, SchemaCache, Sink, TableEvents, table_events
from .event_log_table import (  # noqa: F401 - the envelope and the file names, re-exported
    ENVELOPE_COLUMNS,
    SOURCE_TYPE,
    RetypedError,
    _changelog_range,
    active_files,
    current,
    ensure,
    live_files,
    superseded,
)
from .event_log_table import commit as commit_files

log = logging.getLogger(__name__)


def _origin_fields(events: pa.Table) -> list[pa.Array]:
    from ..core.event_batch import ORIGIN_TYPE

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
    chars = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]].reshape(
        n, ENCODED_LENGTH
    )
    digits = np.where(chars >= ord("a"), chars - (ord("a") - 10), chars - ord("0")).astype(np.uint64)

    def number(first: int, last: int) -> np.ndarray:
        shifts = np.arange(last - first - 1, -1, -1, dtype=np.uint64) * np.uint64(4)
        return (digits[:, first:last] << shifts).sum(axis=1, dtype=np.uint64).astype(np.int64)

    pos, row = number(16, 32), number(32, 40).astype(np.int32)
    return [
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(pos)]),
        pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(row)]),
    ]


def table_dir(data_dir: str, source: str, table: TableName) -> str:
    return storage.join(events_dir(data_dir, source), f"table={table.path_segment}")


class EventLogSink(Sink):
    name = "events"
    placement = UNITS  # a batch's events are its own files: each unit writes its own

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
            self._log_schemas[table.id] = (
                TableSchema.from_json(storage.read_text(path)) if storage.exists(path) else None
            )
        return log_typing_schema(self._log_schemas[table.id], self.staged.get(table.id))

    def envelope(self, te: TableEvents) -> pa.Table:
        """One table's typed events (TableEvents) -> the event log's columns, the images as
        staging typed them (the file names their schema and text columns)."""
        events, schema, table = te.events, te.schema, TableName.parse(te.table)
        n = events.num_rows
        connector = schema.connector if schema is not None else None
        if te.text_columns:
            log.warning(
                "event log of %s: column(s) %s hold values their type cannot, kept as canonical text in this "
                "file (a column that changed type at the source?)",
                table,
                list(te.text_columns),
            )
        src = pa.StructArray.from_arrays(
            [
                pa.repeat(pa.scalar(connector, pa.string()), n),
                pa.repeat(pa.scalar(self.database, pa.string()), n),
                pa.repeat(pa.scalar(table.schema, pa.string()), n),
                pa.repeat(pa.scalar(table.name, pa.string()), n),
                events["position"].combine_chunks(),
                events["snapshot"].combine_chunks(),
                events["watermark"].combine_chunks(),
                *_origin_fields(events),
                *_binlog_fields(events["position"], connector),
            ],
            fields=list(SOURCE_TYPE),
        )
        out = pa.table(
            [events["op"], events["key"], events["before"], events["after"], src, events["ts_ms"]],
            names=list(ENVELOPE_COLUMNS),
        )
        return out.replace_schema_metadata(
            images_metadata(schema, te.text_columns) if schema is not None else None
        )

    def write(self, events: Events) -> None:
        for te in table_events(events, lambda t: self.schema(TableName.parse(t))):
            table = TableName.parse(te.table)
            files = []
            for batch in pc.unique(te.events["batch"]).to_pylist():
                part = te.events.filter(pc.equal(te.events["batch"], batch))
                # (position, key): the same file content whatever order the engine delivered the rows in
                part = part.sort_by([("position", "ascending"), ("key", "ascending")])
                files.append((f"{batch}.parquet", self.envelope(te.with_events(part))))
            check = None if self.fence is None else (lambda t=te.table: self.fence.check(t))
            folder = table_dir(self.data_dir, self.source, table)
            # the files, then one commit of the table's Delta log naming them (sinks/event_log_table.py)
            version = commit_files(folder, files, check=check)
            log.info(
                "event log: %d events of %s -> %s, version %d (%s)",
                sum(t.num_rows for _, t in files),
                table,
                folder,
                version,
                ", ".join(n for n, _ in files),
            )


# --- reading -------------------------------------------------------------------------------------
def file_schema(t: pa.Table) -> tuple[TableSchema | None, list[str]]:
    """The schema an event log file was typed with and its text columns (module docstring);
    (None, []) for a file without them."""
    return metadata_schema(t.schema.metadata)


def canonical_images(t: pa.Table, column: str, *, keep_nulls: bool = False) -> list[dict | None]:
    """``before`` or ``after`` of an event log file as canonical rows (core/schema.py), a
    column that is null left out (unless ``keep_nulls``): the typed struct cannot tell a
    column the event did not carry (added later, a key-only before-image) from a null, so
    neither is claimed."""
    schema, text = file_schema(t)
    return canonical_rows(t[column], schema, text, keep_nulls=keep_nulls)


def read_events(data_dir: str, source: str, table: TableName) -> pa.Table:
    """Every event log file of ``table`` as one Arrow table: op, key, position, before and
    after (canonical row JSON, see :func:`canonical_images`), file. For checks and tests;
    consumers read the typed files."""
    from ..core.schema import encode_row
    from ..storage.staged import read_table

    d = table_dir(data_dir, source, table)
    parts = []
    for name in event_files(d):
        t = read_table(storage.join(d, name))
        images = {
            c: [None if r is None else encode_row(r) for r in canonical_images(t, c)]
            for c in ("before", "after")
        }
        parts.append(
            pa.table(
                {
                    "op": t["op"],
                    "key": t["key"],
                    "before": pa.array(images["before"], pa.string()),
                    "after": pa.array(images["after"], pa.string()),
                    "position": t["source"].combine_chunks().field("position"),
                    "file": pa.array([name] * t.num_rows, pa.string()),
                }
            )
        )
    if not parts:
        return pa.table(
            {n: pa.array([], pa.string()) for n in ("op", "key", "before", "after", "position", "file")}
        )
    return pa.concat_tables(parts)


# --- compaction ----------------------------------------------------------------------------------
#: a changelog file holding fewer bytes than this is small: runs of them are merged
COMPACT_TARGET_BYTES = 32 * 1024 * 1024
#: a run of small files is merged once it holds this many files or reaches the target size
COMPACT_MIN_FILES = 50
#: how long files merged into a larger one stay (readers that listed them before may still open them)
COMPACT_GRACE_SECONDS = 3600.0


def event_files(folder: str) -> list[str]:
    """The files of one table's event log a reader takes, sorted: those of its Delta log's
    newest version (sinks/event_log_table.py); a folder without a log, its live files."""
    found = active_files(folder)
    return found if found is not None else live_files(storage.list_names(folder, suffix=".parquet"), folder)


def compact_table(
    folder: str,
    applied: str,
    *,
    target_bytes: int = COMPACT_TARGET_BYTES,
    min_files: int = COMPACT_MIN_FILES,
    grace_seconds: float = COMPACT_GRACE_SECONDS,
    now: float | None = None,
) -> tuple[int, int]:
    """Merge runs of small changelog files of one table's folder that the event log has applied
    (last position <= ``applied``, an encoded position: apply never writes those again, since a
    replay only rewrites batches past the marker) into one file per run, then delete the files
    the table's Delta log removed more than ``grace_seconds`` ago (and files no version ever
    named, left by a writer that stopped before its commit, once that old). Snapshot files
    (``r-``) are left as they are.

    A run holds consecutive files typed alike (the same ``cdc.schema`` and text columns: a
    schema change starts a new run) and is merged once it reaches ``target_bytes`` or
    ``min_files`` files. The merged file is ``c-{first}-{last}`` of the run, sorted by (position,
    key) like every file, with the run's metadata: readers see the same events in the same
    order. One commit of the table's Delta log removes the inputs and adds it
    (sinks/event_log_table.py), so a reader of the log never sees both. A folder written before
    the log existed is adopted first. Returns (files merged, files deleted)."""
    import time

    import pyarrow.parquet as pq

    now = time.time() if now is None else now
    ensure(folder)
    version, state = current(folder)
    if version < 0:
        return 0, 0
    infos = {
        i.base_name: i
        for i in storage.list_dir(folder)
        if i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
    }
    removed = _delete_unreferenced(folder, state, infos, now - grace_seconds)
    live = [n for n in state.adds if (r := _changelog_range(n)) is not None and r[1] <= applied]
    live.sort(key=lambda n: _changelog_range(n))
    runs: list[list[str]] = []
    run: list[str] = []
    run_meta = None
    run_bytes = 0

    def close() -> None:
        if len(run) >= 2 and (len(run) >= min_files or run_bytes >= target_bytes):
            runs.append(list(run))

    for name in live:
        size = int(state.adds[name].get("size") or 0)
        if size >= target_bytes:  # large already: ends the run
            close()
            run, run_meta, run_bytes = [], None, 0
            continue
        path = storage.join(folder, name)
        fs, p = storage.filesystem(path)
        with fs.open_input_file(p) as fh:
            meta = pq.ParquetFile(fh).schema_arrow.metadata
        if run and meta != run_meta:
            close()
            run, run_bytes = [], 0
        run.append(name)
        run_meta, run_bytes = meta, run_bytes + size
        if run_bytes >= target_bytes:
            close()
            run, run_meta, run_bytes = [], None, 0
    close()
    merged = 0
    for names in runs:
        merged += _merge_run(folder, names)
    return merged, removed


def compact_event_log(data_dir: str, source: str, applied, **kwargs) -> dict[str, tuple[int, int]]:
    """:func:`compact_table` for every table's folder of ``source``'s event log, up to
    ``applied`` (the event log's applied marker, a Position; None: nothing is merged, merged
    files past their grace still go). Returns (files merged, files removed) per folder."""
    root = events_dir(data_dir, source)
    bound = applied.encode() if applied is not None else ""
    out = {}
    for name in storage.list_names(root, files_only=False):
        if name.startswith("table="):
            res = compact_table(storage.join(root, name), bound, **kwargs)
            if any(res):
                out[name] = res
    return out


class _NotAlike(Exception):
    """A run's files differ in their Arrow schema: merged in memory instead."""


def _write_in_order(folder: str, names: list[str], location: str) -> int:
    """The run's files, each sorted and the run in order, copied a batch at a time into one file
    at ``location`` (published whole or not at all); returns its rows."""
    import pyarrow.parquet as pq

    rows = 0
    with storage.atomic_output(location) as (fs, tmp):
        writer = None
        try:
            for n in names:
                in_fs, path = storage.filesystem(storage.join(folder, n))
                with in_fs.open_input_file(path) as fh:
                    f = pq.ParquetFile(fh)
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, f.schema_arrow, filesystem=fs)
                    elif not f.schema_arrow.equals(writer.schema, check_metadata=True):
                        raise _NotAlike(n)
                    for batch in f.iter_batches(batch_size=65_536):
                        writer.write_batch(batch)
                        rows += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
    return rows


def _merge_run(folder: str, names: list[str]) -> int:
    """One run of a table's changelog files merged into ``c-{first}-{last}`` of the run, sorted
    by (position, key), committed in place of them; returns the files merged (0: another
    compaction took the run). A run in order (no two files' ranges overlap: each file is sorted)
    is copied a batch at a time; one whose ranges overlap (a segment read again after a
    failover) is sorted again, in memory."""
    spans = [_changelog_range(n) for n in names]  # overlapping names: the widest claim
    out = f"c-{min(r[0] for r in spans)}-{max(r[1] for r in spans)}.parquet"
    location = storage.join(folder, out)
    in_order = all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
    if not in_order or storage.exists(location):
        return _merge_run_in_memory(folder, names, out)
    try:
        rows = _write_in_order(folder, names, location)
    except _NotAlike:
        return _merge_run_in_memory(folder, names, out)
    try:
        merged = _commit_run(folder, names, out, rows, prewritten=[(out, rows)])
    except RetypedError:  # a column widened meanwhile: merged in memory, in the new types
        storage.delete(location)
        return _merge_run_in_memory(folder, names, out)
    if not merged:  # another compaction took the run: the copy is nobody's
        storage.delete(location)
    return merged


def _merge_run_in_memory(folder: str, names: list[str], out: str) -> int:
    from ..storage.staged import read_table

    tables = [read_table(storage.join(folder, n)) for n in names]
    t = pa.concat_tables(tables).replace_schema_metadata(tables[0].schema.metadata)
    del tables
    order = pc.sort_indices(
        pa.table({"p": pc.struct_field(t["source"], "position"), "k": t["key"]}),
        sort_keys=[("p", "ascending"), ("k", "ascending")],
    )
    return _commit_run(folder, names, out, t.num_rows, files=[(out, t.take(order))])


def _commit_run(folder: str, names: list[str], out: str, rows: int, **files) -> int:
    """The merged file of a run committed in place of its inputs (``files`` or ``prewritten``, as
    :func:`event_log_table.commit` takes them); returns the files merged, 0 when another
    compaction took the run."""
    try:
        v = commit_files(folder, replace=names, operation="OPTIMIZE", data_change=False, **files)
    except RetypedError:  # (a CommitFailedError) the caller merges the run again
        raise
    except CommitFailedError as exc:  # another compaction took the run: it is merged already
        log.info("event log %s: run %s..%s left alone (%s)", folder, names[0], names[-1], exc)
        return 0
    log.info(
        "event log %s: %d files merged into %s (%d events), version %d", folder, len(names), out, rows, v
    )
    return len(names)


def _delete_unreferenced(folder: str, state, infos: dict, before: float) -> int:
    """Delete the table's files its Delta log removed before ``before`` (unix time), and files no
    version named (a writer that stopped before its commit) written before then."""
    removed = 0
    for name, info in infos.items():
        if name in state.adds:
            continue
        gone = state.removes.get(name)
        when = (
            max(int(r.get("deletionTimestamp") or 0) for r in gone) / 1000.0
            if gone
            else (info.mtime.timestamp() if info.mtime is not None else before + 1)
        )
        if when < before:
            storage.delete(storage.join(folder, name))
            removed += 1
    return removed
