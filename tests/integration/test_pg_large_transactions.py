"""A PostgreSQL transaction larger than a segment is staged in parts as it arrives (issue 32).

pgoutput sends a transaction only once it committed, so its parts may be staged before its
Commit message; the slot is confirmed only at a commit. Shown on the real server:
- a 12,000-row UPDATE with segments of 1,000 events is staged in parts no larger than the cut
  (2,000 messages), and the parts hold exactly the events one whole segment holds, positions
  included;
- the byte bound cuts too (a few large values);
- a subtransaction rolled back inside a committed transaction, and an aborted transaction,
  leave nothing;
- a capture killed between two parts of one transaction (a fault no real part produces on
  demand: injected in the staging write) leaves the slot where it was, and the next capture
  stages every change exactly once.
"""

from __future__ import annotations

from contextlib import closing

import psycopg2
import pyarrow.compute as pc
import pytest

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.pipeline import capture as capture_mod
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments, read_table

ROWS = 12_000


@pytest.fixture
def big(pg_uri, unique_name, tmp_path):
    """A table of ROWS rows and a factory of dialects capturing it (each its own slot)."""
    table = TableName("public", f"bigtx_{unique_name}")
    with closing(psycopg2.connect(pg_uri)) as c:
        c.autocommit = True
        c.cursor().execute(f'CREATE TABLE "{table.name}" (id int PRIMARY KEY, v text, b bytea)')
        c.cursor().execute(f"INSERT INTO \"{table.name}\" SELECT g, 'v', NULL FROM generate_series(1, {ROWS}) g")
    made = []

    def dialect(name: str, **options):
        d = get_dialect(ConnectionParams.from_uri(pg_uri), source=f"bt{name}_{unique_name}", tables=[table],
                        watermark_table=f"wm_{unique_name}", **options)
        made.append(d)
        return d, str(tmp_path / name)

    yield table, dialect
    for d in made:
        d.drop_slot()
        d.drop_publication()
        d.close()
    with closing(psycopg2.connect(pg_uri)) as c:
        c.autocommit = True
        c.cursor().execute(f'DROP TABLE "{table.name}"')


def run(pg_uri: str, *statements: str) -> None:
    with closing(psycopg2.connect(pg_uri)) as c:
        cur = c.cursor()
        for sql in statements:
            cur.execute(sql)
        c.commit()


def staged(data_dir: str, source: str):
    """Every staged event (position, table, op, key) in position order, and the segments' sizes."""
    segments = list_segments(changelog_dir(data_dir, source))
    tables = [read_table(p, columns=["position", "table", "op", "key"]) for _, _, p in segments]
    rows = [r for t in tables for r in zip(*(t.column(c).to_pylist() for c in ("position", "table", "op", "key")),
                                          strict=True)]
    return rows, [t.num_rows for t in tables]


def test_a_transaction_larger_than_a_segment_is_staged_in_parts_equal_to_one_segment(pg_uri, big):
    table, dialect = big
    parts, parts_dir = dialect("parts", segment_max_events=1000)
    whole, whole_dir = dialect("whole", segment_max_events=0)
    for d, data in ((parts, parts_dir), (whole, whole_dir)):
        stage_changelog(d, data)
    run(pg_uri, f"UPDATE \"{table.name}\" SET v = 'x' || id", f"INSERT INTO \"{table.name}\" VALUES (0, 'after', NULL)")
    res = stage_changelog(parts, parts_dir)
    stage_changelog(whole, whole_dir)
    got, sizes = staged(parts_dir, parts.source)
    want, whole_sizes = staged(whole_dir, whole.source)
    assert len(whole_sizes) == 1 and len(sizes) >= ROWS // 2000
    assert max(sizes) <= 2000, sizes  # the cut: twice segment_max_events messages
    mine = [r for r in got if r[1] == table.id]
    assert len(mine) == ROWS + 1 and got == want  # same events, same positions, in the same order
    assert len({r[0] for r in got}) == len(got)
    assert res.events == len(got)
    # the slot stands at the last commit: nothing more to read
    assert stage_changelog(parts, parts_dir).events == 0


def test_the_byte_bound_cuts_a_transaction_of_large_values(pg_uri, big):
    table, dialect = big
    d, data = dialect("bytes", segment_max_events=10_000, segment_max_bytes=4 * 1024 * 1024)
    stage_changelog(d, data)
    run(pg_uri, f"UPDATE \"{table.name}\" SET b = decode(repeat('ab', 512 * 1024), 'hex') WHERE id <= 20")
    stage_changelog(d, data)
    rows, sizes = staged(data, d.source)
    assert len([r for r in rows if r[1] == table.id]) == 20
    assert len(sizes) >= 4, sizes  # 20 messages of ~1 MB (old and new value) in parts of 4 MB


def test_rolled_back_subtransactions_and_aborted_transactions_leave_nothing(pg_uri, big):
    table, dialect = big
    d, data = dialect("abort", segment_max_events=1000)
    stage_changelog(d, data)
    with closing(psycopg2.connect(pg_uri)) as c:
        cur = c.cursor()
        cur.execute(f"UPDATE \"{table.name}\" SET v = 'gone' WHERE id <= 3000")
        c.rollback()  # aborted, and large
        cur.execute(f"UPDATE \"{table.name}\" SET v = 'kept' WHERE id = 1")
        cur.execute("SAVEPOINT s")
        cur.execute(f"UPDATE \"{table.name}\" SET v = 'sub' WHERE id <= 2500")
        cur.execute("ROLLBACK TO SAVEPOINT s")
        cur.execute(f"INSERT INTO \"{table.name}\" VALUES (-1, 'kept', NULL)")
        c.commit()
    stage_changelog(d, data)
    events = [r for r in staged(data, d.source)[0] if r[1] == table.id]
    assert [(op, key) for _, _, op, key in events] == [("u", "[1]"), ("c", "[-1]")]
    after = pc.unique(read_table(list_segments(changelog_dir(data, d.source))[0][2]).column("table"))
    assert table.id in after.to_pylist()


def test_a_capture_killed_between_parts_of_a_transaction_resumes_with_nothing_lost_or_twice(
    pg_uri, big, monkeypatch
):
    table, dialect = big
    d, data = dialect("kill", segment_max_events=1000)
    stage_changelog(d, data)
    before = d.load_offset(data)
    run(pg_uri, f"UPDATE \"{table.name}\" SET v = 'k' || id")
    real = capture_mod.write_segment
    calls = {"n": 0}

    def dies_on_the_third_part(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("injected: the worker died while staging the third part")
        return real(*args, **kwargs)

    monkeypatch.setattr(capture_mod, "write_segment", dies_on_the_third_part)
    with pytest.raises(OSError, match="injected"):
        stage_changelog(d, data)
    d.close()
    assert len(list_segments(changelog_dir(data, d.source))) == 2  # two parts staged, the slot not moved
    assert d.load_offset(data) == before
    monkeypatch.setattr(capture_mod, "write_segment", real)
    stage_changelog(d, data)
    events = [r for r in staged(data, d.source)[0] if r[1] == table.id]
    keys = [r[3] for r in events]
    assert len(keys) == ROWS and len(set(keys)) == ROWS  # every change once: 0 missing, 0 twice
    assert len({r[0] for r in events}) == ROWS


def _updates_in_transactions(pg_uri: str, table: TableName, transactions: int, rows: int) -> None:
    with closing(psycopg2.connect(pg_uri)) as c:
        cur = c.cursor()
        for i in range(transactions):
            cur.execute(f"UPDATE \"{table.name}\" SET v = 's' || id WHERE id > %s AND id <= %s",
                        (i * rows, (i + 1) * rows))
            c.commit()


def test_a_run_reads_the_slot_in_bounded_steps_each_staged_then_confirmed(pg_uri, big, monkeypatch):
    """A read is one step of at most capture_step_messages messages (whole transactions): a
    run stages and confirms step after step, and a capture killed after a step was confirmed
    goes on from there with every change once."""
    table, dialect = big
    d, data = dialect("steps", segment_max_events=100, capture_step_messages=50)
    stage_changelog(d, data)
    _updates_in_transactions(pg_uri, table, 30, 10)  # 12 messages each: Begin, 10 rows, Commit
    confirmed: list[str] = []
    real = d.commit_offset

    def confirm_then_die_at_the_third(offset, data_dir):
        if len(confirmed) == 2:
            raise OSError("injected: the worker died before confirming the third step")
        real(offset, data_dir)
        confirmed.append(offset)

    monkeypatch.setattr(d, "commit_offset", confirm_then_die_at_the_third)
    with pytest.raises(OSError, match="injected"):
        stage_changelog(d, data)
    assert d.load_offset(data) == confirmed[-1]  # two steps confirmed, the third re-read next time
    monkeypatch.setattr(d, "commit_offset", real)
    rest = stage_changelog(d, data)
    events = [r for r in staged(data, d.source)[0] if r[1] == table.id]
    keys = [r[3] for r in events]
    assert len(keys) == 300 and len(set(keys)) == 300  # 0 missing, 0 twice
    # steps of 50 messages end at the transaction that reaches 50: 5 transactions (50 events) each
    assert 0 < rest.events <= 300 - 2 * 50
    assert stage_changelog(d, data).events == 0


def test_max_events_bounds_the_step_and_ends_the_run_at_a_commit(pg_uri, big):
    table, dialect = big
    d, data = dialect("maxev", segment_max_events=100)
    stage_changelog(d, data)
    _updates_in_transactions(pg_uri, table, 10, 10)
    first = stage_changelog(d, data, max_events=25)
    assert 25 <= first.events < 100 and first.events % 10 == 0  # whole transactions, stopped past 25
    assert first.events + stage_changelog(d, data).events == 100
