"""Arrow arrays built from buffers (core/arrow_types.string_array / int64_array) equal pyarrow's
own conversion, and the chunk and segment builders never import pandas."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest

from airflow_provider_cdc.core.arrow_types import int64_array, string_array


@pytest.mark.parametrize(
    "values",
    [
        [],
        ["plain", "", "ünï ✓ 🚀", 'q"uote', "nl\nx"],
        [None],
        ["a", None, "", None, "ü"],
        ["x" * 100_000, "y"],
    ],
)
def test_string_array_equals_pyarrow_conversion(values):
    arr = string_array(values)
    arr.validate(full=True)
    assert arr.type == pa.string()
    assert arr.to_pylist() == values
    assert arr.null_count == values.count(None)


def test_int64_array():
    assert int64_array([0, -1, 2**62]).to_pylist() == [0, -1, 2**62]
    assert int64_array([]).to_pylist() == []
    assert int64_array([1, None]).to_pylist() == [1, None]  # the fallback


_NO_PANDAS = r"""
import sys
import pyarrow as pa
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.dialects.postgres.pgcopy import ChunkAssembler, read_csv_batch
from airflow_provider_cdc.dialects.postgres import decoder
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema
from airflow_provider_cdc.core.arrow_types import string_array
from airflow_provider_cdc.storage.staged import ChunkWriter, events_to_table
types = ["int64", "string", "bool", "float64", "timestamptz", "uuid", "decimal(5,2)", "array<int32>", "binary", "json"]
names = [f"c{i}" for i in range(len(types))]
asm = ChunkAssembler(names, types, [decoder(t) for t in types], ["c0"])
csv = bytearray(b'1,"x,y",t,1.5,2024-01-02 03:04:05+00,A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11,1.50,"{1,NULL}",\\x00ff,"{""a"": 1}"\n2,,,,,,,,,\n')
key, typed, text, last = asm.build_typed(read_csv_batch(csv, names))
schema = TableSchema(TableName("s", "t"), tuple(Column(n, t) for n, t in zip(names, types)), ("c0",))
with ChunkWriter(schema, sys.argv[1] + "/c.parquet") as w:
    w.add_typed(key, typed, text)
    w.add(string_array(["[3]"]), [{"c0": 3, "c1": "z"}])
events_to_table([ChangeEvent("s.t", "u", "[1]", Position(1, 0, 0), {"a": 1}, {"a": 2}, 5),
                 WatermarkEvent("w", Position(1, 0, 1), 6)], "cdc.watermark")
print("pandas" in sys.modules)
"""


def test_chunk_and_segment_builders_do_not_import_pandas(tmp_path):
    # pyarrow imports pandas on its first conversion of Python objects: ~60 MB and seconds
    # in every chunk and capture task; a fresh interpreter shows whether anything does
    out = subprocess.run(
        [sys.executable, "-c", _NO_PANDAS, str(tmp_path)], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stderr
