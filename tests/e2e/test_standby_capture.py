"""Capture from a hot standby through the DAGs (PostgreSQL 16+, issue 44).

The source's Airflow connection names a hot standby of a PostgreSQL 18 primary, with
watermark_strategy "log"; the administrator created the publication on the primary. cdc_snapshot
runs under writers on the primary, cdc_changelog catches up; verify (through the standby) finds 0
mismatched and the event log is consistent. The primary ends with no slot but the standby's
physical one and no watermark table: it served nothing but its WAL stream.
"""

from __future__ import annotations

import threading

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.dialects.postgres.prerequisites import default_object_name
from tests.pg_cluster import Cluster, pg_bin
from tools import workload as w

from .conftest import connection_json
from .helpers import ROWS, Pipeline


class StandbyPipeline(Pipeline):
    """A Pipeline whose source is a standby: the table lives on the primary, and nothing is
    dropped on the standby (the pair is removed afterwards); only the Variables are."""

    def __init__(self, cluster: Cluster, name: str, data_dir, monkeypatch) -> None:
        super().__init__(cluster.standby.uri, name, data_dir, monkeypatch)
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}",
                           connection_json(cluster.standby.uri, watermark_strategy="log"))
        self.cluster = cluster

    def cleanup(self) -> None:
        from airflow.models.variable import Variable

        Variable.delete(airflow_variables.variable_key(self.source, self.table.id))
        Variable.delete(airflow_variables.verify_key(self.source, self.table.id))
        Variable.delete(airflow_variables.lag_key(self.source))


def _caught_up(c: Cluster) -> None:
    target = c.primary.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    c.wait(lambda: c.standby.sql("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)) == [(True,)],
           "the standby replayed the primary's WAL")


@pytest.fixture
def standby_pipeline(unique_name, tmp_path, monkeypatch):
    if pg_bin(18) is None:
        pytest.fail("PostgreSQL 18 server binaries are missing (scripts/services.sh installs them)")
    cluster = Cluster(18).start()
    p = None
    try:
        p = StandbyPipeline(cluster, unique_name, tmp_path / "data", monkeypatch)
        w.create_demo_table(cluster.primary.uri, p.table, ROWS)
        # README set-up for a standby source: the publication is created on the primary
        pub = default_object_name(p.source)
        cluster.primary.sql(f'CREATE PUBLICATION {pub} FOR TABLE "{p.table.schema}"."{p.table.name}" '
                            "WITH (publish_via_partition_root = true)")
        _caught_up(cluster)
        # the standby's slot starts at the primary's next running-transactions record
        stop = threading.Event()

        def nudge() -> None:
            while not stop.is_set():
                cluster.primary.sql("SELECT pg_log_standby_snapshot()")
                stop.wait(0.5)

        nudger = threading.Thread(target=nudge, daemon=True)
        nudger.start()
        try:
            p.capture_now()
        finally:
            stop.set()
            nudger.join()
        yield p
    finally:
        if p is not None:
            p.cleanup()
        cluster.remove()


def test_snapshot_and_capture_through_a_standby_source(standby_pipeline):
    p = standby_pipeline
    c = p.cluster
    mix = {"update": 50, "multi": 10, "insert": 25, "delete": 15}
    with w.BackgroundWriter(c.primary.uri, p.table, threads=2, rate=100, seed=31, mix=mix) as writer:
        p.snapshot()
    stats = writer.stats()
    assert stats.committed > 0 and stats.errors == [], stats.errors
    assert p.progress().status == "done", p.progress().to_json()
    _caught_up(c)
    p.catch_up()
    p.assert_equal()  # verify through the standby: 0 mismatched; the event log consistent
    assert c.standby.sql("SELECT slot_type FROM pg_replication_slots WHERE slot_name = %s",
                         (default_object_name(p.source),)) == [("logical",)]
    assert c.primary.sql("SELECT slot_name, slot_type FROM pg_replication_slots") == [("standby1", "physical")]
    for srv in (c.primary, c.standby):
        assert srv.sql("SELECT count(*) FROM pg_class WHERE relname = 'watermark'") == [(0,)]
