"""The consumer tier: independent Delta readers see exactly the source's rows in the mirror.

The mirror masks superseded row versions and deleted keys (tombstones) with Delta deletion
vectors, so any reader implementing the ``deletionVectors`` table feature must see exactly the
live rows. Three readers from the package registry, in a virtualenv of their own
(scripts/delta_readers_env.sh), read the mirror through tools/delta_read.py: deltalake
(delta-rs's DataFusion scan), polars (``read_delta``) and DuckDB's delta extension
(delta-kernel-rs). After every stage of one PostgreSQL table's life each reader's rows, less the
meta columns, equal the source's (a plain SELECT) row for row:

  snapshot under a live writer; two rounds of updates, deletes, re-inserts of deleted keys and
  primary-key changes; a TRUNCATE; inserts and ADD COLUMN; DROP COLUMN (the mirror keeps the
  column, compared on the common ones); a round applied through spark-submit; compaction;
  time travel to every stage's Delta version (all three readers); a vacuum at 0 hours.

A reader without the feature (deltalake 1.0.2) must refuse the table rather than show masked
rows. The same readers read the table's event log through its own Delta log
(sinks/event_log_table.py) after the snapshot, the Spark round and an event-log compaction whose
inputs are still in the folder: each sees every event the package's reader sees, once.
Slow (Airflow runs, a Spark submit, virtualenvs): marked ``consumer``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_cdc.core.position import parse_position
from airflow_provider_cdc.sinks import mirror_compaction
from airflow_provider_cdc.sinks.base import read_marker
from airflow_provider_cdc.sinks.event_log import compact_event_log, read_events, table_dir
from airflow_provider_cdc.sinks.mirror_history import version_at
from airflow_provider_cdc.storage.layout import mirror_dir
from tools import workload as w

from .helpers import Pipeline, qt, run_sql

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.consumer, pytest.mark.timeout(1800)]

READERS = ("deltalake", "polars", "duckdb")
META = ("__key", "__position", "__deleted", "__bucket")


@dataclass(frozen=True)
class Interpreters:
    current: str  # deltalake 1.x, polars 2.x, duckdb 1.4.4 + delta extension
    old: str  # deltalake 1.0.2: no deletion vectors


@pytest.fixture(scope="session")
def delta_readers() -> Interpreters:
    """The readers' interpreters (scripts/delta_readers_env.sh builds their virtualenvs on first use)."""
    out = subprocess.run([str(ROOT / "scripts" / "delta_readers_env.sh")], capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, f"scripts/delta_readers_env.sh failed: {out.stderr[-3000:]}"
    current, old = out.stdout.strip().splitlines()[-2:]
    return Interpreters(current, old)


def _reader_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK", "PYTHONPATH"))}


def run_readers(python: str, path: str, readers=READERS, version: int | None = None) -> dict[str, tuple]:
    """Each reader's (exit code, rows, stderr) for the table at ``path`` (tools/delta_read.py),
    the readers run side by side."""
    procs = {}
    for r in readers:
        cmd = [python, str(ROOT / "tools" / "delta_read.py"), "--reader", r, "--table", path]
        if version is not None:
            cmd += ["--version", str(version)]
        procs[r] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=_reader_env(), cwd=str(ROOT))
    out = {}
    for r, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        rows = [json.loads(line) for line in stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
        out[r] = (proc.returncode, rows, stderr)
    return out


# --- the source, and values normalised to int or str ---------------------------------------------

def _canonical_json(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def norm(value, is_json: bool = False):
    """A source value (psycopg2's) or a reader's (tools/delta_read.py's JSON) as int, str or None."""
    if value is None:
        return None
    if is_json:
        return _canonical_json(json.loads(value) if isinstance(value, str) else value)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (Decimal, float)):
        return str(value)
    return str(value)


@dataclass(frozen=True)
class SourceRows:
    columns: tuple[str, ...]
    json_columns: frozenset[str]
    rows: tuple[tuple, ...]  # normalised, in ``columns`` order
    lsn: str = ""  # the source's WAL position when the copy was taken (nothing was writing)


def read_source(p: Pipeline) -> SourceRows:
    conn = w.connect(p.uri)
    try:
        cur = conn.cursor()
        cur.execute("SELECT column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s", (p.table.schema, p.table.name))
        json_cols = frozenset(c for c, ty in cur.fetchall() if ty in ("json", "jsonb"))
        cur.execute(f"SELECT * FROM {qt(p)}")  # noqa: S608
        cols = tuple(d[0] for d in cur.description)
        rows = tuple(tuple(norm(v, c in json_cols) for c, v in zip(cols, r, strict=True)) for r in cur.fetchall())
        cur.execute("SELECT pg_current_wal_lsn()::text")
        lsn = cur.fetchone()[0]
    finally:
        conn.rollback()
        conn.close()
    return SourceRows(cols, json_cols, rows, lsn)


def _sorted(rows) -> list[tuple]:
    return sorted(rows, key=lambda t: json.dumps(t, default=str))


def differences(stage: str, reader: str, src: SourceRows, got: list[dict]) -> list[str]:
    """What ``reader``'s rows lack or add against the source's, on their common columns; and
    any visible row that is a tombstone or repeats a key."""
    problems = []
    have_cols = set(got[0]) if got else set(src.columns) | set(META)
    missing_cols = [c for c in src.columns if c not in have_cols]
    if missing_cols:
        problems.append(f"[{stage}] {reader}: no column(s) {missing_cols} (has {sorted(have_cols)})")
    deleted = [r for r in got if r.get("__deleted") not in (False, None)]
    if deleted:
        problems.append(f"[{stage}] {reader}: {len(deleted)} visible row(s) with __deleted set, e.g. {deleted[:3]}")
    keys = Counter(r.get("__key") for r in got)
    repeated = {k: n for k, n in keys.items() if n > 1}
    if repeated:
        problems.append(f"[{stage}] {reader}: key(s) seen more than once: {dict(list(repeated.items())[:10])}")
    common = [i for i, c in enumerate(src.columns) if c in have_cols]
    names = [src.columns[i] for i in common]
    want = Counter(tuple(row[i] for i in common) for row in src.rows)
    have = Counter(tuple(norm(r.get(c), c in src.json_columns) for c in names) for r in got)
    if want != have:
        extra, missing = _sorted((have - want).elements()), _sorted((want - have).elements())
        problems.append(
            f"[{stage}] {reader}: {sum(have.values())} row(s), source {sum(want.values())}; columns {names}\n"
            f"  extra ({len(extra)}): {extra[:10]}\n  missing ({len(missing)}): {missing[:10]}")
    return problems


@dataclass
class Stage:
    name: str
    version: int
    source: SourceRows
    masked: int  # stored row versions its deletion vectors mask


class Consumers:
    """The three readers against the source, stage after stage (each stage's Delta version kept
    for the time-travel check)."""

    def __init__(self, p: Pipeline, interpreters: Interpreters) -> None:
        self.p, self.py = p, interpreters
        self.path = str(mirror_dir(p.data_dir, p.source, p.table))
        self.stages: list[Stage] = []
        self.log: list[str] = []

    def check(self, stage: str, *, verify: bool = True) -> None:
        if verify:
            self.p.assert_equal()  # the package's own verify and event log, as a baseline
        src = read_source(self.p)
        dt = DeltaTable(self.path)
        version = dt.version()
        stored = sum(pa.table(dt.get_add_actions(flatten=True)).column("num_records").to_pylist())
        masked = sum(v.count(False) for v in pa.table(dt.deletion_vectors()).column("selection_vector").to_pylist())
        t0 = time.monotonic()
        got = run_readers(self.py.current, self.path)
        problems = []
        for reader, (rc, rows, err) in got.items():
            if rc != 0:
                problems.append(f"[{stage}] {reader} refused the mirror (exit {rc}): {err.strip()[-2000:]}")
            else:
                problems += differences(stage, reader, src, rows)
        self.log.append(f"{stage}: Delta version {version}, {len(src.rows)} source rows, {stored} stored row "
                        f"versions of which {masked} masked, readers in {time.monotonic() - t0:.1f} s")
        print(self.log[-1])
        # the Delta statistics agree: stored row versions less those masked are the live rows
        if stored - masked != len(src.rows):
            problems.append(f"[{stage}] the Delta log counts {stored} stored rows and {masked} masked by deletion "
                            f"vectors: {stored - masked} live, the source has {len(src.rows)}")
        assert problems == [], "\n".join(problems)
        self.stages.append(Stage(stage, version, src, masked))

    def check_events(self, stage: str) -> None:
        """Each reader of the table's event log (its Delta log) sees exactly the events the
        package's reader does, each once: (op, key, position)."""
        ev = read_events(self.p.data_dir, self.p.source, self.p.table)
        want = Counter(zip(ev["op"].to_pylist(), ev["key"].to_pylist(), ev["position"].to_pylist(), strict=True))
        assert want and max(want.values()) == 1, f"[{stage}] the package's reader repeats events"
        folder = str(table_dir(self.p.data_dir, self.p.source, self.p.table))
        problems = []
        for reader, (rc, rows, err) in run_readers(self.py.current, folder).items():
            if rc != 0:
                problems.append(f"[{stage}] {reader} refused the event log (exit {rc}): {err.strip()[-2000:]}")
                continue
            have = Counter((r["op"], r["key"], r["source"]["position"]) for r in rows)
            if have != want:
                problems.append(f"[{stage}] event log, {reader}: {sum(have.values())} events, the package's "
                                f"reader {sum(want.values())}; extra {list((have - want).elements())[:5]}, "
                                f"missing {list((want - have).elements())[:5]}")
        print(f"{stage}: event log of {sum(want.values())} events, read alike by {len(READERS)} readers")
        assert problems == [], "\n".join(problems)

    def time_travel(self) -> None:
        """Every stage's Delta version, and the version the package names for the source position
        the stage's copy was taken at (sinks/mirror_history.py), read again by each reader, equals
        the source as it was."""
        problems = []
        for st in self.stages:
            found = version_at(self.p.data_dir, self.p.source, self.p.table, parse_position(st.source.lsn))
            assert found is not None and found.exact, f"{st.name} at {st.source.lsn}: {found}"
            for version in sorted({st.version, found.version}):
                problems += self._read_at(st, version)
        assert problems == [], "\n".join(problems)

    def _read_at(self, st: Stage, version: int) -> list[str]:
        problems = []
        for reader, (rc, rows, err) in run_readers(self.py.current, self.path, version=version).items():
            if rc != 0:
                problems.append(f"[time travel to {st.name}, v{version}] {reader} failed (exit {rc}): "
                                f"{err.strip()[-2000:]}")
            else:
                problems += differences(f"time travel to {st.name}, v{version}", reader, st.source, rows)
        return problems

    def old_reader_refuses(self) -> None:
        rc, rows, err = run_readers(self.py.old, self.path, readers=("deltalake",))["deltalake"]
        assert rc != 0, f"deltalake 1.0.2 read a deletion-vector mirror ({len(rows)} rows) instead of refusing it"
        assert re.search(r"deletion ?vectors", err, re.I) and re.search(r"reader feature", err, re.I), err


# --- the workload ----------------------------------------------------------------------------------

def fill(t: str, lo: int, hi: int, label: str, *, note: bool = True, extra: bool = False) -> str:
    """Rows ``lo..hi`` of the demo table's shape (every column typed: numeric, timestamptz,
    boolean, jsonb, bytea), ``note`` and ``extra`` when the table has them."""
    cols = ["id", "name", "amount", "updated_at", "active", "attrs", "payload"]
    vals = ["g", f"'{label} ' || g", "round(mod(g * 7919, 1000000)::numeric / 100, 2)",
            "timestamptz '2024-06-01 00:00:00+00' + g * interval '1.000123 second'", "mod(g, 2) = 0",
            f"jsonb_build_object('tier', mod(g, 5), 'label', '{label}', 'tags', jsonb_build_array('x', g))",
            f"decode(md5('{label}' || g), 'hex')"]
    if note:
        cols.append("note")
        vals.append(f"CASE WHEN mod(g, 4) = 0 THEN NULL ELSE '{label} note ' || g END")
    if extra:
        cols.append("extra")
        vals.append(f"'{label} extra ' || g")
    return (f"INSERT INTO {t} ({', '.join(cols)}) SELECT {', '.join(vals)} "  # noqa: S608
            f"FROM generate_series({lo}::bigint, {hi}::bigint) AS g")


def dml_round(t: str, label: str, *, note: bool = True, base: int = 0) -> list[str]:
    """One round, a transaction per item: updates (some rows twice), deletes, re-inserts of the
    deleted keys, primary-key changes (to new keys, onto a deleted key, away and back, and a swap
    of two keys in one transaction)."""
    b = base
    return [
        f"UPDATE {t} SET name = '{label} ' || id, amount = amount + 1 WHERE id BETWEEN {b + 1} AND {b + 60}",
        f"UPDATE {t} SET payload = decode('00ff', 'hex'), attrs = '{{\"again\": true}}' "
        f"WHERE id BETWEEN {b + 1} AND {b + 30}",
        f"DELETE FROM {t} WHERE id BETWEEN {b + 101} AND {b + 140}",
        fill(t, b + 101, b + 120, f"{label} back", note=note),  # deleted keys, inserted again
        f"UPDATE {t} SET id = id + 5000000 WHERE id BETWEEN {b + 201} AND {b + 220}",  # to new keys
        f"UPDATE {t} SET id = {b + 121}, name = '{label} moved' WHERE id = {b + 300}",  # onto a deleted key
        f"UPDATE {t} SET id = 7000001 WHERE id = {b + 400}",  # away ...
        f"UPDATE {t} SET id = {b + 400}, name = '{label} back home' WHERE id = 7000001",  # ... and back
        # a swap of two keys in one transaction (the primary key is checked per row)
        f"UPDATE {t} SET id = -1 WHERE id = {b + 501}; UPDATE {t} SET id = {b + 501} WHERE id = {b + 502}; "
        f"UPDATE {t} SET id = {b + 502} WHERE id = -1",
        f"DELETE FROM {t} WHERE id BETWEEN {b + 111} AND {b + 115}",  # some re-inserted keys deleted again
        f"UPDATE {t} SET name = '{label} last' WHERE id BETWEEN {b + 101} AND {b + 130}",
    ]


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_independent_delta_readers_see_exactly_the_source(pipeline, delta_readers):
    p = pipeline
    t = qt(p)
    c = Consumers(p, delta_readers)
    t0 = time.monotonic()

    # a snapshot under a live writer, then the log caught up
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=43) as writer:
        p.snapshot()
        time.sleep(0.5)
    assert writer.stats().committed > 0
    p.catch_up()
    c.check("snapshot under a writer")
    c.check_events("snapshot under a writer")
    c.old_reader_refuses()

    # rounds of updates, deletes, re-inserts of deleted keys and primary-key changes
    run_sql(p, dml_round(t, "r1"), one_transaction=False)
    p.catch_up()
    c.check("round 1")
    assert c.stages[-1].masked > 0, "round 1 left no masked row version: the readers' deletion vectors went untested"
    run_sql(p, [f"INSERT INTO {t} (id, name, amount, updated_at, active) VALUES (101, 'r2 upsert', 1, now(), true) "
                f"ON CONFLICT (id) DO UPDATE SET name = 'r2 upserted'",
                f"UPDATE {t} SET id = id - 5000000 WHERE id BETWEEN 5000201 AND 5000210",  # back to their old keys
                f"DELETE FROM {t} WHERE mod(id, 97) = 0",
                fill(t, 8000001, 8000050, "r2 new"),
                f"UPDATE {t} SET note = NULL, active = NOT active WHERE id BETWEEN 600 AND 700"]
            + dml_round(t, "r2", base=1000), one_transaction=False)
    p.catch_up()
    c.check("round 2")

    # TRUNCATE: nothing left
    run_sql(p, [f"TRUNCATE TABLE {t}"])
    p.catch_up()
    c.check("truncate", verify=False)  # (verify wants rows)
    assert c.stages[-1].source.rows == ()

    # inserts, then ADD COLUMN with rows written after it
    run_sql(p, [fill(t, 1, 800, "after truncate"),
                f"DELETE FROM {t} WHERE id BETWEEN 700 AND 720",
                f"ALTER TABLE {t} ADD COLUMN extra varchar(40)",
                f"UPDATE {t} SET extra = 'added ' || id WHERE id <= 50",
                fill(t, 9000001, 9000010, "with extra", extra=True),
                f"UPDATE {t} SET id = id + 100000, extra = 'moved' WHERE id BETWEEN 60 AND 65",
                f"DELETE FROM {t} WHERE id BETWEEN 30 AND 35"], one_transaction=False)
    p.catch_up()
    c.check("add column")

    # DROP COLUMN: the mirror keeps it (null from then on); compared on the common columns
    run_sql(p, [f"ALTER TABLE {t} DROP COLUMN note",
                f"UPDATE {t} SET name = 'after drop', extra = 'after drop' WHERE id BETWEEN 1 AND 20",
                fill(t, 9100001, 9100010, "after drop", note=False, extra=True),
                f"DELETE FROM {t} WHERE id BETWEEN 21 AND 25"] + dml_round(t, "r3", note=False),
            one_transaction=False)
    p.catch_up()
    c.check("drop column")

    # a round applied through spark-submit (CDC_LOCAL_MAX_ROWS=0: every round to Spark)
    p.mp.setenv("CDC_LOCAL_MAX_ROWS", "0")
    run_sql(p, [fill(t, 2001, 2300, "spark", note=False, extra=True),
                f"DELETE FROM {t} WHERE id BETWEEN 2101 AND 2150",
                fill(t, 2101, 2120, "spark back", note=False),
                f"UPDATE {t} SET id = id + 300000, extra = 'spark moved' WHERE id BETWEEN 2201 AND 2210",
                f"UPDATE {t} SET name = 'spark', amount = amount * 2 WHERE id BETWEEN 1 AND 400"], one_transaction=False)
    p.catch_up()
    c.check("spark round")
    assert c.stages[-1].masked > 0, "the Spark round left no masked row version: its deletion vectors went unread"
    c.check_events("spark round")
    # the event log's small changelog files merged; their inputs stay in the folder for an hour
    merged = compact_event_log(p.data_dir, p.source, read_marker(p.data_dir, p.source, "events"), min_files=2)
    assert merged, "no event-log run to merge: the compaction's single commit went untested"
    c.check_events("event-log compaction")
    p.mp.setenv("CDC_LOCAL_MAX_ROWS", "1000000")

    # compaction (the tombstones removed, buckets rewritten), every stage's version read again,
    # then a vacuum at 0 hours (the files only old versions referenced are gone)
    mirror_compaction.compact(p.data_dir, p.source, p.table)
    c.check("compaction")
    c.time_travel()
    mirror_compaction.vacuum(c.path, 0)
    c.check("vacuum")
    c.old_reader_refuses()
    print("\n".join(c.log) + f"\ntotal {time.monotonic() - t0:.0f} s")
