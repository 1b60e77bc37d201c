"""verify's entry: which compare a table gets (:func:`verify_table`), and the row-by-row one."""

from __future__ import annotations

import tempfile

from ...core.errors import ConfigurationError
from ...core.position import Position
from ...core.ranges import ranges_by_key_order
from ...core.schema import TableName
from ...core.throttle import Throttle
from .compare import (
    DEFAULT_CHUNK_ROWS,
    DEFAULT_THROTTLE,
    EXAMPLES,
    PARTITION_ROWS,
    VerifyJob,
    VerifyResult,
    source_chunks,
)
from .digests import DIGEST_RANGE_ROWS, digest_problems, verify_digests
from .keyed import verify_keyed


def mirror_position(data_dir: str, source: str, table: TableName) -> Position | None:
    """The newest position the mirror of ``table`` reflects: how far it has applied the staged
    changelog (its sink marker, every table of the source) or the newest row it stores (a chunk
    row may sit past the marker), whichever is later; None when it has neither."""
    from ...sinks.base import read_marker
    from ...sinks.mirror_readers import newest_position

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
    from ...dialects.base import READ_FLOOR_MIRROR

    if method not in ("auto", "rows", "digests"):
        raise ConfigurationError(f"verify method must be 'auto', 'rows' or 'digests', got {method!r}")
    schema = dialect.describe_table(table)
    if schema.multiset:  # a table without a key: its copies per row (pipeline/multiset.py)
        from ..multiset import verify_multiset

        return verify_multiset(dialect, data_dir, source, table, schema)
    floor = mirror_position(data_dir, source, table)
    if floor is not None:
        dialect.read_no_older_than(floor, READ_FLOOR_MIRROR)
    why = [] if method == "rows" else digest_problems(dialect, schema)
    if method == "digests" and why:
        raise ConfigurationError(f"table {table}: no digest verify: {'; '.join(why)}")
    job = VerifyJob(dialect, data_dir, source, table, schema, chunk_rows, examples, partition_rows)
    if method == "rows" or why:
        res = verify_rows(job)
        res.method_note = "; ".join(why)
        return res
    if not ranges_by_key_order(schema):
        return verify_keyed(job, throttle=throttle or DEFAULT_THROTTLE)
    return verify_digests(job, throttle=throttle or DEFAULT_THROTTLE, range_rows=range_rows)


def verify_rows(job: VerifyJob) -> VerifyResult:
    """Every row canonicalised in Python on both sides and compared by key (the reference the
    digests are checked against): the mirror is read a batch at a time and both sides' digests
    wait in hash partitions on local scratch disk."""
    from ...sinks.mirror_readers import mirror_batches

    count, batches = mirror_batches(job.data_dir, job.source, job.table)
    dialect, schema, chunk_rows = job.dialect, job.schema, job.chunk_rows
    with tempfile.TemporaryDirectory(prefix="cdc-verify-") as folder:

        def reread(_i: int, after: tuple | None) -> list[tuple[str, dict]]:
            return next(source_chunks(dialect, schema, chunk_rows, after=after, once=True), [])

        chunks = source_chunks(dialect, schema, chunk_rows)
        return job.compare(chunks, batches, count=count, folder=folder, reread=reread)
