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
    mirror_table._set_properties(dt, {MIRROR.key: str(MIRROR.version + 1)})
    with pytest.raises(FormatError, match=f"^mirror {path}: this mirror table has format version "
                                          f"{MIRROR.version + 1}, written by a newer .*Upgrade"):
        db.read_version(mirror_table._delta(path), path)
