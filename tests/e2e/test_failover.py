"""A failover of the source through the DAGs and the CLI (I14).

PostgreSQL 18 with a synchronized failover slot, promoted in the middle of a cdc_snapshot run
under writers: the snapshot goes on from its last chunk and capture from the slot, no row is read
twice, verify 0 mismatched and the event log consistent.

A failover capture cannot follow: PostgreSQL 15 (no
failover slots) promoted after changes committed on the old primary were replicated but never
captured. cdc_changelog stops naming what happened; ``airflow-cdc resync`` records the gap and
starts capture anew on the new primary; verify --repair re-reads only the key ranges whose rows
differ, far fewer rows than the table has. It ends with verify at 0 mismatched and an event log
without violations (the gap recorded beside it, _gaps.json), writers on both sides of the
promotion."""

from __future__ import annotations

import json
import os
import time

import pyarrow.compute as pc
import pytest

from airflow_provider_cdc.cli import run as cli_run
from airflow_provider_cdc.pipeline.arrow_engine import apply_changelog
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.sinks.event_log import read_events
from airflow_provider_cdc.storage.layout import events_dir
from airflow_provider_cdc.storage.source_server import read_gaps
from tests.pg_cluster import Cluster, pg_bin
from tools import workload as w

from .helpers import ROWS, SNAPSHOT_CONF, Pipeline, _json_out, _triggered_conf


def _pair_pipeline(major: int, unique_name, tmp_path, monkeypatch):
    if pg_bin(major) is None:
        pytest.fail(f"PostgreSQL {major} server binaries are missing (scripts/services.sh installs them)")
    cluster = Cluster(major, failover=major >= 17).start()
    p = Pipeline(cluster.primary.uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(p.uri, p.table, ROWS)
    p.capture_now()
    return p, cluster


@pytest.fixture
def pair_pipeline(unique_name, tmp_path, monkeypatch):
    """``make(major)``: a Pipeline on the primary of a pair of its own (removed afterwards)."""
    made = []

    def make(major: int):
        made.append(_pair_pipeline(major, unique_name, tmp_path, monkeypatch))
        return made[-1]

    yield make
    for p, cluster in made:
        try:
            p.cleanup()
        finally:
            cluster.remove()


def test_a_failover_slot_carries_a_snapshot_run_through_a_promotion(pair_pipeline):
    p, cluster = pair_pipeline(18)
    mix = {"update": 50, "multi": 10, "insert": 25, "delete": 15}
    writers = [w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=21, mix=mix).start()]

    def fail_over() -> None:
        """After the 3rd chunk: the failover slot is synchronized, the primary stops, the standby
        is promoted, the connection (as DNS or the admin would) and the writers move to it."""
        with p.dialect() as d:
            cluster.wait(lambda: (stage_changelog(d, p.data_dir), cluster.slot_synced(d.slot_name))[1],
                         "the failover slot is synchronized on the standby")
        writers[-1].stop()
        cluster.fail_over()
        p.uri = cluster.standby.uri
        p.mp.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}", p.uri)
        writers.append(w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=22, mix=mix).start())

    calls = p.on_chunk(3, fail_over)
    try:
        p.snapshot()
    finally:
        writers[-1].stop()
    assert len(writers) == 2, "the promotion must have happened mid-snapshot"
    for writer in writers:
        stats = writer.stats()
        assert stats.committed > 0 and stats.errors == [], stats.errors
    progress = p.progress()
    assert progress.status == "done", progress.to_json()
    assert len(calls["after_keys"]) == len({k for k in calls["after_keys"]}), "a chunk was read twice"
    p.catch_up()
    p.assert_equal()


def _slot_lsn(server, slot: str) -> int:
    (lsn,) = server.sql(
        "SELECT confirmed_flush_lsn - '0/0'::pg_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )[0]
    return int(lsn)


#: the chunk after which the switchover happens, and the majors (CI: after chunk 2 on 17; the
#: repeated runs of docs/benchmarks.md set others)
AFTER_CHUNK = int(os.environ.get("CDC_E2E_FAILOVER_AFTER_CHUNK", "2"))
MAJORS = [int(m) for m in os.environ.get("CDC_E2E_FAILOVER_MAJORS", "17").split(",")]


@pytest.mark.parametrize("major", MAJORS)
def test_a_switchover_with_the_synced_slot_behind_what_capture_applied_loses_no_event(pair_pipeline, major):
    """Slot synchronization is periodic: a switchover can find the standby's copy of the failover
    slot behind what capture staged and applied. Capture then reads that stretch again from the
    promoted server; the event log must keep every event it held (a re-read segment once replaced
    the files it overlapped, and readers skipped them), the snapshot finish without starting over,
    verify 0 and no violation."""
    p, cluster = pair_pipeline(major)
    mix = {"update": 50, "multi": 10, "insert": 25, "delete": 15}
    writers = [w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=31, mix=mix).start()]
    held: dict = {}

    def fail_over() -> None:
        with p.dialect() as d:
            slot = d.slot_name
            cluster.wait(lambda: (stage_changelog(d, p.data_dir), cluster.slot_synced(slot))[1],
                         "the failover slot is synchronized on the standby")
            # synchronization stops (its next cycle has not come yet); capture goes on past it
            cluster.standby.sql("ALTER SYSTEM SET sync_replication_slots = off", database="postgres")
            cluster.standby.sql("SELECT pg_reload_conf()", database="postgres")
            time.sleep(0.5)  # the slot sync worker exits at its next check of the setting
            synced = _slot_lsn(cluster.standby, slot)
            cluster.wait(lambda: (stage_changelog(d, p.data_dir), _slot_lsn(cluster.primary, slot) > synced)[1],
                         "capture confirmed past the standby's copy of the slot")
            sinks = build_sinks("events,mirror", data_dir=p.data_dir, source=p.source, database=None,
                                require_schema=True)
            apply_changelog(p.data_dir, p.source, sinks)
            assert _slot_lsn(cluster.standby, slot) == synced < _slot_lsn(cluster.primary, slot)
        events = read_events(p.data_dir, p.source, p.table)
        held["events"] = set(zip(events["position"].to_pylist(), events["key"].to_pylist(), strict=True))
        writers[-1].stop()
        cluster.fail_over()
        p.uri = cluster.standby.uri
        p.mp.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}", p.uri)
        writers.append(w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=32, mix=mix).start())

    calls = p.on_chunk(AFTER_CHUNK, fail_over)
    try:
        p.snapshot()
    finally:
        writers[-1].stop()
    assert len(writers) == 2, "the promotion must have happened mid-snapshot"
    assert held["events"], "nothing was in the event log before the switchover"
    for writer in writers:
        stats = writer.stats()
        assert stats.committed > 0 and stats.errors == [], stats.errors
    assert p.progress().status == "done"
    assert len(calls["after_keys"]) == len(set(calls["after_keys"])), "a chunk was read twice"
    p.catch_up()
    events = read_events(p.data_dir, p.source, p.table)
    now = set(zip(events["position"].to_pylist(), events["key"].to_pylist(), strict=True))
    hidden = held["events"] - now
    assert not hidden, f"{len(hidden)} of the {len(held['events'])} events held before the switchover vanished"
    p.assert_equal()  # verify 0 mismatched, the event log without violations


def test_a_promotion_the_slot_did_not_follow_is_resynced_by_verify_and_repair(pair_pipeline, capsys):
    p, cluster = pair_pipeline(15)
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=3, mix={"update": 70, "insert": 30}):
        p.snapshot()
    p.catch_up()
    p.assert_equal()
    # committed on the old primary and replicated, never captured: the promotion loses the slot
    params = w._params(p.uri)
    t, amount, ident = w.quote_table(params, p.table), w.quote_ident(params, "amount"), w.quote_ident(params, "id")
    with w.connect(p.uri) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {t} SET {amount} = {amount} + 1 WHERE {ident} IN (5, 6, 2900)")
        conn.commit()
    cluster.fail_over()
    p.uri = cluster.standby.uri
    p.mp.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}", p.uri)

    p.run("cdc_changelog", expect="failed")  # SourceChangedError: promoted, the slot did not follow
    resync = ["resync", "--conn-id", p.conn_id, "--source", p.source, "--data-dir", p.data_dir]
    assert cli_run(resync) == 0
    out = capsys.readouterr().out
    assert "resynced" in out and f"--table {p.table.id} --repair" in out, out
    assert cli_run(resync) == 2  # capture goes on now: nothing left to resync
    (gap,) = read_gaps(events_dir(p.data_dir, p.source))
    assert gap["state"] == "open" and "did not follow" in gap["reason"] and gap["from"] < gap["to"], gap
    assert gap["tables"] == [p.table.id]
    assert cli_run(["status", "--source", p.source]) == 1  # an open gap: not healthy (it gates monitors)
    assert f"gap (open): changes between {gap['from']} and {gap['to']}" in capsys.readouterr().out
    events = read_events(p.data_dir, p.source, p.table)
    gaps = events.filter(pc.equal(events["op"], "g")).to_pylist()
    assert [(e["position"], e["key"]) for e in gaps] == [(gap["to"], None)]  # where consumers read

    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=4, mix={"update": 70, "insert": 30}):
        p.catch_up()
    p.catch_up()
    verify = ["verify", "--conn-id", p.conn_id, "--source", p.source, "--table", p.table.id, "--data-dir", p.data_dir,
              "--chunk-rows", "500", "--json", "--repair"]
    assert cli_run(verify) == 1
    found = _json_out(capsys.readouterr().out)
    assert (found["different"], found["extra"]) == (3, 0), found
    conf = _triggered_conf("cdc_snapshot", found["repair_run"])
    p.run("cdc_snapshot", {**conf, "chunk_size": 200})
    reread = sum(tp.rows for tp in p.progress().tables.values())
    total = w.count_rows(p.uri, p.table)
    print(json.dumps({"rows_reread": reread, "table_rows": total}))
    assert 0 < reread < total / 2, (reread, total)
    p.catch_up()
    p.assert_equal()  # verify 0 mismatched; the event log holds no violation across the gap
    assert read_gaps(events_dir(p.data_dir, p.source))[0]["state"] == "open"  # (no verify through the CLI yet)
    verify_again = [a for a in verify if a != "--repair"]
    assert cli_run(verify_again) == 0  # equal since the gap: it closes (every captured table verified)
    (gap,) = read_gaps(events_dir(p.data_dir, p.source))
    assert gap["state"] == "closed" and set(gap["verified"]) == {p.table.id}, gap
    capsys.readouterr()
    assert cli_run(["status", "--source", p.source]) == 0
    assert "gap (" not in capsys.readouterr().out
    out = str(p.data_dir) + "/export.jsonl"
    assert cli_run(["export-debezium", "--table", p.table.id, "--source", p.source, "--data-dir", p.data_dir,
                    "--out", out, "--form", "value"]) == 0
    with open(out) as f:
        assert {json.loads(line)["payload"]["op"] for line in f} <= {"c", "u", "d", "r"}  # no gap record


@pytest.mark.parametrize("major", [17, 18])
def test_an_unplanned_promotion_after_a_chunk_only_the_old_primary_had_finishes_the_snapshot(pair_pipeline, major):
    """The standby is cut off after the 2nd chunk; the old primary alone commits writers'
    changes and the 3rd chunk (both of its watermarks), then dies, and the standby is promoted
    with the failover slot. That chunk's high watermark is on no server any more: the run fails
    saying so once capture has passed where it was written, and ``resume`` reads the chunk again
    on the new primary and finishes the snapshot without starting over; verify 0 mismatched, the
    event log without violations."""
    p, cluster = pair_pipeline(major)
    mix = {"update": 50, "multi": 10, "insert": 25, "delete": 15}
    writers = [w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=41, mix=mix).start()]

    def cut_off() -> None:
        with p.dialect() as d:
            cluster.wait(lambda: (stage_changelog(d, p.data_dir), cluster.slot_synced(d.slot_name))[1],
                         "the failover slot is synchronized on the standby")
        cluster.standby.sql("ALTER SYSTEM SET primary_conninfo = ''", database="postgres")
        cluster.standby.sql("SELECT pg_reload_conf()", database="postgres")
        cluster.wait(lambda: cluster.standby.sql("SELECT count(*) FROM pg_stat_wal_receiver",
                                                 database="postgres") == [(0,)], "the standby is cut off")

    def die() -> None:  # the 3rd chunk and the writers' last changes are on the old primary only
        writers[-1].stop()
        cluster.primary.ctl("-m", "immediate", "-w", "stop")
        cluster.standby.promote()
        cluster.wait(lambda: cluster.standby.sql("SELECT pg_is_in_recovery()") == [(False,)],
                     "the standby is promoted")
        p.uri = cluster.standby.uri
        p.mp.setenv(f"AIRFLOW_CONN_{p.conn_id.upper()}", p.uri)
        writers.append(w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=42, mix=mix).start())

    calls = p.on_chunk(2, cut_off)
    p.on_chunk(3, die)
    try:
        first = p.run("cdc_snapshot", {"action": "start", "tables": [p.table.id], **SNAPSHOT_CONF},
                      expect="failed")
        sid = p.progress().snapshot_id
        p.snapshot("resume")
    finally:
        writers[-1].stop()
    assert len(writers) == 2, "the promotion must have happened mid-snapshot"
    for writer in writers:
        stats = writer.stats()
        assert stats.committed > 0 and stats.errors == [], stats.errors
    progress = p.progress()
    assert progress.status == "done" and progress.snapshot_id == sid, progress.to_json()  # not started over
    assert first.state == "failed" and calls["n"] > 3
    p.catch_up()
    p.assert_equal()
