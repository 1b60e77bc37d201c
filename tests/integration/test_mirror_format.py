"""A mirror carries its format version as a Delta table property (core/formats.py MIRROR):
set when the package creates it, and a mirror of a newer version is refused by name."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.formats import MIRROR, FormatError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import delta_buckets as db
from airflow_provider_cdc.sinks import mirror_table
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

pytestmark = pytest.mark.integration

T = TableName("public", "items")


def test_a_mirror_is_stamped_and_a_newer_one_refused(tmp_path):
    data_dir = str(tmp_path)
    schema = TableSchema(T, (Column("id", "int64"), Column("v", "string")), ("id",))
    storage.write_text(schema_path(data_dir, "src", T), schema.to_json())
    event = {"position": Position(1).encode(), "table": T.id, "op": "c", "key": encode_key([1]), "before": None,
             "after": encode_row({"id": 1, "v": "a"}), "ts_ms": 1, "watermark": None, "snapshot": False, "batch": "b"}
    MirrorDeltaSink(data_dir, "src").write(pa.Table.from_pylist([event], schema=EVENT_SCHEMA))
    path = mirror_dir(data_dir, "src", T)
    dt = mirror_table._delta(path)
    assert dt.metadata().configuration[MIRROR.key] == str(MIRROR.version)
    # deletion vectors and nothing a reader of them might not know (delta-rs would add variantType)
    assert dt.protocol().reader_features == ["deletionVectors"]
    assert db.read_version(dt, path).masked
    mirror_table._set_properties(dt, {MIRROR.key: str(MIRROR.version + 1)})
    with pytest.raises(FormatError, match=f"^mirror {path}: this mirror table has format version "
                                          f"{MIRROR.version + 1}, written by a newer .*Upgrade"):
        db.read_version(mirror_table._delta(path), path)


def _row(key: int, pos: int, value: str | None, deleted: bool = False) -> dict:
    return {"id": key, "v": value, "__key": encode_key([key]), "__position": Position(pos).encode(),
            "__deleted": deleted, "__bucket": 0}


def test_a_format_1_mirror_is_upgraded_in_place_by_its_next_commit(tmp_path):
    """A mirror written before deletion vectors holds superseded versions and tombstones as plain
    rows (a plain Delta reader sees 4 rows for 2 live keys). The package's next commit upgrades it
    in one version: protocol reader 3 / writer 7 with deletionVectors, format 2, every bucket
    masked, so no committed version has the feature without the masks (I16)."""
    from deltalake import DeltaTable, write_deltalake

    from airflow_provider_cdc.core.arrow_types import mirror_schema
    from airflow_provider_cdc.sinks import mirror_readers

    data_dir = str(tmp_path)
    schema = TableSchema(T, (Column("id", "int64"), Column("v", "string")), ("id",))
    storage.write_text(schema_path(data_dir, "src", T), schema.to_json())
    path = mirror_dir(data_dir, "src", T)
    arrow = pa.schema([*mirror_schema(schema), pa.field("__bucket", pa.int32(), False)])
    DeltaTable.create(path, arrow, partition_by=["__bucket"],
                      configuration={MIRROR.key: "1", db.BUCKETS_PROPERTY: "1"}, raise_if_key_not_exists=False)
    for rows in ([_row(1, 1, "a"), _row(3, 1, "c")], [_row(1, 2, "b"), _row(2, 3, None, True)]):
        write_deltalake(path, pa.Table.from_pylist(rows, schema=arrow), mode="append", partition_by=["__bucket"])
    before = DeltaTable(path)
    assert before.protocol().min_reader_version == 1 and pa.table(before.scan()).num_rows == 4
    v = db.read_version(mirror_table._delta(path), path)
    assert not v.masked
    assert {r["id"]: r["v"] for r in mirror_readers.read_mirror(data_dir, "src", T).to_pylist()} == {1: "b", 3: "c"}

    event = {"position": Position(5).encode(), "table": T.id, "op": "c", "key": encode_key([4]), "before": None,
             "after": encode_row({"id": 4, "v": "d"}), "ts_ms": 5, "watermark": None, "snapshot": False, "batch": "b"}
    MirrorDeltaSink(data_dir, "src").write(pa.Table.from_pylist([event], schema=EVENT_SCHEMA))

    after = DeltaTable(path)
    assert after.version() == before.version() + 1  # one commit: the upgrade and the write together
    proto = after.protocol()
    assert (proto.min_reader_version, proto.min_writer_version) == (3, 7)
    assert "deletionVectors" in proto.reader_features and "deletionVectors" in proto.writer_features
    assert after.metadata().configuration[MIRROR.key] == str(MIRROR.version)
    assert after.metadata().configuration["delta.enableDeletionVectors"] == "true"
    plain = sorted((r["id"], r["v"]) for r in pa.table(after.scan()).to_pylist())
    assert plain == [(1, "b"), (3, "c"), (4, "d")]
    assert db.read_version(mirror_table._delta(path), path).masked
    # the package still holds every stored version physically (the position guard reads them)
    assert mirror_readers.read_mirror_files(data_dir, "src", T).num_rows == 5
