"""The event log's Delta log: each table's folder of the event log is a Delta table too, so a
reader that lists it through the log (Spark, Trino, duckdb, polars, deltalake, and this
package's own readers) sees exactly the live files: never a compaction's inputs beside its
output, never a file a writer left behind.

- A write (sinks/event_log.EventLogSink) puts its batch files, then commits their ``add``
  actions as the next version, put-if-absent (delta_log.write_commit); another writer's
  version first means: read the log again and try again. A batch written again (a retried
  task) replaces its earlier file in the same commit: its files are named by the batch.
- A compaction (event_log.compact_table) removes its inputs and adds its output in one commit.
- Delta holds one type per column, and the files of a table are typed as the source was when
  they were written. The table's typing (``cdc.eventImages`` in the table's configuration: the
  columns, their types and the columns held as canonical text) only ever grows: a new column
  joins; a file whose column holds another type is converted to the table's type where every
  value fits; otherwise the table takes the file's type where every earlier value fits it (a
  widened number), else the column becomes canonical text. Then the files already there are
  rewritten under the new typing, in the same commit (``{batch}.g{version}.parquet``): once per
  such type change of a table, never for an added or dropped column (a file without a
  column reads null there).
- A folder written before this log existed is adopted by the first write or compaction: its
  live files are added (superseded compaction inputs recorded as removed, so they keep their
  grace period), converted as above where their types differ.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError

from .. import storage
from ..core.arrow_types import (
    SCHEMA_META,
    TEXT_COLUMNS_META,
    arrow_type,
    column_as,
    conform_images,
    images_metadata,
    metadata_schema,
)
from ..core.errors import ConfigurationError
from ..core.event_batch import ORIGIN_TYPE
from ..core.schema import Column, TableSchema
from ..storage.staged import atomic_write_table, read_table
from .delta_log import LogState, after_commit, latest_version, log_state, write_commit
from .event_log_names import _changelog_range, held_in, live_files, superseded  # noqa: F401 - offered here too

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
        *((f.name, f.type) for f in ORIGIN_TYPE),
        # MariaDB/MySQL: the binlog offset of the rows event and the row in it (from position)
        ("pos", pa.int64()),
        ("row", pa.int32()),
    ]
)
#: the envelope's columns; ``before`` and ``after`` are structs whose fields depend on the table
ENVELOPE_COLUMNS = ("op", "key", "before", "after", "source", "ts_ms")


#: the table property holding the typing every file of the table is held in
TYPING_PROPERTY = "cdc.eventImages"
#: a write that loses the race for a version this many times in a row gives up (CommitFailedError)
COMMIT_ATTEMPTS = 100
_IMAGES = ("before", "after")


@dataclass(frozen=True)
class Typing:
    """The columns of a table's event images as its Delta table holds them: ``schema`` (the
    newest source type of each column) and ``text`` (columns held as canonical text)."""

    schema: TableSchema
    text: tuple[str, ...]

    def logical(self) -> dict[str, str]:
        return {c.name: ("string" if c.name in self.text else c.type) for c in self.schema.columns}

    def to_json(self) -> str:
        return json.dumps(
            {"schema": json.loads(self.schema.to_json()), "text": list(self.text)}, sort_keys=True
        )

    @classmethod
    def from_json(cls, text: str) -> Typing:
        d = json.loads(text)
        return cls(TableSchema.from_json(json.dumps(d["schema"])), tuple(d["text"]))

    def metadata(self) -> dict[bytes, bytes]:
        return images_metadata(self.schema, self.text)


def envelope_schema(typing: Typing) -> pa.Schema:
    """The Arrow schema of every file of a table held in ``typing`` (and of its Delta table)."""
    logical = typing.logical()
    images = pa.struct([pa.field(c.name, arrow_type(logical[c.name])) for c in typing.schema.columns])
    return pa.schema(
        [
            ("op", pa.string()),
            ("key", pa.string()),
            ("before", images),
            ("after", images),
            ("source", SOURCE_TYPE),
            ("ts_ms", pa.int64()),
        ]
    )


def _file_typing(t) -> Typing | None:
    """The typing a file's images carry in their metadata (a table or a stand-in with ``schema``)."""
    meta = t.schema.metadata or {}
    return _metadata_typing(meta.get(SCHEMA_META), meta.get(TEXT_COLUMNS_META))


@functools.lru_cache(maxsize=256)
def _metadata_typing(schema: bytes | None, text: bytes | None) -> Typing | None:
    if schema is None:
        return None
    found, columns = metadata_schema({SCHEMA_META: schema, TEXT_COLUMNS_META: text or b"[]"})
    return Typing(found, tuple(sorted(columns)))


def _fits(t: pa.Table, name: str, have: str, want: str, table) -> bool:
    """Whether every value of column ``name`` (logical ``have``) of both images of ``t`` fits ``want``."""
    for image in _IMAGES:
        images = t[image].combine_chunks() if t[image].num_chunks else pa.nulls(0, t[image].type)
        idx = images.type.get_field_index(name)
        if idx < 0:
            continue
        try:
            column_as(images.field(idx), have, want, name=name, table=table)
        except ConfigurationError:
            return False
    return True


def join_typing(typing: Typing | None, t: pa.Table) -> tuple[Typing, dict[str, str]]:
    """The typing once file ``t`` joins a table held in ``typing``: (the new typing, the columns
    whose type the table's files already there must change: name -> the file's logical type).
    A new column joins as the file has it; a column of another type keeps the table's type
    where every value of ``t`` fits it; else it is a candidate for the file's type (decided by
    :func:`settle` against the files already there)."""
    mine = _file_typing(t)
    if mine is None:
        raise ConfigurationError(
            "an event-log file without its images' schema (cdc.schema): written by hand?"
        )
    if typing is None:
        return mine, {}
    cols = list(typing.schema.columns)
    index = {c.name: i for i, c in enumerate(cols)}
    text = set(typing.text)
    theirs, candidates = mine.logical(), {}
    current = typing.logical()
    for c in mine.schema.columns:
        if c.name not in index:
            cols.append(Column(c.name, c.type, c.source_type, True))
            if c.name in mine.text:
                text.add(c.name)
            continue
        if c.name in text or theirs[c.name] == current[c.name]:
            continue
        if _fits(t, c.name, theirs[c.name], current[c.name], typing.schema.table):
            continue
        candidates[c.name] = theirs[c.name]
    schema = TableSchema(
        typing.schema.table, tuple(cols), typing.schema.primary_key, dict(typing.schema.extra)
    )
    return Typing(schema, tuple(sorted(text))), candidates


def settle(
    typing: Typing, candidates: dict[str, str], tables: Sequence[tuple[str, Callable[[], pa.Table]]]
) -> Typing:
    """``typing`` with each candidate column (:func:`join_typing`) given its candidate type when
    every value of ``tables`` (the files already there) fits it, else held as text."""
    if not candidates:
        return typing
    cols = list(typing.schema.columns)
    index = {c.name: i for i, c in enumerate(cols)}
    text = set(typing.text)
    ok = {n: want != "string" for n, want in candidates.items()}
    for _name, load in tables:
        if not any(ok.values()):
            break
        t = load()
        have = (_file_typing(t) or typing).logical()
        for n, want in candidates.items():
            if (
                ok[n]
                and n in have
                and have[n] != want
                and not _fits(t, n, have[n], want, typing.schema.table)
            ):
                ok[n] = False
    for n, want in candidates.items():
        if ok[n]:
            old = cols[index[n]]
            cols[index[n]] = Column(n, want, old.source_type, True)
        else:
            text.add(n)
    schema = TableSchema(
        typing.schema.table, tuple(cols), typing.schema.primary_key, dict(typing.schema.extra)
    )
    return Typing(schema, tuple(sorted(text)))


def conform(t: pa.Table, typing: Typing) -> pa.Table:
    """An event-log file's table readable under ``typing``: as it is when its columns already
    have the table's types (it keeps its own schema and metadata, so an export of its events
    is the same before and after it joins), else its columns converted to the table's types
    (still only the columns it has)."""
    if _physical_matches(t.schema, envelope_schema(typing)):
        return t
    have = _file_typing(t)
    names = set(have.schema.column_names)
    sub = Typing(
        TableSchema(
            typing.schema.table,
            tuple(c for c in typing.schema.columns if c.name in names),
            typing.schema.primary_key,
            dict(typing.schema.extra),
        ),
        tuple(n for n in typing.text if n in names),
    )
    want = envelope_schema(sub)
    images = []
    for image in _IMAGES:
        col = t[image].combine_chunks() if t[image].num_chunks else pa.nulls(0, t[image].type)
        images.append(conform_images(col, have.schema, have.text, sub.schema, sub.text))
    out = pa.table([t["op"], t["key"], *images, t["source"], t["ts_ms"]], names=want.names)
    return out.cast(want).replace_schema_metadata(sub.metadata())


def _physical_matches(schema: pa.Schema, want: pa.Schema) -> bool:
    """Whether a file of ``schema`` reads as ``want`` (a column it lacks reads null)."""
    for image in _IMAGES:
        have, need = schema.field(image).type, want.field(image).type
        for f in have:
            idx = need.get_field_index(f.name)
            if idx < 0 or need.field(idx).type != f.type:
                return False
    return True


def _renamed(name: str, version: int) -> str:
    """A new file of ``name``'s batch for commit ``version``; unique, so a writer that loses the
    race for that version never overwrites a file the winner committed."""
    return f"{batch_of(name)}.g{version}-{uuid.uuid4().hex[:8]}.parquet"


def batch_of(name: str) -> str:
    """The batch a file of the event log holds: ``c-{first}-{last}`` of ``c-{first}-{last}.g7.parquet``."""
    return name.removesuffix(".parquet").split(".")[0]


def _protocol(schema: pa.Schema, current: dict | None) -> dict:
    def ntz(t: pa.DataType) -> bool:
        if pa.types.is_struct(t):
            return any(ntz(f.type) for f in t)
        return pa.types.is_timestamp(t) and t.tz is None

    need = any(ntz(f.type) for f in schema)
    if current and int(current.get("minReaderVersion", 1)) >= 3:
        features = set(current.get("readerFeatures") or [])
        if need and "timestampNtz" not in features:
            features.add("timestampNtz")
            return {
                **current,
                "readerFeatures": sorted(features),
                "writerFeatures": sorted(set(current.get("writerFeatures") or []) | {"timestampNtz"}),
            }
        return current
    if need:  # timestamps without a zone: Delta's timestamp_ntz, a table feature
        return {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["timestampNtz"],
            "writerFeatures": ["timestampNtz"],
        }
    return current or {"minReaderVersion": 1, "minWriterVersion": 2}


def _metadata(state: LogState, typing: Typing) -> dict:
    from deltalake import Schema

    old = state.metadata or {}
    config = dict(old.get("configuration") or {})
    config[TYPING_PROPERTY] = typing.to_json()
    return {
        "id": old.get("id") or str(uuid.uuid4()),
        "description": f"the event log of {typing.schema.table} (airflow-provider-cdc)",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": Schema.from_arrow(envelope_schema(typing)).to_json(),
        "partitionColumns": [],
        "configuration": config,
        "createdTime": old.get("createdTime") or int(time.time() * 1000),
    }


def _add(folder: str, name: str, rows: int, *, data_change: bool) -> dict:
    fs, path = storage.filesystem(storage.join(folder, name))
    st = fs.get_file_info(path)
    return {
        "add": {
            "path": name,
            "size": int(st.size),
            "partitionValues": {},
            "modificationTime": int(st.mtime.timestamp() * 1000) if st.mtime else int(time.time() * 1000),
            "dataChange": data_change,
            "stats": json.dumps({"numRecords": rows}),
        }
    }


def _remove(add: dict, *, data_change: bool) -> dict:
    return {
        "remove": {
            "path": add["path"],
            "deletionTimestamp": int(time.time() * 1000),
            "dataChange": data_change,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": int(add.get("size", 0)),
        }
    }


def typing_of(state: LogState) -> Typing | None:
    raw = ((state.metadata or {}).get("configuration") or {}).get(TYPING_PROPERTY)
    return _typing(raw) if raw else None


@functools.lru_cache(maxsize=256)
def _typing(raw: str) -> Typing:
    return Typing.from_json(raw)


def current(folder: str) -> tuple[int, LogState]:
    """The table's newest version and its state (-1 and an empty state: no log yet)."""
    v = latest_version(folder)
    return (v, log_state(folder, v)) if v >= 0 else (-1, LogState(-1))


def active_files(folder: str) -> list[str] | None:
    """The files of the table's newest version, sorted; None when the folder has no log."""
    v, state = current(folder)
    return None if v < 0 else sorted(state.adds)


def _legacy(folder: str, skip: set[str]) -> tuple[list[str], list[str]]:
    """A folder without a log: (its live files, the compaction inputs waiting for removal)."""
    names = [n for n in storage.list_names(folder, suffix=".parquet") if n not in skip]
    gone = superseded(names, held_in(folder))
    return [n for n in names if n not in gone], sorted(gone)


def _head(operation: str, state: LogState, want: pa.Schema, typing: Typing | None) -> list[dict]:
    """A commit's first actions: its commitInfo, the protocol when ``want`` needs a newer one, and
    the metadata when the typing changed (``typing``; None: it did not)."""
    head: list[dict] = [
        {
            "commitInfo": {
                "timestamp": int(time.time() * 1000),
                "operation": operation,
                "operationParameters": {},
                "clientVersion": "airflow-provider-cdc",
            }
        }
    ]
    protocol = _protocol(want, state.protocol)
    if protocol != state.protocol:
        head.append({"protocol": protocol})
    if typing is not None:
        head.append({"metaData": _metadata(state, typing)})
    return head


class RetypedError(CommitFailedError):
    """A file written for a commit is not in the table's types any more (a column widened
    meanwhile): write it again from its inputs."""


def _joined_typing(folder: str, typing: Typing | None, legacy: Sequence[str],
                   files: Sequence[tuple[str, pa.Table]]) -> tuple[Typing | None, dict[str, str], list]:
    """The table's typing joined with a folder being adopted (its files' typings first, in
    order) and with ``files``: (typing, the candidates of a settle, the adopted files' loaders)."""
    loaders: list[tuple[str, Callable[[], pa.Table]]] = []
    for n in legacy:
        loaders.append((n, (lambda n=n: read_table(storage.join(folder, n)))))
    candidates: dict[str, str] = {}
    for n, load in loaders:
        typing, more = join_typing(typing, _schema_only(_read_schema(folder, n), load))
        candidates.update(more)
    for _n, t in files:
        typing, more = join_typing(typing, t)
        candidates.update(more)
    return typing, candidates, loaders


def _write_batch(folder: str, n: str, t: pa.Table, typing: Typing, v: int, active: dict,
                 done: dict[str, tuple[Typing, str, int]], mine: set[str]) -> tuple[str, int]:
    """Batch file ``n`` written in ``typing`` for version ``v + 1``: (the name it has, rows)."""
    prev = done.get(n)
    if prev is not None and prev[0] == typing and prev[1] not in active:
        # written by an attempt of this call that lost its race, under the same typing,
        # and still named by no version: only the commit is tried again
        return prev[1], prev[2]
    out = conform(t, typing)
    # a batch written before (a retried task) gets a new name: a version that names
    # the file it had must still read those bytes
    fresh = n not in active and (n in mine or not storage.exists(storage.join(folder, n)))
    name = n if fresh else _renamed(n, v + 1)
    if fresh:
        mine.add(n)
    atomic_write_table(out, storage.join(folder, name))
    done[n] = (typing, name, out.num_rows)
    return name, out.num_rows


def _retyped(folder: str, p: str, load: Callable[[], pa.Table], typing: Typing, want: pa.Schema, v: int,
             active: dict, legacy: Sequence[str]) -> list[dict]:
    """The actions that bring file ``p`` (of the table, or of a folder being adopted) to the
    table's types: none, its add (adopted as it is), or a rewrite under a new name."""
    if _physical_matches(_read_schema(folder, p), want):
        return [_add(folder, p, _rows(folder, p), data_change=True)] if p in legacy else []
    t = conform(load(), typing)
    new = _renamed(p, v + 1)
    atomic_write_table(t, storage.join(folder, new))
    removed = [_remove(active[p], data_change=False)] if p in active else []
    return [*removed, _add(folder, new, t.num_rows, data_change=p in legacy)]


def commit(
    folder: str,
    files: Sequence[tuple[str, pa.Table]] = (),
    *,
    replace: Sequence[str] = (),
    operation: str = "WRITE",
    check: Callable[[], None] | None = None,
    data_change: bool = True,
    prewritten: Sequence[tuple[str, int]] = (),
) -> int:
    """Write ``files`` (name, an envelope table with its images metadata) into the table at
    ``folder`` and commit them, with the removal of ``replace`` (files they take the place of: a
    compaction's inputs), as one version; returns it. A file of a batch already in the table
    replaces it. ``check`` runs before each attempt (a merge's fence). Raises CommitFailedError
    when ``replace`` is no longer all in the table (another compaction took them) or after
    COMMIT_ATTEMPTS lost races. ``prewritten``: (name, rows) of files the caller wrote into the
    folder already in the table's types (a compaction's merge, written a batch at a time); one
    whose types the table no longer has raises RetypedError."""
    names = [n for n, _ in files]
    mine: set[str] = set()
    done: dict[str, tuple[Typing, str, int]] = {}  # batch file -> (typing, name, rows) written
    for _attempt in range(COMMIT_ATTEMPTS):
        if check is not None:
            check()
        v, state = current(folder)
        legacy, superseded_names = ([], []) if v >= 0 else _legacy(folder, set(names))
        active = dict(state.adds)
        missing = [r for r in replace if r not in active and r not in legacy]
        if missing:
            raise CommitFailedError(f"event log {folder}: {missing} left the table meanwhile")
        old_typing = typing_of(state)
        typing, candidates, loaders = _joined_typing(folder, old_typing, legacy, files)
        existing = [
            (p, (lambda p=p: read_table(storage.join(folder, p)))) for p in active if p not in replace
        ]
        if typing is None:  # nothing written and nothing to adopt
            return v
        clash = case_clash(typing)
        if clash is not None:
            return _without_log(folder, v, files, typing, clash)
        typing = settle(typing, candidates, existing + loaders)
        want = envelope_schema(typing)
        actions: list[dict] = []
        written = []
        for n, t in files:
            name, rows = _write_batch(folder, n, t, typing, v, active, done, mine)
            actions.append(_add(folder, name, rows, data_change=data_change))
            written.append(name)
        for name, rows in prewritten:
            if not _physical_matches(_read_schema(folder, name), want):
                raise RetypedError(f"event log {folder}: {name} is not in the table's types any more")
            actions.append(_add(folder, name, rows, data_change=data_change))
            written.append(name)
        batches = {batch_of(n) for n in names}
        # the files already there that must change type; a folder being adopted: every file
        retype = (old_typing is not None and typing != old_typing and candidates) or v < 0
        for p, load in (existing + loaders) if retype else []:
            if batch_of(p) not in batches:  # else replaced by the batch written now
                actions += _retyped(folder, p, load, typing, want, v, active, legacy)
        for p, add in active.items():
            if p in replace or (batch_of(p) in batches and p not in written):
                actions.append(_remove(add, data_change=data_change))
        for p in superseded_names:
            actions.append(_remove({"path": p}, data_change=False))
        head = _head(operation, state, want, typing if typing != old_typing or v < 0 else None)
        if check is not None:
            check()
        try:
            write_commit(folder, v + 1, head + actions)
        except CommitFailedError:
            continue
        props = dict(((state.metadata or {}).get("configuration")) or {})
        after_commit(folder, v + 1, props)
        return v + 1
    raise CommitFailedError(f"event log {folder}: no version won in {COMMIT_ATTEMPTS} attempts")


def case_clash(typing: Typing) -> tuple[str, str] | None:
    """Two columns whose names differ only in case (Delta compares names without case, so its
    schema cannot hold both), or None."""
    seen: dict[str, str] = {}
    for c in typing.schema.columns:
        other = seen.setdefault(c.name.lower(), c.name)
        if other != c.name:
            return other, c.name
    return None


def _without_log(folder: str, v: int, files, typing: Typing, clash: tuple[str, str]) -> int:
    """A table whose columns Delta cannot hold: its event log stays plain files (written as
    before the log existed: a batch rewrites its own file), read by listing; -1. A table that
    has a log already cannot take such a column: ConfigurationError, nothing written."""
    if v >= 0:
        raise ConfigurationError(
            f"table {typing.schema.table}: columns {clash[0]!r} and {clash[1]!r} differ only in case, and "
            f"its event log at {folder} is a Delta table, which compares column names without case and "
            "cannot hold both. Rename one of them at the source; the events stay staged until then"
        )
    for n, t in files:
        atomic_write_table(t, storage.join(folder, n))
    if files:
        log.warning(
            "event log of %s: columns %r and %r differ only in case, which a Delta table cannot hold; "
            "this table's event log is plain Parquet files without a Delta log (docs/outputs.md)",
            typing.schema.table,
            *clash,
        )
    return -1


def _read_schema(folder: str, name: str) -> pa.Schema:
    fs, path = storage.filesystem(storage.join(folder, name))
    return pq.read_schema(path, filesystem=fs)


def _rows(folder: str, name: str) -> int:
    fs, path = storage.filesystem(storage.join(folder, name))
    with fs.open_input_file(path) as fh:
        return pq.ParquetFile(fh).metadata.num_rows


def _schema_only(schema: pa.Schema, load: Callable[[], pa.Table]) -> pa.Table:
    """A stand-in for a file whose values :func:`join_typing` may need (then it reads them)."""
    return _LazyTable(schema, load)


class _LazyTable:
    def __init__(self, schema: pa.Schema, load: Callable[[], pa.Table]) -> None:
        self.schema, self._load, self._t = schema, load, None

    def __getitem__(self, name: str):
        if self._t is None:
            self._t = self._load()
        return self._t[name]


def ensure(folder: str) -> int:
    """Adopt a folder written before the log existed (see the module docstring); the newest
    version (-1: nothing in the folder)."""
    v = latest_version(folder)
    if v >= 0 or not storage.list_names(folder, suffix=".parquet"):
        return v
    return commit(folder, operation="ADOPT", data_change=True)
