"""Demo and benchmark workload: a mixed-type table loaded in bulk, and a background writer.

The snapshot must stay correct while the source keeps changing, and the benchmark must
measure how much a snapshot slows the source down. Both need the same two things:

* :func:`create_demo_table` - a table with one column of each common kind (bigint key,
  text, numeric(12,2), timestamptz / DATETIME(6), bool, jsonb / JSON, bytea / VARBINARY,
  a nullable text), ~130 bytes per row, loaded server-side (PostgreSQL
  ``generate_series``, MariaDB's ``seq_1_to_N`` sequence engine, a recursive CTE on
  MySQL) so millions of rows load in seconds without shipping them through Python.
* :class:`BackgroundWriter` - several threads, each with its own connection, committing
  small transactions (updates anywhere in the key range, inserts of new keys, deletes,
  and re-inserts of deleted keys) at an optional total rate, counting committed
  transactions so the benchmark can report write TPS with and without a snapshot.

Identifiers are always quoted and values always bound.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects.base import ConnectionParams

log = logging.getLogger(__name__)

DEFAULT_TABLE = "cdc_demo"
_LOAD_BATCH = 250_000


# --- connections ----------------------------------------------------------------------
def connect(params: ConnectionParams | str):
    """A plain DB-API connection (autocommit off) to the source the URI/params name."""
    if isinstance(params, str):
        params = ConnectionParams.from_uri(params)
    if params.scheme == "postgres":
        import psycopg2

        return psycopg2.connect(
            host=params.host,
            port=params.port or 5432,
            user=params.user or "postgres",
            password=params.password,
            dbname=params.database or "postgres",
        )
    import pymysql

    return pymysql.connect(
        host=params.host,
        port=params.port or 3306,
        user=params.user or "root",
        password=params.password or "",
        database=params.database,
        autocommit=False,
        charset="utf8mb4",
    )


def _params(source: ConnectionParams | str) -> ConnectionParams:
    return ConnectionParams.from_uri(source) if isinstance(source, str) else source


def _is_pg(params: ConnectionParams) -> bool:
    return params.scheme == "postgres"


def quote_ident(params: ConnectionParams, name: str) -> str:
    if _is_pg(params):
        return '"' + name.replace('"', '""') + '"'
    return "`" + name.replace("`", "``") + "`"


def quote_table(params: ConnectionParams, table: TableName) -> str:
    return f"{quote_ident(params, table.schema)}.{quote_ident(params, table.name)}"


def update_in_one_transaction(uri: str, table: TableName, n: int) -> float:
    """UPDATE the demo table's rows with ids 1..n in ONE transaction (the memory benches' large
    transaction); seconds it took."""
    p = ConnectionParams.from_uri(uri)
    q = lambda c: quote_ident(p, c)  # noqa: E731
    conn = connect(uri)
    t0 = time.monotonic()
    try:
        cur = conn.cursor()
        cur.execute(
            f"UPDATE {quote_table(p, table)} SET {q('amount')} = {q('amount')} + 1, "  # noqa: S608
            f"{q('active')} = NOT {q('active')} WHERE {q('id')} <= %s",
            (n,),
        )
        conn.commit()
    finally:
        conn.close()
    return time.monotonic() - t0


def default_table(source: ConnectionParams | str, name: str = DEFAULT_TABLE) -> TableName:
    """``public.<name>`` on PostgreSQL, ``<database>.<name>`` on MySQL/MariaDB."""
    p = _params(source)
    if _is_pg(p):
        return TableName("public", name)
    if not p.database:
        raise ConfigurationError("the MySQL/MariaDB connection names no database; add it to the URI (mysql://host/db)")
    return TableName(p.database, name)


# --- the demo table -----------------------------------------------------------------------
COLUMNS = ("id", "name", "amount", "updated_at", "active", "attrs", "payload", "note")

_PG_DDL = """CREATE TABLE {t} (
    "id" bigint PRIMARY KEY,
    "name" text NOT NULL,
    "amount" numeric(12,2),
    "updated_at" timestamptz NOT NULL,
    "active" boolean NOT NULL,
    "attrs" jsonb,
    "payload" bytea,
    "note" text
)"""
# server-side generation of rows lo..hi (bound), ~130 bytes each
_PG_FILL = """INSERT INTO {t} ("id", "name", "amount", "updated_at", "active", "attrs", "payload", "note")
SELECT g,
       'customer ' || lpad(g::text, 8, '0'),
       round(mod(g * 7919, 1000000)::numeric / 100, 2),
       timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000123 second',
       mod(g, 3) <> 0,
       jsonb_build_object('tier', mod(g, 5), 'tags', jsonb_build_array('a', mod(g, 7))),
       decode(md5(g::text), 'hex'),
       CASE WHEN mod(g, 10) = 0 THEN NULL ELSE md5(g::text) END
FROM generate_series(%s::bigint, %s::bigint) AS g"""

_MY_DDL = """CREATE TABLE {t} (
    `id` BIGINT NOT NULL PRIMARY KEY,
    `name` VARCHAR(64) NOT NULL,
    `amount` DECIMAL(12,2),
    `updated_at` DATETIME(6) NOT NULL,
    `active` BOOLEAN NOT NULL,
    `attrs` JSON,
    `payload` VARBINARY(32),
    `note` TEXT
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""
_MY_SELECT = """SELECT s,
       CONCAT('customer ', LPAD(s, 8, '0')),
       ROUND(MOD(s * 7919, 1000000) / 100, 2),
       TIMESTAMP'2024-01-01 00:00:00' + INTERVAL (s * 1000123) MICROSECOND,
       MOD(s, 3) <> 0,
       JSON_OBJECT('tier', MOD(s, 5), 'tags', JSON_ARRAY('a', MOD(s, 7))),
       UNHEX(MD5(s)),
       IF(MOD(s, 10) = 0, NULL, MD5(s))"""


def _mariadb_has_sequence(cur) -> bool:
    try:
        cur.execute("SELECT COUNT(*) FROM seq_1_to_3")
        return cur.fetchone()[0] == 3
    except Exception:  # noqa: BLE001 - MySQL has no sequence engine: fall back to a CTE
        return False


def create_demo_table(
    source: ConnectionParams | str,
    table: TableName,
    rows: int,
    *,
    drop: bool = True,
    replica_identity_full: bool = True,
) -> int:
    """(Re)create ``table`` with ``rows`` rows (ids 1..rows); returns the row count.

    PostgreSQL gets REPLICA IDENTITY FULL by default so updates and deletes carry whole
    before-images (what the event-log consistency check compares).
    """
    if rows < 0:
        raise ConfigurationError(f"rows must be >= 0, got {rows}")
    p = _params(source)
    t = quote_table(p, table)
    conn = connect(p)
    try:
        cur = conn.cursor()
        if _is_pg(p):
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(p, table.schema)}")
            if drop:
                cur.execute(f"DROP TABLE IF EXISTS {t}")
            cur.execute(_PG_DDL.format(t=t))
            if replica_identity_full:
                cur.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
            conn.commit()
            for lo in range(1, rows + 1, _LOAD_BATCH):
                cur.execute(_PG_FILL.format(t=t), (lo, min(rows, lo + _LOAD_BATCH - 1)))
                conn.commit()
            cur.execute(f"ANALYZE {t}")
            conn.commit()
        else:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS {quote_ident(p, table.schema)}")
            if drop:
                cur.execute(f"DROP TABLE IF EXISTS {t}")
            cur.execute(_MY_DDL.format(t=t))
            conn.commit()
            seq = _mariadb_has_sequence(cur)
            cols = ", ".join(quote_ident(p, c) for c in COLUMNS)
            for lo in range(1, rows + 1, _LOAD_BATCH):
                hi = min(rows, lo + _LOAD_BATCH - 1)
                if seq:
                    # table name built from two ints: MariaDB's sequence engine cannot take binds here
                    src = f"(SELECT seq AS s FROM seq_{int(lo)}_to_{int(hi)}) AS q"  # noqa: S608 - quoted identifiers, bound values
                    cur.execute(f"INSERT INTO {t} ({cols}) {_MY_SELECT} FROM {src}")
                else:
                    cur.execute("SET SESSION cte_max_recursion_depth = %s", (hi - lo + 10,))
                    cur.execute(
                        f"INSERT INTO {t} ({cols}) WITH RECURSIVE q (s) AS "  # noqa: S608 - quoted identifiers, bound values
                        f"(SELECT %s UNION ALL SELECT s + 1 FROM q WHERE s < %s) {_MY_SELECT} FROM q",
                        (lo, hi),
                    )
                conn.commit()
            cur.execute(f"ANALYZE TABLE {t}")
            cur.fetchall()
            conn.commit()
        return count_rows(p, table, conn=conn)
    finally:
        conn.close()


def count_rows(source: ConnectionParams | str, table: TableName, *, conn=None) -> int:
    p = _params(source)
    own = conn is None
    conn = conn or connect(p)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT COUNT(*) FROM {quote_table(p, table)}")  # noqa: S608 - quoted identifiers, bound values
        n = int(cur.fetchone()[0])
        conn.commit()
        return n
    finally:
        if own:
            conn.close()


def max_id(source: ConnectionParams | str, table: TableName) -> int:
    p = _params(source)
    conn = connect(p)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT COALESCE(MAX({quote_ident(p, 'id')}), 0) FROM {quote_table(p, table)}")  # noqa: S608 - quoted identifiers, bound values
        return int(cur.fetchone()[0])
    finally:
        conn.close()


def drop_table(source: ConnectionParams | str, table: TableName) -> None:
    p = _params(source)
    conn = connect(p)
    try:
        conn.cursor().execute(f"DROP TABLE IF EXISTS {quote_table(p, table)}")
        conn.commit()
    finally:
        conn.close()


# --- the background writer ----------------------------------------------------------------
@dataclass
class WriterStats:
    committed: int = 0  # committed transactions
    aborted: int = 0  # rolled back after an error (deadlock, lock timeout...)
    ops: Counter = field(default_factory=Counter)  # committed statements by kind
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # first few error texts

    @property
    def tps(self) -> float:
        return self.committed / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        ops = ", ".join(f"{k}={v}" for k, v in sorted(self.ops.items()))
        return f"{self.committed} transactions committed in {self.seconds:.1f}s ({self.tps:.0f}/s; {ops}; {self.aborted} aborted)"


class BackgroundWriter:
    """Threads with one connection each, committing small transactions until stopped.

    Mix per transaction (weights configurable): ``update`` one row anywhere in 1..max
    (the range being snapshotted), ``multi`` updates 2-4 rows in key order (no deadlocks),
    ``insert`` a new key above the loaded range or re-insert a key this thread deleted
    (key reuse), ``delete`` one row. ``rate`` is the total target transactions per
    second over all threads (None = as fast as the source allows).
    """

    DEFAULT_MIX = {"update": 45, "multi": 10, "insert": 25, "delete": 20}

    def __init__(
        self,
        source: ConnectionParams | str,
        table: TableName,
        *,
        threads: int = 3,
        rate: float | None = 50.0,
        mix: dict[str, int] | None = None,
        key_max: int | None = None,
        seed: int | None = None,
    ) -> None:
        if threads < 1:
            raise ConfigurationError(f"writer threads must be >= 1, got {threads}")
        if rate is not None and rate <= 0:
            raise ConfigurationError(f"writer rate must be > 0 transactions/s or None, got {rate}")
        self.params = _params(source)
        self.table = table
        self.threads = threads
        self.rate = rate
        self.mix = dict(mix or self.DEFAULT_MIX)
        unknown = set(self.mix) - set(self.DEFAULT_MIX)
        if unknown:
            raise ConfigurationError(f"unknown writer op(s) {sorted(unknown)}; known: {sorted(self.DEFAULT_MIX)}")
        self._key_max = key_max
        self._seed = seed
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._stats = WriterStats()
        self._workers: list[threading.Thread] = []
        self._next_key = 0
        self._t0 = 0.0
        self._t1: float | None = None
        self._ready = threading.Barrier(threads + 1)

    # statements, built once per writer
    def _sql(self) -> dict[str, str]:
        p, t = self.params, quote_table(self.params, self.table)
        q = lambda c: quote_ident(p, c)  # noqa: E731
        cols = ", ".join(q(c) for c in COLUMNS)
        if _is_pg(p):
            ins = f"INSERT INTO {t} ({cols}) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s)"  # noqa: S608 - quoted identifiers, bound values
            upd = (
                f"UPDATE {t} SET {q('amount')} = %s, {q('updated_at')} = %s, {q('active')} = NOT {q('active')}, "  # noqa: S608 - quoted identifiers, bound values
                f"{q('attrs')} = %s::jsonb, {q('note')} = %s WHERE {q('id')} = %s"
            )
        else:
            ins = f"INSERT INTO {t} ({cols}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"  # noqa: S608 - quoted identifiers, bound values
            upd = (
                f"UPDATE {t} SET {q('amount')} = %s, {q('updated_at')} = %s, {q('active')} = NOT {q('active')}, "  # noqa: S608 - quoted identifiers, bound values
                f"{q('attrs')} = %s, {q('note')} = %s WHERE {q('id')} = %s"
            )
        return {"insert": ins, "update": upd, "delete": f"DELETE FROM {t} WHERE {q('id')} = %s"}  # noqa: S608 - quoted identifiers, bound values

    def _now(self):
        now = dt.datetime.now(dt.UTC)
        return now if _is_pg(self.params) else now.replace(tzinfo=None)

    def _new_key(self) -> int:
        with self._lock:
            self._next_key += 1
            return self._next_key

    def _row(self, key: int, rnd: random.Random) -> tuple:
        payload = rnd.randbytes(16)
        if _is_pg(self.params):
            import psycopg2

            payload = psycopg2.Binary(payload)
        return (
            key,
            f"customer {key:08d} v{rnd.randrange(1000)}",
            f"{rnd.randrange(10**9) / 100:.2f}",
            self._now(),
            rnd.random() < 0.5,
            json.dumps({"tier": rnd.randrange(5), "tags": ["w", rnd.randrange(7)]}),
            payload,
            None if rnd.random() < 0.1 else f"written {rnd.random():.6f}",
        )

    def start(self) -> BackgroundWriter:
        if self._workers:
            raise RuntimeError("writer already started")
        top = self._key_max if self._key_max is not None else max_id(self.params, self.table)
        self._key_max = max(top, 1)
        self._next_key = top  # new keys continue the key range (reinserts reuse deleted keys)
        self._t0 = time.monotonic()
        for i in range(self.threads):
            seed = None if self._seed is None else self._seed * 1000 + i
            th = threading.Thread(target=self._run, args=(i, seed), name=f"cdc-writer-{i}", daemon=True)
            th.start()
            self._workers.append(th)
        self._ready.wait(timeout=60)
        return self

    def _run(self, idx: int, seed: int | None) -> None:
        rnd = random.Random(seed)
        sql = self._sql()
        deleted: list[int] = []  # keys this thread deleted: candidates for re-insert
        kinds = list(self.mix)
        weights = [self.mix[k] for k in kinds]
        interval = None if self.rate is None else self.threads / self.rate
        try:
            conn = connect(self.params)
        except Exception as exc:
            with self._lock:
                self._stats.errors.append(f"writer {idx}: connect failed: {exc!r}")
            self._ready.wait(timeout=60)
            return
        self._ready.wait(timeout=60)
        next_at = time.monotonic()
        try:
            cur = conn.cursor()
            while not self._stop.is_set():
                kind = rnd.choices(kinds, weights)[0]
                done: Counter = Counter()
                try:
                    if kind == "update":
                        k = rnd.randint(1, self._key_max)
                        r = self._row(k, rnd)
                        cur.execute(sql["update"], (r[2], r[3], r[5], r[7], k))
                        done["update"] += 1
                    elif kind == "multi":
                        for k in sorted(rnd.sample(range(1, self._key_max + 1), min(self._key_max, rnd.randint(2, 4)))):
                            r = self._row(k, rnd)
                            cur.execute(sql["update"], (r[2], r[3], r[5], r[7], k))
                            done["update"] += 1
                    elif kind == "insert":
                        k = deleted.pop(rnd.randrange(len(deleted))) if deleted and rnd.random() < 0.5 else self._new_key()
                        cur.execute(sql["insert"], self._row(k, rnd))
                        done["reinsert" if k <= self._key_max else "insert"] += 1
                    else:
                        k = rnd.randint(1, self._key_max)
                        cur.execute(sql["delete"], (k,))
                        if cur.rowcount == 1:
                            deleted.append(k)
                        done["delete"] += 1
                    conn.commit()
                except Exception as exc:  # noqa: BLE001 - counted and reported; the writer keeps going
                    try:
                        conn.rollback()
                    except Exception:  # noqa: BLE001
                        conn.close()
                        conn = connect(self.params)
                        cur = conn.cursor()
                    with self._lock:
                        self._stats.aborted += 1
                        if len(self._stats.errors) < 5:
                            self._stats.errors.append(f"{kind}: {exc!r}")
                    continue
                with self._lock:
                    self._stats.committed += 1
                    self._stats.ops.update(done)
                if interval is not None:
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        self._stop.wait(delay)
                    elif delay < -1.0:
                        next_at = time.monotonic()  # fell behind: do not burst to catch up
        finally:
            conn.close()

    @property
    def committed(self) -> int:
        with self._lock:
            return self._stats.committed

    def stats(self) -> WriterStats:
        with self._lock:
            s = WriterStats(
                self._stats.committed, self._stats.aborted, Counter(self._stats.ops), 0.0, list(self._stats.errors)
            )
        s.seconds = (self._t1 or time.monotonic()) - self._t0 if self._t0 else 0.0
        return s

    def stop(self, timeout: float = 30.0) -> WriterStats:
        """Stop all threads (each finishes its current transaction) and return the totals."""
        self._stop.set()
        for th in self._workers:
            th.join(timeout)
        if self._t1 is None:
            self._t1 = time.monotonic()
        return self.stats()

    def __enter__(self) -> BackgroundWriter:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
