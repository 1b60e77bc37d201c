"""The compare both sides meet in: rows or digests in hash partitions of their canonical key, the
report (:class:`VerifyResult`, its examples and repair conf) and the source's key chunks."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...core.arrow_types import KEY_COLUMN, RowNormaliser, arrow_canonical
from ...core.errors import ConfigurationError
from ...core.ranges import FULL_RANGE, ChunkRange, ranges_by_key_order
from ...core.schema import TableSchema, encode_key, encode_row
from ...core.throttle import Throttle
from ...sinks.delta_buckets import bucket_of

DEFAULT_CHUNK_ROWS = 10_000
EXAMPLES = 10
#: ranges a repair snapshot reads at once (its conf's parallelism, at most)
REPAIR_PARALLELISM = 4

#: the source's load by default: two range queries at once, no pause (a snapshot's Throttle)
DEFAULT_THROTTLE = Throttle(chunk_size=DEFAULT_CHUNK_ROWS, parallelism=2)
_MASK64 = (1 << 64) - 1
#: key types whose order numpy reproduces exactly (the database's order of integers)


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


@dataclass(frozen=True)
class VerifyJob:
    """One table's verify as every method reads it: the source (``dialect``, the table's
    ``schema``), where the mirror is, and the bounds they share (rows a source chunk, examples
    kept, rows a hash partition holds)."""

    dialect: Any
    data_dir: str
    source: str
    table: Any  # TableName
    schema: TableSchema
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    examples: int = EXAMPLES
    partition_rows: int = PARTITION_ROWS

    def compare(
        self,
        chunks: Iterable[list[tuple[str, dict]]],
        mirror_batches,
        *,
        count: int,
        folder: str,
        reread: ChunkReader | None,
        end_of: Callable[[int], tuple | None] | None = None,
    ) -> VerifyResult:
        """The source's ``chunks`` against the typed ``mirror_batches`` (``count`` rows) indexed
        in hash partitions under ``folder`` (:func:`compare`)."""
        mirror = mirror_index(
            self.schema,
            mirror_batches,
            count=count,
            folder=folder,
            partition_rows=self.partition_rows,
            data_dir=self.data_dir,
            source=self.source,
            table=self.table,
        )
        return compare(self.schema, chunks, mirror, examples=self.examples, reread=reread, end_of=end_of)


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
    batches of typed mirror rows (core/arrow_types/, with ``__key``), read one batch at a
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


class Numbered:
    """The chunks ``read`` gives for ``items`` (an iterable of chunks for :func:`compare`), empty
    ones skipped; ``kept[c]`` is the item of the ``c``-th chunk compare saw, which
    :meth:`reread` reads again."""

    def __init__(self, items: Iterable, read: Callable[[Any], list[tuple[str, dict]]]) -> None:
        self.items, self.read = items, read
        self.kept: list = []

    def __iter__(self) -> Iterator[list[tuple[str, dict]]]:
        for item in self.items:
            rows = self.read(item)
            if rows:
                self.kept.append(item)
                yield rows

    def reread(self, c: int, _after: tuple | None = None) -> list[tuple[str, dict]]:
        return self.read(self.kept[c])


def mirror_index(
    schema: TableSchema,
    batches,
    *,
    count: int,
    folder: str,
    partition_rows: int,
    data_dir: str,
    source: str,
    table,
) -> MirrorIndex:
    """A :class:`MirrorIndex` of typed mirror ``batches`` that fetches the rows of keys it must
    show again from the mirror of ``table``."""
    from ...sinks.mirror_readers import mirror_rows_of

    return MirrorIndex(
        schema,
        batches,
        count=count,
        folder=folder,
        partition_rows=partition_rows,
        fetch=lambda keys: mirror_rows_of(data_dir, source, table, keys),
    )
