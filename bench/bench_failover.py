"""Failover of the source: seconds from the promotion to the first change of the new primary in
the mirror, and rows re-read to get the mirror equal to the source again, per case:

- ``slot``: PostgreSQL 18 with a synchronized failover slot. Capture goes on from the slot; no
  row is re-read. ``slot17``: the same on PostgreSQL 17.
- ``resync``: PostgreSQL 15 (no failover slots), promoted after ``--gap-seconds`` of writes that
  were replicated but never captured. Capture stops (SourceChangedError), ``resync`` starts it
  anew, verify finds what differs and a snapshot of only those key ranges repairs it.
- ``mariadb``: MariaDB with a GTID replica (log_slave_updates) promoted: capture follows it from
  its GTID position in the next epoch; no row is re-read.

Each case runs on a primary/standby pair of its own (tests/pg_cluster.py), a table of ``--rows``
rows snapshotted into a Delta mirror first, writers at ``--rate`` transactions/s (updates and
inserts; a delete lost in a gap would make the repair whole-table, see README "Failover") on
whichever server is the primary; in ``resync`` one transaction in ten is a delete, so deletes
are lost in the gap too: the repair's snapshot of key ranges converges inside them (removes the
mirror rows the source no longer has), as the snapshot DAG's commit does. The figures are
seconds on this machine and rows; the rows re-read are also given as a share of the table.

    python -m bench failover [--rows 100000] [--rate 50] [--gap-seconds 1] [--verify-chunk-rows 1000]
                             [--cases slot,slot17,resync,mariadb]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
import uuid

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import SourceChangedError
from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName, encode_key
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.resync import resync
from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
from airflow_provider_cdc.pipeline.verify import verify_table
from airflow_provider_cdc.sinks.event_log import EventLogSink
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.sinks.mirror_readers import mirror_rows_of
from airflow_provider_cdc.storage.layout import schema_path
from tests import mariadb_cluster
from tests.pg_cluster import Cluster

SOURCE = "bench"
TABLE = TableName("public", "orders")
CHUNK = 20_000
MARKER = -1  # the key the new primary's first change writes


class Writer:
    """Updates and inserts at ``rate`` on the current primary (``server``), reconnecting to
    whichever server that is after a failover."""

    def __init__(self, server, rows: int, rate: float, deletes: bool = False) -> None:
        self.server, self.rows, self.rate, self.deletes = server, rows, rate, deletes
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rnd, conn, next_id = random.Random(7), None, self.rows + 1
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = _connect(self.server)
                with conn.cursor() as cur:
                    if self.deletes and rnd.random() < 0.1:
                        cur.execute("DELETE FROM orders WHERE id = %s", (rnd.randint(1, self.rows),))
                    elif rnd.random() < 0.8:
                        cur.execute("UPDATE orders SET v = %s, n = n + 1 WHERE id = %s",
                                    (f"u{rnd.random()}", rnd.randint(1, self.rows)))
                    else:
                        cur.execute("INSERT INTO orders VALUES (%s, 'new', 0)", (next_id,))
                        next_id += 1
                conn.commit()
            except Exception:  # noqa: BLE001 - the primary went away: reconnect to self.server
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001 - already gone
                        pass
                conn = None
            time.sleep(1 / self.rate)
        if conn is not None:
            conn.close()


def _connect(server):
    if isinstance(server, mariadb_cluster.Server):
        return server.connect()
    import psycopg2

    return psycopg2.connect(server.uri, connect_timeout=2)


class _Pair:
    """A primary and the server a failover promotes, of either database."""

    def __init__(self, case: str) -> None:
        self.case = case
        if case == "mariadb":
            self.cluster = mariadb_cluster.Cluster().start()
            self.old, self.new, self.table = self.cluster.primary, self.cluster.replica, TableName("cdc_test", "orders")
        else:
            self.major = {"slot": 18, "slot17": 17}.get(case, 15)
            self.cluster = Cluster(self.major, failover=case.startswith("slot")).start()
            self.old, self.new, self.table = self.cluster.primary, self.cluster.standby, TABLE
        self.database = "MariaDB" if case == "mariadb" else f"PostgreSQL {self.major}"

    def load(self, rows: int) -> None:
        self.old.sql("CREATE TABLE orders (id int PRIMARY KEY, v text, n int)")
        if self.case == "mariadb":
            self.old.sql(f"INSERT INTO orders SELECT seq, CONCAT('v', seq), seq FROM seq_1_to_{int(rows)}")  # noqa: S608 - an int
            self.cluster.wait_replica()
        else:
            self.old.sql("INSERT INTO orders SELECT g, 'v' || g, g FROM generate_series(1, %s) g", (rows,))

    def ready(self, d, data_dir: str) -> None:
        """What must hold before the promotion: the failover slot is synchronized (slot), or the
        replica has applied everything (mariadb)."""
        if self.case.startswith("slot"):
            self.cluster.wait(lambda: (stage_changelog(d, data_dir), self.cluster.slot_synced(d.slot_name))[1],
                              "the failover slot is synced")
        elif self.case == "mariadb":
            self.cluster.wait_replica()

    def fail_over(self) -> None:
        if self.case == "mariadb":
            self.cluster.promote()
        else:
            self.cluster.fail_over()


def _dialect(uri: str, table: TableName = TABLE):
    return get_dialect(ConnectionParams.from_uri(uri), source=SOURCE, tables=[table])


def _sinks(data_dir: str) -> list:
    return [EventLogSink(data_dir, SOURCE), MirrorDeltaSink(data_dir, SOURCE)]


def _snapshot(d, data_dir: str, rng=FULL_RANGE, snapshot_id: str = "snap") -> int:
    """Chunks over ``rng``, captured and merged into the mirror; returns the rows read."""
    table = d.scope_tables()[0]
    schema = d.describe_table(table)
    storage.write_text(schema_path(data_dir, SOURCE, table), schema.to_json())
    results, after, seq = [], None, 0
    while True:
        res = snapshot_chunk(d, schema, rng, data_dir=data_dir, snapshot_id=snapshot_id, seq=seq, limit=CHUNK,
                             after_key=after)
        results.append(res)
        seq += 1
        if res.exhausted:
            break
        after = res.last_key
    stage_changelog(d, data_dir)
    arrow_engine.merge_round(results, data_dir=data_dir, source=SOURCE, sinks=_sinks(data_dir))
    return sum(r.rows for r in results)


def _until_marker_applied(d, data_dir: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    key = encode_key([MARKER])
    while time.monotonic() < deadline:
        stage_changelog(d, data_dir)
        arrow_engine.apply_changelog(data_dir, SOURCE, _sinks(data_dir))
        if mirror_rows_of(data_dir, SOURCE, d.scope_tables()[0], [key]).num_rows:
            return
    raise AssertionError("the new primary's first change never reached the mirror")


def _converge(d, data_dir: str, table: TableName, mark: str, vis, ranges) -> None:
    """What the snapshot DAG's commit does once a snapshot of key ranges is merged: mirror rows
    inside the ranges older than its convergence mark go (pipeline/snapshot_controller.py)."""
    from airflow_provider_cdc.core.window import lowered_low
    from airflow_provider_cdc.pipeline.windows import staged_log
    from airflow_provider_cdc.sinks.mirror_delta import sweep
    from airflow_provider_cdc.storage.layout import changelog_dir, mirror_dir
    from airflow_provider_cdc.storage.staged import staged_watermarks

    stage_changelog(d, data_dir)
    changelog = changelog_dir(data_dir, SOURCE)
    at = staged_watermarks(changelog, [mark])[mark][0]
    at = lowered_low(vis, at, at, staged_log(changelog, [vis], at))
    sweep(mirror_dir(data_dir, SOURCE, table), at, within=ranges, reason="repair convergence")


def run_case(case: str, args) -> dict:
    pair = _Pair(case)
    data_dir = tempfile.mkdtemp(prefix=f"bench-failover-{case}-")
    try:
        pair.load(args.rows)
        table = pair.table
        d = _dialect(pair.old.uri, table)
        d.prepare_watermarks()
        d.load_offset(data_dir)
        writer = Writer(pair.old, args.rows, args.rate, deletes=case == "resync")
        writer.thread.start()
        try:
            _snapshot(d, data_dir)
            stage_changelog(d, data_dir)
            arrow_engine.apply_changelog(data_dir, SOURCE, _sinks(data_dir))
            pair.ready(d, data_dir)
            if case == "resync":
                time.sleep(args.gap_seconds)  # written, replicated, never captured
            d.close()
            t0 = time.monotonic()
            pair.fail_over()
            promoted = time.monotonic()
            writer.server = pair.new
            d2 = _dialect(pair.new.uri, table)
            reread = 0
            if case == "resync":
                try:
                    stage_changelog(d2, data_dir)
                    raise AssertionError("capture went on after a promotion without a failover slot")
                except SourceChangedError:
                    pass
                resync(d2, data_dir)  # (a change committed before this is in the gap: the repair brings it)
            pair.new.sql("INSERT INTO orders VALUES (%s, 'first on the new primary', 0)", (MARKER,))
            _until_marker_applied(d2, data_dir)
            first_applied = time.monotonic()
        finally:
            writer.stop.set()
            writer.thread.join()
        stage_changelog(d2, data_dir)
        arrow_engine.apply_changelog(data_dir, SOURCE, _sinks(data_dir))
        res = verify_table(d2, data_dir, SOURCE, table, chunk_rows=args.verify_chunk_rows)
        ranges = len(res.repair_ranges)
        if not res.ok:
            conf = res.repair_conf()
            if "key_ranges" in (conf or {}):
                # the convergence mark first, as the snapshot DAG's plan takes it
                mark, vis = d2.mark(f"converge-{uuid.uuid4().hex}"), d2.visibility()
                for i, r in enumerate(res.repair_ranges):
                    reread += _snapshot(d2, data_dir, r, snapshot_id=f"repair{i}")
                _converge(d2, data_dir, table, mark, vis, res.repair_ranges)
            else:
                reread += _snapshot(d2, data_dir, snapshot_id="repair")
        consistent = time.monotonic()
        again = verify_table(d2, data_dir, SOURCE, table, chunk_rows=args.verify_chunk_rows)
        total = again.source_rows
        if case != "mariadb":
            d2.drop_slot()
        extra = res.extra
        d2.close()
        return {
            "case": case, "database": pair.database, "rows": total,
            "promotion_s": round(promoted - t0, 2),
            "promotion_to_first_change_applied_s": round(first_applied - promoted, 2),
            "mismatched_after_catch_up": res.mismatched, "extra_after_catch_up": extra, "repair_ranges": ranges,
            "rows_reread": reread, "rows_reread_share": round(reread / total, 4) if total else None,
            "promotion_to_mirror_equal_s": round(consistent - promoted, 2),
            "verify_after_repair_mismatched": again.mismatched,
        }
    finally:
        pair.cluster.remove()
        storage.delete_dir(data_dir)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench failover")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=50.0, help="writer transactions/s")
    ap.add_argument("--gap-seconds", type=float, default=1.0, help="resync: seconds of writes never captured")
    ap.add_argument("--verify-chunk-rows", type=int, default=1000)
    ap.add_argument("--cases", default="slot,slot17,resync,mariadb")
    args = ap.parse_args(argv)
    failed = 0
    for case in args.cases.split(","):
        out = run_case(case.strip(), args)
        print(json.dumps(out), flush=True)
        failed += out["verify_after_repair_mismatched"] != 0
    return 1 if failed else 0
