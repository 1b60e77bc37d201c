"""The storage layer on local disk and on a real S3 HTTP server (moto_server on 127.0.0.1)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import ConfigurationError


@pytest.fixture(params=["local", "s3"])
def base(request, tmp_path, monkeypatch):
    if request.param == "local":
        return str(tmp_path / "data dir é")
    s3 = request.getfixturevalue("s3_server")
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    return f"s3://{s3['bucket']}/t-{tmp_path.name}"


def test_files_round_trip_and_list(base):
    a = storage.join(base, "x", "a.json")
    assert not storage.exists(a) and storage.list_names(storage.join(base, "x")) == []
    storage.write_text(a, '{"é": 1}')
    storage.write_bytes(storage.join(base, "x", "b.bin"), b"\x00\x01")
    assert storage.read_text(a) == '{"é": 1}' and storage.exists(a)
    assert storage.list_names(storage.join(base, "x")) == ["a.json", "b.bin"]
    assert storage.list_names(storage.join(base, "x"), suffix=".json") == ["a.json"]
    assert storage.is_dir(storage.join(base, "x")) and not storage.is_dir(a)
    storage.write_text(a, "replaced")  # a rewrite replaces the file whole
    assert storage.read_text(a) == "replaced"
    storage.delete(a)
    storage.delete(a)  # absent is fine
    assert storage.list_names(storage.join(base, "x")) == ["b.bin"]


def test_a_failed_write_publishes_nothing(base):
    target = storage.join(base, "p", "t.parquet")
    table = pa.table({"a": list(range(1000))})
    with pytest.raises(RuntimeError, match="writer died"), storage.atomic_output(target) as (fs, tmp):
        with pq.ParquetWriter(tmp, table.schema, filesystem=fs) as w:
            w.write_table(table)
        raise RuntimeError("writer died")
    assert not storage.exists(target)
    assert [i.base_name for i in storage.list_dir(storage.join(base, "p"))] == []  # the temporary is gone too
    with storage.atomic_output(target) as (fs, tmp):
        pq.write_table(table, tmp, filesystem=fs)
    fs, path = storage.filesystem(target)
    assert pq.read_table(path, filesystem=fs).num_rows == 1000


def test_locations_are_checked():
    assert storage.check_location("s3://bucket/prefix") == "s3://bucket/prefix"
    for bad, message in (("ftp://x/y", "not supported"), ("s3:///nobucket", "names no bucket"), ("  ", "must be")):
        with pytest.raises(ConfigurationError, match=message):
            storage.check_location(bad, "CDC_DATA_DIR")
    assert storage.join("s3://b/p/", "x", "y") == "s3://b/p/x/y"
    assert storage.parent("s3://b/p/x") == "s3://b/p" and storage.basename("s3://b/p/x") == "x"
    assert storage.is_local("file:///tmp/x") and storage.local_path("file:///tmp/x") == "/tmp/x"


def test_put_if_absent_lets_exactly_one_writer_create_a_file(base):
    """The primitive of the mirror's own Delta commits (sinks/delta_log.py): the second writer of
    a location is told, and the first one's bytes stay (S3: a conditional PutObject)."""
    target = storage.join(base, "log", "00000000000000000001.json")
    storage.put_if_absent(target, b"first")
    with pytest.raises(storage.AlreadyExists):
        storage.put_if_absent(target, b"second")
    assert storage.read_bytes(target) == b"first"
    assert storage.list_names(storage.join(base, "log")) == ["00000000000000000001.json"]  # no temporaries left
