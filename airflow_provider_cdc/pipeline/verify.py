"""Is the mirror equal to the source (I2), and is the event log consistent (I1)?
:func:`verify_table` compares digests of key chunks read with the snapshot's own keyset SQL and
drills only into chunks that differ; :func:`check_event_log` replays a table's events per key
and reports what I1 forbids (docs/DESIGN.md, "What operators and consumers see").
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..core.arrow_types import KEY_COLUMN, RowNormaliser, arrow_canonical
from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.ranges import FULL_RANGE, ChunkRange
from ..core.schema import TableName, TableSchema, encode_key, encode_row
from ..core.throttle import Throttle
from ..sinks.delta_buckets import bucket_of
from ..sinks.event_log import read_events as read_event_log

DEFAULT_CHUNK_ROWS = 10_000
EXAMPLES = 10
#: ranges a repair snapshot reads at once (its conf's parallelism, at most)
REPAIR_PARALLELISM = 4

#: source rows of a top-level digest range: the source returns (count, XOR of the rows' digests)
#: per range; a range that differs is split into DIGEST_FANOUT sub-ranges, recursively, until a
#: range holds at most ``chunk_rows`` source rows: those rows are compared as :func:`verify_rows` does
DIGEST_RANGE_ROWS = 500_000
DIGEST_FANOUT = 16
#: splits of one range at most (a source changing under the verify cannot make it endless)
DIGEST_MAX_DEPTH = 12
#: the source's load by default: two range queries at once, no pause (a snapshot's Throttle)
DEFAULT_THROTTLE = Throttle(chunk_size=DEFAULT_CHUNK_ROWS, parallelism=2)
_MASK64 = (1 << 64) - 1
#: key types whose order numpy reproduces exactly (the database's order of integers)
_ORDERED_KEYS = ("int16", "int32", "int64")


def row_digest(key: str, row: dict[str, Any]) -> bytes:
    return hashlib.blake2b(f"{key}\x00{encode_row(row)}".encode(), digest_size=16).digest()


# --- the compare --------------------------------------------------------------------------
@dataclass
class Mismatch:
    key: str
    kind: str  # missing (in mirror) | extra (in mirror) | different
    columns: tuple[str, ...] = ()  # differing columns for "different"
    source: dict | None = None
    mirror: dict | None = None

    def describe(self) -> str:
        if self.kind == "different":
            diffs = ", ".join(
                f"{c}: source={json.dumps((self.source or {}).get(c))} mirror="
                f"{json.dumps((self.mirror or {}).get(c))}"
                for c in self.columns
            )
            return f"key {self.key}: different ({diffs})"
        return (
            f"key {self.key}: "
            f"{'missing from the mirror' if self.kind == 'missing' else 'in the mirror, not in the source'}"
        )


@dataclass
class VerifyResult:
    table: str
    rows_checked: int = 0  # distinct keys compared (source rows + extra mirror rows)
    source_rows: int = 0
    mirror_rows: int = 0
    chunks: int = 0
    mismatched_chunks: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    examples: list[Mismatch] = field(default_factory=list)
    #: the key ranges of the source chunks that differed (start inclusive, end exclusive: the
    #: next chunk's first key), adjacent ones joined; in the database's own key order
    repair_ranges: list[ChunkRange] = field(default_factory=list)
    #: the repair ranges also hold the extra rows' keys (one integer key column): a snapshot of
    #: those ranges removes them (it converges inside its ranges), no whole table needed
    extra_in_ranges: bool = False
    #: how the table was compared: "digests" (range digests computed in the source and over the
    #: mirror, rows compared only inside ranges that differ) or "rows" (every row in Python)
    method: str = "rows"
    #: why "rows" (a column type without a digest form, a key without a vectorised order)
    method_note: str = ""
    #: digest ranges compared (top level and the sub-ranges of ranges that differed)
    digest_ranges: int = 0

    @property
    def mismatched(self) -> int:
        return self.missing + self.extra + self.different

    @property
    def ok(self) -> bool:
        return self.mismatched == 0

    def summary(self) -> str:
        return f"{self.rows_checked} rows checked, {self.mismatched} mismatched"

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "rows_checked": self.rows_checked,
            "mismatched": self.mismatched,
            "source_rows": self.source_rows,
            "mirror_rows": self.mirror_rows,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "chunks": self.chunks,
            "mismatched_chunks": self.mismatched_chunks,
            "examples": [m.describe() for m in self.examples],
            "repair_ranges": [json.loads(r.to_json()) for r in self.repair_ranges],
            "repair_conf": self.repair_conf(),
            "method": self.method,
            **({"method_note": self.method_note} if self.method_note else {}),
        }

    def repair_conf(self) -> dict | None:
        """The snapshot conf that repairs what this verify found (None: nothing to repair).

        Missing and different rows: a snapshot of only the key ranges of the chunks that
        differed. Rows the mirror has and the source does not: with a one-integer key, those
        ranges hold their keys too and a snapshot of key ranges removes them (it converges inside
        its ranges, I9); otherwise the whole table, the only snapshot that converges there."""
        if self.ok:
            return None
        conf: dict[str, Any] = {"action": "start", "tables": [self.table]}
        if (not self.extra or self.extra_in_ranges) and self.repair_ranges:
            conf["key_ranges"] = {self.table: [json.loads(r.to_json()) for r in self.repair_ranges]}
            # a run reads `parallelism` ranges at once; more ranges continue in resume runs
            conf["parallelism"] = min(len(self.repair_ranges), REPAIR_PARALLELISM)
        return conf


#: live mirror rows per hash partition of the compare: a partition's keys and digests (~40
#: bytes a row) are what the compare holds in memory at once
PARTITION_ROWS = 2_000_000
#: what the compare keeps of every row: its canonical key, the digest of its canonical row
#: and, on the source side, the number of its chunk
_MIRROR = pa.schema([("key", pa.string()), ("mdigest", pa.binary())])
_SOURCE = pa.schema([("key", pa.string()), ("sdigest", pa.binary()), ("chunk", pa.int64())])


class _Partitions:
    """Rows in hash partitions of their canonical key (crc32, as the mirror's buckets), each
    an Arrow IPC file in a local scratch folder: the compare never holds a side whole, and
    a partition of one side meets the same keys' partition of the other."""

    def __init__(self, folder: str, name: str, schema: pa.Schema, count: int) -> None:
        self.schema, self.count = schema, count
        self.paths = [os.path.join(folder, f"{name}-{p}.arrow") for p in range(count)]
        self._sinks: list = [None] * count
        self._written = [False] * count

    def add(self, rows: pa.Table) -> None:
        if not rows.num_rows:
            return
        if self.count == 1:
            self._writer(0).write_table(rows)
            return
        part = bucket_of(rows["key"], self.count).to_numpy()
        order = np.argsort(part, kind="stable")
        rows = rows.take(pa.array(order))
        start = 0
        for p, n in enumerate(np.bincount(part, minlength=self.count).tolist()):
            if n:
                self._writer(p).write_table(rows.slice(start, n))
                start += n

    def _writer(self, p: int):
        if self._sinks[p] is None:
            self._sinks[p] = pa.ipc.new_file(self.paths[p], self.schema)
            self._written[p] = True
        return self._sinks[p]

    def close(self) -> None:
        for p, w in enumerate(self._sinks):
            if w is not None:
                w.close()
                self._sinks[p] = None

    def remove(self) -> None:
        self.close()
        for p, path in enumerate(self.paths):
            if self._written[p] and os.path.exists(path):
                os.remove(path)

    def batches(self, p: int) -> Iterator[pa.RecordBatch]:
        if not self._written[p]:
            return
        with pa.memory_map(self.paths[p]) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def table(self, p: int) -> pa.Table:
        return pa.Table.from_batches(list(self.batches(p)), schema=self.schema)


class MirrorIndex:
    """The mirror's live rows as (canonical key, digest of the canonical row), hash-partitioned
    into a local scratch folder (``folder``; a temporary one by default), and a way back to
    the rows of a few keys (``fetch``, for the examples of a mismatch). ``rows``: a table or
    batches of typed mirror rows (core/arrow_types.py, with ``__key``), read one batch at a
    time; ``count``: how many (it sizes the partitions, PARTITION_ROWS each)."""

    def __init__(
        self,
        schema: TableSchema,
        rows: pa.Table | Iterable,
        *,
        count: int | None = None,
        fetch: Callable[[list[str]], pa.Table] | None = None,
        folder: str | None = None,
        partition_rows: int = PARTITION_ROWS,
    ) -> None:
        if isinstance(rows, pa.Table):
            count = rows.num_rows
            fetch = fetch or (
                lambda keys, t=rows: (
                    t.filter(pc.is_in(t[KEY_COLUMN], pa.array(keys, pa.string())))
                    if KEY_COLUMN in t.column_names
                    else t.slice(0, 0)
                )
            )
            rows = rows.to_batches(max_chunksize=100_000)
        if folder is None:
            folder = tempfile.mkdtemp(prefix="cdc-verify-")
            weakref.finalize(self, shutil.rmtree, folder, True)
        self.schema, self.folder = schema, folder
        self._fetch = fetch
        self.parts = max(1, -(-(count or 0) // max(1, partition_rows)))
        self.partitions = _Partitions(folder, "mirror", _MIRROR, self.parts)
        self.rows = 0
        self.logical = {c.name: c.type for c in schema.columns}
        for batch in rows:
            self._add(batch)
        self.partitions.close()

    def _add(self, batch) -> None:
        if batch.num_rows == 0:
            return
        present = set(batch.schema.names)
        missing_cols = [c for c in self.schema.column_names if c not in present]
        if missing_cols:
            raise ConfigurationError(
                f"mirror of {self.schema.table} lacks column(s) {missing_cols} the source has; the "
                "schema changed "
                "since the mirror was written: re-snapshot the table"
            )
        keys = batch.column(KEY_COLUMN).to_pylist() if KEY_COLUMN in present else None
        rows = self.canonical(batch)
        if keys is None:
            keys = [encode_key(self.schema.key_values(r)) for r in rows]
        digests = [row_digest(k, r) for k, r in zip(keys, rows, strict=True)]
        self.partitions.add(
            pa.table([pa.array(keys, pa.string()), pa.array(digests, pa.binary())], schema=_MIRROR)
        )
        self.rows += len(keys)

    def canonical(self, batch) -> list[dict]:
        """Typed mirror rows -> canonical rows (the schema's columns)."""
        names = self.schema.column_names
        cols = [
            arrow_canonical(batch.column(batch.schema.get_field_index(c)), self.logical[c]) for c in names
        ]
        return [dict(zip(names, values, strict=True)) for values in zip(*cols, strict=True)]

    def fetch(self, keys: list[str]) -> dict[str, dict]:
        """The canonical mirror rows of these keys (those it has)."""
        if not keys or self._fetch is None:
            return {}
        t = self._fetch(keys)
        if not t.num_rows:
            return {}
        return dict(zip(t[KEY_COLUMN].to_pylist(), self.canonical(t), strict=True))


#: (chunk number, the key the chunk's read continues after) -> the chunk's (key, row) pairs
ChunkReader = Callable[[int, tuple | None], list[tuple[str, dict]]]


def compare(
    schema: TableSchema,
    chunks: Iterable[list[tuple[str, dict]]],
    mirror: MirrorIndex,
    *,
    examples: int = EXAMPLES,
    reread: ChunkReader | None = None,
    end_of: Callable[[int], tuple | None] | None = None,
) -> VerifyResult:
    """Each source row's digest against its key's mirror digest, a hash partition at a time
    (pyarrow joins: memory follows a partition, not the table). The source is read once, in
    key order, in chunks: a chunk with a missing or differing row is a repair range. The rows
    of the examples are read again at the end (``reread``: that chunk from the source; a
    list of chunks is its own reader), only when something differs. ``end_of(i)``: where
    chunk i's repair range ends (the table's next key after it; default: the next chunk's
    first key, the chunks being the whole table)."""
    if reread is None and isinstance(chunks, Sequence):
        reread = lambda i, _after, c=chunks: c[i]  # noqa: E731 - the chunks are at hand
    res = VerifyResult(schema.table.id, mirror_rows=mirror.rows)
    norm = RowNormaliser(schema)
    firsts: list[tuple] = []  # the first key of each chunk (a repair range starts there)
    afters: list[tuple | None] = []  # the key each chunk's read continues after
    last: str | None = None  # the previous chunk's last key
    src = _Partitions(mirror.folder, f"source-{uuid.uuid4().hex[:8]}", _SOURCE, mirror.parts)
    try:
        for raw_chunk in chunks:
            if not raw_chunk:
                continue
            n = len(firsts)  # this chunk's number
            afters.append(None if last is None else tuple(json.loads(last)))
            firsts.append(tuple(json.loads(raw_chunk[0][0])))
            last = raw_chunk[-1][0]
            keys = [k for k, _ in raw_chunk]
            digests = [row_digest(k, norm(r)) for k, r in raw_chunk]
            src.add(
                pa.table(
                    [
                        pa.array(keys, pa.string()),
                        pa.array(digests, pa.binary()),
                        pa.array(np.full(len(keys), n, dtype=np.int64)),
                    ],
                    schema=_SOURCE,
                )
            )
            res.source_rows += len(keys)
        src.close()
        res.chunks = len(firsts)
        found = _Found(examples)
        numbered = ends = None
        if ranges_by_key_order(schema) and firsts:
            numbered = np.array([f[0] for f in firsts], dtype=np.int64)
            top = np.iinfo(np.int64).max
            ends = np.array(
                [
                    top if e is None else int(e[0])
                    for e in (
                        end_of(i) if end_of is not None else (firsts[i + 1] if i + 1 < len(firsts) else None)
                        for i in range(len(firsts))
                    )
                ],
                dtype=np.int64,
            )
        for p in range(mirror.parts):
            _compare_partition(mirror.partitions.table(p), src.batches(p), found, numbered, ends)
        res.extra_in_ranges = ranges_by_key_order(schema) and not found.unassigned
    finally:
        src.remove()
    res.missing, res.different, res.extra = found.missing, found.different, found.extra
    res.rows_checked = res.source_rows + res.extra
    bad = sorted(found.chunks)
    res.mismatched_chunks = len(bad)
    for i in bad:  # adjacent chunks join into one range (end exclusive: the next chunk's first key)
        end = end_of(i) if end_of is not None else (firsts[i + 1] if i + 1 < len(firsts) else None)
        start = (found.below,) if i == 0 and found.below is not None else firsts[i]  # extra keys below
        if res.repair_ranges and res.repair_ranges[-1].end == start:
            res.repair_ranges[-1] = ChunkRange(res.repair_ranges[-1].start, end)
        else:
            res.repair_ranges.append(ChunkRange(start, end))
    res.examples = _examples(schema, found, mirror, norm, reread, afters, examples)
    return res


@dataclass
class _Found:
    """What the partitions' compares found: counts, the chunks with a missing or differing row,
    and the first few keys of each kind by chunk (the examples)."""

    keep: int
    missing: int = 0
    different: int = 0
    extra: int = 0
    chunks: set = field(default_factory=set)
    samples: dict = field(default_factory=lambda: {"missing": [], "different": [], "extra": []})
    #: where chunks' first keys order as integers: the lowest extra key below the first chunk
    below: int | None = None
    #: extra rows no chunk's range could be given (no source chunk at all)
    unassigned: bool = False

    def add(self, kind: str, keys: pa.Array, chunks: pa.Array | None = None) -> None:
        n = len(keys)
        if not n:
            return
        setattr(self, kind, getattr(self, kind) + n)
        order = np.arange(n) if chunks is None else np.argsort(chunks.to_numpy(), kind="stable")
        head = order[: self.keep]
        ks = keys.take(pa.array(head)).to_pylist()
        cs = [0] * len(ks) if chunks is None else chunks.take(pa.array(head)).to_pylist()
        self.samples[kind] = sorted(self.samples[kind] + [(c, k, kind) for c, k in zip(cs, ks, strict=True)])[
            : self.keep
        ]
        if chunks is not None:
            self.chunks.update(np.unique(chunks.to_numpy()).tolist())


def _pieces(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """The batches gathered into tables of at least ``rows`` rows (the last may be smaller)."""
    held: list[pa.RecordBatch] = []
    n = 0
    for b in batches:
        held.append(b)
        n += b.num_rows
        if n >= rows:
            yield pa.Table.from_batches(held)
            held, n = [], 0
    if held:
        yield pa.Table.from_batches(held)


def _compare_partition(
    mirror: pa.Table,
    source: Iterable[pa.RecordBatch],
    found: _Found,
    firsts: np.ndarray | None = None,
    ends: np.ndarray | None = None,
) -> None:
    """One hash partition: the mirror's (the join's build side, whole) against the source's,
    in pieces as large as the mirror's partition (each piece hashes the build side once: the
    source's spill holds a small batch per chunk); mirror rows no source row matched are extra.
    With ``firsts`` (the chunks' first keys, integers in key order) and ``ends`` (where each
    chunk's range ends, exclusive) an extra row counts in the chunk whose range holds its key,
    so a repair re-reads that range (and sweeps it); one below the first chunk widens the first
    range down to it; one between two ranges (no source row near it) is left unassigned."""
    mirror = mirror.append_column("mrow", pa.array(np.arange(mirror.num_rows, dtype=np.int64)))
    matched = np.zeros(mirror.num_rows, dtype=bool)
    for piece in _pieces(source, max(mirror.num_rows, 100_000)):
        j = piece.join(mirror, keys="key", join_type="left outer")
        hit = pc.is_valid(j["mrow"])
        matched[j["mrow"].drop_null().to_numpy()] = True
        miss = j.filter(pc.invert(hit))
        found.add("missing", miss["key"].combine_chunks(), miss["chunk"].combine_chunks())
        diff = j.filter(pc.and_(hit, pc.not_equal(j["sdigest"], j["mdigest"])))
        found.add("different", diff["key"].combine_chunks(), diff["chunk"].combine_chunks())
    extra = mirror["key"].combine_chunks().filter(pa.array(~matched))
    if firsts is None or not len(extra) or not len(firsts):
        found.unassigned = found.unassigned or bool(len(extra))
        found.add("extra", extra)
        return
    ints = pc.utf8_slice_codeunits(extra, 1, -1).cast(pa.int64()).to_numpy(zero_copy_only=False)
    at = np.searchsorted(firsts, ints, side="right") - 1
    if ends is not None and (ints >= ends[np.maximum(at, 0)])[at >= 0].any():
        found.unassigned = True
    if (at < 0).any():
        low = int(ints[at < 0].min())
        found.below = low if found.below is None else min(found.below, low)
    found.add("extra", extra, pa.array(np.maximum(at, 0)))


def _examples(
    schema: TableSchema,
    found: _Found,
    mirror: MirrorIndex,
    norm: RowNormaliser,
    reread: ChunkReader | None,
    afters: list,
    examples: int,
) -> list[Mismatch]:
    """The first few mismatches of each kind in source order (extras last), with the rows
    that show them: the source chunks that hold them read again, the mirror rows fetched."""
    picked = sorted(found.samples["missing"] + found.samples["different"])[:examples]
    wanted = {k for _c, k, _kind in picked}
    src_rows: dict[str, dict] = {}
    if reread is not None:
        for c in sorted({c for c, _k, _kind in picked}):
            src_rows.update((k, norm(r)) for k, r in reread(c, afters[c]) if k in wanted)
    mir_rows = mirror.fetch([k for _c, k, kind in picked if kind == "different"])
    out = []
    for _c, key, kind in picked:
        row, mrow = src_rows.get(key), mir_rows.get(key)
        if kind == "different":
            cols = tuple(
                c
                for c in schema.column_names
                if row is not None and mrow is not None and row.get(c) != mrow.get(c)
            )
            out.append(Mismatch(key, "different", cols, row, mrow))
        else:
            out.append(Mismatch(key, "missing", source=row))
    out += [Mismatch(k, "extra") for _c, k, _kind in found.samples["extra"][: max(0, examples - len(out))]]
    return out


def source_chunks(
    dialect, schema: TableSchema, chunk_rows: int, *, after: tuple | None = None, once: bool = False
) -> Iterator[list[tuple[str, dict]]]:
    """The source's rows in key order, ``chunk_rows`` at a time, as (canonical key, canonical
    row), from after the key ``after`` (None: the start); ``once``: the first chunk only."""
    while True:
        sql, params = dialect.chunk_query(schema, FULL_RANGE, after_key=after, limit=chunk_rows)
        chunk: list[tuple[str, dict]] = []
        for batch in dialect.stream_query(sql, params):
            for raw in batch:
                row = dialect.row_to_canonical(schema, raw)
                chunk.append((encode_key(schema.key_values(row)), row))
        if not chunk:
            return
        yield chunk
        if once or len(chunk) < chunk_rows:
            return
        after = tuple(json.loads(chunk[-1][0]))


def mirror_position(data_dir: str, source: str, table: TableName) -> Position | None:
    """The newest position the mirror of ``table`` reflects: how far it has applied the staged
    changelog (its sink marker, every table of the source) or the newest row it stores (a chunk
    row may sit past the marker), whichever is later; None when it has neither."""
    from ..sinks.base import read_marker
    from ..sinks.mirror_readers import newest_position

    newest = newest_position(data_dir, source, table)
    found = [read_marker(data_dir, source, "mirror"), None if newest is None else Position.decode(newest)]
    found = [p for p in found if p is not None]
    return max(found) if found else None


def verify_table(
    dialect,
    data_dir: str,
    source: str,
    table: TableName,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    examples: int = EXAMPLES,
    partition_rows: int = PARTITION_ROWS,
    throttle: Throttle | None = None,
    method: str = "auto",
    range_rows: int = DIGEST_RANGE_ROWS,
) -> VerifyResult:
    """Compare the mirror of ``table`` with the source the dialect reads (I2). Memory follows
    ``partition_rows``, not the table.

    ``method`` "auto": by digests where every column type has a digest form in the dialect: range
    digests (:func:`verify_digests`) for a key of one integer column, row digests matched by key
    (:func:`verify_keyed`) for any other key; else row by row (:func:`verify_rows`), saying why in
    ``method_note``; "rows" or "digests" force one (a table
    that allows no digests raises ConfigurationError under "digests"). ``throttle``: the load on the
    source of the digest queries (parallelism: range queries at once, 2 by default;
    delay_seconds: pause after each), as a snapshot's.

    Rows read from a replica (PostgreSQL: a hot standby named by ``chunk_conn_id``) are read only
    once it has replayed past :func:`mirror_position` (at most ``max_replica_lag_seconds``, then
    the verify fails naming the standby and how far behind it is): a replica behind the mirror
    would show its lag as mismatches."""
    from ..dialects.base import READ_FLOOR_MIRROR

    if method not in ("auto", "rows", "digests"):
        raise ConfigurationError(f"verify method must be 'auto', 'rows' or 'digests', got {method!r}")
    schema = dialect.describe_table(table)
    floor = mirror_position(data_dir, source, table)
    if floor is not None:
        dialect.read_no_older_than(floor, READ_FLOOR_MIRROR)
    why = [] if method == "rows" else digest_problems(dialect, schema)
    if method == "digests" and why:
        raise ConfigurationError(f"table {table}: no digest verify: {'; '.join(why)}")
    if method == "rows" or why:
        res = verify_rows(
            dialect,
            data_dir,
            source,
            table,
            schema,
            chunk_rows=chunk_rows,
            examples=examples,
            partition_rows=partition_rows,
        )
        res.method_note = "; ".join(why)
        return res
    if not ranges_by_key_order(schema):
        return verify_keyed(
            dialect,
            data_dir,
            source,
            table,
            schema,
            chunk_rows=chunk_rows,
            examples=examples,
            partition_rows=partition_rows,
            throttle=throttle or DEFAULT_THROTTLE,
        )
    return verify_digests(
        dialect,
        data_dir,
        source,
        table,
        schema,
        chunk_rows=chunk_rows,
        examples=examples,
        partition_rows=partition_rows,
        throttle=throttle or DEFAULT_THROTTLE,
        range_rows=range_rows,
    )


def verify_rows(
    dialect,
    data_dir: str,
    source: str,
    table: TableName,
    schema: TableSchema,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    examples: int = EXAMPLES,
    partition_rows: int = PARTITION_ROWS,
) -> VerifyResult:
    """Every row canonicalised in Python on both sides and compared by key (the reference the
    digests are checked against): the mirror is read a batch at a time and both sides' digests
    wait in hash partitions on local scratch disk."""
    from ..sinks.mirror_readers import mirror_batches, mirror_rows_of

    count, batches = mirror_batches(data_dir, source, table)
    with tempfile.TemporaryDirectory(prefix="cdc-verify-") as folder:
        mirror = MirrorIndex(
            schema,
            batches,
            count=count,
            folder=folder,
            partition_rows=partition_rows,
            fetch=lambda keys: mirror_rows_of(data_dir, source, table, keys),
        )

        def reread(_i: int, after: tuple | None) -> list[tuple[str, dict]]:
            return next(source_chunks(dialect, schema, chunk_rows, after=after, once=True), [])

        return compare(
            schema, source_chunks(dialect, schema, chunk_rows), mirror, examples=examples, reread=reread
        )


# --- range digests ------------------------------------------------------------------------
def digest_problems(dialect, schema: TableSchema) -> list[str]:
    """Why ``schema``'s table is verified row by row rather than by digests (empty: it is not):
    the source must compute a digest form of every column (dialects/base.py DIGEST_FORMS)."""
    return list(dialect.digest_problems(schema))


def ranges_by_key_order(schema: TableSchema) -> bool:
    """Whether the mirror can assign its rows to the source's key ranges by comparing keys: only
    where numpy orders keys exactly as the database does (one integer column). Text keys follow
    a collation, composite keys a row order the mirror does not compute: their row digests are
    matched by key instead (:func:`verify_keyed`)."""
    pk = schema.primary_key
    return len(pk) == 1 and schema.column(pk[0]).type in _ORDERED_KEYS


def _duck_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _digest_input(batch: pa.RecordBatch | pa.Table, schema: TableSchema) -> pa.Table:
    """The schema's columns of typed mirror rows as the digest forms read them: floats as their
    bits, dates as their days, timestamps as their microseconds (zero-copy views)."""
    cols = []
    for c in schema.columns:
        arr = batch.column(batch.schema.get_field_index(c.name))
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        t = arr.type
        if pa.types.is_float64(t) and c.type == "float64":
            arr = arr.view(pa.int64())
        elif pa.types.is_float32(t) and c.type == "float32":
            arr = arr.view(pa.int32())
        elif pa.types.is_date32(t):
            arr = arr.view(pa.int32())
        elif pa.types.is_timestamp(t):
            arr = arr.view(pa.int64())
        cols.append(arr)
    return pa.table(cols, names=[f"c{i}" for i in range(len(cols))])


def mirror_digest_sql(schema: TableSchema, arrow: pa.Schema) -> str:
    """duckdb SQL of each row's 64-bit digest (``h``) over :func:`_digest_input`'s table ``m``: the
    same text the source's SQL builds (dialects/base.py DIGEST_FORMS), vectorised."""
    from ..dialects.base import DIGEST_NULL, DIGEST_SIZED

    pieces = []
    for i, c in enumerate(schema.columns):
        ident, t = f"c{i}", arrow.field(i).type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            text = ident  # strings, and values the mirror keeps as their canonical text
        elif pa.types.is_boolean(t):
            text = f"CASE WHEN {ident} THEN 't' WHEN NOT {ident} THEN 'f' END"
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            text = f"lower(hex({ident}))"
        else:  # integers, decimals, and the views of floats, dates and timestamps
            text = f"CAST({ident} AS VARCHAR)"
        # (|| is null when a part is, unlike concat(): a null value gives the null piece)
        value = (
            f"CAST(strlen({text}) AS VARCHAR) || ':' || {text}"
            if c.type in DIGEST_SIZED
            else f"{text} || ','"
        )
        pieces.append(f"coalesce({value}, '{DIGEST_NULL}')")
    return f"SELECT ('0x' || left(md5(concat({', '.join(pieces)})), 16))::UBIGINT AS h FROM m"  # noqa: S608 - our names


class MirrorDigests:
    """Row digests of typed mirror rows, computed by duckdb over Arrow (no Python per row)."""

    def __init__(self, schema: TableSchema) -> None:
        import duckdb  # a well-kept library that computes md5 over Arrow columns, vectorised

        self.schema = schema
        self.con = duckdb.connect()
        self._sql: dict[pa.Schema, str] = {}

    def __call__(self, batch: pa.RecordBatch | pa.Table) -> np.ndarray:
        """The uint64 digest of each row."""
        if not batch.num_rows:
            return np.zeros(0, dtype=np.uint64)
        m = _digest_input(batch, self.schema)
        sql = self._sql.get(m.schema)
        if sql is None:
            sql = self._sql[m.schema] = mirror_digest_sql(self.schema, m.schema)
        self.con.register("m", m)
        try:
            return self.con.execute(sql).fetchnumpy()["h"].astype(np.uint64, copy=False)
        finally:
            self.con.unregister("m")

    def close(self) -> None:
        self.con.close()


class SourceDigests:
    """The source's side: key boundaries and range digests, each query on a connection of the
    worker thread's own (``Dialect.digest_session``), throttled as a snapshot's chunks are:
    ``parallelism`` queries at once, ``delay_seconds`` after each."""

    def __init__(self, dialect, schema: TableSchema, throttle: Throttle) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.dialect, self.schema, self.throttle = dialect, schema, throttle
        self.pool = ThreadPoolExecutor(max_workers=throttle.parallelism, thread_name_prefix="cdc-verify")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._sessions: list = []
        self.queries = 0

    def _rows(self, sql: str, params: Sequence) -> list[tuple]:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.dialect.digest_session()
            with self._lock:
                self._sessions.append(conn)
        cur = conn.cursor()
        try:
            cur.execute(sql, tuple(params))
            rows = list(cur.fetchall())
        finally:
            cur.close()
        with self._lock:
            self.queries += 1
        if self.throttle.delay_seconds:
            time.sleep(self.throttle.delay_seconds)
        return rows

    def boundary(self, after: int | None, upto: int | None, offset: int) -> int | None:
        """The key ``offset`` keys past the first one after ``after`` (at most ``upto``); None
        when the range holds fewer keys."""
        sql, params = self.dialect.key_boundary_query(
            self.schema,
            after_key=None if after is None else (after,),
            upto_key=None if upto is None else (upto,),
            offset=offset,
        )
        rows = self._rows(sql, params)
        return int(rows[0][0]) if rows else None

    def digest(self, after: int | None, upto: int | None) -> tuple[int, int]:
        """(rows, XOR of their digests as uint64) of the keys in (after, upto]."""
        sql, params = self.dialect.range_digest_query(
            self.schema,
            after_key=None if after is None else (after,),
            upto_key=None if upto is None else (upto,),
        )
        count, xor = self._rows(sql, params)[0]
        return int(count), int(xor or 0) & _MASK64

    def digests(self, ranges: Sequence[tuple[int | None, int | None]]) -> list:
        """Futures of :meth:`digest` of each range, queued on the throttled workers."""
        return [self.pool.submit(self.digest, a, b) for a, b in ranges]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        for conn in self._sessions:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a connection that broke
                pass


def prefetched(items: Iterable, depth: int = 2) -> Iterator:
    """``items`` produced on a thread of their own, ``depth`` ahead of the consumer: the mirror's
    Parquet decoding (pyarrow) and its digests (duckdb) both release the GIL, so they overlap."""
    import queue

    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer left

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # noqa: BLE001 - raised in the consumer
            put(exc)

    t = threading.Thread(target=produce, name="cdc-verify-read", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        t.join()


def _xor(h: np.ndarray) -> int:
    return int(np.bitwise_xor.reduce(h)) if len(h) else 0


def _in_range(keys: np.ndarray, after: int | None, upto: int | None) -> np.ndarray:
    mask = np.ones(len(keys), dtype=bool)
    if after is not None:
        mask &= keys > after
    if upto is not None:
        mask &= keys <= upto
    return mask


def verify_digests(
    dialect,
    data_dir: str,
    source: str,
    table: TableName,
    schema: TableSchema,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    examples: int = EXAMPLES,
    partition_rows: int = PARTITION_ROWS,
    throttle: Throttle = DEFAULT_THROTTLE,
    range_rows: int = DIGEST_RANGE_ROWS,
) -> VerifyResult:
    """The mirror against the source by range digests (the work where the data is).

    1. The source's key boundaries every ``range_rows`` keys, from its own keyset order
       (``Dialect.key_boundary_query``); ranges are (previous boundary, boundary].
    2. Each range's (row count, XOR of row digests) computed by the source in one aggregate
       (``Dialect.range_digest_query``), on the throttled workers, while the mirror is read once:
       its rows' digests computed by duckdb (:class:`MirrorDigests`) and summed up per range
       (a row's range found by comparing integer keys, vectorised).
    3. Ranges whose digests differ are read again from the mirror (as many at once as hold
       ``partition_rows`` source rows) and split into DIGEST_FANOUT sub-ranges on both sides,
       recursively, down to ranges of at most ``chunk_rows`` source rows; those rows are compared
       as :func:`verify_rows` compares them (:func:`compare`), which makes the report, the
       examples and the repair conf (a digest that differs while the rows are equal counts
       nothing)."""
    from ..sinks.mirror_readers import mirror_batches, mirror_rows_of

    key = schema.primary_key[0]
    src = SourceDigests(dialect, schema, throttle)
    digest = MirrorDigests(schema)
    try:
        # 1. boundaries, in the source's order
        ranges: list[tuple[int | None, int | None]] = []
        after: int | None = None
        while True:
            b = src.boundary(after, None, max(1, range_rows) - 1)
            ranges.append((after, b))
            if b is None:
                break
            after = b
        lasts = np.array([b for _a, b in ranges[:-1]], dtype=np.int64)

        def mirror_rows(
            wanted: np.ndarray | None = None,
        ) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]]:
            """(typed rows, their keys, digests, range numbers) a batch at a time; ``wanted``: only
            the rows of these ranges."""
            _count, batches = mirror_batches(data_dir, source, table)
            for batch in prefetched(batches):
                if not batch.num_rows:
                    continue
                rows = pa.Table.from_batches([batch])
                keys = pc.cast(rows[key], pa.int64()).to_numpy()
                rid = np.searchsorted(lasts, keys, side="left")
                if wanted is not None:
                    mask = np.isin(rid, wanted)
                    if not mask.any():
                        continue
                    rows, keys, rid = rows.filter(pa.array(mask)), keys[mask], rid[mask]
                yield rows, keys, digest(rows), rid

        # 2. the source's digests on the workers, the mirror's here meanwhile
        futures = src.digests(ranges)
        m_count = np.zeros(len(ranges), dtype=np.int64)
        m_xor = np.zeros(len(ranges), dtype=np.uint64)
        for _rows, _keys, h, rid in mirror_rows():
            m_count += np.bincount(rid, minlength=len(ranges))
            np.bitwise_xor.at(m_xor, rid, h)
        s_digests = [f.result() for f in futures]
        differ = [i for i, (n, x) in enumerate(s_digests) if (n, x) != (int(m_count[i]), int(m_xor[i]))]

        # 3. the ranges that differ, down to rows
        leaves: list[tuple[int | None, int | None]] = []
        counter = {"ranges": len(ranges)}

        def descend(
            after: int | None,
            upto: int | None,
            n: int,
            mkeys: np.ndarray,
            mh: np.ndarray,
            idx: np.ndarray,
            depth: int,
        ) -> Iterator[np.ndarray]:
            """Rows of the sub-ranges of (after, upto] that differ, as indices into the held mirror rows."""
            if n <= chunk_rows or depth >= DIGEST_MAX_DEPTH:
                leaves.append((after, upto))
                yield idx
                return
            step = max(chunk_rows, -(-n // DIGEST_FANOUT))
            subs: list[tuple[int | None, int | None]] = []
            a = after
            while True:
                b = src.boundary(a, upto, step - 1)
                if b is None or b == upto:
                    subs.append((a, upto))
                    break
                subs.append((a, b))
                a = b
            counter["ranges"] += len(subs)
            for (a, b), f in zip(subs, src.digests(subs), strict=True):
                sn, sx = f.result()
                sel = idx[_in_range(mkeys[idx], a, b)]
                if (sn, sx) != (len(sel), _xor(mh[sel])):
                    yield from descend(a, b, sn, mkeys, mh, sel, depth + 1)

        def leaf_mirror_rows() -> Iterator[pa.RecordBatch]:
            """The typed mirror rows of the leaves that differ, a group of ranges at a time."""
            group: list[int] = []
            held = 0
            groups: list[list[int]] = []
            for i in differ:
                if group and held + s_digests[i][0] > partition_rows:
                    groups.append(group)
                    group, held = [], 0
                group.append(i)
                held += s_digests[i][0]
            if group:
                groups.append(group)
            for g in groups:
                parts, pkeys, ph, prid = [], [], [], []
                for rows, keys, h, rid in mirror_rows(np.array(g, dtype=np.int64)):
                    parts.append(rows)
                    pkeys.append(keys)
                    ph.append(h)
                    prid.append(rid)
                rows = pa.concat_tables(parts) if parts else None
                mkeys = np.concatenate(pkeys) if pkeys else np.zeros(0, dtype=np.int64)
                mh = np.concatenate(ph) if ph else np.zeros(0, dtype=np.uint64)
                mrid = np.concatenate(prid) if prid else np.zeros(0, dtype=np.int64)
                for i in g:
                    a, b = ranges[i]
                    for idx in descend(a, b, s_digests[i][0], mkeys, mh, np.flatnonzero(mrid == i), 0):
                        if len(idx) and rows is not None:
                            yield from rows.take(pa.array(idx)).to_batches()

        numbered: list[
            tuple[int | None, int | None]
        ] = []  # the leaves with source rows, as compare numbers them

        def read_leaf(after: int | None, upto: int | None) -> list[tuple[str, dict]]:
            return _source_rows(dialect, schema, after, upto)

        def leaf_chunks() -> Iterator[list[tuple[str, dict]]]:
            for leaf in leaves:
                rows = read_leaf(*leaf)
                if rows:
                    numbered.append(leaf)
                    yield rows

        def end_of(i: int) -> tuple | None:
            upto = numbered[i][1]
            nxt = None if upto is None else src.boundary(upto, None, 0)
            return None if nxt is None else (nxt,)

        with tempfile.TemporaryDirectory(prefix="cdc-verify-") as folder:
            mirror = MirrorIndex(
                schema,
                leaf_mirror_rows(),
                count=int(sum(m_count[i] for i in differ)),
                folder=folder,
                partition_rows=partition_rows,
                fetch=lambda keys: mirror_rows_of(data_dir, source, table, keys),
            )
            res = compare(
                schema,
                leaf_chunks(),
                mirror,
                examples=examples,
                reread=lambda c, _after: read_leaf(*numbered[c]),
                end_of=end_of,
            )
    finally:
        src.close()
        digest.close()
    res.method = "digests"
    res.digest_ranges = counter["ranges"]
    res.source_rows = sum(n for n, _x in s_digests)
    res.chunks = -(
        -res.source_rows // chunk_rows
    )  # the table in chunks of chunk_rows, as verify_rows reads it
    res.mirror_rows = int(m_count.sum())
    res.rows_checked = res.source_rows + res.extra
    return res


#: what the keyed compare keeps of every row: its canonical key, its 64-bit digest and, on the
#: source side, the number of its chunk
_MIRROR_H = pa.schema([("key", pa.string()), ("mdigest", pa.uint64())])
_SOURCE_H = pa.schema([("key", pa.string()), ("sdigest", pa.uint64()), ("chunk", pa.int64())])


def verify_keyed(
    dialect,
    data_dir: str,
    source: str,
    table: TableName,
    schema: TableSchema,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    examples: int = EXAMPLES,
    partition_rows: int = PARTITION_ROWS,
    throttle: Throttle = DEFAULT_THROTTLE,
) -> VerifyResult:
    """The mirror against the source by row digests matched by key, for keys the mirror cannot
    order as the database does (text in a collation, composite keys).

    The source computes each row's digest in SQL and sends it with the row's key columns, in key
    order, ``chunk_rows`` rows a query (``Dialect.row_digests_query``, throttled: ``delay_seconds``
    after each); the mirror's digests are computed by duckdb. Both wait in hash partitions of
    their canonical key (as :func:`verify_rows`'s do) and meet there: keys on one side only are
    missing or extra rows, and the chunks holding a missing row or a digest that differs are read
    again and compared row by row (:func:`compare`), which makes the report, the examples and the
    repair conf. No range is ever formed by comparing keys outside the database."""
    from ..sinks.mirror_readers import mirror_batches, mirror_rows_of

    pk = schema.primary_key
    key_schema = TableSchema(schema.table, tuple(schema.column(k) for k in pk), pk, dict(schema.extra))
    count, batches = mirror_batches(data_dir, source, table)
    parts = max(1, -(-(count or 0) // max(1, partition_rows)))
    digest = MirrorDigests(schema)
    firsts: list[tuple] = []  # each chunk's first key
    afters: list[tuple | None] = []  # the key each chunk's read continues after
    n_src = n_mirror = 0
    try:
        with tempfile.TemporaryDirectory(prefix="cdc-verify-") as folder:
            mp = _Partitions(folder, "mirror", _MIRROR_H, parts)
            for batch in prefetched(batches):
                if not batch.num_rows:
                    continue
                rows = pa.Table.from_batches([batch])
                mp.add(
                    pa.table(
                        [rows[KEY_COLUMN].cast(pa.string()), pa.array(digest(rows), pa.uint64())],
                        schema=_MIRROR_H,
                    )
                )
                n_mirror += rows.num_rows
            mp.close()
            sp = _Partitions(folder, "source", _SOURCE_H, parts)
            after: tuple | None = None
            while True:
                sql, params = dialect.row_digests_query(schema, after_key=after, limit=chunk_rows)
                keys: list[str] = []
                hs: list[int] = []
                last = None
                for batch in dialect.stream_query(sql, params):
                    for raw in batch:
                        last = tuple(dialect.row_to_canonical(key_schema, raw[:-1]).values())
                        keys.append(encode_key(last))
                        hs.append(int(raw[-1]) & _MASK64)
                if not keys:
                    break
                afters.append(after)
                firsts.append(tuple(json.loads(keys[0])))
                sp.add(
                    pa.table(
                        [
                            pa.array(keys, pa.string()),
                            pa.array(hs, pa.uint64()),
                            pa.array(np.full(len(keys), len(firsts) - 1, dtype=np.int64)),
                        ],
                        schema=_SOURCE_H,
                    )
                )
                n_src += len(keys)
                if throttle.delay_seconds:
                    time.sleep(throttle.delay_seconds)
                if len(keys) < chunk_rows:
                    break
                after = last
            sp.close()
            found = _Found(examples)
            for p in range(parts):
                _compare_partition(mp.table(p), sp.batches(p), found)
            flagged = sorted(found.chunks)
            flagged_keys: list[
                str
            ] = []  # the source keys of the chunks that differ (their mirror rows are read)
            if flagged:
                wanted = pa.array(flagged, pa.int64())
                for p in range(parts):
                    for b in sp.batches(p):
                        hit = pc.is_in(b.column(2), value_set=wanted)
                        flagged_keys += b.column(0).filter(hit).to_pylist()

            def mirror_rows() -> Iterator[pa.RecordBatch]:
                for lo in range(0, len(flagged_keys), max(1, partition_rows)):
                    t = mirror_rows_of(data_dir, source, table, flagged_keys[lo : lo + partition_rows])
                    if t.num_rows:
                        yield from t.to_batches()

            def chunk_rows_of(i: int) -> list[tuple[str, dict]]:
                return next(source_chunks(dialect, schema, chunk_rows, after=afters[i], once=True), [])

            numbered: list[int] = []

            def flagged_chunks() -> Iterator[list[tuple[str, dict]]]:
                for i in flagged:
                    rows = chunk_rows_of(i)
                    if rows:
                        numbered.append(i)
                        yield rows

            mirror = MirrorIndex(
                schema,
                mirror_rows(),
                count=len(flagged_keys),
                folder=folder,
                partition_rows=partition_rows,
                fetch=lambda keys: mirror_rows_of(data_dir, source, table, keys),
            )
            res = compare(
                schema,
                flagged_chunks(),
                mirror,
                examples=examples,
                reread=lambda c, _after: chunk_rows_of(numbered[c]),
                end_of=lambda c: firsts[numbered[c] + 1] if numbered[c] + 1 < len(firsts) else None,
            )
    finally:
        digest.close()
    # keys only the mirror has: found by the key match, exact (a digest plays no part)
    res.extra = found.extra
    res.examples += [
        Mismatch(k, "extra")
        for _c, k, _kind in found.samples["extra"][: max(0, examples - len(res.examples))]
    ]
    res.method = "digests"
    res.digest_ranges = len(firsts)
    res.chunks = len(firsts)
    res.source_rows, res.mirror_rows = n_src, n_mirror
    res.rows_checked = n_src + res.extra
    return res


def _source_rows(dialect, schema: TableSchema, after: int | None, upto: int | None) -> list[tuple[str, dict]]:
    """The source's rows with keys in (after, upto], in key order, as (canonical key, canonical row)."""
    sql, params = dialect.chunk_query(
        schema,
        FULL_RANGE,
        after_key=None if after is None else (after,),
        limit=None,
        upper_bound=None if upto is None else (upto,),
    )
    out = []
    for batch in dialect.stream_query(sql, params):
        for raw in batch:
            row = dialect.row_to_canonical(schema, raw)
            out.append((encode_key(schema.key_values(row)), row))
    return out


# --- the event log ------------------------------------------------------------------------
@dataclass
class EventLogReport:
    table: str
    events: int = 0  # after de-duplication by (key, position)
    duplicates: int = 0  # identical copies removed (allowed: I3 de-duplicates them)
    keys: int = 0
    violation_count: int = 0
    violations: list[str] = field(default_factory=list)  # the first few, described

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def summary(self) -> str:
        return (
            f"event log of {self.table}: {self.events} events over {self.keys} keys, "
            f"{self.duplicates} duplicate copies, {self.violation_count} violations"
        )


def check_events(
    table_id: str, events: Iterable[dict], *, primary_key: tuple[str, ...] = (), max_violations: int = 20
) -> EventLogReport:
    """Replay events (dicts with op, key, position, before, after; rows as canonical JSON text or
    dicts) per key in position order and report what I1 forbids (see the module docstring)."""
    return check_event_tuples(
        table_id,
        (
            (
                e["key"],
                e["position"].encode() if isinstance(e["position"], Position) else e["position"],
                e["op"],
                e.get("before"),
                e.get("after"),
            )
            for e in events
        ),
        primary_key=primary_key,
        max_violations=max_violations,
    )


def _obj(row: Any) -> dict | None:
    return json.loads(row) if isinstance(row, str) else row


def _same(a: Any, b: Any) -> bool:
    """Equal rows, comparing the canonical JSON text first and parsing only when it differs.
    Images from either side of an ADD or DROP COLUMN are compared on the columns both have
    (a column added later has no value in the earlier image; a dropped one none in the later)."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    x, y = _obj(a), _obj(b)
    if x.keys() == y.keys():
        return x == y
    return all(x[c] == y[c] for c in x.keys() & y.keys())


def check_event_tuples(
    table_id: str,
    events: Iterable[tuple[str, str, str, Any, Any]],
    *,
    primary_key: tuple[str, ...] = (),
    max_violations: int = 20,
    gaps: Sequence[tuple[str, str]] = (),
) -> EventLogReport:
    """:func:`check_events` on ``(key, encoded position, op, before, after)`` tuples. ``gaps``:
    (from, to) encoded positions between which the log was lost and resynced (a failover,
    storage/source_server.py): a key's history is not followed across one."""
    rep = EventLogReport(table_id)
    per_key: dict[str, list] = {}
    truncates: list[str] = []  # positions of TRUNCATE events (op "t", no key): every key is gone there
    for ev in events:
        if ev[2] == "t":
            truncates.append(ev[1])
            continue
        if ev[2] == "g":  # a gap (resync): its ends are in ``gaps``
            continue
        lst = per_key.get(ev[0])
        if lst is None:
            per_key[ev[0]] = [ev]
        else:
            lst.append(ev)

    def violation(text: str) -> None:
        rep.violation_count += 1
        if len(rep.violations) < max_violations:
            rep.violations.append(text)

    rep.keys = len(per_key)
    truncates = sorted(set(truncates))
    rep.events += len(truncates)
    for key, evs in per_key.items():
        if len(evs) == 1:
            rep.events += 1
            continue
        evs.sort(key=lambda e: e[1])
        prev = None
        for ev in evs:
            _, pos, op, before, after = ev
            if prev is not None and truncates:
                # a TRUNCATE between the previous event and this one deleted the key there
                i = bisect.bisect_left(truncates, pos) - 1
                if i >= 0 and truncates[i] > prev[1]:
                    prev = (key, truncates[i], "d", None, None)
            if prev is not None and any(prev[1] < g_to and pos > g_from for g_from, g_to in gaps):
                prev = None  # the events between them may be lost: the resync's repair re-read the key
            if prev is not None and prev[1] == pos:
                if prev[2] == op and _same(prev[3], before) and _same(prev[4], after):
                    rep.duplicates += 1
                else:
                    violation(
                        f"key {key}: two different events at position {_readable(pos)}: {prev[2]} and {op}"
                    )
                continue
            rep.events += 1
            problem = None
            if prev is not None:
                pop, pafter, ppos = prev[2], prev[4], prev[1]
                live = pop != "d"
                if op == "c" and live:
                    problem = f"create of a live key (previous {pop} at {_readable(ppos)})"
                elif op in ("u", "d", "r") and not live:
                    problem = f"{op} after a delete at {_readable(ppos)}" + (
                        " (resurrected by a chunk row)" if op == "r" else ""
                    )
                elif op == "r" and not _same(after, pafter):
                    problem = (
                        f"chunk row is not the state at its position (stale; previous {pop} at "
                        f"{_readable(ppos)})"
                    )
                elif (
                    op in ("u", "d")
                    and before is not None
                    and pafter is not None
                    and not _same(before, pafter)
                ):
                    b, pa_ = _obj(before), _obj(pafter)
                    if _full(b, pa_, primary_key):
                        problem = (
                            f"before-image differs from the previous after-image ({pop} at {_readable(ppos)})"
                        )
            if problem:
                violation(f"key {key}: {op} at {_readable(pos)}: {problem}")
            prev = ev
    return rep


def _full(before: dict, after: dict, primary_key: tuple[str, ...]) -> bool:
    """A before-image is comparable when it has every column (REPLICA IDENTITY FULL / binlog
    FULL); a key-only before-image (PostgreSQL's default identity) is not."""
    return bool(set(before) & (set(after) - set(primary_key))) and (
        not primary_key or set(before) != set(primary_key)
    )


def _readable(encoded: str) -> str:
    try:
        return str(Position.decode(encoded))
    except ValueError:
        return encoded


def check_event_log(
    data_dir: str, source: str, table: TableName, *, primary_key: tuple[str, ...] = ()
) -> EventLogReport:
    """Read the event log of ``table`` and check it per key (I1); see :func:`check_events`."""
    from ..storage.layout import events_dir
    from ..storage.source_server import read_gaps

    t = read_event_log(data_dir, source, table)
    cols = [t[c].to_pylist() for c in ("key", "position", "op", "before", "after")]
    gaps = [(g.get("from") or "", g.get("to") or "~") for g in read_gaps(events_dir(data_dir, source))]
    return check_event_tuples(table.id, zip(*cols, strict=True), primary_key=primary_key, gaps=gaps)
