"""Names are data on every medium (I10): folders named by the one path encoder hold Parquet
files and Delta tables on local disk and on a real S3 HTTP server (moto's standalone
server), list back to the same table, and two tables never share a folder."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.sinks.mirror_delta import upsert
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.sinks.mirror_table import mirror_tables
from airflow_provider_cdc.storage.layout import mirror_dir

names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=40)
HOSTILE = [TableName("public", "Order Items"), TableName("public", "a'b %s; é"), TableName("s.p \"q\"", "x/y?#%20"),
           TableName("_hidden", ".dot"), TableName("sch", "ü" * 70)]


def _rows(n: int) -> pa.Table:
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        KEY_COLUMN: pa.array([f"[{i}]" for i in range(n)]),
        POSITION_COLUMN: pa.array(["0000000001"] * n),
        DELETED_COLUMN: pa.array([False] * n),
    })


def test_mirrors_of_hostile_tables_on_local_disk_list_back(tmp_path):
    data_dir = str(tmp_path / "data é")
    for i, t in enumerate(HOSTILE):
        upsert(mirror_dir(data_dir, "src", t), _rows(i + 1))
    # names too long for a folder are found through their staged schema (written by capture/plan)
    from airflow_provider_cdc.core.schema import Column, TableSchema
    from airflow_provider_cdc.storage.layout import schema_path

    long = HOSTILE[-1]
    p = tmp_path / "data é" / schema_path("", "src", long).lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(TableSchema(long, (Column("id", "int64"),), ("id",)).to_json(), encoding="utf-8")
    assert mirror_tables(data_dir, "src") == sorted(HOSTILE)
    for i, t in enumerate(HOSTILE):
        assert read_mirror(data_dir, "src", t).num_rows == i + 1


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(names, names), min_size=2, max_size=3, unique=True))
def test_hostile_names_round_trip_on_object_storage(s3_server, pairs):
    """Arbitrary Unicode schema/table names: an event-log folder and a Delta mirror per table on
    S3; listing the prefix decodes back to exactly these tables, each holding its own rows."""
    tables = [TableName(s, n) for s, n in pairs]
    fs = s3_server["arrow_fs"]()
    opts = s3_server["delta_options"]
    run = __import__("uuid").uuid4().hex[:8]
    base = f"{s3_server['bucket']}/{run}"
    for i, t in enumerate(tables):
        pq.write_table(pa.table({"n": [i]}), f"{base}/events/table={t.path_segment}/b.parquet", filesystem=fs)
        write_deltalake(f"s3://{base}/mirror/{t.path_segment}", pa.table({"n": [i] * (i + 1)}), storage_options=opts)
    listed = fs.get_file_info(pafs.FileSelector(f"{base}/events", recursive=False))
    decoded = sorted(
        TableName.from_path_segment(info.base_name.removeprefix("table=")) for info in listed
        if TableName.from_path_segment(info.base_name.removeprefix("table=")) is not None
    )
    hashed = [t for t in tables if TableName.from_path_segment(t.path_segment) is None]
    assert decoded == sorted(set(tables) - set(hashed))
    assert len(listed) == len(tables)  # distinct folders, none merged, none hidden
    for i, t in enumerate(tables):
        assert pq.read_table(f"{base}/events/table={t.path_segment}/b.parquet", filesystem=fs)["n"].to_pylist() == [i]
        assert DeltaTable(f"s3://{base}/mirror/{t.path_segment}", storage_options=opts).to_pyarrow_table().num_rows == i + 1
