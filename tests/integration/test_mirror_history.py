"""The mirror as of a source position (sinks/mirror_history.py): each row-writing commit records
the position it brings the mirror to; the version named for a position equals a copy of the
table at that position, read by the package and by delta-rs's time travel; a position inside one
apply's changes has no exact version and is said so; positions as users write them parse."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.cli import run as cli
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.position import Position, parse_position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import mirror_compaction, mirror_readers
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.event_log import EventLogSink
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.sinks.mirror_history import version_at
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

pytestmark = pytest.mark.integration

SOURCE = "src"
T = TableName("public", "items")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("v", "string")), ("id",))


def ev(pos: int, op: str, key: int, value: str | None = None, batch: str = "") -> dict:
    return {"position": Position(pos).encode(), "table": T.id, "op": op, "key": encode_key([key]), "before": None,
            "after": None if op == "d" else encode_row({"id": key, "v": value}), "ts_ms": pos, "watermark": None,
            "snapshot": False, "batch": batch}


def apply(data_dir: str, events: list[dict], model: dict[int, str]) -> None:
    """One apply batch to both sinks (the event log file named by its position range, as capture's
    segments are), and to the model of the source."""
    lo, hi = min(e["position"] for e in events), max(e["position"] for e in events)
    events = [{**e, "batch": f"c-{lo}-{hi}"} for e in events]
    table = pa.Table.from_pylist(events, schema=EVENT_SCHEMA)
    EventLogSink(data_dir, SOURCE).write(table)
    MirrorDeltaSink(data_dir, SOURCE).write(table)
    for e in sorted(events, key=lambda e: e["position"]):
        key = int(e["key"][1:-1])
        if e["op"] == "d":
            model.pop(key, None)
        else:
            model[key] = value_of(e)


def value_of(e: dict) -> str:
    import json

    return json.loads(e["after"])["v"]


def live(data_dir: str, **kw) -> dict[int, str]:
    return {r["id"]: r["v"] for r in mirror_readers.read_mirror(data_dir, SOURCE, T, **kw).to_pylist()}


def test_the_version_for_a_position_equals_the_source_there(tmp_path, capsys, monkeypatch):
    data_dir = str(tmp_path)
    monkeypatch.setenv("CDC_TABLES", T.id)  # the command reads only tables of the capture scope (I15)
    storage.write_text(schema_path(data_dir, SOURCE, T), SCHEMA.to_json())
    model: dict[int, str] = {}
    copies: dict[int, dict[int, str]] = {}
    apply(data_dir, [ev(10 + i, "c", i, f"a{i}") for i in range(20)], model)
    copies[40] = dict(model)  # a position after the first batch, before the second
    apply(data_dir, [ev(50, "u", 1, "b1"), ev(51, "d", 2), ev(52, "c", 100, "new"), ev(53, "u", 1, "c1")], model)
    copies[60] = dict(model)
    mirror_compaction.compact(data_dir, SOURCE, T)  # maintenance: no position of its own
    apply(data_dir, [ev(70, "d", 1), ev(71, "c", 2, "back"), ev(72, "u", 3, "x")], model)
    copies[90] = dict(model)
    apply(data_dir, [ev(95, "u", 4, "y"), ev(99, "u", 5, "z")], model)

    path = mirror_dir(data_dir, SOURCE, T)
    from deltalake import DeltaTable

    for at, copy in copies.items():
        found = version_at(data_dir, SOURCE, T, Position(at))
        assert found is not None and found.exact, (at, found)
        assert live(data_dir, as_of=Position(at)) == copy
        plain = pa.table(DeltaTable(path, version=found.version).scan()).to_pylist()
        assert sorted((r["id"], r["v"]) for r in plain) == sorted(copy.items())
    assert live(data_dir) == model

    # 97: between the two changes of the last batch, applied in one commit: no exact version
    inside = version_at(data_dir, SOURCE, T, Position(97))
    assert inside is not None and inside.exact is False and inside.changes_between == 1
    with pytest.raises(ConfigurationError, match="no version equals the source"):
        live(data_dir, as_of=Position(97))
    assert version_at(data_dir, SOURCE, T, Position(5)) is None  # before the first row

    assert cli(["mirror-version", "--table", T.id, "--at", Position(60).encode(), "--source", SOURCE,
                "--data-dir", data_dir]) == 0
    out = capsys.readouterr().out
    assert f"Delta version {version_at(data_dir, SOURCE, T, Position(60)).version} equals" in out
    assert "versionAsOf" in out
    assert cli(["mirror-version", "--table", T.id, "--at", Position(97).encode(), "--source", SOURCE,
                "--data-dir", data_dir]) == 1
    assert cli(["mirror-version", "--table", T.id, "--at", "not a position", "--source", SOURCE,
                "--data-dir", data_dir]) == 2
    assert "not a source position" in capsys.readouterr().err


def test_positions_as_users_write_them():
    assert parse_position("16/B374D848") == Position.pg("16/B374D848", 2**32 - 1)
    assert parse_position("binlog.000042:1234") == Position.binlog("binlog.000042", 1234, 2**32 - 1)
    assert parse_position("binlog.000042:1234@1") == Position.binlog("binlog.000042", 1234, 2**32 - 1, 1)
    encoded = Position(7, 8, 9).encode()
    assert parse_position(encoded) == Position(7, 8, 9)
    for bad in ("", "16/XYZ", "binlog:abc", "12345"):
        with pytest.raises(ValueError, match="not a source position"):
            parse_position(bad, "--at")
