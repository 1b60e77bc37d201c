"""Chunk reads (DBLog step 2): a keyset SELECT streamed through COPY into Parquet, rows decoded
to canonical values, key bounds and samples, and the hot standby rules; the dialect's ``chunks``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...core.errors import SourceBehindError, SourceError
from ...core.position import (
    Position,
    int_to_lsn,
    just_before,
    lsn_to_int,
    next_record_start,
    position_mark,
    standby_mark,
)
from ...core.schema import TableSchema
from ...core.visibility import ReplayedBefore
from ..base import (
    READ_FLOOR_MIRROR,
    READ_FLOOR_SNAPSHOT,
    ChunkReadResult,
    ReadSnapshot,
    TableScan,
    WholeTableRead,
)
from .catalog import PgCatalog
from .offsets import PgOffsets
from .server import PgServer
from .types import decoder, identity, pg_message, to_db

DEFAULT_COPY_BATCH_ROWS = 2_000
#: what to do when a standby did not reach a read floor in time, by what the floor stands for
WAIT_ADVICE = {
    READ_FLOOR_SNAPSHOT: "the task retries: check the standby's replication",
    READ_FLOOR_MIRROR: "check the standby's replication (or raise max_replica_lag_seconds) and verify "
    "again: a "
    "standby behind the mirror would show its lag as mismatches",
}


class PgChunkReader:
    """Read chunks and keys (on a connection of their own, REPEATABLE READ per chunk)."""

    def __init__(
        self,
        server: PgServer,
        catalog: PgCatalog,
        offsets: PgOffsets,
        *,
        max_replica_lag_seconds: float,
        copy_batch_rows: int,
        batch_max_bytes: int,
    ) -> None:
        self.server = server
        self.catalog = catalog
        self.offsets = offsets
        self.max_replica_lag_seconds = max_replica_lag_seconds
        self.copy_batch_rows = copy_batch_rows
        self.batch_max_bytes = batch_max_bytes
        #: tests only: called in a chunk's transaction between taking its snapshot and reading the
        #: position after it (an interleaving no real part produces on demand)
        self.read_snapshot_hook: Callable[[], None] | None = None
        self._read_floor: Position | None = None  # chunks from a standby: no older than this
        self._read_floor_why = READ_FLOOR_SNAPSHOT
        self._decoders_cache: dict = {}
        self._last_schema: TableSchema | None = None
        self._last_decoders: tuple = ()

    def stream_query(
        self, sql: str, params: Sequence[Any], batch_size: int = 10_000, snapshot: list | None = None
    ) -> Iterator[list[tuple]]:
        """A server-side (named) cursor declared after the call, in a transaction of its own: a
        fresh snapshot that sees everything visible before it, fetched ``batch_size`` rows at a
        time. Values come back as their text (see module docstring). ``snapshot``: the
        snapshot the query reads is recorded there first (:meth:`_read_snapshot`)."""
        import psycopg2

        conn = self.server.read_conn()
        done = False
        try:
            replayed = self.replayed_before_snapshot(conn)  # (a standby: not older than the floor)
            if snapshot is not None:
                with conn.cursor() as cur:
                    snapshot.append(self._read_snapshot(cur, replayed))
            with conn.cursor(name=f"cdc_{uuid.uuid4().hex}") as cur:
                cur.itersize = batch_size
                try:
                    cur.execute(sql, tuple(params))
                    while True:
                        box = [cur.fetchmany(batch_size)]
                        if not box[0]:
                            break
                        yield box.pop()  # no reference left here: the caller may free the batch
                except psycopg2.Error as exc:
                    raise SourceError(
                        f"PostgreSQL rejected the chunk query: {pg_message(exc)}\nSQL: {sql}"
                    ) from exc
            done = True
        finally:
            try:
                if done:
                    conn.commit()
                else:
                    conn.rollback()
            except psycopg2.Error:
                conn.close()

    def _copy_staged(
        self, cur: Any, schema: TableSchema, copy_sql: str, path: str
    ) -> tuple[int, tuple | None]:
        """Run ``copy_sql`` (a ``COPY (SELECT) TO STDOUT (FORMAT csv)``) on ``cur`` into a staged
        chunk file at ``path``, decoded per column with Arrow in batches bounded by rows and
        bytes (see :mod:`.pgcopy`): (rows, the last row's key)."""
        from ...storage.staged import ChunkWriter
        from .pgcopy import ChunkAssembler, read_csv_batch

        asm = ChunkAssembler(
            schema.column_names,
            [c.type for c in schema.columns],
            [decoder(c.type) for c in schema.columns],
            schema.primary_key,
        )
        state = {"rows": 0, "last": None, "pending": 0}
        buf = bytearray()  # COPY rows of the batch being filled (no object per row)
        batch_rows, batch_bytes = max(1, self.copy_batch_rows), self.batch_max_bytes

        with ChunkWriter(schema, path) as writer:

            def flush() -> None:
                if not state["pending"]:
                    return
                cols = read_csv_batch(buf, schema.column_names)
                buf.clear()
                state["pending"] = 0
                key, typed, text, last = asm.build_typed(cols)
                del cols
                writer.add_typed(key, typed, text)
                state["rows"] += len(key)
                state["last"] = last

            class _Sink:  # psycopg2 writes one COPY row per call
                def write(self, data: bytes) -> int:
                    buf.extend(data)
                    state["pending"] += 1
                    if state["pending"] >= batch_rows or len(buf) >= batch_bytes:
                        flush()
                    return len(data)

            cur.copy_expert(copy_sql, _Sink())
            flush()
        return state["rows"], state["last"]

    def read_chunk(self, schema: TableSchema, sql: str, params: Sequence[Any], path: str) -> ChunkReadResult:
        """DBLog step 2 through ``COPY (chunk SELECT) TO STDOUT (FORMAT csv)``, decoded per
        column with Arrow (see :mod:`.pgcopy`; same rows and bytes as the generic path,
        several times faster). The COPY runs in a transaction of its own begun after the low
        watermark committed, whose snapshot is recorded first (:meth:`_read_snapshot`)."""
        import psycopg2

        conn = self.server.read_conn()
        try:
            replayed = self.replayed_before_snapshot(conn)
            with conn.cursor() as cur:
                seen = self._read_snapshot(cur, replayed)
                copy_sql = f"COPY ({cur.mogrify(sql, tuple(params)).decode()}) TO STDOUT WITH (FORMAT csv)"
                rows, last = self._copy_staged(cur, schema, copy_sql, path)
            conn.commit()
        except psycopg2.Error as exc:
            self.server.reset_read_conn()
            raise SourceError(f"PostgreSQL rejected the chunk query: {pg_message(exc)}\nSQL: {sql}") from exc
        except BaseException:
            self.server.reset_read_conn()
            raise
        return ChunkReadResult(rows, last, seen.mark, seen.visibility)

    def read_whole(self, request: TableScan, select: str) -> WholeTableRead:
        """A whole-table refresh's read (Dialect.read_whole_table) in physical ``ctid`` ranges:
        one REPEATABLE READ transaction (one snapshot, recorded first as a chunk's is), the
        table's blocks split into spans of about ``rows_per_file`` rows by the planner's
        rows-per-page, each span one ``COPY (SELECT ... WHERE ctid >= '(a,0)' AND ctid <
        '(b,0)')`` (a TID range scan: it reads those blocks only) into a file of its own; the
        last span is open-ended. Duplicate rows are read as they are. ``select``: the SELECT of
        every row (:meth:`Dialect.whole_table_query`)."""
        import psycopg2

        schema, path_of, rows_per_file, progress = (
            request.schema, request.path_of, request.rows_per_file, request.progress
        )
        conn = self.server.read_conn()
        files: list[tuple[str, int]] = []
        try:
            replayed = self.replayed_before_snapshot(conn)
            with conn.cursor() as cur:
                seen = self._read_snapshot(cur, replayed)
                qt = self.server.quote_table(schema.table)
                cur.execute(
                    "SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint, c.reltuples, "
                    "c.relpages FROM pg_class c WHERE c.oid = %s::regclass",
                    (qt,),
                )
                blocks, tuples, pages = cur.fetchone()  # (as text: the chunk connection's values)
                blocks, tuples, pages = int(blocks), float(tuples), int(pages)
                per_block = tuples / pages if pages > 0 and tuples > 0 else 50.0
                span = max(1, int(rows_per_file / max(per_block, 1.0)))
                start = 0
                while True:
                    end = start + span
                    cond = f"ctid >= '({start},0)'::tid"
                    if end < blocks:
                        cond += f" AND ctid < '({end},0)'::tid"
                    copy_sql = f"COPY ({select} WHERE {cond}) TO STDOUT WITH (FORMAT csv)"
                    rows, _last = self._copy_staged(cur, schema, copy_sql, path_of(len(files)))
                    files.append((path_of(len(files)), rows))
                    if progress is not None:
                        progress(sum(n for _p, n in files))
                    if end >= blocks:
                        break
                    start = end
            conn.commit()
        except psycopg2.Error as exc:
            self.server.reset_read_conn()
            raise SourceError(
                f"table {schema.table}: PostgreSQL rejected the whole-table read: {pg_message(exc)}"
            ) from exc
        except BaseException:
            self.server.reset_read_conn()
            raise
        return WholeTableRead(tuple(files), seen.mark, seen.visibility)

    def read_floor(self) -> Position | None:
        """Chunks from a hot standby: the primary's position now (after the slot exists and after
        any convergence mark): a standby that has not replayed that far may miss changes older
        than the slot, which no window could then drop."""
        return None if self.server.read_params is None else self.offsets.mark_position()

    def read_no_older_than(self, position: Position, why: str = READ_FLOOR_SNAPSHOT) -> None:
        self._read_floor = position
        self._read_floor_why = why

    def replayed_before_snapshot(self, conn: Any) -> str | None:
        """Chunks from a hot standby: its replay position, read in a transaction of its own before
        the chunk's (whose snapshot then sees every commit record before it: core/visibility.py,
        ReplayedBefore); None when chunks are read from the primary. First waits until the standby
        has replayed up to the floor (:meth:`read_no_older_than`: the snapshot's read floor or
        convergence mark, so that the chunk's own mark is not older than it; for verify, what the
        mirror has applied); at most ``max_replica_lag_seconds``, then fails saying how far behind
        the standby is. A source whose own connection is a hot standby (capture from a standby,
        PostgreSQL 16+) reads its chunks there under the same rules, with no floor of its own: its
        slot decodes only what that standby replayed."""
        if not self.server.chunks_on_standby:
            return None
        deadline = time.monotonic() + self.max_replica_lag_seconds
        while True:
            replay = self._standby_row(conn, "SELECT pg_last_wal_replay_lsn()::text")[0]
            if replay is None:  # (only in recovery is there a replay position)
                raise SourceError(self._not_a_standby)
            # (the floor stays: a reconnect may reach another standby, not as far on)
            if (
                self._read_floor is None
                or just_before(
                    Position.pg(next_record_start(lsn_to_int(replay), *self.server.wal_geometry()))
                )
                >= self._read_floor
            ):
                return replay
            if time.monotonic() >= deadline:
                raise SourceBehindError(self._behind_the_floor(conn, replay))  # retried: it may catch up
            time.sleep(0.02)

    def _behind_the_floor(self, conn: Any, replay: str) -> str:
        """Why a read waited out ``max_replica_lag_seconds``: which standby, how far behind the
        floor, whether its replay is paused, and what to do."""
        why = self._read_floor_why
        floor = self._read_floor
        behind = max(0, floor.major - lsn_to_int(replay))
        state = ""
        try:
            paused, seconds = self._standby_row(
                conn,
                "SELECT pg_is_wal_replay_paused(), extract(epoch FROM now() - "
                "pg_last_xact_replay_timestamp())",
            )
            if paused in (True, "t"):
                state += ", its replay is paused (pg_wal_replay_resume())"
            if seconds is not None:
                state += f", its last replayed transaction committed {float(seconds):,.0f} s ago"
        except Exception:  # noqa: BLE001 - the error below says what is known
            pass
        p = self.server.read_params or self.server.params
        which = (
            "the connection extra chunk_conn_id"
            if self.server.read_params is not None
            else "the source's connection"
        )
        advice = WAIT_ADVICE.get(why, WAIT_ADVICE[READ_FLOOR_SNAPSHOT])
        return (
            f"source {self.server.source!r}: the hot standby chunks are read from ({p.host}:"
            f"{p.port or 5432}, "
            f"{which}) has not replayed up to {why} ({int_to_lsn(floor.major)}; "
            f"replayed {replay}, {behind:,} bytes behind it{state}) within "
            f"max_replica_lag_seconds={self.max_replica_lag_seconds:g}; {advice}"
        )

    @property
    def _not_a_standby(self) -> str:
        if self.server.read_params is None:
            return (
                f"source {self.server.source!r}: the source's server was a hot standby when this run "
                "started and is not "
                "in recovery any more (promoted): the task retries, reading it as a primary"
            )
        return (
            f"source {self.server.source!r}: the chunk connection is not a hot standby (it is not in "
            "recovery); name a "
            "standby of the source, or remove chunk_conn_id"
        )

    def _standby_row(self, conn: Any, sql: str) -> tuple:
        """One row from the chunk connection between chunks, in a transaction of its own (a
        chunk's REPEATABLE READ snapshot is taken by the next one)."""
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchone()
        finally:
            conn.rollback()

    def _read_snapshot(self, cur: Any, replayed: str | None) -> ReadSnapshot:
        """The first statement of a chunk's REPEATABLE READ transaction: it takes the snapshot the
        chunk's SELECT then reads, and records which transactions it sees: on a primary
        ``pg_current_snapshot()``; on a hot standby ``replayed``, the replay position read before
        it (core/visibility.py: a standby's snapshot lists no running xid). The next statement reads
        the position after it: the WAL insert position (on a standby its replay position, where
        transactions become visible as their commit records are replayed). Under watermark
        strategy "log" that position bounds the window: every transaction whose commit record lies
        before it is in the staged changelog before the chunk's rows and is checked against what
        the snapshot saw (dropped from the chunk when it did not see it); every one after it comes
        after the rows. The same check makes a standby that lags behind the primary's watermarks
        safe: what it had not replayed yet is dropped from the chunk, not written over newer rows."""
        cur.execute("SELECT pg_current_snapshot()::text, pg_is_in_recovery()")
        visibility, recovering = cur.fetchone()
        standby = recovering in (True, "t")  # (the chunk connection returns every value as its text)
        if self.server.read_params is not None and not standby:  # promoted since it was asked
            raise SourceError(self._not_a_standby)
        if standby:
            if replayed is None:  # (read as a primary's when the run started)
                raise SourceError(
                    f"source {self.server.source!r}: the source's connection reached a hot standby in the "
                    "middle of a run that started on a primary: the task retries"
                )
            visibility = ReplayedBefore.text(replayed)
        if self.read_snapshot_hook is not None:
            self.read_snapshot_hook()
        if standby:
            cur.execute("SELECT pg_last_wal_replay_lsn()::text, pg_last_wal_receive_lsn()::text")
            replay, received = cur.fetchone()
            at = standby_mark(
                lsn_to_int(replay),
                None if received is None else lsn_to_int(received),
                *self.server.wal_geometry(),
            )
        else:
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            at = just_before(Position.pg(cur.fetchone()[0]))
        return ReadSnapshot(position_mark(at, int(time.time() * 1000)), visibility)

    def replica_lag(self) -> tuple[int, float] | None:
        """(bytes, seconds) the standby chunks are read from (a ``chunk_conn_id`` standby, or the
        source itself when it is a hot standby capture reads) is behind its primary; None when
        chunks are read from a primary. Seconds: since the last transaction it replayed, 0
        when it has replayed everything the primary has written."""
        if self.server.read_params is None:
            if not self.server.on_standby:
                return None
            # the source itself is a hot standby (capture and chunks read there): how much of what
            # it received it has not replayed yet, and for how long (a receiver that stopped, e.g.
            # its primary failed: not replicating). Any role may ask these; pg_stat_wal_receiver
            # shows its details only to pg_read_all_stats (NULL to others: taken as streaming).
            # A receiver says "streaming" from the moment it starts, before its primary said
            # anything: until a first message its send and receipt times are the one value it
            # started with, and latest_end_lsn is still the previous primary's. A primary it
            # cannot follow (its timeline forked before what this standby replayed) makes the
            # receiver cycle: "streaming" while that primary sends the old timeline up to the fork,
            # then "waiting"; what it last said its WAL ends at lies before what this standby
            # replayed, which no primary it follows can say. Neither receiver replicates
            received, replay, seconds, receiving = self.server.query(
                "SELECT pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text, "
                "extract(epoch FROM now() - pg_last_xact_replay_timestamp()), "
                "EXISTS (SELECT 1 FROM pg_stat_wal_receiver "
                "WHERE coalesce(status, 'streaming') = 'streaming' AND (last_msg_receipt_time IS NULL "
                "OR (last_msg_send_time <> last_msg_receipt_time "
                "AND latest_end_lsn >= pg_last_wal_replay_lsn())))"
            )[0]
            if received is None or not receiving:
                return 0, float("inf")
            behind = max(0, lsn_to_int(received) - lsn_to_int(replay or "0/0"))
            return behind, (float(seconds or 0.0) if behind else 0.0)
        primary = lsn_to_int(self.server.query("SELECT pg_current_wal_lsn()::text")[0][0])
        recovering, replay, seconds = self._standby_row(
            self.server.read_conn(),
            "SELECT pg_is_in_recovery(), pg_last_wal_replay_lsn()::text, "
            "extract(epoch FROM now() - pg_last_xact_replay_timestamp())",
        )
        if recovering in (False, "f"):  # (the chunk connection returns every value as its text)
            raise SourceError(self._not_a_standby)
        behind = max(0, primary - lsn_to_int(replay or "0/0"))
        return behind, (float(seconds or 0.0) if behind else 0.0)

    def _decoders(self, schema: TableSchema) -> tuple:
        if schema is self._last_schema:  # the hot path: rows of one chunk
            return self._last_decoders
        key = (schema.table, schema.columns)
        decs = self._decoders_cache.get(key)
        if decs is None:
            decs = tuple((c.name, decoder(c.type)) for c in schema.columns)
            self._decoders_cache[key] = decs
        self._last_schema, self._last_decoders = schema, decs
        return decs

    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        return {
            name: (v if v is None or dec is identity else dec(v))
            for (name, dec), v in zip(self._decoders(schema), row, strict=True)
        }

    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        """Canonical -> bound value. Text literals are typed by the column they are compared
        with, so most values bind as strings (floats too: ``1.1`` as a numeric literal
        would not equal the float4 1.1)."""
        if value is None:
            return None
        t = schema.column(column).type
        return to_db(t, value)

    def max_key(self, schema: TableSchema, where: tuple[str, list] | None = None) -> tuple | None:
        """``where``: a rendered row filter ``(sql, params)``."""
        pk = [self.server.quote_ident(k) for k in schema.primary_key]
        sql = f"SELECT {', '.join(pk)} FROM {self.server.quote_table(schema.table)}"  # noqa: S608
        params: list = []
        if where:
            cond, params = where
            sql += f" WHERE {cond}"
        sql += " ORDER BY " + ", ".join(f"{k} DESC" for k in pk) + " LIMIT 1"
        return next(iter(self._key_rows(schema, sql, params)), None)

    def _key_rows(self, schema: TableSchema, sql: str, params: Sequence[Any]) -> list[tuple]:
        decs = [decoder(schema.column(k).type) for k in schema.primary_key]
        out = []
        for batch in self.stream_query(sql, params):
            for row in batch:
                out.append(tuple(None if v is None else d(v) for d, v in zip(decs, row, strict=True)))
        return out

    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        """TABLESAMPLE SYSTEM reads a few random pages (about 4 x ``count`` of them), not the
        table; the sorted sample is then thinned to ``count`` evenly spaced keys."""
        if count <= 0:
            return []
        rel = self.catalog.relation(schema.table)
        if rel is None:
            raise SourceError(f"table {schema.table} not found")
        pages = self.server.query(  # every partition of a partitioned table (or the table itself)
            # pg_partition_tree() has no rows for a plain table: then the table's own size
            "SELECT (greatest(coalesce((SELECT sum(pg_relation_size(relid)) FROM "
            "pg_partition_tree(%s::oid)), 0), "
            "pg_relation_size(%s::oid)) / current_setting('block_size')::bigint)::bigint",
            (rel[0], rel[0]),
        )[0][0]
        if not pages:
            return []
        pct = min(100.0, 100.0 * max(4 * count, 8) / pages)
        pk = ", ".join(self.server.quote_ident(k) for k in schema.primary_key)
        sql = (
            f"SELECT {pk} FROM {self.server.quote_table(schema.table)} TABLESAMPLE SYSTEM (%s) "  # noqa: S608
            f"REPEATABLE (7) ORDER BY {pk}"
        )
        keys = self._key_rows(schema, sql, [pct])
        if len(keys) <= count:
            return keys
        step = len(keys) / count
        # in the database's order (Python cannot order NaN, infinities or BC dates like it)
        return [keys[i] for i in sorted({int(i * step + step / 2) for i in range(count)})]
