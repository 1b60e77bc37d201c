"""The shared integration suite: every dialect runs these tests against its real server.

Written once against the :class:`~airflow_provider_cdc.dialects.base.Dialect` interface;
a dialect's test module subclasses :class:`DialectSuite` and provides the hooks below.
pytest collects the subclass (its name starts with ``Test``), never this base.

Hooks a subclass provides (keep them small)::

    class TestPostgresDialect(DialectSuite):
        table_schema = "public"                       # schema / database for test tables
        sql_types = {"int": "integer", "text": "text"}  # generic -> SQL type names

        @pytest.fixture
        def source_uri(self, pg_uri): return pg_uri   # the server under test

        def make_dialect(self, uri, *, source, tables, watermark_table): ...
            # a Dialect for ``source``, capturing (at least) ``tables`` (list[TableName]),
            # with its watermark table named ``watermark_table`` in the default schema
        def connect(self, uri, *, autocommit): ...    # plain DB-API connection (%s params)
        def type_parity_cases(self): ...             # list[ParityCase]
        def cleanup_capture(self, dialect): ...      # optional: drop slot / publication
        def is_deadlock(self, exc): ...               # optional: writer errors to retry
        def drop_session(self, ctx, dialect): ...     # optional: the server ends the dialect's session

What the dialect must do, as these tests read it:

* ``dialect.load_offset(data_dir)`` starts capture (creates the slot / records the
  binlog position): changes committed after it returns are in the next ``capture()``.
* A ``where`` filter that the database rejects (unknown column...) raises ``SourceError``;
  one that could end the statement raises ``ConfigurationError`` before any SQL runs.
* ``describe_table`` of a missing table raises ``SourceError`` naming the table; of a
  table without primary key, ``SourceError`` mentioning "primary key".
"""

from __future__ import annotations

import os
import random
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.core.errors import ConfigurationError, SourceError
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.ranges import FULL_RANGE, ChunkRange
from airflow_provider_cdc.core.schema import TableName, decode_key, decode_row, encode_key
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.dialects.base import ChunkRead, Dialect
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.snapshot import GapHooks, snapshot_chunk
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments, read_chunk_rows, read_log_events


@dataclass(frozen=True)
class ParityCase:
    """One column of the type-parity table: inserted as ``sql_literal`` (an SQL
    expression), it must read back as ``expected`` (canonical) through both paths."""

    column: str
    sql_type: str
    sql_literal: str
    expected: Any


@dataclass
class Ctx:
    """Per-test helpers; everything created through it is dropped afterwards."""

    suite: DialectSuite
    uri: str
    unique: str
    data_dir: str
    tables: list[TableName] = field(default_factory=list)
    dialects: list[Dialect] = field(default_factory=list)

    @property
    def source(self) -> str:
        return f"s{self.unique}"

    @property
    def watermark_table(self) -> str:
        return f"wm_{self.unique}"

    def dialect(self, tables: list[TableName] | None = None, **options: Any) -> Dialect:
        d = self.suite.make_dialect(
            self.uri, source=self.source, tables=list(tables or []), watermark_table=self.watermark_table,
            **options,
        )
        self.dialects.append(d)
        return d

    def q(self, name: str) -> str:
        return self.suite.quoter.quote_ident(name)

    def qt(self, table: TableName) -> str:
        return self.suite.quoter.quote_table(table)

    def execute(self, sql: str, params: tuple | list = ()) -> list[tuple]:
        conn = self.suite.connect(self.uri, autocommit=True)
        try:
            cur = conn.cursor()
            cur.execute(sql, tuple(params))
            return list(cur.fetchall()) if cur.description else []
        finally:
            conn.close()

    def create_table(self, base: str, columns: list[tuple[str, str]], pk: list[str] | None) -> TableName:
        """``columns``: (name, SQL type or a generic name from ``sql_types``)."""
        t = TableName(self.suite.table_schema, f"{base}_{self.unique}" if base else self.unique)
        types = self.suite.sql_types
        cols = [f"{self.q(c)} {types.get(ty, ty)}" for c, ty in columns]
        if pk:
            cols.append(f"PRIMARY KEY ({', '.join(self.q(k) for k in pk)})")
        self.execute(f"CREATE TABLE {self.qt(t)} ({', '.join(cols)})")
        self.tables.append(t)
        return t

    def capture_all(self, d: Dialect) -> list:
        """Drain until the log is empty; return every staged event in position order."""
        stage_changelog(d, self.data_dir)
        return list(read_log_events(changelog_dir(self.data_dir, self.source)))

    def source_rows(self, d: Dialect, table: TableName) -> dict[str, dict]:
        """The table now, as canonical key -> row, read through the dialect's chunk path."""
        schema = d.describe_table(table)
        path = f"{self.data_dir}/verify-{table.name}-{time.monotonic_ns()}.parquet"
        d.read_chunk(ChunkRead(schema, FULL_RANGE, after_key=None, limit=10**9, path=path))
        return dict(read_chunk_rows(path, table.id))


def _is_duplicate_key(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "duplicate key" in text or "duplicate entry" in text


def chunks_with_capture(d: Dialect, table: TableName, data_dir: str, after, seq: int, count: int,
                        chunk_size: int) -> tuple[list, object, bool]:
    """Up to ``count`` chunks of ``table`` from ``after`` (chunk numbers from ``seq``), a capture
    every third one as in production; (results, the key to go on after, exhausted)."""
    schema = d.describe_table(table)
    results = []
    for _ in range(count):
        res = snapshot_chunk(d, schema, FULL_RANGE, data_dir=data_dir, snapshot_id="snap", seq=seq,
                             limit=chunk_size, after_key=after)
        results.append(res)
        seq += 1
        if seq % 3 == 0:
            stage_changelog(d, data_dir)
        if res.exhausted:
            return results, None, True
        after = res.last_key
    return results, after, False


def table_events(events: list, table: TableName) -> list[ChangeEvent]:
    return [e for e in events if isinstance(e, ChangeEvent) and e.table == table.id]


class DialectSuite(ABC):
    table_schema: str = "public"
    sql_types: dict[str, str] = {"int": "integer", "text": "text"}

    # --- hooks ------------------------------------------------------------------------
    @pytest.fixture
    def source_uri(self) -> str:  # pragma: no cover - overridden
        raise NotImplementedError

    @abstractmethod
    def make_dialect(
        self, uri: str, *, source: str, tables: list[TableName], watermark_table: str, **options: Any
    ) -> Dialect: ...

    #: the watermark strategies (dialect option ``watermark_strategy``) this database supports
    watermark_strategies: tuple[str, ...] = ("table",)

    @abstractmethod
    def connect(self, uri: str, *, autocommit: bool) -> Any: ...

    @abstractmethod
    def type_parity_cases(self) -> list[ParityCase]: ...

    def is_deadlock(self, exc: BaseException) -> bool:
        """Optional hook: ``exc`` made the server roll a concurrent writer back (deadlock
        victim); the random writers retry such transactions instead of failing the test.
        The default recognises the usual messages of PostgreSQL and MySQL/MariaDB."""
        text = f"{type(exc).__name__} {exc}".lower()
        return "deadlock" in text or "could not serialize" in text or "lock wait timeout" in text

    def cleanup_capture(self, dialect: Dialect) -> None:  # noqa: B027 - optional hook
        """Drop what ``load_offset`` created on the server (e.g. a replication slot)."""

    def drop_session(self, ctx: Ctx, dialect: Dialect) -> None:
        """Optional hook: the server ends ``dialect``'s own session from another one (as a
        primary that stops or fails over does) and it is gone when this returns."""
        pytest.skip("this suite cannot end a session on its server")

    # --- plumbing ---------------------------------------------------------------------
    @pytest.fixture
    def ctx(self, source_uri, unique_name, tmp_path):
        c = Ctx(self, source_uri, unique_name, str(tmp_path / "data"))
        self.quoter = self.make_dialect(source_uri, source="quoter", tables=[], watermark_table="unused")
        yield c
        for d in c.dialects:
            try:
                self.cleanup_capture(d)
            finally:
                d.close()
        self.quoter.close()
        for t in reversed(c.tables):
            c.execute(f"DROP TABLE IF EXISTS {c.qt(t)}")
        wm = TableName(c.dialects[0].watermark_table.schema if c.dialects else "cdc", c.watermark_table)
        c.execute(f"DROP TABLE IF EXISTS {c.qt(wm)}")

    def _kv_table(self, ctx: Ctx, rows: int, base: str = "t") -> TableName:
        t = ctx.create_table(base, [("id", "int"), ("v", "text"), ("n", "int")], ["id"])
        self._kv_rows(ctx, t, rows)
        return t

    @staticmethod
    def _kv_rows(ctx: Ctx, t: TableName, rows: int) -> None:
        """Rows 1..``rows`` of an (id, v, n) table."""
        if rows:
            ctx.execute(
                f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}) VALUES "
                + ", ".join(["(%s, %s, %s)"] * rows),
                [x for i in range(1, rows + 1) for x in (i, f"v{i}", i * 10)],
            )

    # --- watermarks -------------------------------------------------------------------
    def test_watermarks_appear_in_commit_order_among_concurrent_transactions(self, ctx):
        t = self._kv_table(ctx, 0)
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        d.load_offset(ctx.data_dir)
        ins = f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}) VALUES (%s, %s, %s)"

        # T begins before the low watermark and commits after it: its row must follow lw.
        conn = self.connect(ctx.uri, autocommit=False)
        try:
            conn.cursor().execute(ins, (1, "a", 1))
            d.write_watermark("lw-1")
            conn.cursor().execute(ins, (2, "b", 2))
            conn.commit()
        finally:
            conn.close()
        d.write_watermark("hw-1")

        # Several threads, each on its own dialect (own connections), write watermarks
        # while another writes rows: each thread's watermarks keep their order.
        per_thread = 5
        errors: list[BaseException] = []

        def wm_writer(n: int) -> None:
            try:
                with ctx.suite.make_dialect(
                    ctx.uri, source=ctx.source, tables=[t], watermark_table=ctx.watermark_table
                ) as w:
                    for i in range(per_thread):
                        w.write_watermark(f"t{n}-{i}")
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        def row_writer() -> None:
            c = self.connect(ctx.uri, autocommit=False)
            try:
                for i in range(10, 30):
                    c.cursor().execute(ins, (i, f"r{i}", i))
                    if i % 3 == 0:
                        c.commit()
                c.commit()
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                c.close()

        threads = [threading.Thread(target=wm_writer, args=(n,)) for n in range(3)] + [
            threading.Thread(target=row_writer)
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors

        events = ctx.capture_all(d)
        positions = [e.position for e in events]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        mine = [e for e in events if isinstance(e, WatermarkEvent) or e.table == t.id]
        labels = [
            f"wm:{e.id}" if isinstance(e, WatermarkEvent) else f"row:{decode_key(e.key)[0]}" for e in mine
        ]
        assert labels[:4] == ["wm:lw-1", "row:1", "row:2", "wm:hw-1"], labels[:6]
        wms = [e.id for e in mine if isinstance(e, WatermarkEvent)]
        for n in range(3):
            assert [w for w in wms if w.startswith(f"t{n}-")] == [f"t{n}-{i}" for i in range(per_thread)]
        assert len(wms) == 2 + 3 * per_thread
        assert sorted(decode_key(e.key)[0] for e in mine if isinstance(e, ChangeEvent)) == [
            1,
            2,
            *range(10, 30),
        ]

    # --- the DBLog window under concurrent writes -------------------------------------
    def test_chunks_under_concurrent_writes_merge_to_the_source(self, ctx):
        results, reads = self._chunks_under_concurrent_writes(ctx)
        assert len(reads) < sum(r.rows for r in results), "forced in-window writes must drop keys"

    def test_chunks_without_writes_under_concurrent_writes_merge_to_the_source(self, ctx):
        """Watermark strategy "log": each chunk's window is the position of the snapshot its
        SELECT read; nothing is written to the source (no watermark table is created)."""
        if "log" not in self.watermark_strategies:
            with pytest.raises(ConfigurationError, match="watermark_strategy 'log' is not available"):
                ctx.dialect([], watermark_strategy="log")
            return
        results, reads = self._chunks_under_concurrent_writes(ctx, watermark_strategy="log")
        assert all(r.low_watermark == r.high_watermark and r.low_watermark.startswith("pos-") for r in results)
        if not ctx.dialects[0].records_visibility:  # MariaDB: the snapshot is the window, nothing is dropped
            assert len(reads) == sum(r.rows for r in results)
        wm = ctx.dialects[0].watermark_table
        assert not ctx.execute(self.table_exists_sql, (wm.schema, wm.name)), "a watermark table was created"

    @pytest.mark.parametrize("strategy", ["table", "log"])
    def test_window_cases_under_each_strategy(self, ctx, strategy):
        """Writes before, inside (both gaps) and after each chunk: updates, deletes, inserts, a
        primary-key update and a large transaction; under either strategy the chunks merge with
        the log to exactly the source."""
        if strategy not in self.watermark_strategies:
            pytest.fail(f"{type(self).__name__} supports no watermark strategy {strategy!r}")
        rows, chunk = 3_000, 500
        t = self._kv_table(ctx, rows)
        d = ctx.dialect([t], watermark_strategy=strategy)
        d.prepare_watermarks()
        d.load_offset(ctx.data_dir)
        schema = d.describe_table(t)
        qt, qid, qv, qn = ctx.qt(t), ctx.q("id"), ctx.q("v"), ctx.q("n")
        seq = [0]

        def writes(tag: str) -> None:
            """One round of each kind of change around the chunk being read (keys all over)."""
            i = seq[0] = seq[0] + 1
            conn = self.connect(ctx.uri, autocommit=False)
            try:
                cur = conn.cursor()
                cur.execute(f"UPDATE {qt} SET {qv} = %s WHERE {qid} = %s", (f"{tag}{i}", 1 + (i * 37) % rows))
                cur.execute(f"DELETE FROM {qt} WHERE {qid} = %s", (1 + (i * 53) % rows,))
                cur.execute(f"INSERT INTO {qt} ({qid}, {qv}, {qn}) VALUES (%s, %s, %s)", (rows + i, tag, i))
                conn.commit()
                # a primary-key update: the old key goes, a new one comes (in the chunk's range or not)
                cur.execute(f"UPDATE {qt} SET {qid} = {qid} + %s WHERE {qid} = %s", (10 * rows, 1 + (i * 71) % rows))
                conn.commit()
                if i % 3 == 0:  # a large transaction touching every key of a stretch of the table
                    lo = 1 + (i * 211) % rows
                    cur.execute(f"UPDATE {qt} SET {qn} = {qn} + 1, {qv} = %s WHERE {qid} BETWEEN %s AND %s",
                                (f"big{i}", lo, lo + 800))
                    conn.commit()
            finally:
                conn.close()

        results, after, n = [], None, 0
        while True:
            writes("before")
            res = snapshot_chunk(d, schema, FULL_RANGE, data_dir=ctx.data_dir, snapshot_id="cases", seq=n,
                                 limit=chunk, after_key=after,
                                 gap_hooks=GapHooks(after_low_watermark=lambda: writes("gap1"),
                                                    before_high_watermark=lambda: writes("gap2")))
            writes("after")
            results.append(res)
            n += 1
            if res.exhausted:
                break
            after = res.last_key
        events = ctx.capture_all(d)
        chunks = [WindowChunk.from_result(r, read_chunk_rows(r.path, r.table)) for r in results]
        reads = merge_window(chunks, events)
        state = mirror_apply({}, table_events(events, t))
        mirror_apply(state, reads)
        assert mirror_rows(state, t.id) == ctx.source_rows(d, t)
        assert n > 3 and len(reads) > 0

    #: (schema, table) -> a row when the table exists
    table_exists_sql = "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = %s"

    def _chunks_under_concurrent_writes(self, ctx, table: TableName | None = None, **options):
        rows = 400
        t = table or self._kv_table(ctx, rows)
        d = ctx.dialect([t], **options)
        d.prepare_watermarks()
        d.load_offset(ctx.data_dir)  # capture starts before the snapshot
        schema = d.describe_table(t)
        qt, qid, qv, qn = ctx.qt(t), ctx.q("id"), ctx.q("v"), ctx.q("n")
        stop = threading.Event()
        errors: list[BaseException] = []
        writes = [0]

        def writer(seed: int) -> None:
            rnd = random.Random(seed)
            c = self.connect(ctx.uri, autocommit=False)
            try:
                cur = c.cursor()
                while not stop.is_set():
                    try:
                        for _ in range(rnd.randint(1, 4)):
                            k = rnd.randint(1, rows + 100)
                            op = rnd.random()
                            if op < 0.5:
                                cur.execute(
                                    f"UPDATE {qt} SET {qv} = %s, {qn} = {qn} + 1 WHERE {qid} = %s",
                                    (f"u{seed}-{rnd.random():.6f}", k),
                                )
                            elif op < 0.75:
                                cur.execute(f"DELETE FROM {qt} WHERE {qid} = %s", (k,))
                            else:
                                cur.execute(f"DELETE FROM {qt} WHERE {qid} = %s", (k,))
                                cur.execute(
                                    f"INSERT INTO {qt} ({qid}, {qv}, {qn}) VALUES (%s, %s, %s)",
                                    (k, f"i{seed}", k),
                                )
                        c.commit()
                    except Exception as exc:
                        if not (self.is_deadlock(exc) or _is_duplicate_key(exc)):
                            raise
                        # a deadlock victim, or two writers re-inserting the same deleted key
                        # (READ COMMITTED): applications retry; so does this writer
                        c.rollback()
                        continue
                    writes[0] += 1
                    time.sleep(rnd.random() * 0.002)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                c.close()

        forced = []
        chunk = 25  # 16+ windows over the 400 rows

        def force_write_in_window() -> None:
            # a change inside the window to a key of the chunk being read: the merge must drop it
            k = (len(forced) * chunk) + 7
            forced.append(k)
            ctx.execute(f"UPDATE {qt} SET {qv} = %s WHERE {qid} = %s", (f"forced-{k}", k))

        threads = [threading.Thread(target=writer, args=(s,)) for s in range(3)]
        for th in threads:
            th.start()
        try:
            results, after = [], None
            seq = 0
            while True:
                res = snapshot_chunk(
                    d,
                    schema,
                    FULL_RANGE,
                    data_dir=ctx.data_dir,
                    snapshot_id="snap",
                    seq=seq,
                    limit=chunk,
                    after_key=after,
                    gap_hooks=GapHooks(after_low_watermark=force_write_in_window),
                )
                results.append(res)
                seq += 1
                if seq % 3 == 0:
                    stage_changelog(d, ctx.data_dir)  # capture runs alongside, as in production
                if res.exhausted:
                    break
                after = res.last_key
        finally:
            stop.set()
            for th in threads:
                th.join()
        assert not errors, errors
        assert writes[0] > 0

        events = ctx.capture_all(d)
        chunks = [
            WindowChunk.from_result(
                r, read_chunk_rows(r.path, r.table)
            )
            for r in results
        ]
        reads = merge_window(chunks, events)
        state = mirror_apply({}, table_events(events, t))
        mirror_apply(state, reads)
        deadline = time.monotonic() + 60
        while (lag := d.replica_lag()) is not None and lag[0] > 0:  # chunks from a replica: compare caught up
            assert time.monotonic() < deadline, f"the replica did not catch up: {lag}"
            time.sleep(0.05)
        assert mirror_rows(state, t.id) == ctx.source_rows(d, t)
        return results, reads

    # --- tables without a primary key -------------------------------------------------
    def unique_keyed_options(self, ctx: Ctx, table: TableName, variant: str) -> dict[str, Any]:
        """Make ``table`` (no primary key; a unique index on its NOT NULL ``id``) capturable the
        way ``variant`` says, returning the dialect options that go with it: ``key_columns``
        (the key named in CDC_KEY_COLUMNS) or ``identity_index`` (PostgreSQL's REPLICA IDENTITY
        USING INDEX, no setting). A dialect without that way skips."""
        if variant != "key_columns":
            pytest.skip(f"{variant}: PostgreSQL only")
        return {"key_columns": {table.id: ["id"]}}

    def _unique_keyed_table(self, ctx: Ctx, rows: int) -> TableName:
        t = ctx.create_table("uk", [("id", "int NOT NULL"), ("v", "text"), ("n", "int")], None)
        ctx.execute(f"CREATE UNIQUE INDEX {ctx.q('ux_' + ctx.unique)} ON {ctx.qt(t)} ({ctx.q('id')})")
        self._kv_rows(ctx, t, rows)
        return t

    @pytest.mark.parametrize("variant", ["key_columns", "identity_index"])
    def test_a_table_keyed_by_a_unique_index_snapshots_under_writers_to_the_source(self, ctx, variant):
        """No primary key, a unique index on NOT NULL columns: chunked, windowed and mirrored by
        that key while writers update, delete and re-insert; the mirror equals the source."""
        t = self._unique_keyed_table(ctx, 400)
        options = self.unique_keyed_options(ctx, t, variant)
        results, reads = self._chunks_under_concurrent_writes(ctx, t, **options)
        assert ctx.dialects[0].describe_table(t).primary_key == ("id",)
        assert len(reads) < sum(r.rows for r in results), "forced in-window writes must drop keys"

    def test_a_table_without_any_key_is_refused_before_anything_is_created(self, ctx):
        """A scope naming a table with no key the log carries: capture refuses to start, naming
        the table and the statements that would make it capturable, and creates nothing on the
        source; the application's UPDATE and DELETE on it still work."""
        t = ctx.create_table("nokey", [("id", "int"), ("v", "text")], None)
        ctx.execute(f"INSERT INTO {ctx.qt(t)} VALUES (1, 'a'), (2, 'b')")
        d = ctx.dialect([t])
        before = self.source_objects(ctx, d)
        with pytest.raises(ConfigurationError) as err:
            d.load_offset(ctx.data_dir)
        text = str(err.value)
        assert str(t) in text and "ALTER TABLE" in text and "CDC_TABLES" in text, text
        assert self.source_objects(ctx, d) == before
        ctx.execute(f"UPDATE {ctx.qt(t)} SET {ctx.q('v')} = 'c' WHERE {ctx.q('id')} = 1")
        ctx.execute(f"DELETE FROM {ctx.qt(t)} WHERE {ctx.q('id')} = 2")
        assert ctx.execute(f"SELECT {ctx.q('id')}, {ctx.q('v')} FROM {ctx.qt(t)}") == [(1, "c")]
        with pytest.raises(SourceError, match="ALTER TABLE"):
            d.describe_table(t)

    # --- tables without a key: the whole-table refresh (pipeline/refresh.py) --------------
    def _keyless_rows(self, ctx: Ctx, t: TableName, rows: int, copies: int = 2) -> None:
        """``rows`` distinct (id, v, n) rows, each ``copies`` times."""
        values = [x for i in range(1, rows + 1) for _c in range(copies) for x in (i, f"v{i}", i * 10)]
        for at in range(0, len(values), 3000):
            part = values[at : at + 3000]
            ctx.execute(f"INSERT INTO {ctx.qt(t)} VALUES " + ", ".join(["(%s, %s, %s)"] * (len(part) // 3)), part)

    @staticmethod
    def _multiset(rows) -> dict:
        from collections import Counter

        return dict(Counter(tuple(r) for r in rows))

    def _refreshed(self, uri: str, version: int | None = None) -> dict:
        from deltalake import DeltaTable

        t = DeltaTable(uri, version=version).to_pyarrow_table()
        return self._multiset(zip(*(t[c].to_pylist() for c in ("id", "v", "n")), strict=True))

    def test_a_keyless_table_is_refreshed_whole_in_one_snapshot_with_its_duplicates(self, ctx, monkeypatch):
        """A table with no key at all, with duplicate rows, refreshed twice: each refresh is one
        Delta version equal (as a multiset, read by deltalake) to one state of the source, the
        version before stays readable, and nothing is created on the source. Between the read's
        files a writer moves every row and deletes some (a forced interleaving): the refresh
        still holds the state its snapshot began with, not rows read twice or missed."""
        from airflow_provider_cdc.pipeline.refresh import refresh_table

        t = ctx.create_table("nokey", [("id", "int"), ("v", "text"), ("n", "int")], None)
        self._keyless_rows(ctx, t, 1500)
        d = ctx.dialect([], fetch_batch_rows=300)  # (the generic read's files end at batch ends)
        before_objects = self.source_objects(ctx, d)
        cols = f"{ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}"
        state1 = self._multiset(ctx.execute(f"SELECT {cols} FROM {ctx.qt(t)}"))
        assert max(state1.values()) == 2
        orig = d.read_whole_table
        fired = []

        def read(request):
            progress = request.progress

            def between(n):
                if not fired:
                    fired.append(n)
                    ctx.execute(f"UPDATE {ctx.qt(t)} SET {ctx.q('n')} = {ctx.q('n')} + 1")
                    ctx.execute(f"DELETE FROM {ctx.qt(t)} WHERE {ctx.q('id')} > 1400")
                if progress is not None:
                    progress(n)

            return orig(replace(request, progress=between))

        monkeypatch.setattr(d, "read_whole_table", read)
        first = refresh_table(d, ctx.data_dir, ctx.source, t, file_rows=400)
        assert fired and first.files >= 3, first
        assert first.rows == sum(state1.values())
        assert self._refreshed(first.location) == state1
        state2 = self._multiset(ctx.execute(f"SELECT {cols} FROM {ctx.qt(t)}"))
        assert state2 != state1
        monkeypatch.setattr(d, "read_whole_table", orig)
        second = refresh_table(d, ctx.data_dir, ctx.source, t, file_rows=400)
        assert second.version > first.version
        assert self._refreshed(second.location) == state2
        assert self._refreshed(first.location, first.version) == state1  # time travel: the version before
        assert self.source_objects(ctx, d) == before_objects

    # --- tables without a key captured as multisets (pipeline/multiset.py) -----------------
    def multiset_options(self, ctx: Ctx, table: TableName) -> dict[str, Any]:
        """What makes the keyless ``table`` capturable as a multiset (PostgreSQL: the owner's
        REPLICA IDENTITY FULL), with the dialect options that name it so."""
        return {"key_columns": {table.id: ["*"]}}

    def one_copy_sql(self, ctx: Ctx, t: TableName, statement: str) -> str:
        """``statement`` ("UPDATE ... SET ..." or "DELETE FROM ...", for the rows WHERE id = %s)
        limited to one copy of the matching rows."""
        return f"{statement} WHERE {ctx.q('id')} = %s LIMIT 1"

    #: whether :meth:`during_load_snapshot` runs its function (a dialect with the hook)
    commits_at_load_snapshot = False

    def during_load_snapshot(self, d: Dialect, fn) -> None:  # noqa: B027 - optional hook
        """Run ``fn`` right after a whole-table read took its snapshot (PostgreSQL: before the
        position that bounds it is read)."""

    def test_a_keyless_table_captured_as_a_multiset_equals_the_source_through_single_copy_changes(self, ctx):
        """A keyless table with three copies of each row, captured as a multiset: loaded while
        changes commit at the snapshot, between the read and the publish (staged: the load's
        catch-up applies them) and after it (the apply), then rounds that update, delete and
        insert single copies. The mirror (read by deltalake, not this package) equals the source
        as a multiset; a replayed round changes nothing; verify compares multisets, 0 mismatched,
        and counts a copy the mirror lost."""
        from deltalake import DeltaTable

        from airflow_provider_cdc.pipeline.arrow_engine import apply_changelog
        from airflow_provider_cdc.pipeline.multiset import load_table, verify_multiset
        from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
        from airflow_provider_cdc.storage.layout import mirror_dir

        t = ctx.create_table("ms", [("id", "int"), ("v", "text"), ("n", "int")], None)
        self._keyless_rows(ctx, t, 300, copies=3)
        d = ctx.dialect([t], **self.multiset_options(ctx, t))
        d.load_offset(ctx.data_dir)  # capture starts: the table joins the publication
        schema = d.describe_table(t)
        assert schema.multiset and schema.primary_key == ()
        upd = self.one_copy_sql(ctx, t, f"UPDATE {ctx.qt(t)} SET {ctx.q('n')} = {ctx.q('n')} + 1")
        dele = self.one_copy_sql(ctx, t, f"DELETE FROM {ctx.qt(t)}")
        ins = f"INSERT INTO {ctx.qt(t)} VALUES (%s, %s, %s)"
        cols = f"{ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}"

        def source() -> dict:
            return self._multiset(ctx.execute(f"SELECT {cols} FROM {ctx.qt(t)}"))

        def mirror() -> dict:
            m = DeltaTable(mirror_dir(ctx.data_dir, ctx.source, t)).to_pyarrow_table()
            return self._multiset(zip(*(m[c].to_pylist() for c in ("id", "v", "n")), strict=True))

        at_snapshot: list = []

        def once() -> None:  # (the hook stays on the dialect: verify's reads come later)
            if not at_snapshot:
                at_snapshot.append(1)
                ctx.execute(upd, (1,))
                ctx.execute(dele, (2,))

        self.during_load_snapshot(d, once)

        def between():  # after the read, before the publish: staged, so the catch-up applies them
            ctx.execute(upd, (3,))
            ctx.execute(ins, (4, "v4", 40))
            ctx.execute(dele, (5,))
            stage_changelog(d, ctx.data_dir)
            ctx.execute(upd, (6,))  # not staged yet: the apply's

        load_table(d, ctx.data_dir, ctx.source, t, before_publish=between)
        assert at_snapshot or not self.commits_at_load_snapshot, "the forced interleaving did not run"
        sink = MirrorDeltaSink(ctx.data_dir, ctx.source)
        rng = random.Random(7)
        for _round in range(4):
            for _ in range(40):
                i = rng.randint(1, 320)
                stmt = rng.choice([upd, dele, ins])
                ctx.execute(stmt, (i, f"v{i}", i * 10) if stmt is ins else (i,))
            stage_changelog(d, ctx.data_dir)
            apply_changelog(ctx.data_dir, ctx.source, [sink])
            assert mirror() == source()
        want = source()
        assert max(want.values()) >= 3 and min(want.values()) >= 1
        # a replay of every staged change (the markers lost) changes nothing
        from airflow_provider_cdc.sinks.base import marker_path

        os.remove(marker_path(ctx.data_dir, ctx.source, "mirror"))
        apply_changelog(ctx.data_dir, ctx.source, [sink])
        assert mirror() == want
        res = verify_multiset(d, ctx.data_dir, ctx.source, t, schema)
        assert res.ok and res.method == "multiset" and res.source_rows == sum(want.values()), res.to_dict()
        ctx.execute(upd, (7,))  # staged, not applied: verify brings the mirror to its read
        stage_changelog(d, ctx.data_dir)
        assert verify_multiset(d, ctx.data_dir, ctx.source, t, schema).ok
        apply_changelog(ctx.data_dir, ctx.source, [sink])
        # a copy the mirror lost is found, as one missing copy
        uri = mirror_dir(ctx.data_dir, ctx.source, t)
        got = DeltaTable(uri).to_pyarrow_table()
        DeltaTable(uri).delete(f"id = {got['id'][0].as_py()} AND n = {got['n'][0].as_py()}")
        bad = verify_multiset(d, ctx.data_dir, ctx.source, t, schema)
        assert bad.missing >= 1 and bad.extra == 0, bad.to_dict()

    def test_a_multiset_needs_a_table_without_a_key(self, ctx):
        """'*' in CDC_KEY_COLUMNS on a table with a primary key is refused by name."""
        t = self._kv_table(ctx, 3)
        d = ctx.dialect([t], key_columns={t.id: ["*"]})
        with pytest.raises(ConfigurationError, match="has a primary key"):
            d.load_offset(ctx.data_dir)

    def test_a_superseded_refresh_publishes_nothing(self, ctx):
        """Fencing: a refresh that a newer one claimed after it (a zombie task, a retry that
        overtook it) cannot publish; it leaves no file behind, and the newer one publishes."""
        from airflow_provider_cdc.core.errors import FencedError
        from airflow_provider_cdc.pipeline.refresh import refresh_table

        t = ctx.create_table("nokey", [("id", "int"), ("v", "text"), ("n", "int")], None)
        self._keyless_rows(ctx, t, 20)
        d = ctx.dialect([])
        newer = []

        def overtaken():
            ctx.execute(f"DELETE FROM {ctx.qt(t)} WHERE {ctx.q('id')} = 1")
            newer.append(refresh_table(d, ctx.data_dir, ctx.source, t))

        with pytest.raises(FencedError, match="newer refresh"):
            refresh_table(d, ctx.data_dir, ctx.source, t, before_publish=overtaken)
        assert sum(self._refreshed(newer[0].location).values()) == 38
        from deltalake import DeltaTable

        live = set(DeltaTable(newer[0].location).file_uris())
        on_disk = {str(p) for p in __import__("pathlib").Path(newer[0].location).glob("*.parquet")}
        assert on_disk == {u.removeprefix("file://") for u in live}, "the fenced refresh left files"

    def test_key_columns_that_no_unique_index_covers_are_refused_by_name(self, ctx):
        t = self._unique_keyed_table(ctx, 0)
        options = self.unique_keyed_options(ctx, t, "key_columns")
        options["key_columns"] = {t.id: ["v"]}
        d = ctx.dialect([t], **options)
        with pytest.raises(ConfigurationError, match=r"no unique index on exactly the CDC_KEY_COLUMNS \['v'\]"):
            d.load_offset(ctx.data_dir)
        outside = ctx.dialect([t], key_columns={f"{t.schema}.elsewhere": ["id"]})
        with pytest.raises(ConfigurationError, match="CDC_KEY_COLUMNS names .*elsewhere.* which CDC_TABLES does not"):
            outside.load_offset(ctx.data_dir)

    def source_objects(self, ctx: Ctx, d: Dialect) -> list:
        """What capture would create on the source for ``d`` (a dialect adds its own)."""
        return ctx.execute(self.table_exists_sql, (d.watermark_table.schema, d.watermark_table.name))

    # --- I6: crash between staging and confirming -------------------------------------
    def test_capture_crash_before_commit_redelivers_and_loses_nothing(self, ctx, monkeypatch):
        t = self._kv_table(ctx, 0)
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        start = d.load_offset(ctx.data_dir)
        ins = f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}) VALUES (%s, %s, %s)"
        for i in range(1, 6):
            ctx.execute(ins, (i, f"v{i}", i))
        d.write_watermark("w-before-crash")

        def crash(*_a, **_k):
            raise RuntimeError("injected crash before the offset is committed")

        monkeypatch.setattr(d, "commit_offset", crash)
        with pytest.raises(RuntimeError, match="injected crash"):
            stage_changelog(d, ctx.data_dir)
        directory = changelog_dir(ctx.data_dir, ctx.source)
        orphan = list_segments(directory)
        assert len(orphan) == 1
        orphan_events = list(read_log_events(directory))
        d.close()  # the process died

        d2 = ctx.dialect([t])
        assert d2.load_offset(ctx.data_dir) == start, "the offset must not move before the commit"
        for i in range(6, 8):
            ctx.execute(ins, (i, f"v{i}", i))
        res = stage_changelog(d2, ctx.data_dir)
        segs = list_segments(directory)
        assert len(segs) == 1 and segs[0][2] == res.segment, "the new segment supersedes the orphan"
        events = list(read_log_events(directory))
        assert events[: len(orphan_events)] == orphan_events, "same events at the same positions"
        mine = table_events(events, t)
        assert [decode_key(e.key)[0] for e in mine] == [1, 2, 3, 4, 5, 6, 7]
        assert [e.op for e in mine] == ["c"] * 7
        assert d2.load_offset(ctx.data_dir) == res.end_offset != start

        # confirmed: nothing comes again
        again = stage_changelog(d2, ctx.data_dir)
        assert not [e for e in list(read_log_events(directory)) if e not in events]
        assert again.start_offset == res.end_offset
        ctx.execute(ins, (8, "v8", 8))
        stage_changelog(d2, ctx.data_dir)
        mine = table_events(list(read_log_events(directory)), t)
        assert [decode_key(e.key)[0] for e in mine] == list(range(1, 9))

    # --- streaming capture: segments at transaction boundaries ------------------------
    def _transactions(self, ctx: Ctx, t: TableName, sizes: list[int], first_id: int = 1) -> list[list[int]]:
        """One transaction per size, each inserting that many rows with one statement per
        row (several row events per transaction); returns the ids of each transaction."""
        ins = f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}) VALUES (%s, %s, %s)"
        out, next_id = [], first_id
        conn = self.connect(ctx.uri, autocommit=False)
        try:
            for tx, size in enumerate(sizes):
                ids = list(range(next_id, next_id + size))
                for i in ids:
                    conn.cursor().execute(ins, (i, f"tx{tx}", i))
                conn.commit()
                out.append(ids)
                next_id += size
        finally:
            conn.close()
        return out

    @staticmethod
    def _segment_ids(path: str) -> list[int]:
        return [decode_key(k)[0] for k in pq.read_table(path, columns=["key"]).column("key").to_pylist() if k]

    def test_capture_streams_segments_at_transaction_boundaries_equal_to_one_segment(self, ctx, monkeypatch):
        t = self._kv_table(ctx, 0)
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        start = d.load_offset(ctx.data_dir)
        txs = self._transactions(ctx, t, [3, 1, 4, 1, 5])
        d.write_watermark("w-mid")  # a transaction of its own
        txs += self._transactions(ctx, t, [9, 2, 6, 5, 3], first_id=100)
        tx_of = {i: n for n, ids in enumerate(txs) for i in ids}

        def crash(*_a, **_k):
            raise RuntimeError("injected crash before the offset is committed")

        # several segments of >= 5 events, then a crash before the offset commit (a transaction
        # is cut only past twice segment_max_events: these, of at most 9 events, stay whole)
        monkeypatch.setattr(d, "commit_offset", crash)
        with pytest.raises(RuntimeError, match="injected crash"):
            stage_changelog(d, ctx.data_dir, segment_max_events=5)
        directory = changelog_dir(ctx.data_dir, ctx.source)
        segs = list_segments(directory)
        assert len(segs) >= 4, segs
        seen: set[int] = set()
        for n, (first, last, path) in enumerate(segs):
            staged = pq.read_table(path).column("position").to_pylist()
            rows = len(staged)
            assert rows >= 5 or n == len(segs) - 1, f"segment {n} cut before 5 events ({rows})"
            assert (first, last) == (Position.decode(staged[0]), Position.decode(staged[-1])), "named by its range"
            in_seg = {tx_of[i] for i in self._segment_ids(path) if i in tx_of}
            assert not in_seg & seen, f"a transaction is split across segments: {sorted(in_seg & seen)}"
            seen |= in_seg
            if n:
                assert first > segs[n - 1][1], "segments are disjoint and in position order"
        multi = list(read_log_events(directory))
        d.close()  # the process died

        # the same changes captured again from the same (uncommitted) offset as one segment
        d2 = ctx.dialect([t])
        assert d2.load_offset(ctx.data_dir) == start
        res = stage_changelog(d2, ctx.data_dir, segment_max_events=0)
        assert res.segments == (res.segment,)
        assert [p for _f, _l, p in list_segments(directory)] == [res.segment], "it supersedes the segments"
        single = list(read_log_events(directory))
        assert single == multi, "same events at the same positions"
        assert [decode_key(e.key)[0] for e in table_events(single, t)] == [i for ids in txs for i in ids]
        assert [e.id for e in single if isinstance(e, WatermarkEvent)] == ["w-mid"]
        assert d2.load_offset(ctx.data_dir) == res.end_offset != start

    def test_capture_crash_between_segments_redelivers_without_loss_or_duplicates(self, ctx, monkeypatch):
        import airflow_provider_cdc.pipeline.capture as base_module  # where the capture stages its segments

        t = self._kv_table(ctx, 0)
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        start = d.load_offset(ctx.data_dir)
        txs = self._transactions(ctx, t, [2, 3, 1, 4, 2, 2, 5, 1])
        directory = changelog_dir(ctx.data_dir, ctx.source)
        real_write = base_module.write_segment
        written: list[str] = []

        def crash_after_two(events, *args, **kwargs):
            if len(written) == 2:
                raise RuntimeError("injected crash after two segments")
            written.append(real_write(events, *args, **kwargs))
            return written[-1]

        monkeypatch.setattr(base_module, "write_segment", crash_after_two)
        with pytest.raises(RuntimeError, match="injected crash"):
            stage_changelog(d, ctx.data_dir, segment_max_events=3)
        monkeypatch.setattr(base_module, "write_segment", real_write)
        assert [p for _f, _l, p in list_segments(directory)] == written and len(written) == 2
        d.close()  # the process died

        d2 = ctx.dialect([t])
        assert d2.load_offset(ctx.data_dir) == start, "the offset must not move before the commit"
        txs += self._transactions(ctx, t, [3, 2], first_id=100)  # more changes meanwhile
        res = stage_changelog(d2, ctx.data_dir, segment_max_events=3)
        assert res.segments[:2] == tuple(written), "the retry rewrites the same segment names"
        assert [p for _f, _l, p in list_segments(directory)] == list(res.segments)
        events = list(read_log_events(directory))
        positions = [e.position for e in events]
        assert positions == sorted(set(positions))
        mine = table_events(events, t)
        assert [decode_key(e.key)[0] for e in mine] == [i for ids in txs for i in ids], "no loss, no duplicate"
        raw = [i for _f, _l, p in list_segments(directory) for i in self._segment_ids(p)]
        assert sorted(raw) == sorted(i for ids in txs for i in ids), "no duplicate even before de-duplication"
        assert d2.load_offset(ctx.data_dir) == res.end_offset
        again = stage_changelog(d2, ctx.data_dir, segment_max_events=3)
        assert table_events(list(read_log_events(directory)), t) == mine and again.start_offset == res.end_offset

    # --- type parity ------------------------------------------------------------------
    def test_type_parity_between_chunk_and_changelog(self, ctx):
        cases = self.type_parity_cases()
        t = ctx.create_table("types", [("id", "int")] + [(c.column, c.sql_type) for c in cases], ["id"])
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        d.load_offset(ctx.data_dir)
        cols = ", ".join(ctx.q(c.column) for c in cases)
        ctx.execute(
            f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {cols}) VALUES (1, {', '.join(c.sql_literal for c in cases)})"
        )
        ctx.execute(f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}) VALUES (2)")
        log = {decode_key(e.key)[0]: e.after for e in table_events(ctx.capture_all(d), t)}
        chunk = {decode_key(k)[0]: row for k, row in ctx.source_rows(d, t).items()}
        assert set(log) == set(chunk) == {1, 2}
        for c in cases:
            assert chunk[1][c.column] == log[1][c.column], (
                f"{c.column} ({c.sql_type}): chunk and changelog differ"
            )
            assert chunk[1][c.column] == c.expected, f"{c.column} ({c.sql_type}) canonical value"
            assert chunk[2][c.column] is None and log[2][c.column] is None, f"{c.column} NULL"
        # the event log types the same events with the log schema capture wrote, losing nothing
        typed = self._event_log_afters(ctx, t)
        for c in cases:
            assert typed[1].get(c.column) == log[1][c.column], f"{c.column} ({c.sql_type}) in the typed event log"
            assert c.column not in typed[2], f"{c.column} NULL in the typed event log"

    @staticmethod
    def _event_log_afters(ctx: Ctx, t: TableName) -> dict:
        """The table's staged events written by the event log sink, read back: id -> canonical after."""
        from airflow_provider_cdc.sinks.event_log import read_events

        from .event_log_helpers import write_event_log

        write_event_log(ctx.data_dir, ctx.source, t)
        out = {}
        for r in read_events(ctx.data_dir, ctx.source, t).to_pylist():
            if r["after"] is not None:
                out[decode_key(r["key"])[0]] = decode_row(r["after"])
        return out

    def test_log_schema_follows_add_and_drop_column_and_keeps_dropped_values(self, ctx):
        from airflow_provider_cdc.pipeline.schema_changes import read_log_schema

        t = self._kv_table(ctx, 0)
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        d.load_offset(ctx.data_dir)
        ctx.execute(f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}) VALUES (1, 'one', 10)")
        ctx.capture_all(d)
        assert read_log_schema(ctx.data_dir, ctx.source, t).column_names == ("id", "v", "n")
        int_type = self.sql_types["int"]
        ctx.execute(f"ALTER TABLE {ctx.qt(t)} ADD COLUMN {ctx.q('x')} {int_type}")
        ctx.execute(f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('x')}) VALUES (2, 'two', 7)")
        ctx.execute(f"ALTER TABLE {ctx.qt(t)} DROP COLUMN {ctx.q('v')}")
        ctx.execute(f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('x')}) VALUES (3, 8)")
        ctx.capture_all(d)
        schema = read_log_schema(ctx.data_dir, ctx.source, t)
        assert schema.column_names == ("id", "v", "n", "x") and schema.primary_key == ("id",)
        assert schema.column("v").nullable
        typed = self._event_log_afters(ctx, t)
        assert typed == {1: {"id": 1, "v": "one", "n": 10}, 2: {"id": 2, "v": "two", "x": 7}, 3: {"id": 3, "x": 8}}

    # --- a server that refused or dropped the connection is no schema change ----------------
    @staticmethod
    def _followed_table(ctx: Ctx) -> tuple[TableName, Any, str]:
        """A table with its staged schema and a Delta mirror: (table, staged schema, mirror path)."""
        from airflow_provider_cdc.core.arrow_types import mirror_schema
        from airflow_provider_cdc.pipeline.schema_changes import write_staged_schema
        from airflow_provider_cdc.sinks.mirror_fencing import open_for_write
        from airflow_provider_cdc.storage.layout import mirror_dir

        t = ctx.suite._kv_table(ctx, 2)
        staged = ctx.dialect([t]).describe_table(t)
        write_staged_schema(ctx.data_dir, ctx.source, staged)
        mirror = mirror_dir(ctx.data_dir, ctx.source, t)
        open_for_write(mirror, mirror_schema(staged))
        return t, staged, mirror

    def test_a_refused_connection_is_no_schema_change_and_stops_no_mirror(self, ctx):
        """A server that refuses the connection (nothing listens on its port: a primary down or
        failing over) raises SourceUnreachableError naming host and port, never credentials, from
        every schema follow: a chunk's (not SchemaChangeError "cannot be read any more") and
        capture's, which stops no mirror for it."""
        from airflow_provider_cdc.core.errors import SchemaChangeError, SourceUnreachableError
        from airflow_provider_cdc.pipeline.schema_changes import (
            chunk_schema,
            current_schema,
            follow_log_schemas,
            follow_schema_changes,
        )
        from airflow_provider_cdc.sinks.mirror_fencing import schema_stopped

        from .helpers import _free_port

        t, staged, mirror = self._followed_table(ctx)
        port = _free_port()  # bound and released: nothing listens there
        u = urlsplit(ctx.uri)
        closed = urlunsplit((u.scheme, f"{u.username or 'root'}:pw-not-shown@127.0.0.1:{port}", u.path, "", ""))
        down = self.make_dialect(closed, source=ctx.source, tables=[t], watermark_table=ctx.watermark_table)
        try:
            for follow in (
                lambda: current_schema(down, t),
                lambda: chunk_schema(down, ctx.data_dir, ctx.source, staged),
                lambda: follow_schema_changes(down, ctx.data_dir, ctx.source),
                lambda: follow_log_schemas(down, ctx.data_dir, ctx.source, [t.id]),
            ):
                with pytest.raises(SourceUnreachableError) as info:
                    follow()
                text = str(info.value)
                assert not isinstance(info.value, SchemaChangeError) and info.value.retryable
                assert f"127.0.0.1:{port}" in text and "docs/operations.md 'Failover'" in text, text
                assert "new primary" in text and "pw-not-shown" not in text, text
                assert info.value.__cause__ is not None  # the driver's error, chained
        finally:
            down.close()
        assert schema_stopped(mirror) is None

    def test_a_dropped_session_is_no_schema_change_and_the_next_attempt_reads_on(self, ctx):
        """The server ends the dialect's session (a primary stopping or failing over, an
        administrator): the schema follows raise SourceUnreachableError, the mirror is not
        stopped, and the next attempt reconnects and follows the table as before."""
        from airflow_provider_cdc.core.errors import SourceUnreachableError
        from airflow_provider_cdc.pipeline.schema_changes import chunk_schema, follow_schema_changes
        from airflow_provider_cdc.sinks.mirror_fencing import schema_stopped

        t, staged, mirror = self._followed_table(ctx)
        d = ctx.dialects[-1]
        self.drop_session(ctx, d)
        with pytest.raises(SourceUnreachableError, match="refused or dropped the connection"):
            chunk_schema(d, ctx.data_dir, ctx.source, staged)
        assert chunk_schema(d, ctx.data_dir, ctx.source, staged) == staged  # reconnected
        self.drop_session(ctx, d)
        with pytest.raises(SourceUnreachableError, match="refused or dropped the connection"):
            follow_schema_changes(d, ctx.data_dir, ctx.source)
        assert schema_stopped(mirror) is None
        assert follow_schema_changes(d, ctx.data_dir, ctx.source) == {}
        assert schema_stopped(mirror) is None

    # --- keyset chunking, composite keys, planning ------------------------------------
    def test_composite_key_chunks_cover_the_table_once(self, ctx):
        t = ctx.create_table("ck", [("a", "int"), ("b", "text"), ("v", "int")], ["a", "b"])
        data = [(a, f"k{b:02d}", a * 100 + b) for a in range(1, 8) for b in range(9)]
        ctx.execute(
            f"INSERT INTO {ctx.qt(t)} ({ctx.q('a')}, {ctx.q('b')}, {ctx.q('v')}) VALUES "
            + ", ".join(["(%s, %s, %s)"] * len(data)),
            [x for row in data for x in row],
        )
        d = ctx.dialect([t])
        schema = d.describe_table(t)
        assert schema.primary_key == ("a", "b")
        seen, after, n = [], None, 0
        while True:
            path = f"{ctx.data_dir}/ck-{n}.parquet"
            res = d.read_chunk(ChunkRead(schema, FULL_RANGE, after_key=after, limit=10, path=path))
            keys = [decode_key(k) for k in pq.read_table(path, columns=["key"])["key"].to_pylist()]
            assert keys == sorted(keys)
            seen += keys
            n += 1
            if res.rows < 10:
                break
            assert res.last_key == keys[-1]
            after = res.last_key
        assert seen == sorted((a, b) for a, b, _ in data)

        # a bounded range and a filter
        rng = ChunkRange((2, "k05"), (4, "k01"))
        path = f"{ctx.data_dir}/ck-range.parquet"
        d.read_chunk(ChunkRead(schema, rng, after_key=None, limit=1000, path=path, where=f"{ctx.q('v')} % 2 = 0"))
        got = [decode_key(k) for k in pq.read_table(path, columns=["key"])["key"].to_pylist()]
        want = [(a, b) for a, b, v in sorted(data) if (2, "k05") <= (a, b) < (4, "k01") and v % 2 == 0]
        assert got == want and got

        assert d.max_key(schema) == (7, "k08")
        assert d.max_key(schema, where=f"{ctx.q('a')} < 3") == (2, "k08")
        sample = d.sample_keys(schema, 4)
        assert sample == sorted(sample)
        assert all(s in seen for s in sample)

    def test_upper_bound_stops_chunks_at_the_snapshot_max_key(self, ctx):
        """Rows inserted above the max key of the snapshot's start are not read (the
        changelog brings them), so constant inserts cannot make a snapshot endless; the
        database compares in its own collation, also for text and composite keys."""
        t = ctx.create_table("ub", [("a", "int"), ("b", "text"), ("v", "int")], ["a", "b"])
        data = [(a, f"k{b:02d}", b) for a in range(1, 5) for b in range(5)]
        ins = f"INSERT INTO {ctx.qt(t)} ({ctx.q('a')}, {ctx.q('b')}, {ctx.q('v')}) VALUES "
        ctx.execute(ins + ", ".join(["(%s, %s, %s)"] * len(data)), [x for row in data for x in row])
        d = ctx.dialect([t])
        schema = d.describe_table(t)
        upper = d.max_key(schema)
        assert upper == (4, "k04")
        ctx.execute(ins + "(%s, %s, %s), (%s, %s, %s)", [4, "k05", 0, 9, "a", 0])  # above the bound
        got, after, n = [], None, 0
        while True:
            path = f"{ctx.data_dir}/ub-{n}.parquet"
            res = d.read_chunk(ChunkRead(schema, FULL_RANGE, after_key=after, limit=7, path=path, upper_bound=upper))
            got += [decode_key(k) for k in pq.read_table(path, columns=["key"])["key"].to_pylist()]
            n += 1
            if res.rows < 7:
                break
            after = res.last_key
        assert got == sorted((a, b) for a, b, _ in data)

    def test_key_ranks_follow_the_database_order_and_check_text_key_ranges(self, ctx):
        """key_ranks orders bounds as the database orders the key (its type and collation:
        the same order as the table's ORDER BY), equal keys share a rank; the plan refuses
        inverted and overlapping text key ranges that Python could not order."""
        from airflow_provider_cdc.core.planning import SnapshotRequest
        from airflow_provider_cdc.operators.snapshot import plan_table_ranges

        t = ctx.create_table("kr", [("k", "text"), ("v", "int")], ["k"])
        words = ["cherry", "Banana", "apple", "b%s'q", "Zed", "éclair", "10", "9"]
        ctx.execute(f"INSERT INTO {ctx.qt(t)} ({ctx.q('k')}, {ctx.q('v')}) VALUES "
                    + ", ".join(["(%s, 1)"] * len(words)), words)
        db_order = [r[0] for r in ctx.execute(f"SELECT {ctx.q('k')} FROM {ctx.qt(t)} ORDER BY {ctx.q('k')}")]
        d = ctx.dialect([t])
        schema = d.describe_table(t)
        ranks = d.key_ranks(schema, [(w,) for w in words] + [(words[0],)])
        assert ranks[-1] == ranks[0]  # equal keys, one rank
        assert sorted(words, key=lambda w: ranks[words.index(w)]) == db_order
        assert sorted(set(ranks)) == list(range(1, len(words) + 1))
        lo, hi = db_order[1], db_order[5]

        def plan(ranges):
            return plan_table_ranges(d, schema, SnapshotRequest((t,), ranges={t.id: ranges}))

        assert len(plan([[[lo], [hi]], [[hi], None]])) == 2  # touching ranges are fine
        with pytest.raises(ConfigurationError, match="empty or inverted"):
            plan([[[hi], [lo]]])
        with pytest.raises(ConfigurationError, match="overlap"):
            plan([[[lo], [hi]], [[db_order[3]], None]])
        with pytest.raises(ConfigurationError, match="must be a string"):
            plan([[[5], None]])

    def test_sample_keys_spread_over_a_plain_table(self, ctx):
        t = self._kv_table(ctx, 3000, base="sk")
        d = ctx.dialect([t])
        sample = d.sample_keys(d.describe_table(t), 8)
        assert 2 <= len(sample) <= 8, f"sample_keys gave {sample!r} for a 3000-row table"
        assert sample == sorted(sample) and all(1 <= k[0] <= 3000 for k in sample)

    def test_current_position_moves_past_committed_changes(self, ctx):
        t = self._kv_table(ctx, 0)
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        d.load_offset(ctx.data_dir)
        p0 = d.current_position()
        ctx.execute(f"INSERT INTO {ctx.qt(t)} ({ctx.q('id')}, {ctx.q('v')}, {ctx.q('n')}) VALUES (1, 'a', 1)")
        p1 = d.current_position()
        assert isinstance(p1, Position) and p1 > p0
        (ev,) = table_events(ctx.capture_all(d), t)
        assert p0 < ev.position <= Position(p1.major, p1.minor, 2**32 - 1)

    # --- bad input --------------------------------------------------------------------
    def test_missing_table_is_a_source_error_naming_it(self, ctx):
        d = ctx.dialect()
        missing = TableName(self.table_schema, f"no_such_{ctx.unique}")
        with pytest.raises(SourceError, match=f"no_such_{ctx.unique}"):
            d.describe_table(missing)

    def test_table_without_primary_key_says_what_to_do(self, ctx):
        t = ctx.create_table("nopk", [("id", "int"), ("v", "text")], None)
        d = ctx.dialect()
        with pytest.raises(SourceError, match="primary key") as err:
            d.describe_table(t)
        assert t.name in str(err.value)

    def test_bad_where_filters(self, ctx):
        t = self._kv_table(ctx, 3)
        d = ctx.dialect([t])
        schema = d.describe_table(t)
        path = f"{ctx.data_dir}/bad.parquet"
        # untrusted input (core/filters.py): statements, escapes from the parentheses, function
        # calls and subqueries never reach the source; unknown columns are named before it
        for bad in ("1=1; DROP TABLE x", f"{ctx.q('id')} < 100) OR ({ctx.q('id')} > 0", "   ",
                    "sleep(1) = 0", f"{ctx.q('id')} IN (SELECT 1)", "no_such_column > 1"):
            with pytest.raises(ConfigurationError, match="filter"):
                d.read_chunk(ChunkRead(schema, FULL_RANGE, after_key=None, limit=10, path=path, where=bad))
        # a comment is dropped by the parser, never sent: the condition reads as written
        res = d.read_chunk(ChunkRead(schema, FULL_RANGE, after_key=None, limit=10, path=path,
                           where=f"{ctx.q('id')} > 1 -- AND 1=0"))
        assert res.rows == 2
        # the dialect still works after a failed statement
        res = d.read_chunk(
            ChunkRead(schema, FULL_RANGE, after_key=None, limit=10, path=path, where=f"{ctx.q('id')} >= 2")
        )
        assert res.rows == 2 and res.last_key == (3,)

    def test_hostile_identifiers_work_end_to_end(self, ctx):
        cols = ['or"der', "select", "sp ace", "ünï cødé", "Mixed`Case"]
        t = ctx.create_table(
            'Tab "q" ü select',
            [(cols[0], "int"), (cols[1], "text"), (cols[2], "int"), (cols[3], "text"), (cols[4], "int")],
            [cols[0], cols[1]],
        )
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        d.load_offset(ctx.data_dir)
        schema = d.describe_table(t)
        assert schema.column_names == tuple(cols) and schema.primary_key == (cols[0], cols[1])
        q = ctx.q
        ins = f"INSERT INTO {ctx.qt(t)} ({', '.join(q(c) for c in cols)}) VALUES (%s, %s, %s, %s, %s)"
        for i in range(1, 6):
            ctx.execute(ins, (i, f"k'{i}\"", i, f"ü{i} ✓", -i))
        ctx.execute(f"UPDATE {ctx.qt(t)} SET {q(cols[2])} = 99 WHERE {q(cols[0])} = %s", (2,))
        ctx.execute(f"DELETE FROM {ctx.qt(t)} WHERE {q(cols[0])} = %s", (3,))
        res = snapshot_chunk(
            d,
            schema,
            FULL_RANGE,
            data_dir=ctx.data_dir,
            snapshot_id="h",
            seq=0,
            limit=2,
            after_key=(1, "k'1\""),
            where=f"{q(cols[2])} >= 0",
        )
        assert res.rows == 2 and res.last_key == (4, "k'4\"")
        events = ctx.capture_all(d)
        mine = table_events(events, t)
        assert [e.op for e in mine] == ["c"] * 5 + ["u", "d"]
        assert mine[5].after == {cols[0]: 2, cols[1]: "k'2\"", cols[2]: 99, cols[3]: "ü2 ✓", cols[4]: -2}
        assert decode_key(mine[6].key) == (3, "k'3\"")
        assert encode_key([2, "k'2\""]) == mine[5].key
        assert sum(isinstance(e, WatermarkEvent) for e in events) == 2
        assert d.max_key(schema) == (5, "k'5\"")
        assert set(d.sample_keys(schema, 2)) <= {(i, f"k'{i}\"") for i in (1, 2, 4, 5)}

    def test_a_chunk_records_where_its_high_watermark_is_staged_by_and_a_promotion_discards_it(self, ctx, monkeypatch):
        """Issue 57. A chunk records where the source's log stood just after its high watermark
        (``high_position``): once capture has staged the log past it, the watermark is staged
        (or lost, were it another's). A chunk read while the server behind the source changed
        (a promotion between its watermarks: injected, as no test can move a connection's
        server) is discarded for the task's retry."""
        from airflow_provider_cdc.core.errors import ChunkStraddledFailoverError
        from airflow_provider_cdc.pipeline.snapshot import lost_chunks

        t = ctx.create_table("hwpos", [("id", "int"), ("v", "text")], ["id"])
        for i in range(1, 6):
            ctx.execute(f"INSERT INTO {ctx.qt(t)} VALUES (%s, %s)", (i, f"v{i}"))
        d = ctx.dialect([t])
        d.ensure_watermark_table()
        d.load_offset(ctx.data_dir)
        schema = d.describe_table(t)
        res = snapshot_chunk(d, schema, FULL_RANGE, data_dir=ctx.data_dir, snapshot_id="hp", seq=0, limit=3)
        assert res.high_position is not None
        # a commit flushes the log past the position recorded (another session's WAL inserted
        # before it may not be flushed yet, and capture reads to the flushed end)
        ctx.execute(f"INSERT INTO {ctx.qt(t)} VALUES (%s, %s)", (6, "v6"))
        events = ctx.capture_all(d)
        (hw,) = [e for e in events if isinstance(e, WatermarkEvent) and e.id == res.high_watermark]
        assert hw.position.encode() < res.high_position
        assert lost_chunks(ctx.data_dir, ctx.source, [res.to_dict()]) == []  # staged: not lost
        never = {**res.to_dict(), "high_watermark": "written-on-a-server-that-failed"}
        assert lost_chunks(ctx.data_dir, ctx.source, [never]) == [never]  # staged past, not found: lost

        real = d.server_identity()
        assert real is not None and real.get("system_identifier")
        answers = iter([real, {**real, "server_id_or_timeline": "after a promotion"}])
        monkeypatch.setattr(d, "server_identity", lambda: next(answers))
        with pytest.raises(ChunkStraddledFailoverError, match="changed while chunk 1 was read"):
            snapshot_chunk(d, schema, FULL_RANGE, data_dir=ctx.data_dir, snapshot_id="hp", seq=1, limit=3,
                           after_key=res.last_key)
        folder = res.path.rsplit("/", 1)[0]
        assert [n for n in os.listdir(folder) if n.startswith("chunk-000001-")] == []  # nothing left of it
