"""Capture from a hot standby (PostgreSQL 16+, issue 44): a source whose connection is a standby
of the primary, with watermark_strategy "log", creates and reads its logical slot on the standby
and reads its chunks there, so the primary serves nothing but its WAL stream.

On a private PostgreSQL 18 pair (tests/pg_cluster.py; its standby has hot_standby_feedback=on):
writers on the primary throughout a snapshot in chunks and the capture beside it, all through the
standby; the mirror equals the primary's rows once the standby caught up, and the primary has no
slot but the standby's physical one, no watermark table and no publication but the one the
administrator made. Refused by name on a standby: watermark_strategy "table" (a standby cannot be
written) and a publication that does not exist yet (created on the primary, not there).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace

import pytest

from airflow_provider_cdc.core.errors import CdcError
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName, encode_key
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.dialects.postgres.prerequisites import prerequisite_problems
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.snapshot import GapHooks, snapshot_chunk
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import read_chunk_rows, read_log_events
from tests.pg_cluster import Cluster, pg_bin

from .dialect_suite import table_events
from .helpers import Writers

ROWS = 400
CHUNK = 25
TABLE = TableName("public", "orders")
PUBLICATION = "cdc_shop"


@pytest.fixture(scope="module", params=[16, 17, 18], ids=lambda v: f"pg{v}")
def pair(request):
    """A primary and its hot standby on PostgreSQL 16 (the first that decodes logically on a
    standby), 17 and 18."""
    if pg_bin(request.param) is None:
        pytest.fail(f"PostgreSQL {request.param} server binaries are missing (scripts/setup.sh installs them)")
    c = Cluster(request.param).start()
    try:
        c.primary.sql("CREATE TABLE public.orders (id int PRIMARY KEY, v text, n int)")
        c.primary.sql("INSERT INTO public.orders SELECT g, 'v' || g, g FROM generate_series(1, %s) g", (ROWS,))
        # set-up of a standby source: the administrator creates the publication on the primary
        c.primary.sql(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE public.orders WITH (publish_via_partition_root = true)")
        c.wait(lambda: c.standby.sql("SELECT count(*) FROM pg_publication_tables WHERE pubname = %s",
                                     (PUBLICATION,)) == [(1,)], "the standby replayed the publication")
        yield c
    finally:
        c.remove()


def _dialect(uri: str, **options):
    options.setdefault("watermark_strategy", "log")
    return get_dialect(ConnectionParams.from_uri(uri), source="shop", tables=[TABLE], **options)


def _caught_up(c: Cluster) -> None:
    """The standby replayed everything the primary wrote so far."""
    target = c.primary.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    c.wait(lambda: c.standby.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)) == [(True,)],
           "the standby replayed the primary's WAL")


@contextlib.contextmanager
def _nudging(c: Cluster):
    """The primary logs a running-transactions record every 0.5 s meanwhile: a slot made on the
    standby starts at the next one (the primary would log one within 15 s of writing WAL)."""
    stop = threading.Event()

    def nudge() -> None:
        while not stop.is_set():
            c.primary.sql("SELECT pg_log_standby_snapshot()")
            stop.wait(0.5)

    nudger = threading.Thread(target=nudge, daemon=True)
    nudger.start()
    try:
        yield
    finally:
        stop.set()
        nudger.join()


def _logical_slots(server) -> list[tuple]:
    return server.sql("SELECT slot_name, slot_type FROM pg_replication_slots ORDER BY 1")


def _nothing_written(c: Cluster) -> None:
    assert _logical_slots(c.primary) == [("standby1", "physical")]
    for srv in (c.primary, c.standby):
        assert srv.sql("SELECT count(*) FROM pg_class WHERE relname = 'watermark'") == [(0,)]
        assert srv.sql("SELECT pubname FROM pg_publication") == [(PUBLICATION,)]


def test_table_watermarks_on_a_standby_are_refused_by_name(pair, tmp_path):
    d = _dialect(pair.standby.uri, watermark_strategy="table", slot_name="cdc_refused")
    with pytest.raises(CdcError) as err:
        d.load_offset(str(tmp_path / "data"))
    text = str(err.value)
    assert "watermark_strategy 'table'" in text and "hot standby" in text and "'log'" in text, text
    with pytest.raises(CdcError, match="watermark_strategy 'table'"):
        d.ensure_watermark_table()  # (a snapshot's first watermark)
    d.close()
    assert pair.standby.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == [(0,)]
    _nothing_written(pair)


def test_a_missing_publication_is_refused_with_the_statement_for_the_primary(pair, tmp_path):
    d = _dialect(pair.standby.uri, slot_name="cdc_refused", publication_name="cdc_nopub")
    with pytest.raises(CdcError) as err:
        d.load_offset(str(tmp_path / "data"))
    text = str(err.value)
    assert "hot standby" in text and 'Run on the primary: CREATE PUBLICATION "cdc_nopub" FOR TABLE "public"."orders"' in text, text
    d.close()
    assert pair.standby.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == [(0,)]
    _nothing_written(pair)


def test_a_slot_creation_that_waits_for_the_primary_says_so(pair, tmp_path):
    """Creation on a standby waits for the primary's next running-transactions record; bounded by
    read_timeout (1 ms here, nothing nudges the primary), the error names what to run there."""
    d = _dialect(pair.standby.uri, slot_name="cdc_waits", publication_name=PUBLICATION, read_timeout=0.001)
    with pytest.raises(CdcError) as err:
        d.load_offset(str(tmp_path / "data"))
    text = str(err.value)
    assert "running-transactions record from the primary" in text and "pg_log_standby_snapshot()" in text, text
    d.close()
    assert pair.standby.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == [(0,)]
    _nothing_written(pair)


def test_capture_and_chunks_from_the_standby_mirror_the_primary(pair, tmp_path):
    c = pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.standby.uri, publication_name=PUBLICATION)
    assert d.on_standby
    d.check_prerequisites()
    # the standby's slot starts at the primary's next running-transactions record: logged at
    # once here (the primary would log one within 15 s of writing WAL)
    with _nudging(c):
        t0 = time.monotonic()
        start = d.load_offset(data_dir)
        created = time.monotonic() - t0
    assert _logical_slots(c.standby) == [("cdc_shop", "logical")], created
    _nothing_written(c)
    schema = d.describe_table(TABLE)
    forced: list[int] = []

    def force_write_in_window() -> None:  # a change on the primary to a key of the chunk being read
        k = len(forced) * CHUNK + 7
        forced.append(k)
        c.primary.sql("UPDATE orders SET v = %s WHERE id = %s", (f"forced-{k}", k))

    results, after, seq = [], None, 0
    with Writers(c.primary.uri) as writers:
        while True:
            res = snapshot_chunk(d, schema, FULL_RANGE, data_dir=data_dir, snapshot_id="snap", seq=seq,
                                 limit=CHUNK, after_key=after,
                                 gap_hooks=GapHooks(after_low_watermark=force_write_in_window))
            assert res.visibility and res.visibility.startswith("replayed-before:"), res.visibility
            results.append(res)
            seq += 1
            if seq % 3 == 0:
                stage_changelog(d, data_dir)  # capture beside the snapshot, on the standby
            if res.exhausted:
                break
            after = res.last_key
    assert writers.committed > 50 and len(results) > 10
    _caught_up(c)
    stage_changelog(d, data_dir)
    events = list(read_log_events(changelog_dir(data_dir, "shop")))
    chunks = [WindowChunk.from_result(r, read_chunk_rows(r.path, r.table)) for r in results]
    reads = merge_window(chunks, events)
    state = mirror_apply({}, table_events(events, TABLE))
    mirror_apply(state, reads)
    source = {r[0]: r for r in c.primary.sql("SELECT id, v, n FROM orders")}
    mirror = {v["id"]: tuple(v[k] for k in ("id", "v", "n")) for v in mirror_rows(state, TABLE.id).values()}
    assert len(mirror) == len(source) > 0
    assert mirror == source
    # the slot advanced on the standby (I6: after the staging), and capture reads no lag left
    assert c.standby.sql("SELECT confirmed_flush_lsn > %s::pg_lsn FROM pg_replication_slots WHERE slot_name = "
                         "'cdc_shop'", (start,)) == [(True,)]
    retention = d.log_retention("")
    assert retention is not None and not retention.lost
    _nothing_written(c)
    d.drop_slot()
    d.close()


def test_the_standby_prerequisites_are_named(pair):
    d = _dialect(pair.standby.uri, publication_name=PUBLICATION)
    pair.standby.sql("ALTER SYSTEM SET hot_standby_feedback = off")
    pair.standby.sql("SELECT pg_reload_conf()")
    try:
        pair.wait(lambda: pair.standby.sql("SHOW hot_standby_feedback") == [("off",)], "the setting applies")
        with pytest.raises(CdcError, match="hot_standby_feedback is off on this hot standby"):
            d.check_prerequisites()
    finally:
        pair.standby.sql("ALTER SYSTEM SET hot_standby_feedback = on")
        pair.standby.sql("SELECT pg_reload_conf()")
        pair.wait(lambda: pair.standby.sql("SHOW hot_standby_feedback") == [("on",)], "the setting applies")
    settings = d.read_settings()
    assert settings.in_recovery and settings.hot_standby_feedback
    d.check_prerequisites()
    d.close()
    # PostgreSQL 15 (Debian's) cannot decode on a standby: said, with the way that works there
    old = replace(settings, server_version_num=150014)
    assert any("PostgreSQL 15 cannot decode logically on a standby" in p and "chunk_conn_id" in p
               for p in prerequisite_problems(old, "cdc_shop"))


def test_a_synchronized_failover_slot_on_the_standby_is_refused_by_name(tmp_path):
    if pg_bin(18) is None:
        pytest.fail("PostgreSQL 18 server binaries are missing (scripts/services.sh installs them)")
    c = Cluster(18, failover=True).start()
    try:
        c.primary.sql("CREATE TABLE public.orders (id int PRIMARY KEY, v text, n int)")
        on_primary = _dialect(c.primary.uri)
        on_primary.load_offset(str(tmp_path / "primary"))  # a failover slot, synchronized to the standby
        data = str(tmp_path / "primary")

        def synced() -> bool:  # (the standby's copy persists once the slot moved on after its creation)
            c.primary.sql("INSERT INTO public.orders SELECT coalesce(max(id), 0) + 1, 'x', 0 FROM public.orders")
            stage_changelog(on_primary, data)
            return c.slot_synced(on_primary.slot_name)

        c.wait(synced, "the failover slot is synced")
        d = _dialect(c.standby.uri)
        with pytest.raises(CdcError, match="failover slot, synchronized here .* another slot_name"):
            d.load_offset(str(tmp_path / "standby"))
        d.close()
        on_primary.drop_slot()
        on_primary.close()
    finally:
        c.remove()


def test_the_lag_of_a_standby_captured_from_is_shown_and_a_stopped_receiver_is_said(pair, tmp_path):
    """Issue 57: a source that is a hot standby shows how far it is behind its primary with the
    capture's lag (status); once it stops receiving (its primary failed) it says it does not
    replicate, rather than "0 s behind"."""
    from airflow_provider_cdc.pipeline.capture import describe_replica_lag

    c = pair
    d = _dialect(c.standby.uri, publication_name=PUBLICATION)
    (conninfo,) = c.standby.sql("SHOW primary_conninfo")[0]
    try:
        d.server_identity()  # (what a capture's first step learns: this is a standby)
        behind, seconds = d.replica_lag()
        assert behind >= 0 and seconds != float("inf"), (behind, seconds)
        assert "behind its primary" in describe_replica_lag(behind, seconds)
        c.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
        c.standby.sql("SELECT pg_reload_conf()")
        c.wait(lambda: c.standby.sql("SELECT count(*) FROM pg_stat_wal_receiver") == [(0,)], "the receiver stops")
        assert d.replica_lag() == (0, float("inf"))
        assert describe_replica_lag(*d.replica_lag()).endswith("is not replicating")
    finally:
        c.standby.sql(f"ALTER SYSTEM SET primary_conninfo = '{conninfo.replace(chr(39), chr(39) * 2)}'")
        c.standby.sql("SELECT pg_reload_conf()")
        c.wait(lambda: c.standby.sql("SELECT status FROM pg_stat_wal_receiver") == [("streaming",)], "it streams")
        d.close()


@pytest.mark.parametrize("major", [17, 18])
def test_a_standby_captured_from_that_is_promoted_is_followed(major, tmp_path):
    """Issue 57: the hot standby a source captures from is promoted (its primary failed): its
    own slot goes on on the new timeline, capture follows it (logging the promotion), and every
    change, before and after, is staged once."""
    if pg_bin(major) is None:
        pytest.fail(f"PostgreSQL {major} server binaries are missing (scripts/setup.sh installs them)")
    c = Cluster(major).start()
    try:
        data = str(tmp_path / "data")
        d = _start_standby_capture(c, data)
        c.primary.sql("INSERT INTO orders VALUES (1, 'before', 1)")
        _caught_up(c)
        assert stage_changelog(d, data).events == 1
        d.close()
        c.fail_over()
        c.standby.sql("INSERT INTO orders VALUES (2, 'after', 2)")
        d2 = _dialect(c.standby.uri, publication_name=PUBLICATION)
        stage_changelog(d2, data)
        keys = [e.key for e in read_log_events(changelog_dir(data, "shop")) if isinstance(e, ChangeEvent)]
        assert keys == [encode_key([1]), encode_key([2])], keys
        d2.drop_slot()
        d2.close()
    finally:
        c.remove()


def _start_standby_capture(c: Cluster, data: str):
    """The source's slot on the hot standby (``c.standby``), created while the primary logs the
    running-transactions records a standby slot starts at."""
    c.primary.sql("CREATE TABLE public.orders (id int PRIMARY KEY, v text, n int)")
    c.primary.sql(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE public.orders")
    c.wait(lambda: c.standby.sql("SELECT count(*) FROM pg_publication_tables WHERE pubname = %s",
                                 (PUBLICATION,)) == [(1,)], "the standby replayed the publication")
    d = _dialect(c.standby.uri, publication_name=PUBLICATION)
    with _nudging(c):
        d.load_offset(data)
    return d


def _replayed(standby, upstream) -> None:
    target = upstream.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    Cluster.wait(lambda: standby.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)) == [(True,)],
                 "the standby replayed its upstream's WAL")


def _staged_keys(data: str) -> list:
    return [e.key for e in read_log_events(changelog_dir(data, "shop")) if isinstance(e, ChangeEvent)]


@pytest.mark.parametrize("major", [17, 18])
def test_a_standby_captured_from_follows_its_primarys_failover_to_a_third_server(major, tmp_path, caplog):
    """Issue 57: the source is hot standby S1 of primary P, and P has a second standby S2. P fails
    over to S2 and S1 is re-pointed at S2 (as an administrator or an HA manager does). S1 replays
    S2's new timeline and its own slot goes on along it: capture proves continuity (everything it
    staged lies before the fork), says so, and every change, before and after, is staged once."""
    if pg_bin(major) is None:
        pytest.fail(f"PostgreSQL {major} server binaries are missing (scripts/setup.sh installs them)")
    c = Cluster(major).start()
    try:
        s2 = c.add_standby()
        data = str(tmp_path / "data")
        d = _start_standby_capture(c, data)
        c.primary.sql("INSERT INTO orders VALUES (1, 'before', 1)")
        _caught_up(c)
        assert stage_changelog(d, data).events == 1
        d.close()
        c.primary.stop()  # a clean stop: both standbys received everything it wrote
        s2.promote()
        c.wait(lambda: s2.sql("SELECT pg_is_in_recovery()") == [(False,)], "S2 is promoted")
        c.follow(c.standby, s2, "standby1")
        c.wait(lambda: c.standby.sql("SELECT status, received_tli FROM pg_stat_wal_receiver") == [("streaming", 2)],
               "S1 streams S2's timeline 2")
        s2.sql("INSERT INTO orders VALUES (2, 'after', 2)")
        _replayed(c.standby, s2)
        d2 = _dialect(c.standby.uri, publication_name=PUBLICATION)
        with caplog.at_level("WARNING"):
            assert stage_changelog(d2, data).events == 1
        assert "(a hot standby) failed over and it follows the new one (timeline 1 -> 2)" in caplog.text
        assert _staged_keys(data) == [encode_key([1]), encode_key([2])]
        behind, seconds = d2.replica_lag()
        assert seconds != float("inf"), (behind, seconds)  # S1 replicates again, from S2
        d2.close()
        # S2 stops: with no WAL receiver, S1 tells the timeline of its last restartpoint, which may
        # still be 1; a timeline never goes back, so capture goes on (it is not a new failover)
        s2.stop()
        c.wait(lambda: c.standby.sql("SELECT count(*) FROM pg_stat_wal_receiver") == [(0,)], "S1's receiver stops")
        d2 = _dialect(c.standby.uri, publication_name=PUBLICATION)
        assert stage_changelog(d2, data).events == 0
        d2.drop_slot()
        d2.close()
    finally:
        c.remove()


def test_a_standby_captured_from_that_cannot_follow_its_primarys_failover_says_it_does_not_replicate(tmp_path):
    """Issue 57: S2 was cut off from P before P's last commit, which S1 replayed and capture
    staged; P fails over to S2, whose timeline forks before that commit, so S1 cannot follow it.
    S1's lag says it does not replicate (its receiver restarts over and over: not streaming), and
    capture stages nothing of S2's timeline: no change that is not on the new primary's history
    is mixed with its own."""
    if pg_bin(18) is None:
        pytest.fail("PostgreSQL 18 server binaries are missing (scripts/setup.sh installs them)")
    c = Cluster(18).start()
    try:
        s2 = c.add_standby()
        data = str(tmp_path / "data")
        d = _start_standby_capture(c, data)
        s2.sql("ALTER SYSTEM SET primary_conninfo = ''")  # S2 is cut off from P
        s2.sql("SELECT pg_reload_conf()")
        c.wait(lambda: s2.sql("SELECT count(*) FROM pg_stat_wal_receiver") == [(0,)], "S2's receiver stops")
        c.primary.sql("INSERT INTO orders VALUES (3, 'only on S1', 3)")
        _caught_up(c)
        assert stage_changelog(d, data).events == 1
        c.primary.stop()
        s2.promote()
        c.wait(lambda: s2.sql("SELECT pg_is_in_recovery()") == [(False,)], "S2 is promoted")
        s2.sql("INSERT INTO orders VALUES (4, 'on S2', 4)")
        c.follow(c.standby, s2, "standby1")
        # S1's receiver reaches S2 but cannot stream S2's timeline: it cycles, "streaming" for a
        # moment (S2 sends timeline 1 up to the fork), then "waiting" (an unfiltered look at
        # pg_stat_wal_receiver read that as replicating, "0 s behind"). From the moment S1 is
        # pointed at S2 (its new receiver says "streaming" before S2 said anything, with P's last
        # reading), over a retry period of the receiver (wal_retrieve_retry_interval, 5 s) and
        # more, every reading says S1 does not replicate
        seen, readings = set(), []
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            seen.update(r[0] for r in c.standby.sql("SELECT status FROM pg_stat_wal_receiver"))
            readings.append(d.replica_lag())
            time.sleep(0.05)
        assert set(readings) == {(0, float("inf"))}, (set(readings), seen)
        assert stage_changelog(d, data).events == 0
        assert _staged_keys(data) == [encode_key([3])]
        assert c.standby.sql("SELECT count(*) FROM orders WHERE id = 4") == [(0,)]
        d.drop_slot()
        d.close()
    finally:
        c.remove()
