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


def test_local_outputs_are_their_owners_only(tmp_path):
    """Audit (issue 58): staged files were 0600 while the mirror's data files (written by pyarrow
    and delta-rs with the umask's mode) were 0644. Every folder the package creates is 0700, so
    no file of a mirror, staged or not, can be read by another user."""
    import stat

    import pyarrow as pa

    from airflow_provider_cdc.sinks.delta_buckets import write_bucket_file
    from airflow_provider_cdc.sinks.mirror_fencing import claim_epoch

    lake = tmp_path / "lake"
    table = storage.join(str(lake), "output", "shop", "mirror", "public.t")
    rows = pa.table({"id": [1, 2], "__key": ["[1]", "[2]"], "__position": ["a", "b"], "__deleted": [False, False]})
    claim_epoch(table, rows.schema)
    write_bucket_file(table, 0, rows)
    with storage.atomic_output(storage.join(str(lake), "staging", "shop", "x.json")) as (_fs, tmp):
        open(tmp, "w").write("{}")
    files = [p for p in lake.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and any(p.name == "x.json" for p in files), files
    for p in files:
        guarded = [d for d in p.parents if d.is_relative_to(lake) and not stat.S_IMODE(d.stat().st_mode) & 0o077]
        assert guarded or not stat.S_IMODE(p.stat().st_mode) & 0o077, f"{p} readable by others"
    assert stat.S_IMODE(lake.stat().st_mode) == 0o700
