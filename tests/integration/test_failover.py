"""A failover of the source (I14), on private primary/standby pairs these tests start and
promote (tests/pg_cluster.py): capture goes on from a position proven to continue the old log,
or stops naming what happened.

- PostgreSQL 18 with a failover slot, promoted mid-snapshot under writers: the slot followed the
  standby; capture and the snapshot go on from where they were, and the mirror equals the source.
- PostgreSQL 15 promoted: its slot did not follow; capture stops with SourceChangedError saying
  so, and nothing is created on the new primary.
"""

from __future__ import annotations

import logging

import pytest

from airflow_provider_cdc.core.errors import SourceChangedError, SourceError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import read_chunk_rows, read_log_events
from tests.pg_cluster import Cluster, pg_bin

from .dialect_suite import chunks_with_capture, table_events
from .helpers import ROWS, Writers

CHUNK = 25
TABLE = TableName("public", "orders")


def _cluster(major: int, failover: bool):
    if pg_bin(major) is None:
        pytest.fail(f"PostgreSQL {major} server binaries are missing (scripts/services.sh installs them)")
    c = Cluster(major, failover=failover).start()
    c.primary.sql(f"CREATE TABLE {TABLE.schema}.{TABLE.name} (id int PRIMARY KEY, v text, n int)")
    c.primary.sql(f"INSERT INTO {TABLE.schema}.{TABLE.name} SELECT g, 'v' || g, g FROM generate_series(1, %s) g",
                  (ROWS,))
    return c


@pytest.fixture(params=[17, 18], ids=lambda v: f"pg{v}")
def pg18_pair(request):
    """A pair with failover slots: PostgreSQL 17 (where they came) and 18."""
    c = _cluster(request.param, failover=True)
    yield c
    c.remove()


@pytest.fixture(params=[15, 16], ids=lambda v: f"pg{v}")
def pg15_pair(request):
    """A pair without failover slots: PostgreSQL 15 and 16."""
    c = _cluster(request.param, failover=False)
    yield c
    c.remove()


def _dialect(uri: str):
    return get_dialect(ConnectionParams.from_uri(uri), source="shop", tables=[TABLE])


def _chunks(d, data_dir: str, after, seq: int, count: int) -> tuple[list, object, bool]:
    return chunks_with_capture(d, TABLE, data_dir, after, seq, count, CHUNK)


def test_a_failover_slot_carries_capture_and_the_snapshot_through_a_promotion(pg18_pair, tmp_path, caplog):
    c = pg18_pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.primary.uri)
    d.load_offset(data_dir)
    assert c.primary.sql("SELECT failover FROM pg_replication_slots WHERE slot_name = %s", (d.slot_name,)) == [(True,)]
    with Writers(c.primary.uri) as writers:
        results, after, done = _chunks(d, data_dir, None, 0, 6)
        assert not done
        stage_changelog(d, data_dir)
        # the standby's copy of the slot is synchronized and persistent before the promotion
        c.wait(lambda: (stage_changelog(d, data_dir), c.slot_synced(d.slot_name))[1], "the failover slot is synced")
        d.close()
        c.fail_over()  # mid-snapshot, writers running
        writers.uri = c.standby.uri
        before = writers.committed
        c.wait(lambda: writers.committed > before + 20, "the writers go on on the new primary")
        d2 = _dialect(c.standby.uri)
        # a promoted server that kept its old primary's synchronized_standby_slots would make
        # every read of the failover slot wait: refused at once, naming the setting
        c.standby.sql("ALTER SYSTEM SET synchronized_standby_slots = 'standby1'")
        c.standby.sql("SELECT pg_reload_conf()")
        c.wait(lambda: c.standby.sql("SHOW synchronized_standby_slots") == [("standby1",)], "the setting applies")
        with pytest.raises(SourceError, match="synchronized_standby_slots .* names 'standby1'"):
            stage_changelog(d2, data_dir)
        c.standby.sql("ALTER SYSTEM SET synchronized_standby_slots = ''")
        c.standby.sql("SELECT pg_reload_conf()")
        c.wait(lambda: c.standby.sql("SHOW synchronized_standby_slots") == [("",)], "the setting applies")
        with caplog.at_level(logging.WARNING):
            stage_changelog(d2, data_dir)  # capture goes on from the synchronized slot
        assert "capture goes on from slot" in caplog.text
        more, _after, done = _chunks(d2, data_dir, after, len(results), 100)
        assert done
        results += more
    stage_changelog(d2, data_dir)
    events = list(read_log_events(changelog_dir(data_dir, "shop")))
    chunks = [WindowChunk.from_result(r, read_chunk_rows(r.path, r.table)) for r in results]
    reads = merge_window(chunks, events)
    state = mirror_apply({}, table_events(events, TABLE))
    mirror_apply(state, reads)
    source = {str(r[0]): r for r in c.standby.sql("SELECT id, v, n FROM orders")}
    mirror = mirror_rows(state, TABLE.id)
    assert len(mirror) == len(source) > 0
    assert {tuple(v[k] for k in ("id", "v", "n")) for v in mirror.values()} == set(source.values())
    d2.drop_slot()
    d2.close()


def test_a_promoted_standby_without_the_slot_stops_capture_by_name(pg15_pair, tmp_path):
    c = pg15_pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.primary.uri)
    d.load_offset(data_dir)
    c.primary.sql("UPDATE orders SET v = 'captured' WHERE id = 1")
    stage_changelog(d, data_dir)
    d.close()
    c.primary.sql("UPDATE orders SET v = 'maybe lost' WHERE id = 2")
    c.fail_over()
    d2 = _dialect(c.standby.uri)
    with pytest.raises(SourceChangedError) as err:
        stage_changelog(d2, data_dir)
    text = str(err.value)
    assert "promoted from a standby (timeline 1 -> 2)" in text and d2.slot_name in text, text
    major = int(c.standby.sql("SHOW server_version_num")[0][0]) // 10000
    assert "airflow-cdc resync" in text and f"PostgreSQL {major} has no failover slots" in text, text
    assert c.standby.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == [(0,)]
    d2.close()


def test_an_unplanned_promotion_loses_a_chunks_high_watermark_and_the_chunk_is_read_again(pg18_pair, tmp_path):
    """Issue 57, on 17 and 18: the standby stops receiving, the old primary commits an UPDATE and a
    whole chunk (both watermarks) that no other server ever gets, then dies and the standby is
    promoted. Capture follows the failover slot; once it has staged the new timeline past where
    the chunk's high watermark was written, that watermark counts as lost (not as "not staged
    yet"), and the chunk read again on the new primary gives a mirror equal to it, without the
    lost UPDATE."""
    from airflow_provider_cdc.pipeline.snapshot import lost_chunks

    c = pg18_pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.primary.uri)
    d.load_offset(data_dir)
    results, after, done = _chunks(d, data_dir, None, 0, 3)
    assert not done
    c.wait(lambda: (stage_changelog(d, data_dir), c.slot_synced(d.slot_name))[1], "the failover slot is synced")
    # the standby stops receiving: what the primary commits from here is on no other server
    c.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
    c.standby.sql("SELECT pg_reload_conf()")
    c.wait(lambda: c.standby.sql("SELECT count(*) FROM pg_stat_wal_receiver") == [(0,)], "the standby is cut off")
    c.primary.sql("UPDATE orders SET v = 'lost' WHERE id > %s", (after[0],))
    (doomed,), _after, _done = _chunks(d, data_dir, after, len(results), 1)
    assert doomed.high_position is not None
    d.close()
    c.primary.ctl("-m", "immediate", "-w", "stop")  # the primary dies
    c.standby.promote()
    c.wait(lambda: c.standby.sql("SELECT pg_is_in_recovery()") == [(False,)], "the standby is promoted")
    d2 = _dialect(c.standby.uri)
    stage_changelog(d2, data_dir)  # follows the failover slot
    assert lost_chunks(data_dir, "shop", [doomed.to_dict()]) == []  # not passed yet: only waited for
    # the new timeline's positions continue from the fork: written past the lost watermark's
    for _ in range(20):
        if lost_chunks(data_dir, "shop", [doomed.to_dict()]):
            break
        c.standby.sql("UPDATE orders SET n = n + 1 WHERE id = 1")
        c.standby.sql("SELECT pg_switch_wal()")
        stage_changelog(d2, data_dir)
    assert lost_chunks(data_dir, "shop", [doomed.to_dict()]) == [doomed.to_dict()]
    assert lost_chunks(data_dir, "shop", [r.to_dict() for r in results]) == []  # the chunks before hold
    more, _after, done = _chunks(d2, data_dir, after, len(results) + 1, 100)  # read again, and on
    assert done
    results += more
    stage_changelog(d2, data_dir)
    events = list(read_log_events(changelog_dir(data_dir, "shop")))
    chunks = [WindowChunk.from_result(r, read_chunk_rows(r.path, r.table)) for r in results]
    state = mirror_apply({}, table_events(events, TABLE))
    mirror_apply(state, merge_window(chunks, events))
    source = {r for r in c.standby.sql("SELECT id, v, n FROM orders")}
    mirror = {tuple(v[k] for k in ("id", "v", "n")) for v in mirror_rows(state, TABLE.id).values()}
    assert mirror == source and not any(v == "lost" for _i, v, _n in mirror)
    d2.drop_slot()
    d2.close()


def _sinks(data_dir: str):
    from airflow_provider_cdc.pipeline.spark.common import build_sinks

    return build_sinks("events,mirror", data_dir=data_dir, source="shop", database=None, require_schema=True)


def _round(d, data_dir: str, chunks: list) -> None:
    """A changelog round (capture, apply to the event log and the mirror), then the merge of
    ``chunks``, as the DAGs run them."""
    from airflow_provider_cdc.pipeline import arrow_engine

    stage_changelog(d, data_dir)
    sinks = _sinks(data_dir)
    try:
        arrow_engine.apply_changelog(data_dir, "shop", sinks)
        if chunks:
            arrow_engine.merge_round(chunks, data_dir=data_dir, source="shop", sinks=sinks)
    finally:
        for s in sinks:
            s.close()


@pytest.mark.slow
@pytest.mark.parametrize("promote_after", [1, 2, 3, 4, 5])
def test_a_switchover_with_the_synced_slot_behind_what_was_applied_keeps_the_event_log_sound(
        pg18_pair, tmp_path, promote_after):
    """Issue 57, on 17 and 18: slot synchronization is periodic, so at a switchover the standby's
    copy of the failover slot may lag what capture had applied; capture then re-reads from the
    copy's older point. Under writers, a snapshot in rounds, the switchover after
    ``promote_after`` rounds: the event log has no violation (every event it held stays readable)
    and the mirror equals the new primary."""
    from airflow_provider_cdc import storage
    from airflow_provider_cdc.pipeline.verify import check_event_log
    from airflow_provider_cdc.sinks.mirror_readers import read_mirror
    from airflow_provider_cdc.storage.layout import schema_path

    c = pg18_pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.primary.uri)
    d.load_offset(data_dir)
    d.ensure_watermark_table()
    storage.write_text(schema_path(data_dir, "shop", TABLE), d.describe_table(TABLE).to_json())
    after, n, done = None, 0, False
    with Writers(c.primary.uri) as writers:
        for _ in range(promote_after):
            results, after, done = _chunks(d, data_dir, after, n, 2)
            n += len(results)
            _round(d, data_dir, results)
        c.wait(lambda: (stage_changelog(d, data_dir), c.slot_synced(d.slot_name))[1], "the failover slot is synced")
        synced = c.standby.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                               (d.slot_name,))[0][0]
        # the next synchronization has not come yet when the switchover does (held off here: it
        # is periodic, and a clean shutdown may otherwise sync the copy at the last moment)
        c.standby.sql("ALTER SYSTEM SET sync_replication_slots = off")
        c.standby.sql("SELECT pg_reload_conf()")
        c.wait(lambda: c.standby.sql("SHOW sync_replication_slots") == [("off",)], "slot sync is held off")
        before = writers.committed
        c.wait(lambda: writers.committed > before + 30, "more changes")
        _round(d, data_dir, [])  # applied past the standby's copy of the slot
        applied = c.primary.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                (d.slot_name,))[0][0]
        d.close()
        c.fail_over()
        writers.uri = c.standby.uri
        lagged = c.standby.sql("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                               (d.slot_name,))[0][0]
        assert c.standby.sql("SELECT %s::pg_lsn < %s::pg_lsn", (lagged, applied)) == [(True,)]
        d2 = _dialect(c.standby.uri)
        while not done:
            results, after, done = _chunks(d2, data_dir, after, n, 3)
            n += len(results)
            _round(d2, data_dir, results)
    _round(d2, data_dir, [])
    report = check_event_log(data_dir, "shop", TABLE, primary_key=("id",))
    assert report.events > 0 and report.violation_count == 0, report.violations
    mirror = {(r["id"], r["v"], r["n"]) for r in read_mirror(data_dir, "shop", TABLE).to_pylist()}
    assert mirror == set(c.standby.sql("SELECT id, v, n FROM orders"))
    print(f"slot synced at {synced}, applied {applied}, the new primary's copy at {lagged}")
    d2.drop_slot()
    d2.close()
