"""A large mirror file's key index (sinks/key_index.py): a write finds the rows it masks through
it exactly as by reading the file's key column, for keys of any script; small or unsorted
files get none; an index that is missing, torn or another file's only costs the read; and it
goes with its file (an uncommitted writer's, or one vacuum removes). The mirror's state
machine (test_mirror_layout.py) also drives writes through indexes of any block size."""

from __future__ import annotations

import os
import random

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from airflow_provider_cdc.core.schema import encode_key
from airflow_provider_cdc.sinks import bucket_files, key_index
from airflow_provider_cdc.sinks import delta_buckets as db

pytestmark = pytest.mark.integration

WORDS = ["a", "z", "é", "ß", "Ωmega", "日本", "😀", "x y", "\u00a0", "ÿ", "ą", "[", "]", '"']


@pytest.fixture
def small_index(monkeypatch):
    monkeypatch.setattr(key_index, "MIN_ROWS", 100)
    monkeypatch.setattr(key_index, "BLOCK", 7)


def _rows(keys: list[str]) -> pa.Table:
    n = len(keys)
    return pa.table(
        {
            "v": pa.array(range(n), pa.int64()),
            KEY_COLUMN: pa.array(keys, pa.string()),
            POSITION_COLUMN: pa.array([f"{i:08d}" for i in range(n)], pa.string()),
            DELETED_COLUMN: pa.array(np.zeros(n, dtype=bool)),
        }
    ).sort_by(KEY_COLUMN)


def _keys(n: int, rnd: random.Random) -> list[str]:
    out = set()
    while len(out) < n:
        out.add(encode_key([rnd.choice(WORDS) + str(rnd.randint(0, 10**6)) + rnd.choice(WORDS)]))
    return sorted(out)


def _found(uri: str, rel: str, wanted: list[str]) -> list[tuple]:
    got = db.stored_versions(uri, [rel], pa.array(wanted, pa.string()))
    return sorted(
        zip(got["k"].to_pylist(), got["row"].to_pylist(), got[POSITION_COLUMN].to_pylist(), strict=True)
    )


def test_a_lookup_through_the_index_finds_what_reading_the_keys_finds(tmp_path, small_index, monkeypatch):
    monkeypatch.setattr(bucket_files, "ROW_GROUP_ROWS", 50)  # several row groups: rows numbered across them
    rnd = random.Random(5)
    keys = _keys(3_000, rnd)
    rows = _rows(keys)
    uri = str(tmp_path)
    add = db.write_bucket_file(uri, 3, rows)
    assert storage.exists(key_index.location(uri, add.path))
    stored = rows[KEY_COLUMN].to_pylist()
    absent = [encode_key([""]), encode_key(["\U0010ffff"]), *_keys(40, random.Random(6))]
    for trial in range(6):
        wanted = rnd.sample(stored, [1, 5, 60, 400, 3_000, 0][trial]) + absent[: trial * 8]
        wanted = list(dict.fromkeys(wanted))
        through_index = _found(uri, add.path, wanted)
        hits = key_index.lookup(uri, add.path, pa.array(wanted, pa.string()))
        assert hits is not None and hits.file_rows == len(keys)
        assert [stored[r] for r in hits.rows] == [wanted[k] for k in hits.keys]  # the row holds the key
        assert len(hits.rows) == len(set(wanted) & set(stored))  # and every stored wanted key is found
        os.rename(storage.local_path(key_index.location(uri, add.path)), str(tmp_path / "aside"))
        try:
            assert through_index == _found(uri, add.path, wanted)  # the column read agrees
        finally:
            os.rename(str(tmp_path / "aside"), storage.local_path(key_index.location(uri, add.path)))


def test_small_or_unsorted_files_get_no_index(tmp_path, small_index):
    uri = str(tmp_path)
    keys = _keys(500, random.Random(1))
    small = db.write_bucket_file(uri, 0, _rows(keys[:99]))
    unsorted = db.write_bucket_file(uri, 0, _rows(keys).take(pa.array(list(range(499, -1, -1)))))
    indexed = db.write_bucket_file(uri, 0, _rows(keys))
    assert not storage.exists(key_index.location(uri, small.path))
    assert not storage.exists(key_index.location(uri, unsorted.path))
    assert storage.exists(key_index.location(uri, indexed.path))


@pytest.mark.parametrize("damage", ["torn", "another file's", "another row count"])
def test_a_damaged_index_only_costs_the_read(tmp_path, small_index, damage, caplog):
    uri = str(tmp_path)
    keys = _keys(800, random.Random(2))
    a = db.write_bucket_file(uri, 0, _rows(keys[:400]))
    b = db.write_bucket_file(uri, 0, _rows(keys[400:]))
    where = storage.local_path(key_index.location(uri, a.path))
    wanted = keys[::37]
    expect = _found(uri, a.path, wanted)
    if damage == "torn":
        data = open(where, "rb").read()
        open(where, "wb").write(data[: len(data) - 20])
    elif damage == "another file's":
        open(where, "wb").write(open(storage.local_path(key_index.location(uri, b.path)), "rb").read())
    else:  # a file replaced under the same name (never done by the package) is not misread
        key_index.write(uri, a.path, pa.array(keys[:300]))
    assert _found(uri, a.path, wanted) == expect
    assert "key index" in caplog.text


def test_an_index_goes_with_its_file(tmp_path, small_index):
    """A writer that cannot commit removes it; vacuum removes one whose file no retained
    version references, and keeps one whose file is live."""
    import time

    uri = str(tmp_path)
    keys = _keys(300, random.Random(3))
    lost = db.write_bucket_file(uri, 1, _rows(keys))
    db.discard(uri, [lost])
    assert not storage.exists(key_index.location(uri, lost.path))

    live = db.write_bucket_file(uri, 1, _rows(keys))
    orphan = db.write_bucket_file(uri, 2, _rows(keys))
    old = time.time() - 7200
    for f in (live, orphan):
        os.utime(storage.local_path(key_index.location(uri, f.path)), (old, old))
    horizon = (time.time() - 3600) * 1000
    assert key_index.sweep(uri, {live.path}, horizon) == 1
    assert storage.exists(key_index.location(uri, live.path))
    assert not storage.exists(key_index.location(uri, orphan.path))
    fresh = db.write_bucket_file(uri, 3, _rows(keys))  # a writer in flight: younger than the horizon
    assert key_index.sweep(uri, {live.path}, horizon) == 0
    assert storage.exists(key_index.location(uri, fresh.path))
