"""Range digests: the source sums row digests per key range in SQL, the mirror's are computed by
duckdb, and only ranges that differ are read row by row."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...core.ranges import FULL_RANGE
from ...core.row_digest import digest_input as _digest_input
from ...core.row_digest import mirror_digest_sql
from ...core.schema import TableSchema, encode_key
from ...core.throttle import Throttle
from .compare import (
    _MASK64,
    DEFAULT_THROTTLE,
    Numbered,
    VerifyJob,
    VerifyResult,
)

#: source rows of a top-level digest range: the source returns (count, XOR of the rows' digests)
#: per range; a range that differs is split into DIGEST_FANOUT sub-ranges, recursively, until a
#: range holds at most ``chunk_rows`` source rows: those rows are compared as :func:`verify_rows` does
DIGEST_RANGE_ROWS = 500_000
DIGEST_FANOUT = 16
#: splits of one range at most (a source changing under the verify cannot make it endless)
DIGEST_MAX_DEPTH = 12


def digest_problems(dialect, schema: TableSchema) -> list[str]:
    """Why ``schema``'s table is verified row by row rather than by digests (empty: it is not):
    the source must compute a digest form of every column (core/row_digest.py, the digest forms)."""
    return list(dialect.digests.digest_problems(schema))


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
    worker thread's own (``Dialect.digests.digest_session``), throttled as a snapshot's chunks are:
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
            conn = self._local.conn = self.dialect.digests.digest_session()
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
        sql, params = self.dialect.digests.key_boundary_query(
            self.schema,
            after_key=None if after is None else (after,),
            upto_key=None if upto is None else (upto,),
            offset=offset,
        )
        rows = self._rows(sql, params)
        return int(rows[0][0]) if rows else None

    def digest(self, after: int | None, upto: int | None) -> tuple[int, int]:
        """(rows, XOR of their digests as uint64) of the keys in (after, upto]."""
        sql, params = self.dialect.digests.range_digest_query(
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


Range = tuple[int | None, int | None]


class _RangeDescent:
    """:func:`verify_digests`'s work on one table: the source's top-level key ranges and their
    digests against the mirror's (step 2), then the descent into ranges that differ (step 3)."""

    def __init__(self, job: VerifyJob, throttle: Throttle) -> None:
        dialect, schema = job.dialect, job.schema
        self.dialect, self.data_dir, self.source, self.table, self.schema = (
            dialect,
            job.data_dir,
            job.source,
            job.table,
            schema,
        )
        self.chunk_rows, self.partition_rows = job.chunk_rows, job.partition_rows
        self.src = SourceDigests(dialect, schema, throttle)
        self.digest = MirrorDigests(schema)
        self.ranges: list[Range] = []
        self.leaves: list[Range] = []  # the smallest ranges that differ, read row by row
        self.range_count = 0

    def close(self) -> None:
        self.src.close()
        self.digest.close()

    def split(self, after: int | None, upto: int | None, step: int) -> list[Range]:
        """(after, upto] cut every ``step`` keys at the source's boundaries, in its order."""
        subs: list[Range] = []
        a = after
        while True:
            b = self.src.boundary(a, upto, max(1, step) - 1)
            if b is None or b == upto:
                subs.append((a, upto))
                break
            subs.append((a, b))
            a = b
        self.range_count += len(subs)
        return subs

    def mirror_rows(
        self, wanted: np.ndarray | None = None
    ) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]]:
        """(typed rows, their keys, digests, range numbers) a batch at a time; ``wanted``: only
        the rows of these ranges."""
        from ...sinks.mirror_readers import mirror_batches

        key = self.schema.primary_key[0]
        lasts = np.array([b for _a, b in self.ranges[:-1]], dtype=np.int64)
        _count, batches = mirror_batches(self.data_dir, self.source, self.table)
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
            yield rows, keys, self.digest(rows), rid

    def top_level(self, range_rows: int) -> None:
        """Step 1 and 2: the ranges, the source's digests on the workers and the mirror's here
        meanwhile; sets ``differ``, the ranges whose digests differ."""
        self.ranges = self.split(None, None, range_rows)
        futures = self.src.digests(self.ranges)
        self.m_count = np.zeros(len(self.ranges), dtype=np.int64)
        m_xor = np.zeros(len(self.ranges), dtype=np.uint64)
        for _rows, _keys, h, rid in self.mirror_rows():
            self.m_count += np.bincount(rid, minlength=len(self.ranges))
            np.bitwise_xor.at(m_xor, rid, h)
        self.s_digests = [f.result() for f in futures]
        self.differ = [
            i for i, (n, x) in enumerate(self.s_digests) if (n, x) != (int(self.m_count[i]), int(m_xor[i]))
        ]

    def descend(
        self,
        after: int | None,
        upto: int | None,
        n: int,
        mkeys: np.ndarray,
        mh: np.ndarray,
        idx: np.ndarray,
        depth: int,
    ) -> Iterator[np.ndarray]:
        """Rows of the sub-ranges of (after, upto] that differ, as indices into the held mirror rows."""
        if n <= self.chunk_rows or depth >= DIGEST_MAX_DEPTH:
            self.leaves.append((after, upto))
            yield idx
            return
        subs = self.split(after, upto, max(self.chunk_rows, -(-n // DIGEST_FANOUT)))
        for (a, b), f in zip(subs, self.src.digests(subs), strict=True):
            sn, sx = f.result()
            sel = idx[_in_range(mkeys[idx], a, b)]
            if (sn, sx) != (len(sel), _xor(mh[sel])):
                yield from self.descend(a, b, sn, mkeys, mh, sel, depth + 1)

    def _groups(self) -> list[list[int]]:
        """The ranges that differ, in groups holding at most ``partition_rows`` source rows."""
        groups: list[list[int]] = []
        held = 0
        for i in self.differ:
            if not groups or (groups[-1] and held + self.s_digests[i][0] > self.partition_rows):
                groups.append([])
                held = 0
            groups[-1].append(i)
            held += self.s_digests[i][0]
        return groups

    def leaf_mirror_rows(self) -> Iterator[pa.RecordBatch]:
        """Step 3: the typed mirror rows of the leaves that differ, a group of ranges at a time."""
        for g in self._groups():
            parts = list(self.mirror_rows(np.array(g, dtype=np.int64)))
            if not parts:
                rows, mkeys = None, np.zeros(0, dtype=np.int64)
                mh, mrid = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
            else:
                rows = pa.concat_tables([p[0] for p in parts])
                mkeys, mh, mrid = (np.concatenate([p[j] for p in parts]) for j in (1, 2, 3))
            for i in g:
                a, b = self.ranges[i]
                for idx in self.descend(a, b, self.s_digests[i][0], mkeys, mh, np.flatnonzero(mrid == i), 0):
                    if len(idx) and rows is not None:
                        yield from rows.take(pa.array(idx)).to_batches()

    def end_of(self, leaf: Range) -> tuple | None:
        """The first source key after ``leaf`` (where a repair range of it ends)."""
        upto = leaf[1]
        nxt = None if upto is None else self.src.boundary(upto, None, 0)
        return None if nxt is None else (nxt,)


def verify_digests(
    job: VerifyJob, *, throttle: Throttle = DEFAULT_THROTTLE, range_rows: int = DIGEST_RANGE_ROWS
) -> VerifyResult:
    """The mirror against the source by range digests (the work where the data is).

    1. The source's key boundaries every ``range_rows`` keys, from its own keyset order
       (``Dialect.digests.key_boundary_query``); ranges are (previous boundary, boundary].
    2. Each range's (row count, XOR of row digests) computed by the source in one aggregate
       (``Dialect.digests.range_digest_query``), on the throttled workers, while the mirror is read once:
       its rows' digests computed by duckdb (:class:`MirrorDigests`) and summed up per range
       (a row's range found by comparing integer keys, vectorised).
    3. Ranges whose digests differ are read again from the mirror (as many at once as hold
       ``partition_rows`` source rows) and split into DIGEST_FANOUT sub-ranges on both sides,
       recursively, down to ranges of at most ``chunk_rows`` source rows; those rows are compared
       as :func:`verify_rows` compares them (:func:`compare`), which makes the report, the
       examples and the repair conf (a digest that differs while the rows are equal counts
       nothing)."""

    dialect, schema = job.dialect, job.schema
    work = _RangeDescent(job, throttle)
    try:
        work.top_level(range_rows)
        leaves = Numbered(work.leaves, lambda leaf: _source_rows(dialect, schema, *leaf))
        with tempfile.TemporaryDirectory(prefix="cdc-verify-") as folder:
            res = job.compare(
                leaves,
                work.leaf_mirror_rows(),
                count=int(sum(work.m_count[i] for i in work.differ)),
                folder=folder,
                reread=leaves.reread,
                end_of=lambda c: work.end_of(leaves.kept[c]),
            )
    finally:
        work.close()
    res.method = "digests"
    res.digest_ranges = work.range_count
    res.source_rows = sum(n for n, _x in work.s_digests)
    res.chunks = -(
        -res.source_rows // job.chunk_rows
    )  # the table in chunks of chunk_rows, as verify_rows reads it
    res.mirror_rows = int(work.m_count.sum())
    res.rows_checked = res.source_rows + res.extra
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
