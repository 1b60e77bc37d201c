"""MariaDB positions across a failover (dialects/mysql/failover.py): the epoch above the binlog
file index orders a promoted replica's positions after the old server's; offsets written before
it keep reading as epoch 0."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.core.errors import StateError
from airflow_provider_cdc.core.position import Position, binlog_epoch, binlog_major
from airflow_provider_cdc.dialects.mysql import BinlogOffset
from airflow_provider_cdc.dialects.mysql.failover import GtidState


def test_an_offset_without_epoch_or_server_reads_as_before():
    o = BinlogOffset.from_json('{"file": "binlog.000042", "gtid": "0-1-9", "pos": 1234}')
    assert (o.epoch, o.index, o.server, o.gtid) == (0, 42, None, "0-1-9")
    assert o.position() == Position.binlog("binlog.000042", 1234) == Position(42, 1234, 0)
    assert json.loads(o.to_json()) == {"file": "binlog.000042", "pos": 1234, "gtid": "0-1-9"}


def test_a_later_epoch_sorts_after_every_file_of_the_server_before():
    old = BinlogOffset.of("binlog.999999", 10**9, 0, 1, "0-1-500")
    new = BinlogOffset.of("binlog.000001", 4, 1, 2, "0-1-500")
    assert new > old and new.position() > old.position()
    assert BinlogOffset.from_json(new.to_json()) == new and BinlogOffset.from_json(new.to_json()).server == 2
    assert binlog_epoch(new.major) == (1, 1) and new.major == binlog_major(1, 1) == (1 << 32) | 1
    assert Position.binlog("binlog.000003", 7, 2, epoch=1) > Position.binlog("binlog.000900", 7, 2)
    assert new.at("binlog.000002", 9) == BinlogOffset.of("binlog.000002", 9, 1, 2)


def test_gtid_state_follows_groups_per_domain():
    s = GtidState.parse("1-2-7,0-1-42")
    assert str(s) == "0-1-42,1-2-7" and s.domain(1) == (1, 2, 7) and s.domain(5) is None
    assert str(s.after("0-3-43")) == "0-3-43,1-2-7"
    assert str(GtidState.parse(None).after("0-1-1")) == "0-1-1"
    with pytest.raises(StateError, match="not a MariaDB GTID position"):
        GtidState.parse("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5")
