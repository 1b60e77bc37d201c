"""Parquet I/O for staged changelog segments and chunks, typed (the columns: docs/outputs.md,
"Typed staging"); files appear whole (written, then renamed), and a retry writing the same
name replaces it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..core import arrow_types as at
from ..core.arrow_types import string_array
from ..core.errors import StateError
from ..core.event_batch import SEGMENT_SCHEMA, EventBatch, events_to_batch
from ..core.events import ORIGIN_FIELDS, WATERMARK_OP, ChangeEvent, LogEvent, WatermarkEvent
from ..core.position import Position
from ..core.schema import TableName, TableSchema
from .layout import parse_segment_name

#: the staged changelog's columns with canonical-JSON images: the hand-built event form
#: (sinks/base.py EVENT_SCHEMA)
CHANGELOG_SCHEMA = pa.schema(
    [
        *(f for f in SEGMENT_SCHEMA if f.name not in ("ts_ms", "watermark", "origin")),
        ("before", pa.string()),
        ("after", pa.string()),
        *(f for f in SEGMENT_SCHEMA if f.name in ("ts_ms", "watermark", "origin")),
    ]
)
TABLES_META = b"cdc.tables"
#: ParquetWriter options of staged chunks: keys and rows are unique, so a dictionary
#: page only costs memory and time before the writer falls back to plain encoding
CHUNK_PARQUET_OPTIONS: dict = {"use_dictionary": False}


class ChunkWriter:
    """A staged chunk at ``path``, typed and streamed: ``with ChunkWriter(schema, path) as w``,
    then ``w.add`` / ``w.add_typed`` batch after batch; each batch is typed as it comes and
    written as a row group, so memory holds one batch, not the chunk. The file appears when
    the block ends without an exception (storage.atomic_output).

    A batch with a value its column's type cannot hold (a NaN numeric) makes that column
    canonical text in the whole file: the rows written so far are read back and rewritten
    with the column as text (rare, and bounded by the chunk)."""

    def __init__(self, schema: TableSchema, path: str) -> None:
        self.schema, self.path = schema, path
        self.rows = 0
        self._stack = ExitStack()
        self._fs = self._tmp = None
        self._writer: pq.ParquetWriter | None = None
        self._typed: tuple[TableSchema, list[str]] | None = None  # what the file's columns hold now

    def __enter__(self) -> ChunkWriter:
        self._fs, self._tmp = self._stack.enter_context(storage.atomic_output(self.path))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None and self._writer is None:  # no rows: an empty file of the declared columns
                self._open(self.schema, [])
            if self._writer is not None:
                self._writer.close()
        finally:
            self._writer = None
            closed = self._stack.__exit__(exc_type, exc, tb)
        return bool(closed)

    def add_typed(
        self, keys: pa.Array, columns: Sequence[pa.Array], text_columns: Sequence[str] = ()
    ) -> None:
        """A batch already typed: one array per column of the schema (``text_columns``: those
        holding canonical text instead)."""
        fields = [pa.field(c.name, a.type) for c, a in zip(self.schema.columns, columns, strict=True)]
        self._write(
            keys, pa.StructArray.from_arrays(list(columns), fields=fields), self.schema, list(text_columns)
        )

    def add(self, keys: pa.Array, afters) -> None:
        """``afters``: canonical row JSON texts (an Arrow string array) or canonical row dicts."""
        self._write(keys, *at.type_image(self.schema, afters))

    def _open(self, schema: TableSchema, text: list[str]) -> None:
        after = at.conform_images(pa.nulls(0, pa.struct([])), None, [], schema, text)
        empty = chunk_table(string_array([]), after, schema, text)
        self._writer = pq.ParquetWriter(
            self._tmp,
            empty.schema,
            filesystem=self._fs,
            **CHUNK_PARQUET_OPTIONS,
            write_statistics=at.statistics_columns(empty.schema, ("key",)),
        )
        self._typed = (schema, list(text))

    def _write(self, keys: pa.Array, after: pa.StructArray, schema: TableSchema, text: list[str]) -> None:
        union = at.unify_schemas([self._typed, (schema, text)] if self._typed else [(schema, text)])
        if self._writer is None:
            self._open(*union)
        elif union != self._typed:
            self._retype(*union)
        want_schema, want_text = self._typed
        if (schema, sorted(text)) != (want_schema, sorted(want_text)):
            after = at.conform_images(after, schema, text, want_schema, want_text)
        self._writer.write_table(chunk_table(keys, after, want_schema, want_text))
        self.rows += len(keys)

    def _retype(self, schema: TableSchema, text: list[str]) -> None:
        """The rows written so far, rewritten with the columns of ``schema`` / ``text``."""
        self._writer.close()
        old_schema, old_text = self._typed
        written = pq.read_table(self._tmp, filesystem=self._fs)
        self._open(schema, text)
        if written.num_rows:
            after = at.conform_images(written["after"], old_schema, old_text, schema, text)
            self._writer.write_table(chunk_table(written["key"], after, schema, text))


def chunk_table(keys, after, schema: TableSchema, text_columns) -> pa.Table:
    t = pa.table({"key": keys, "after": after})
    return t.replace_schema_metadata(at.images_metadata(schema, text_columns))


def read_chunk(path: str, table: str) -> tuple[pa.Table, TableSchema | None, list[str]]:
    """A staged chunk of ``table`` (its id): (``key`` and typed ``after``, the schema they were
    typed with, the text columns)."""
    t = read_table(path)
    schema, text = at.metadata_schema(t.schema.metadata)
    if schema is None:
        raise StateError(
            f"table {table}: the staged chunk {path} names no schema (a file this airflow-provider-cdc "
            "did not write, or one from before its first release); stop the snapshot and start a new one"
        )
    return t, schema, text


def atomic_write_table(table: pa.Table, path: str, **kwargs) -> None:
    """One Parquet file at a location, whole or not at all (storage.atomic_output)."""
    with storage.atomic_output(path) as (fs, tmp):
        pq.write_table(table, tmp, filesystem=fs, **kwargs)


def read_table(location: str, **kwargs) -> pa.Table:
    """A Parquet file at a location."""
    fs, path = storage.filesystem(location)
    return pq.read_table(path, filesystem=fs, **kwargs)


def read_chunk_rows(path: str, table: str) -> list[tuple[str, dict]]:
    """A staged chunk as (canonical key, canonical row) pairs in key order: for checks and
    the reference merge (core.window.WindowChunk), never the hot path."""
    t, schema, text = read_chunk(path, table)
    return list(
        zip(t["key"].to_pylist(), at.canonical_rows(t["after"], schema, text, keep_nulls=True), strict=True)
    )


def events_to_table(events: Iterable[LogEvent], watermark_table: str, schemas=None) -> pa.Table:
    """Events (position order) -> a typed segment table (module docstring). ``schemas``:
    table id -> the TableSchema to type its images with (None or absent: text columns the
    rows name)."""
    return batch_to_table(events_to_batch(list(events), watermark_table), schemas)


def batch_to_table(batch: EventBatch, schemas=None) -> pa.Table:
    """An EventBatch -> a typed segment table: each table's images under the schema
    ``schemas[table]`` gives (its log schema; absent: the schema the images were typed with,
    or text columns the rows name), one ``before_{i}``/``after_{i}`` pair per table."""
    n = len(batch)
    arrays = [batch.log.column(f.name).combine_chunks() for f in SEGMENT_SCHEMA]
    fields = list(SEGMENT_SCHEMA)
    meta = []
    keys = batch.log["key"]
    for i, table in enumerate(batch.tables):
        parts = [p for p in batch.parts if p.table == table and len(p.rows)]
        rows = np.concatenate([p.rows for p in parts])
        typing = (schemas or {}).get(table)
        typed = []
        for p in parts:
            if p.typed:
                typed.append((p.before, p.after, p.schema, list(p.text_columns)))
            else:
                schema = typing or _inferred(table, keys[int(p.rows[0])].as_py(), p.before, p.after)
                b, a, schema, text = at.type_images(schema, p.before, p.after)
                typed.append((b, a, schema, text))
        if len(typed) == 1 and (typing is None or typed[0][2] == typing or not parts[0].typed):
            b, a, schema, text = typed[0]
        else:
            conformed, schema, text = at.conform_parts(typed, typing)
            b = pa.concat_arrays([c[0] for c in conformed])
            a = pa.concat_arrays([c[1] for c in conformed])
        # one slot per event: row r of the batch takes image number (its place among ``rows``)
        where = np.full(n, -1, dtype=np.int64)
        where[rows] = np.arange(len(rows), dtype=np.int64)
        take = at.index_array(np.maximum(where, 0), where >= 0)
        arrays += [b.take(take), a.take(take)]
        fields += [pa.field(f"before_{i}", b.type), pa.field(f"after_{i}", a.type)]
        meta.append({"table": table, "schema": json.loads(schema.to_json()), "text_columns": text})
    return pa.Table.from_arrays(
        arrays, schema=pa.schema(fields, metadata={TABLES_META: json.dumps(meta).encode()})
    )


def _inferred(table: str, key: str | None, befores: list, afters: list) -> TableSchema:
    """Text columns the rows name, for a table staged without a schema (never described)."""
    names = dict.fromkeys(k for r in (*afters, *befores) if r is not None for k in r)
    return at.text_schema(TableName.parse(table), names, len(json.loads(key)) if key else 0)


def write_segment(
    events: list[LogEvent] | EventBatch, directory: str, watermark_table: str, schemas=None
) -> str:
    """Stage events (already in position order; LogEvents or an EventBatch) as one segment
    named by its position range, each table's images typed with ``schemas[table]`` (see
    :func:`batch_to_table`)."""
    from .layout import segment_name

    batch = events if isinstance(events, EventBatch) else events_to_batch(events, watermark_table)
    if not len(batch):
        raise ValueError("write_segment needs at least one event")
    path = storage.join(directory, segment_name(batch.first, batch.last))
    table = batch_to_table(batch, schemas)
    # no min/max statistics of row values: they copy a large value several times; no
    # dictionaries (as chunk files): a segment's values are mostly distinct, and measured 2.8x
    # faster to write and smaller without them
    atomic_write_table(
        table,
        path,
        write_statistics=at.statistics_columns(table.schema, SEGMENT_SCHEMA.names),
        **CHUNK_PARQUET_OPTIONS,
    )
    return path


def segment_tables(meta) -> list[tuple[str, TableSchema, list[str]]]:
    """The tables of a segment (its schema metadata) in column order: (table id, schema, text
    columns); [] for a segment of watermarks only."""
    raw = (meta or {}).get(TABLES_META)
    if raw is None:
        return []
    return [
        (m["table"], TableSchema.from_json(json.dumps(m["schema"])), list(m["text_columns"]))
        for m in json.loads(raw)
    ]


def segment_images(t: pa.Table) -> list[tuple[str, TableSchema | None, list[str], pa.Table]]:
    """A segment's rows (any subset of its rows, all its columns) a table at a time: (table
    id, schema, text columns, the rows of that table with SEGMENT_SCHEMA's columns plus
    ``before`` and ``after`` typed). Watermark rows are left out."""
    import pyarrow.compute as pc

    out = []
    tables = segment_tables(t.schema.metadata)
    common = list(SEGMENT_SCHEMA.names)
    if not tables and "after" in t.column_names:
        raise StateError(
            "a staged segment holds canonical JSON images without the cdc.tables metadata (a file from "
            "before airflow-provider-cdc's first release); move the staging folder away and resync"
        )
    for i, (table, schema, text) in enumerate(tables):
        part = t.filter(pc.equal(t["table"], table))
        if part.num_rows == 0:
            continue
        b, a = (part[f"before_{i}"].combine_chunks(), part[f"after_{i}"].combine_chunks())
        out.append((table, schema, text, _with_images(part, common, b, a)))
    return out


def _with_images(part: pa.Table, common: list[str], before, after) -> pa.Table:
    cols = {
        c: (part[c] if c in part.column_names else pa.nulls(part.num_rows, SEGMENT_SCHEMA.field(c).type))
        for c in common
    }
    cols["before"], cols["after"] = before, after
    return pa.table(cols)


def list_segments(directory: str) -> list[tuple[Position, Position, str]]:
    out = []
    for name in storage.list_names(directory, suffix=".parquet"):
        if name.startswith("seg-"):
            first, last = parse_segment_name(name)
            out.append((first, last, storage.join(directory, name)))
    return sorted(out)


def read_log_events(
    directory: str, after: Position | None = None, upto: Position | None = None
) -> Iterator[LogEvent]:
    """Staged events with ``after < position <= upto``, in position order, duplicates removed,
    their images as canonical rows (for checks and the reference engine; engines read the
    typed columns)."""
    seen_last: Position | None = None
    for first, last, path in list_segments(directory):
        if after is not None and last <= after:
            continue
        if upto is not None and first > upto:
            break
        tbl = read_table(path)
        images: dict[str, tuple] = {}  # position -> (before, after) as canonical rows
        for _table, schema, text, part in segment_images(tbl):
            rows = (
                at.canonical_rows(part["before"], schema, text),
                at.canonical_rows(part["after"], schema, text, keep_nulls=True),
            )
            for j, p in enumerate(part["position"].to_pylist()):
                images[p] = (rows[0][j], rows[1][j])
        cols = ["position", "table", "op", "key", "ts_ms", "watermark"]
        has_origin = "origin" in tbl.column_names
        recs = tbl.select(cols + (["origin"] if has_origin else [])).to_pylist()
        for rec in recs:
            pos = Position.decode(rec["position"])
            if (after is not None and pos <= after) or (upto is not None and pos > upto):
                continue
            if seen_last is not None and pos <= seen_last:
                continue  # overlap left by a crashed capture: same position, same event
            seen_last = pos
            if rec["op"] == WATERMARK_OP:
                yield WatermarkEvent(rec["watermark"], pos, rec["ts_ms"])
            else:
                origin = rec.get("origin")
                before, after_row = images.get(rec["position"], (None, None))
                yield ChangeEvent(
                    rec["table"],
                    rec["op"],
                    rec["key"],
                    pos,
                    before,
                    after_row,
                    rec["ts_ms"],
                    origin=None if origin is None else tuple(origin[f] for f in ORIGIN_FIELDS),
                )


def segment_lower_bounds(segments: Sequence[tuple[Position, Position, str]]) -> dict[str, str]:
    """For each segment file name, the position its events must exceed to count.

    Overlapping segments (left by a capture that crashed before committing its offset)
    hold the same events; each event is counted in the first segment that holds it, the
    same rule as :func:`read_log_events`, so batch names are deterministic (both engines'
    apply loop, pipeline/arrow_engine.apply_segments).
    """
    bounds: dict[str, str] = {}
    seen: Position | None = None
    for _first, last, path in segments:
        bounds[path.rsplit("/", 1)[-1]] = "" if seen is None else seen.encode()
        seen = last if seen is None or last > seen else seen
    return bounds


def find_watermarks(
    segments: Sequence[tuple[Position, Position, str]], ids: Iterable[str]
) -> dict[str, tuple[str, int]]:
    """id -> (encoded position, ts_ms) of the first staged write of each watermark id.

    Read on the driver with pyarrow (only the op/watermark/position/ts_ms columns, ``op = 'w'``
    pushed down): watermark rows are few, and a Spark job here would cost more than the read.
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    wanted = sorted(set(ids))
    if not segments or not wanted:
        return {}
    fs, _ = storage.filesystem(segments[0][2])
    paths = [storage.filesystem(p)[1] for _, _, p in segments]
    table = ds.dataset(paths, filesystem=fs, format="parquet").to_table(
        columns=["position", "watermark", "ts_ms"],
        filter=(pc.field("op") == "w") & pc.field("watermark").isin(wanted),
    )
    from .segment_index import first_writes

    return first_writes(table)


def staged_watermarks(changelog: str, ids: Iterable[str], *, attempts: int = 3) -> dict[str, tuple[str, int]]:
    """:func:`find_watermarks` over the segments staged in ``changelog`` now: from the index
    (storage/segment_index.py) for the segments it describes, opening only the others. A
    segment that disappears between the listing and the read (a concurrent capture replaced an
    orphan) makes it list again."""
    from ..core.position import marked_position
    from .segment_index import find_in_index, staged_segments, staged_through

    wanted = set(ids)
    marks = {i: hit for i in wanted if (hit := marked_position(i)) is not None}
    if marks:  # a position mark is staged once the changelog is complete through its position
        wanted -= marks.keys()
        through = staged_through(changelog)
        covered = {
            i: (p.encode(), ts) for i, (p, ts) in marks.items() if through is not None and through[0] >= p
        }
        return {**(staged_watermarks(changelog, wanted, attempts=attempts) if wanted else {}), **covered}
    for attempt in range(attempts):
        try:
            found, unknown = find_in_index(staged_segments(changelog), wanted)
            for wid, hit in find_watermarks(unknown, wanted).items():
                if wid not in found or hit[0] < found[wid][0]:
                    found[wid] = hit
            return found
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    return {}


def staged_transactions(changelog: str, before: str, since_xid: int) -> tuple:
    """(position, origin.tx) arrays of the staged events below the encoded position ``before`` in
    the segments that may hold a transaction with a 32-bit xid at or after ``since_xid`` (modulo
    2^32: the index's xid ranges rule the others out; a segment the index does not describe is
    read). What a window needs to find the transactions its chunk's snapshot did not see
    (core/visibility.py): with no long transaction open, the last few segments."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from .segment_index import staged_segments

    def older(x: int) -> bool:  # ``x`` precedes since_xid in xid order
        return 0 < ((since_xid - x) & 0xFFFFFFFF) <= 1 << 31

    positions, txs = [], []
    for s in staged_segments(changelog):
        if s.first.encode() >= before:
            continue
        known = s.info is not None
        xids = s.info.xids if known else None
        if known and (xids is None or (xids[0] <= xids[1] and older(xids[1]))):
            continue  # no numeric xid, or every one older than the snapshot's oldest running one
        fs, p = storage.filesystem(s.path)
        with fs.open_input_file(p) as fh:
            t = pq.read_table(fh, columns=["position", "origin"])
        positions.append(t["position"].combine_chunks())
        txs.append(pc.struct_field(t["origin"], "tx").combine_chunks())
    if not positions:
        return pa.array([], pa.string()), pa.array([], pa.string())
    return pa.concat_arrays(positions), pa.concat_arrays(txs)


def staged_watermark_position(data_dir: str, source: str, watermark_id: str) -> Position | None:
    """Where a watermark write landed in the staged changelog of ``source`` (None: not yet)."""
    from .layout import changelog_dir

    hit = staged_watermarks(changelog_dir(data_dir, source), [watermark_id]).get(watermark_id)
    return None if hit is None else Position.decode(hit[0])
