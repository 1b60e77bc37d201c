"""``airflow cdc status``'s caught-up position without a database: how positions are read from
the command line and shown, how binlog bytes are counted, and how far staged and applied
changelog reach (README "Status")."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.dialects.mysql.offsets import binlog_bytes
from airflow_provider_cdc.sinks.base import write_marker
from airflow_provider_cdc.status import caught_up, native_position, parse_position
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.segment_index import record_through


def test_positions_from_the_command_line_and_back():
    assert parse_position("16/B374D848") == Position.pg("16/B374D848")
    assert native_position(parse_position("16/B374D848")) == "16/B374D848"
    assert parse_position("mysql-bin.000012:345", "mysql-bin.000003") == Position.binlog(12, 345)
    assert native_position(Position.binlog(12, 345), "mysql-bin.000003") == "mysql-bin.000012:345"
    assert parse_position(Position.pg("0/10").encode()) == Position.pg("0/10")
    with pytest.raises(ConfigurationError, match="the source is PostgreSQL"):
        parse_position("binlog.000001:4")
    with pytest.raises(ConfigurationError, match="reads a binlog"):
        parse_position("0/10", "binlog.000001")
    with pytest.raises(ConfigurationError, match="not a position"):
        parse_position("yesterday")


def test_binlog_bytes_span_files():
    files = [("b.000001", 1000), ("b.000002", 500), ("b.000003", 300)]
    assert binlog_bytes(files, Position.binlog(1, 900), Position.binlog(1, 950)) == 50
    assert binlog_bytes(files, Position.binlog(1, 900), Position.binlog(3, 120)) == 100 + 500 + 120
    assert binlog_bytes(files[1:], Position.binlog(1, 900), Position.binlog(2, 10)) == 10  # a purged file


def test_caught_up_is_where_the_changelog_is_staged_unless_a_sink_has_not_applied_it(tmp_path):
    data, source = str(tmp_path), "s"
    changelog = changelog_dir(data, source)
    assert caught_up(data, source) is None  # no capture yet
    storage.makedirs(changelog)
    record_through(changelog, Position.pg("0/500"), 1000)
    assert caught_up(data, source)["caught_up_to"] == "0/500"  # nothing staged: all of it
    for first, last in (("0/100", "0/180"), ("0/200", "0/280")):
        name = f"seg-{Position.pg(first).encode()}-{Position.pg(last).encode()}.parquet"
        storage.write_text(storage.join(changelog, name), "")
    assert caught_up(data, source)["caught_up_to"] == "0/100"  # nothing applied
    write_marker(data, source, "events", Position.pg("0/280"))
    write_marker(data, source, "mirror", Position.pg("0/180"))
    got = caught_up(data, source)
    assert (got["caught_up_to"], got["pending_segments"], got["staged_through"]) == ("0/200", 1, "0/500")
    write_marker(data, source, "mirror", Position.pg("0/280"))
    assert caught_up(data, source)["position"] == Position.pg("0/500").encode()
    # a MariaDB source: its committed offset names its binlog
    mlog = changelog_dir(data, "m")
    storage.makedirs(mlog)
    storage.write_text(storage.join(mlog, "_offset.json"), json.dumps({"file": "binlog.000007", "pos": 4}))
    record_through(mlog, Position.binlog(7, 1234), 1000)
    assert caught_up(data, "m")["caught_up_to"] == "binlog.000007:1234"
