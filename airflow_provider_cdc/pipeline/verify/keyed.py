"""Row digests matched by key, for keys the mirror cannot order as the database does."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...core.arrow_types import KEY_COLUMN
from ...core.schema import TableName, TableSchema, encode_key
from ...core.throttle import Throttle
from .compare import (
    _MASK64,
    DEFAULT_THROTTLE,
    Mismatch,
    Numbered,
    VerifyJob,
    VerifyResult,
    _compare_partition,
    _Found,
    _Partitions,
    source_chunks,
)
from .digests import MirrorDigests, prefetched

#: what the keyed compare keeps of every row: its canonical key, its 64-bit digest and, on the
#: source side, the number of its chunk
_MIRROR_H = pa.schema([("key", pa.string()), ("mdigest", pa.uint64())])
_SOURCE_H = pa.schema([("key", pa.string()), ("sdigest", pa.uint64()), ("chunk", pa.int64())])


def _mirror_digests(batches: Iterable[pa.RecordBatch], digest: MirrorDigests, into: _Partitions) -> int:
    """Every mirror row's (canonical key, digest) into ``into``'s partitions; returns the rows."""
    n = 0
    for batch in prefetched(batches):
        if not batch.num_rows:
            continue
        rows = pa.Table.from_batches([batch])
        into.add(
            pa.table(
                [rows[KEY_COLUMN].cast(pa.string()), pa.array(digest(rows), pa.uint64())], schema=_MIRROR_H
            )
        )
        n += rows.num_rows
    into.close()
    return n


class _SourceChunks:
    """The source's row digests in key order, ``chunk_rows`` rows a query, into partitions, each
    row with its chunk's number; ``afters[i]`` is the key chunk ``i``'s read continues after and
    ``firsts[i]`` its first key."""

    def __init__(self, dialect, schema: TableSchema, chunk_rows: int, throttle: Throttle) -> None:
        self.dialect, self.schema, self.chunk_rows, self.throttle = dialect, schema, chunk_rows, throttle
        pk = schema.primary_key
        self.key_schema = TableSchema(
            schema.table, tuple(schema.column(k) for k in pk), pk, dict(schema.extra)
        )
        self.firsts: list[tuple] = []
        self.afters: list[tuple | None] = []
        self.rows = 0

    def _chunk(self, after: tuple | None) -> tuple[list[str], list[int], tuple | None]:
        digests = self.dialect.digests
        sql, params = digests.row_digests_query(self.schema, after_key=after, limit=self.chunk_rows)
        keys: list[str] = []
        hs: list[int] = []
        last = None
        for batch in self.dialect.stream_query(sql, params):
            for raw in batch:
                last = tuple(self.dialect.row_to_canonical(self.key_schema, raw[:-1]).values())
                keys.append(encode_key(last))
                hs.append(int(raw[-1]) & _MASK64)
        return keys, hs, last

    def read_into(self, into: _Partitions) -> None:
        after: tuple | None = None
        while True:
            keys, hs, last = self._chunk(after)
            if not keys:
                break
            self.afters.append(after)
            self.firsts.append(tuple(json.loads(keys[0])))
            number = np.full(len(keys), len(self.firsts) - 1, dtype=np.int64)
            into.add(
                pa.table(
                    [pa.array(keys, pa.string()), pa.array(hs, pa.uint64()), pa.array(number)],
                    schema=_SOURCE_H,
                )
            )
            self.rows += len(keys)
            if self.throttle.delay_seconds:
                time.sleep(self.throttle.delay_seconds)
            if len(keys) < self.chunk_rows:
                break
            after = last
        into.close()

    def end_of(self, i: int) -> tuple | None:
        return self.firsts[i + 1] if i + 1 < len(self.firsts) else None


def _flagged_keys(sp: _Partitions, flagged: list[int]) -> list[str]:
    """The source keys of the chunks that differ (their mirror rows are read)."""
    out: list[str] = []
    if flagged:
        wanted = pa.array(flagged, pa.int64())
        for p in range(sp.count):
            for b in sp.batches(p):
                out += b.column(0).filter(pc.is_in(b.column(2), value_set=wanted)).to_pylist()
    return out


def _mirror_rows_of(
    data_dir: str, source: str, table: TableName, keys: list[str], step: int
) -> Iterator[pa.RecordBatch]:
    """The typed mirror rows of ``keys``, ``step`` keys a read."""
    from ...sinks.mirror_readers import mirror_rows_of

    for lo in range(0, len(keys), max(1, step)):
        t = mirror_rows_of(data_dir, source, table, keys[lo : lo + step])
        if t.num_rows:
            yield from t.to_batches()


def verify_keyed(job: VerifyJob, *, throttle: Throttle = DEFAULT_THROTTLE) -> VerifyResult:
    """The mirror against the source by row digests matched by key, for keys the mirror cannot
    order as the database does (text in a collation, composite keys).

    The source computes each row's digest in SQL and sends it with the row's key columns, in key
    order, ``chunk_rows`` rows a query (``Dialect.digests.row_digests_query``, throttled: ``delay_seconds``
    after each); the mirror's digests are computed by duckdb. Both wait in hash partitions of
    their canonical key (as :func:`verify_rows`'s do) and meet there: keys on one side only are
    missing or extra rows, and the chunks holding a missing row or a digest that differs are read
    again and compared row by row (:func:`compare`), which makes the report, the examples and the
    repair conf. No range is ever formed by comparing keys outside the database."""
    from ...sinks.mirror_readers import mirror_batches

    dialect, data_dir, source, table, schema = job.dialect, job.data_dir, job.source, job.table, job.schema
    chunk_rows, examples, partition_rows = job.chunk_rows, job.examples, job.partition_rows
    count, batches = mirror_batches(data_dir, source, table)
    parts = max(1, -(-(count or 0) // max(1, partition_rows)))
    digest = MirrorDigests(schema)
    src = _SourceChunks(dialect, schema, chunk_rows, throttle)
    try:
        with tempfile.TemporaryDirectory(prefix="cdc-verify-") as folder:
            mp = _Partitions(folder, "mirror", _MIRROR_H, parts)
            n_mirror = _mirror_digests(batches, digest, mp)
            sp = _Partitions(folder, "source", _SOURCE_H, parts)
            src.read_into(sp)
            found = _Found(examples)
            for p in range(parts):
                _compare_partition(mp.table(p), sp.batches(p), found)
            flagged = sorted(found.chunks)
            keys = _flagged_keys(sp, flagged)

            chunks = Numbered(
                flagged,
                lambda i: next(
                    source_chunks(dialect, schema, chunk_rows, after=src.afters[i], once=True), []
                ),
            )
            res = job.compare(
                chunks,
                _mirror_rows_of(data_dir, source, table, keys, partition_rows),
                count=len(keys),
                folder=folder,
                reread=chunks.reread,
                end_of=lambda c: src.end_of(chunks.kept[c]),
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
    res.digest_ranges = res.chunks = len(src.firsts)
    res.source_rows, res.mirror_rows = src.rows, n_mirror
    res.rows_checked = src.rows + res.extra
    return res
