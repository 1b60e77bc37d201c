"""MariaDB capture of large groups and XA transactions (issue 32), on the real server.

- A transaction larger than a segment is staged in parts before its XID (the binlog holds only
  committed groups); the parts hold exactly what one whole segment holds, and the memory of a
  capture does not follow the transaction's size.
- A capture killed between two parts of one transaction (a fault no real part produces on
  demand: injected in the staging write) leaves the offset where it was; the next capture
  stages every change exactly once, rewriting the same segment names.
- XA: a prepared transaction's events wait under ``<changelog>/_xa`` and are staged at its
  XA COMMIT (its position), in the same capture run or a later one; XA ROLLBACK leaves
  nothing; XA COMMIT ... ONE PHASE is an ordinary group; a commit whose prepare the capture
  never read is refused, naming the transaction.
- Groups with non-transactional changes: what a ROLLBACK or ROLLBACK TO SAVEPOINT undid is
  not staged, the non-transactional changes are.
"""

from __future__ import annotations

import json
import tracemalloc
from contextlib import closing

import pymysql
import pytest

from airflow_provider_cdc.core.errors import SourceError
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.core.schema import TableName, decode_key
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.dialects.mysql import XA_DIR, BinlogOffset, MySqlDialect
from airflow_provider_cdc.pipeline import capture as capture_mod
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments, read_log_events, read_table

DB = "cdc_test"


def _connect(mysql_uri):
    p = ConnectionParams.from_uri(mysql_uri)
    return pymysql.connect(host=p.host, port=p.port or 3306, user=p.user or "root", password=p.password or "",
                           charset="utf8mb4", autocommit=True)


@pytest.fixture
def sql(mysql_uri):
    with closing(_connect(mysql_uri)) as conn:
        yield conn.cursor()


@pytest.fixture
def table(sql, unique_name):
    """A captured InnoDB table (id, v) of this test, dropped after it."""
    name = f"lx_{unique_name}"
    sql.execute(f"CREATE TABLE `{DB}`.`{name}` (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    yield name
    sql.execute(f"DROP TABLE IF EXISTS `{DB}`.`{name}`")


@pytest.fixture
def make_dialect(mysql_uri, unique_name):
    made = []

    def make(*tables: str, **options) -> MySqlDialect:
        d = get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"mx_{unique_name}", watermark_schema="cdc",
                        watermark_table=f"wm_{unique_name}", tables=[TableName(DB, t) for t in tables], **options)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


@pytest.fixture
def xa(mysql_uri, unique_name):
    """A connection for XA statements (ids end with the test's unique name); a transaction a
    failing test left prepared is rolled back (the server keeps it past the connection)."""
    with closing(_connect(mysql_uri)) as conn:
        cur = conn.cursor()
        yield cur
        cur.execute("XA RECOVER")
        for fmt, glen, _blen, data in cur.fetchall():
            data = data if isinstance(data, bytes) else data.encode()
            if unique_name.encode() in data:
                cur.execute(f"XA ROLLBACK X'{data[:glen].hex()}',X'{data[glen:].hex()}',{fmt}")


def _insert_seq(sql, table: str, first: int, count: int, v: str = "a") -> None:
    """``count`` rows in one transaction (MariaDB's SEQUENCE engine makes them server-side)."""
    sql.execute(f"INSERT INTO `{DB}`.`{table}` SELECT seq, '{v}' FROM `{DB}`.seq_{first}_to_{first + count - 1}")


def _staged(d: MySqlDialect, data: str) -> list:
    return list(read_log_events(changelog_dir(data, d.source)))


def _raw_positions(d: MySqlDialect, data: str) -> list[str]:
    """Every staged row's position, duplicates kept (read_log_events would hide them)."""
    out = []
    for _f, _l, path in list_segments(changelog_dir(data, d.source)):
        out += read_table(path)["position"].to_pylist()
    return out


def _fold(events) -> dict:
    """The mirror the events make: key -> last after image (deletes remove)."""
    state = {}
    for e in events:
        if isinstance(e, ChangeEvent):
            k = decode_key(e.key)[0]
            if e.after is None:
                state.pop(k, None)
            else:
                state[k] = e.after
    return state


def _source(sql, table: str) -> dict:
    sql.execute(f"SELECT id, v FROM `{DB}`.`{table}`")
    return {i: {"id": i, "v": v} for i, v in sql.fetchall()}


def _xa_files(d: MySqlDialect, data: str) -> list[str]:
    import os

    root = os.path.join(changelog_dir(data, d.source), XA_DIR)
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


# --------------------------------------------------------------------------- large groups


def test_a_large_transaction_is_staged_in_parts_equal_to_one_segment(make_dialect, sql, table, tmp_path):
    d = make_dialect(table)
    parts_dir, whole_dir = str(tmp_path / "parts"), str(tmp_path / "whole")
    start = d.load_offset(parts_dir)
    d.commit_offset(start, whole_dir)
    _insert_seq(sql, table, 0, 50_000)
    sql.execute(f"INSERT INTO `{DB}`.`{table}` VALUES (-1, 'after')")

    parts = stage_changelog(d, parts_dir, segment_max_events=5_000)
    whole = stage_changelog(d, whole_dir, segment_max_events=0)
    assert parts.events == whole.events == 50_001
    assert len(whole.segments) == 1 and len(parts.segments) >= 5
    # each ends at a group end, where the server knows its GTID position (the two may differ: other
    # tests write to the same server between the captures)
    for res in (parts, whole):
        o = json.loads(res.end_offset)
        sql.execute("SELECT BINLOG_GTID_POS(%s, %s)", (o["file"], o["pos"]))
        assert o["gtid"] == sql.fetchone()[0], res.end_offset
    segs = list_segments(changelog_dir(parts_dir, d.source))
    assert all(a[1] < b[0] for a, b in zip(segs, segs[1:], strict=False))  # position ranges do not overlap
    # a cut inside the transaction comes at twice the segment's events: no part is larger
    assert max(read_table(p).num_rows for _f, _l, p in segs) <= 10_000
    assert _staged(d, parts_dir) == _staged(d, whole_dir)


def test_capture_memory_does_not_follow_the_transaction(make_dialect, sql, table, tmp_path):
    """Peak Python memory (tracemalloc) of capturing one 5,000-row and one 25,000-row
    transaction with segments of 500 events: the same bound, not 5x (before: every event
    of a group was held until its XID)."""
    d = make_dialect(table)
    data = str(tmp_path)
    d.load_offset(data)
    stage_changelog(d, data)  # imports and first-use caches out of the measure
    peaks = []
    for first, count in ((0, 5_000), (100_000, 25_000)):
        _insert_seq(sql, table, first, count)
        tracemalloc.start()
        try:
            res = stage_changelog(d, data, segment_max_events=500)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert res.events == count and len(res.segments) == count // 1_000
    assert peaks[1] < 2 * peaks[0], f"peak {peaks[1]:,} B for 25k rows vs {peaks[0]:,} B for 5k"


def test_a_capture_killed_inside_a_transaction_resumes_without_loss_or_duplicates(
    make_dialect, sql, table, tmp_path, monkeypatch
):
    d = make_dialect(table)
    data = str(tmp_path)
    start = d.load_offset(data)
    _insert_seq(sql, table, 0, 30_000)
    sql.execute(f"INSERT INTO `{DB}`.`{table}` VALUES (-1, 'after')")
    written_end = d.binlog_end()
    real, written = capture_mod.write_segment, []

    def dies_after_two(*args, **kwargs):
        if len(written) == 2:
            raise RuntimeError("killed after the 2nd part")
        written.append(real(*args, **kwargs))
        return written[-1]

    monkeypatch.setattr(capture_mod, "write_segment", dies_after_two)
    with pytest.raises(RuntimeError, match="2nd part"):
        stage_changelog(d, data, segment_max_events=5_000)
    monkeypatch.setattr(capture_mod, "write_segment", real)
    assert d.load_offset(data) == start  # the offset did not move into the transaction (I6)

    res = stage_changelog(d, data, segment_max_events=5_000)
    assert set(written) <= set(res.segments)  # the same cuts: the same names, rewritten
    positions = _raw_positions(d, data)
    assert len(positions) == len(set(positions)) == 30_001  # 0 duplicated
    keys = sorted(decode_key(e.key)[0] for e in _staged(d, data))
    assert keys == [-1, *range(30_000)]  # 0 missing
    assert BinlogOffset.from_json(res.end_offset) >= written_end  # past the transaction: a group end
    assert d.load_offset(data) == res.end_offset


def test_max_events_still_stops_at_a_group_end(make_dialect, sql, table, tmp_path):
    d = make_dialect(table)
    data = str(tmp_path)
    d.load_offset(data)
    _insert_seq(sql, table, 0, 3_000)
    sql.execute(f"INSERT INTO `{DB}`.`{table}` VALUES (-1, 'after')")
    first = stage_changelog(d, data, max_events=10, segment_max_events=500)
    assert first.events == 3_000 and len(first.segments) >= 3  # the whole transaction, in parts
    second = stage_changelog(d, data, segment_max_events=500)
    assert second.events == 1 and second.start_offset == first.end_offset


# --------------------------------------------------------------------------- XA


def test_xa_commit_in_the_same_run_lands_at_the_commit_in_order(make_dialect, sql, xa, table, tmp_path, unique_name):
    u = f"t{unique_name}_"
    d = make_dialect(table)
    data = str(tmp_path)
    d.load_offset(data)
    t = f"`{DB}`.`{table}`"
    xa.execute(f"XA START '{u}1'")
    xa.execute(f"INSERT INTO {t} VALUES (1, 'xa')")
    xa.execute(f"UPDATE {t} SET v = 'xa2' WHERE id = 1")
    xa.execute(f"XA END '{u}1'")
    xa.execute(f"XA PREPARE '{u}1'")
    sql.execute(f"INSERT INTO {t} VALUES (5, 'plain')")  # committed while t1 is prepared
    xa.execute(f"XA COMMIT '{u}1'")
    sql.execute(f"UPDATE {t} SET v = 'after' WHERE id = 1")
    sql.execute(f"INSERT INTO {t} VALUES (6, 'plain')")

    res = stage_changelog(d, data)
    events = _staged(d, data)
    assert [(e.op, decode_key(e.key)[0]) for e in events] == [("c", 5), ("c", 1), ("u", 1), ("u", 1), ("c", 6)]
    xa_events = events[1:3]
    assert xa_events[0].position.minor == xa_events[1].position.minor  # the XA COMMIT's offset
    assert [e.position.index for e in xa_events] == [0, 1]
    assert events[0].position < xa_events[0].position < events[3].position
    assert _fold(events) == _source(sql, table)
    assert res.events == 5 and _xa_files(d, data) == []  # resolved and committed: nothing waits


def test_xa_prepared_in_one_run_and_committed_in_the_next(make_dialect, sql, xa, table, tmp_path, unique_name):
    u = f"t{unique_name}_"
    d = make_dialect(table)
    data = str(tmp_path)
    d.load_offset(data)
    t = f"`{DB}`.`{table}`"
    sql.execute(f"INSERT INTO {t} VALUES (1, 'one')")
    xa.execute(f"XA START '{u}2','b',7")
    xa.execute(f"INSERT INTO {t} VALUES (2, 'xa')")
    xa.execute(f"UPDATE {t} SET v = 'xa' WHERE id = 1")
    xa.execute(f"XA END '{u}2','b',7")
    xa.execute(f"XA PREPARE '{u}2','b',7")

    prepared_end = d.binlog_end()

    first = stage_changelog(d, data)
    assert first.events == 1  # the prepared changes are not visible yet
    assert BinlogOffset.from_json(first.end_offset) >= prepared_end  # the offset passed the prepare
    assert any(f.startswith("x-7-") for f in _xa_files(d, data))  # ... once its events were staged aside

    xa.execute(f"XA COMMIT '{u}2','b',7")
    sql.execute(f"INSERT INTO {t} VALUES (3, 'plain')")
    second = stage_changelog(make_dialect(table), data)  # a new process: only the staged files remember t2
    assert second.events == 3
    events = _staged(d, data)
    assert [(e.op, decode_key(e.key)[0]) for e in events] == [("c", 1), ("c", 2), ("u", 1), ("c", 3)]
    assert _fold(events) == _source(sql, table)
    assert _xa_files(d, data) == []


def test_xa_rollback_leaves_nothing(make_dialect, sql, xa, table, tmp_path, unique_name):
    u = f"t{unique_name}_"
    d = make_dialect(table)
    data = str(tmp_path)
    d.load_offset(data)
    t = f"`{DB}`.`{table}`"
    for key, split in ((3, True), (4, False)):  # across two runs, and inside one
        xa.execute(f"XA START '{u}{key}'")
        xa.execute(f"INSERT INTO {t} VALUES ({key}, 'xa')")
        xa.execute(f"XA END '{u}{key}'")
        xa.execute(f"XA PREPARE '{u}{key}'")
        if split:
            assert stage_changelog(d, data).events == 0
        xa.execute(f"XA ROLLBACK '{u}{key}'")
    sql.execute(f"INSERT INTO {t} VALUES (9, 'plain')")
    assert stage_changelog(d, data).events == 1
    assert [decode_key(e.key)[0] for e in _staged(d, data)] == [9]
    assert _xa_files(d, data) == []


def test_xa_one_phase_commit_is_captured(make_dialect, sql, xa, table, tmp_path, unique_name):
    u = f"t{unique_name}_"
    d = make_dialect(table)
    data = str(tmp_path)
    d.load_offset(data)
    t = f"`{DB}`.`{table}`"
    xa.execute(f"XA START '{u}5'")
    xa.execute(f"INSERT INTO {t} VALUES (1, 'xa'), (2, 'xa')")
    xa.execute(f"DELETE FROM {t} WHERE id = 2")
    xa.execute(f"XA END '{u}5'")
    xa.execute(f"XA COMMIT '{u}5' ONE PHASE")
    stage_changelog(d, data)
    events = _staged(d, data)
    assert [(e.op, decode_key(e.key)[0]) for e in events] == [("c", 1), ("c", 2), ("d", 2)]
    assert _fold(events) == _source(sql, table)


def test_xa_commit_of_a_prepare_never_read_is_refused_by_name(make_dialect, sql, xa, table, tmp_path, unique_name):
    u = f"t{unique_name}_"
    d = make_dialect(table)
    data = str(tmp_path)
    t = f"`{DB}`.`{table}`"
    xa.execute(f"XA START '{u}6'")
    xa.execute(f"INSERT INTO {t} VALUES (1, 'xa')")
    xa.execute(f"XA END '{u}6'")
    xa.execute(f"XA PREPARE '{u}6'")
    start = d.load_offset(data)  # the capture starts while t6 is prepared
    xa.execute(f"XA COMMIT '{u}6'")
    with pytest.raises(SourceError, match=rf"XA COMMIT of XA transaction '{u}6' .*never read its XA PREPARE.*"
                                          r"on_unreadable='skip'"):
        stage_changelog(d, data)
    assert d.load_offset(data) == start
    d.log.on_unreadable = "skip"  # after a re-snapshot: pass it, with a warning
    assert stage_changelog(d, data).events == 0


# --------------------------------------------------------------------------- rolled-back changes


def test_rolled_back_changes_in_groups_with_non_transactional_tables_are_not_staged(
    make_dialect, sql, table, unique_name, tmp_path
):
    """MariaDB logs a group that changed a MyISAM table with the InnoDB changes a ROLLBACK TO
    SAVEPOINT or ROLLBACK undid, followed by that statement: only the MyISAM changes stand."""
    my = f"lxm_{unique_name}"
    sql.execute(f"CREATE TABLE `{DB}`.`{my}` (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=MyISAM")
    try:
        d = make_dialect(table, my)
        data = str(tmp_path)
        d.load_offset(data)
        t, m = f"`{DB}`.`{table}`", f"`{DB}`.`{my}`"
        sql.execute("BEGIN")
        sql.execute(f"INSERT INTO {t} VALUES (3, 'kept')")
        sql.execute("SAVEPOINT a")
        sql.execute(f"INSERT INTO {t} VALUES (4, 'undone')")
        sql.execute(f"INSERT INTO {m} VALUES (4, 'myisam')")
        sql.execute("ROLLBACK TO SAVEPOINT a")
        sql.execute(f"INSERT INTO {t} VALUES (5, 'kept')")
        sql.execute("COMMIT")
        u = f"t{unique_name}_"
        sql.execute(f"XA START '{u}7'")  # MariaDB logs this one as BEGIN .. ROLLBACK with the InnoDB row
        sql.execute(f"INSERT INTO {m} VALUES (7, 'myisam')")
        sql.execute(f"INSERT INTO {t} VALUES (7, 'undone')")
        sql.execute(f"XA END '{u}7'")
        sql.execute(f"XA ROLLBACK '{u}7'")
        sql.execute("BEGIN")
        sql.execute(f"INSERT INTO {m} VALUES (8, 'myisam')")
        sql.execute(f"INSERT INTO {t} VALUES (8, 'undone')")
        sql.execute("ROLLBACK")
        stage_changelog(d, data)
        got = sorted((e.table.split(".")[1], decode_key(e.key)[0]) for e in _staged(d, data))
        assert got == sorted([(table, 3), (table, 5), (my, 4), (my, 7), (my, 8)])
        assert _fold(e for e in _staged(d, data) if e.table.endswith(table)) == _source(sql, table)
    finally:
        sql.execute(f"DROP TABLE IF EXISTS `{DB}`.`{my}`")


def test_statement_logged_change_is_refused(make_dialect, sql, table, tmp_path):
    """A writer whose session logs statements: the rows are not in the binlog; never skipped silently."""
    d = make_dialect(table)
    data = str(tmp_path)
    start = d.load_offset(data)
    sql.execute("SET SESSION binlog_format = 'STATEMENT'")
    try:
        sql.execute(f"INSERT INTO `{DB}`.`{table}` VALUES (1, 'stmt')")
    finally:
        sql.execute("SET SESSION binlog_format = 'ROW'")
    with pytest.raises(SourceError, match=rf"INSERT INTO .*{table}.* logged as a statement"):
        stage_changelog(d, data)
    assert d.load_offset(data) == start
    d.log.on_unreadable = "skip"
    assert stage_changelog(d, data).events == 0


def test_on_unreadable_option_is_checked(mysql_uri):
    with pytest.raises(Exception, match="on_unreadable"):
        get_dialect(ConnectionParams.from_uri(mysql_uri), source="x", tables=["a.b"], on_unreadable="maybe")

