"""A failover of a MariaDB source (I14), on a private primary and GTID replica these tests start
and promote (tests/mariadb_cluster.py): capture goes on from the GTID position it stands at, or
stops naming what happened.

- The replica (``--log-slave-updates``: a binlog of its own, numbered on its own) promoted
  mid-snapshot under writers, under both watermark strategies: capture follows it from its
  GTID position, its positions sort after every old one (the next epoch), the snapshot goes on,
  the merge equals the source and the event log holds every change once, in order, per key.
- A fresh server of another topology, and a replica whose binlog no longer holds the GTID
  capture stands at, stop capture with SourceChangedError by name; resync then starts anew.
"""

from __future__ import annotations

import logging
import random
import threading
import time

import pymysql
import pytest

from airflow_provider_cdc.core.errors import SourceChangedError, SourceError
from airflow_provider_cdc.core.position import binlog_epoch
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.dialects.mysql import BinlogOffset
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.resync import resync
from airflow_provider_cdc.pipeline.verify import check_event_log
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.source_server import read_gaps, read_server
from airflow_provider_cdc.storage.staged import read_chunk_rows, read_log_events
from tests.mariadb_cluster import Cluster, Server, _free_port, mariadbd, wait

from .dialect_suite import chunks_with_capture, table_events
from .event_log_helpers import write_event_log

ROWS = 400
CHUNK = 25
TABLE = TableName("cdc_test", "orders")


@pytest.fixture
def pair():
    if mariadbd() is None:
        pytest.fail("mariadbd is missing (scripts/services.sh installs mariadb-server)")
    c = Cluster().start()
    c.primary.sql("CREATE TABLE orders (id int PRIMARY KEY, v varchar(64), n int)")
    c.primary.sql("INSERT INTO orders WITH RECURSIVE g(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM g WHERE i < %s) "
                  "SELECT i, CONCAT('v', i), i FROM g", (ROWS,))
    c.wait_replica()
    yield c
    c.remove()


def _dialect(uri: str, strategy: str = "table"):
    return get_dialect(ConnectionParams.from_uri(uri), source="shop", tables=[TABLE], watermark_strategy=strategy)


class Writers:
    """Writers on the current primary throughout; a failover's connection errors are retried
    against whichever server is the primary then, as an application's pool does."""

    def __init__(self, port: int, threads: int = 2) -> None:
        self.port = port
        self.stop = threading.Event()
        self.committed = 0
        self.threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in range(threads)]

    def _run(self, seed: int) -> None:
        rnd = random.Random(seed)
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = pymysql.connect(host="127.0.0.1", port=self.port, user="root", database="cdc_test",
                                           autocommit=False, connect_timeout=2, read_timeout=5, write_timeout=5)
                with conn.cursor() as cur:
                    k = rnd.randint(1, ROWS + 50)
                    op = rnd.random()
                    if op < 0.6:
                        cur.execute("UPDATE orders SET v = %s, n = n + 1 WHERE id = %s", (f"u{seed}-{rnd.random()}", k))
                    elif op < 0.8:
                        cur.execute("DELETE FROM orders WHERE id = %s", (k,))
                    else:
                        cur.execute("INSERT INTO orders VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE v = 'ins'",
                                    (k, f"i{seed}", k))
                conn.commit()
                self.committed += 1
                time.sleep(0.002)
            except pymysql.err.MySQLError:
                # the primary went away: reconnect to self.port (the new primary once promoted)
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - already broken
                        pass
                conn = None
                time.sleep(0.05)
        if conn is not None:
            conn.close()

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _chunks(d, data_dir: str, after, seq: int, count: int) -> tuple[list, object, bool]:
    return chunks_with_capture(d, TABLE, data_dir, after, seq, count, CHUNK)


def _offset(data_dir: str) -> BinlogOffset:
    from airflow_provider_cdc import storage

    return BinlogOffset.from_json(storage.read_text(storage.join(changelog_dir(data_dir, "shop"), "_offset.json")))


@pytest.mark.parametrize("strategy", ["table", "log"])
def test_capture_and_the_snapshot_follow_a_promoted_gtid_replica(pair, tmp_path, caplog, strategy):
    c = pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.primary.uri, strategy)
    d.prepare_watermarks()
    d.load_offset(data_dir)
    with Writers(c.primary.port) as writers:
        # changes on the old primary before its capture: under watermark strategy "log" nothing
        # else is written there, and the chunks and the capture can finish before a writer's
        # first commit (a clean-clone run of .ci/run: capture stood at GTID 0-1-3, the set-up's own)
        wait(lambda: writers.committed > 20, "the writers commit on the old primary")
        results, after, done = _chunks(d, data_dir, None, 0, 6)
        assert not done
        stage_changelog(d, data_dir)
        old = _offset(data_dir)
        assert (old.server, old.epoch) == (1, 0) and old.gtid.startswith("0-1-")
        d.close()
        c.promote()  # mid-snapshot, writers running (they fail until they reach the new primary)
        writers.port = c.replica.port
        before = writers.committed
        wait(lambda: writers.committed > before + 20, "the writers go on on the new primary")
        d2 = _dialect(c.replica.uri, strategy)
        if strategy == "log":
            # a chunk of the new server before capture followed it: its epoch is not settled yet
            with pytest.raises(SourceError, match="run the capture .* first"):
                _chunks(d2, data_dir, after, len(results), 1)
        with caplog.at_level(logging.WARNING):
            stage_changelog(d2, data_dir)  # capture follows the replica from its GTID position
        assert "replaces server_id 1 (a failover)" in caplog.text and "positions in epoch 1" in caplog.text
        new = _offset(data_dir)
        assert (new.server, new.epoch) == (2, 1), new
        more, _after, done = _chunks(d2, data_dir, after, len(results), 100)
        assert done
        results += more
    stage_changelog(d2, data_dir)
    events = list(read_log_events(changelog_dir(data_dir, "shop")))
    positions = [e.position for e in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    epochs = [binlog_epoch(p.major)[0] for p in positions]
    assert epochs == sorted(epochs) and {0, 1} <= set(epochs), "changes from both servers, old ones first"
    chunks = [WindowChunk.from_result(r, read_chunk_rows(r.path, r.table)) for r in results]
    reads = merge_window(chunks, events)
    state = mirror_apply({}, table_events(events, TABLE))
    mirror_apply(state, reads)
    source = {r[0]: r for r in c.replica.sql("SELECT id, v, n FROM orders")}
    mirror = mirror_rows(state, TABLE.id)
    assert len(mirror) == len(source) > 0
    assert {tuple(v[k] for k in ("id", "v", "n")) for v in mirror.values()} == set(source.values())
    # every change once, in order: each key's events chain (before = the previous after) across
    # the failover, so none was lost or read twice
    assert write_event_log(data_dir, "shop", TABLE) == len(table_events(events, TABLE))
    report = check_event_log(data_dir, "shop", TABLE, primary_key=("id",))
    assert not report.violations, report.violations[:5]
    assert read_server(changelog_dir(data_dir, "shop")) == {
        "system_identifier": "mariadb-gtid-domains:0", "server_id": 2, "epoch": 1}
    d2.close()


def test_a_server_without_the_captured_gtid_stops_capture_and_resync_starts_anew(pair, tmp_path):
    c = pair
    data_dir = str(tmp_path / "data")
    d = _dialect(c.primary.uri)
    d.load_offset(data_dir)
    c.primary.sql("UPDATE orders SET v = 'captured' WHERE id = 1")
    stage_changelog(d, data_dir)
    d.close()
    staged = _offset(data_dir)

    # a fresh server of another topology: its domain 0 is its own
    other = Server(c.root / "other", _free_port(), 3)
    other.start()
    try:
        other.sql("CREATE DATABASE cdc_test", database=None)
        other.sql("CREATE TABLE orders (id int PRIMARY KEY, v varchar(64), n int)")
        with pytest.raises(SourceChangedError) as err:
            stage_changelog(_dialect(other.uri), data_dir)
        text = str(err.value)
        assert "(server_id 3) is not the server capture read before (server_id 1)" in text, text
        assert f"before {staged.gtid} where capture stands" in text and "airflow-cdc resync" in text, text
    finally:
        other.stop()
    assert _offset(data_dir) == staged

    # the replica, whose binlog was purged past the captured GTID before it was promoted
    c.primary.sql("UPDATE orders SET v = 'maybe lost' WHERE id = 2")
    c.wait_replica()
    c.replica.sql("FLUSH BINARY LOGS", database=None)
    newest = c.replica.sql("SHOW MASTER STATUS", database=None)[0][0]

    def purged() -> bool:  # a file InnoDB has not checkpointed yet stays ("in use"): tried until it went
        c.replica.sql(f"PURGE BINARY LOGS TO '{newest}'", database=None)
        return [r[0] for r in c.replica.sql("SHOW BINARY LOGS", database=None)] == [newest]

    wait(purged, "the replica's older binlog files are purged")
    c.promote()
    d2 = _dialect(c.replica.uri)
    with pytest.raises(SourceChangedError) as err:
        stage_changelog(d2, data_dir)
    text = str(err.value)
    assert f"cannot send its binlog from GTID {staged.gtid}, where capture stands" in text, text
    assert "purged" in text and "airflow-cdc resync" in text, text

    gap = resync(d2, data_dir)
    assert gap["state"] == "open" and "cannot send its binlog" in gap["reason"]
    assert gap["server_before"]["server_id"] == 1 and gap["server_after"] == {
        "system_identifier": "mariadb-gtid-domains:0", "server_id": 2, "epoch": 1}
    assert gap["to"] > gap["from"]
    assert read_gaps(changelog_dir(data_dir, "shop"))[-1]["id"] == gap["id"]
    c.replica.sql("UPDATE orders SET v = 'after resync' WHERE id = 3")
    stage_changelog(d2, data_dir)
    events = [e for e in read_log_events(changelog_dir(data_dir, "shop")) if getattr(e, "table", None) == TABLE.id]
    assert [(e.after["id"], e.after["v"], binlog_epoch(e.position.major)[0]) for e in events] == [
        (1, "captured", 0), (3, "after resync", 1)]
    d2.close()


def test_a_table_id_a_restart_gives_another_table_is_decoded_with_that_tables_columns(tmp_path):
    """Capture keeps the binlog library's map of table ids (freeze_schema: a table map event is
    not parsed again for an id already mapped). The server numbers table ids per run of it, so
    after a restart the first table opened takes the id the first one took before. Forced here:
    a restart before each of two inserts into two tables of different columns, both read by one
    capture across the three binlog files; each row is decoded with its own table's columns (the
    map is cleared at each new file)."""
    if mariadbd() is None:
        pytest.fail("mariadbd is missing (scripts/services.sh installs mariadb-server)")
    srv = Server(tmp_path / "solo", _free_port(), 1)
    try:
        srv.start()
        srv.sql("CREATE DATABASE cdc_test", database=None)
        srv.sql("CREATE TABLE narrow (id int PRIMARY KEY, x varchar(10))")
        srv.sql("CREATE TABLE wide (id int PRIMARY KEY, y int, z varchar(10), w double)")
        tables = [TableName("cdc_test", "narrow"), TableName("cdc_test", "wide")]
        data_dir = str(tmp_path / "data")
        with get_dialect(ConnectionParams.from_uri(srv.uri), source="ids", tables=tables) as d:
            d.load_offset(data_dir)
        for insert in ("INSERT INTO narrow VALUES (1, 'one')", "INSERT INTO wide VALUES (2, 20, 'two', 2.5)"):
            srv.stop()
            srv.start()
            srv.sql(insert)  # the first user table this run of the server opens
        maps = [r for f in srv.sql("SHOW BINARY LOGS", database=None)
                for r in srv.sql(f"SHOW BINLOG EVENTS IN '{f[0]}'", database=None) if r[2] == "Table_map"]
        ids = {info.split("(")[1].rstrip(")"): info.split()[1] for *_x, info in maps}
        assert ids["cdc_test.narrow"] == ids["cdc_test.wide"], ids  # the interleaving this test needs
        with get_dialect(ConnectionParams.from_uri(srv.uri), source="ids", tables=tables) as d:
            assert stage_changelog(d, data_dir).events == 2
        events = table_events(list(read_log_events(changelog_dir(data_dir, "ids"))), tables[1])
        assert [(e.key, e.after) for e in events] == [("[2]", {"id": 2, "y": 20, "z": "two", "w": 2.5})]
    finally:
        srv.stop()
