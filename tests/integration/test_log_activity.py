"""Rounds that start when the source writes (issue 49): ``Dialect.log_activity`` read-only on
real servers, and the event trigger that schedules ``cdc_changelog`` on ``@log`` driven through
its ``run()`` as the triggerer drives it.

PostgreSQL counts writes to the publication's tables only (``pg_stat_user_tables``): a write to
another table moves the WAL but starts no round. ``pg_stat_force_next_flush()`` after a write makes
the writer's counters visible before its next statement, instead of within the second PostgreSQL allows itself.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams
from airflow_provider_cdc.dialects.mysql import BinlogOffset
from airflow_provider_cdc.pipeline.capture import run_capture
from airflow_provider_cdc.triggers.log_activity import LogActivityTrigger, round_reason

from .helpers import Handle

pytestmark = pytest.mark.integration


def _next(loop, agen, timeout: float = 30):
    """The trigger's next event, or a failure after ``timeout`` seconds of polls without one."""
    return loop.run_until_complete(asyncio.wait_for(agen.__anext__(), timeout))


@pytest.fixture
def pg_tables(pg_uri, unique_name):
    import psycopg2

    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    inside, outside = f"la_in_{unique_name}", f"la_out_{unique_name}"
    for name in (inside, outside):
        cur.execute(f'CREATE TABLE "{name}" (id int PRIMARY KEY)')

    def write(name: str, key: int) -> None:
        cur.execute(f'INSERT INTO "{name}" VALUES (%s)', (key,))
        cur.execute("SELECT pg_stat_force_next_flush()")  # flushed before the backend says it is ready

    yield inside, outside, write
    for name in (inside, outside):
        cur.execute(f'DROP TABLE IF EXISTS "{name}"')
    admin.close()


def test_postgres_activity_moves_with_writes_to_the_scope_only(pg_uri, unique_name, tmp_path, pg_tables):
    inside, outside, write = pg_tables
    handle = Handle(pg_uri, f"la_{unique_name}", [TableName("public", inside)])
    data_dir = str(tmp_path)
    try:
        run_capture(handle, data_dir)  # the slot and the publication
        with handle.get_dialect() as d:
            before = d.log_activity(data_dir)
            write(outside, 1)
            other = d.log_activity(data_dir)
            assert other.token == before.token, "a write outside the capture scope changed the reading"
            assert other.pending_bytes > 0  # the WAL moved past the slot all the same
            assert round_reason(before, other, first=False, since_last=1, heartbeat=600) is None
            write(inside, 1)
            after = d.log_activity(data_dir)
            assert after.token != before.token
            assert round_reason(other, after, first=False, since_last=1, heartbeat=600) == (
                "the source wrote to the capture scope"
            )
        result, _lag = run_capture(handle, data_dir)
        assert result.events == 1  # the one write inside the scope
    finally:
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()


def test_the_trigger_starts_a_round_at_its_start_with_log_pending_then_on_each_write(
    pg_uri, unique_name, tmp_path, pg_tables, monkeypatch
):
    inside, _outside, write = pg_tables
    source = f"la_{unique_name}"
    handle = Handle(pg_uri, source, [TableName("public", inside)], own_watermark_table=False)
    monkeypatch.setenv(f"AIRFLOW_CONN_{source.upper()}", pg_uri)
    data_dir = str(tmp_path)
    trigger = LogActivityTrigger(conn_id=source, source=source, data_dir=data_dir, poll_interval=0.05, heartbeat=3600)
    agen = trigger.run()
    loop = asyncio.new_event_loop()  # the triggerer's, here the test's own
    try:
        run_capture(handle, data_dir)
        write(inside, 1)  # not captured yet
        first = _next(loop, agen)
        assert first.payload["source"] == source and first.payload["pending_bytes"] > 0
        assert first.payload["reason"].startswith("the watch started with")
        run_capture(handle, data_dir)
        write(inside, 2)
        second = _next(loop, agen)
        assert second.payload["reason"] == "the source wrote to the capture scope", second.payload
        # serialised as the triggerer stores it, and built again the same
        path, kwargs = trigger.serialize()
        assert path == "airflow_provider_cdc.triggers.log_activity.LogActivityTrigger"
        assert LogActivityTrigger(**kwargs).serialize() == (path, kwargs)
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()
        assert trigger._dialect is None  # its connection closed with the watch
        with handle.get_dialect() as d:
            d.drop_slot()
            d.drop_publication()


def test_mariadb_activity_is_the_binlog_end_and_the_bytes_past_the_offset(mysql_uri, unique_name, tmp_path):
    import pymysql

    p = ConnectionParams.from_uri(mysql_uri)
    conn = pymysql.connect(host=p.host, port=p.port, user=p.user, password=p.password or "", database=p.database,
                           autocommit=True)
    t = TableName(p.database, f"la_{unique_name}")
    with conn.cursor() as c:
        c.execute(f"CREATE TABLE `{t.name}` (id int PRIMARY KEY)")
    handle = Handle(mysql_uri, f"la_{unique_name}", [t])
    data_dir = str(tmp_path)
    try:
        with handle.get_dialect() as d:
            fresh = d.log_activity(data_dir)
            offset_file = d.offsets.offset_path(data_dir)
        assert fresh.pending_bytes is None  # no offset committed yet: a round must start
        assert not os.path.exists(offset_file)  # read-only: reading committed no offset
        assert round_reason(None, fresh, first=True, since_last=0, heartbeat=600) is not None
        run_capture(handle, data_dir)
        with handle.get_dialect() as d:
            offset = BinlogOffset.from_json(d.load_offset(data_dir))
            caught_up = d.log_activity(data_dir)
            end = d.binlog_end()
            # caught up: only what was written since (the shared server's other tests write too:
            # make test runs two sessions) lies past the offset; none of it when nobody wrote
            if end.file == offset.file:  # (a rotation meanwhile: the bytes span files)
                assert 0 <= caught_up.pending_bytes <= end.pos - offset.pos, (caught_up, offset, end)
            with conn.cursor() as c:
                c.execute(f"INSERT INTO `{t.name}` VALUES (1)")
            wrote = d.log_activity(data_dir)
        assert wrote.token != caught_up.token and wrote.pending_bytes > 0
    finally:
        with conn.cursor() as c:
            c.execute(f"DROP TABLE IF EXISTS `{t.name}`")
        conn.close()
