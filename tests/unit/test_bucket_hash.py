"""The mirror's key hash (sinks/bucket_tree.crc_of): computed over the Arrow buffers, it must be
zlib's crc32 of each key's UTF-8 bytes, bit for bit, or a key would land in another bucket than
the one every earlier write (and the Spark engine) put it in."""

from __future__ import annotations

import zlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.sinks.bucket_tree import bucket_of, crc_of

pytestmark = pytest.mark.unit


def reference(keys: list[str]) -> np.ndarray:
    return np.array([zlib.crc32(k.encode("utf-8")) for k in keys], dtype=np.uint64)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.text(max_size=40), max_size=60),
    cut=st.integers(min_value=0, max_value=60),
    large=st.booleans(),
)
def test_the_hash_is_zlibs_crc32_of_each_keys_utf8_bytes(keys, cut, large):
    arr = pa.array(keys, pa.large_string() if large else pa.string())
    assert crc_of(arr).tolist() == reference(keys).tolist()
    # a slice (offsets that do not start at 0) and a chunked column of it
    tail = keys[min(cut, len(keys)) :]
    assert crc_of(arr.slice(min(cut, len(keys)))).tolist() == reference(tail).tolist()
    chunked = pa.chunked_array([arr.slice(0, min(cut, len(keys))), arr.slice(min(cut, len(keys)))], arr.type)
    assert crc_of(chunked).tolist() == reference(keys).tolist()


def test_canonical_keys_keep_their_buckets():
    """Keys as the mirror writes them (canonical JSON): the buckets of earlier writes hold."""
    keys = ["[1]", "[25000007]", '["a\\u00e9"]', '[1,"x"]', "[-3.5]", "[null]", "[" + "9" * 200 + "]"]
    assert crc_of(pa.array(keys)).tolist() == reference(keys).tolist()
    assert bucket_of(pa.array(keys), 8).to_pylist() == [int(c % 8) for c in reference(keys)]
    assert crc_of(pa.array([], pa.string())).tolist() == []


def test_a_null_key_is_refused():
    with pytest.raises(ValueError, match="never null"):
        crc_of(pa.array(["[1]", None]))


@settings(max_examples=50, deadline=None)
@given(keys=st.lists(st.text(min_size=60, max_size=300), min_size=1, max_size=20), cut=st.integers(0, 20))
def test_long_keys_take_zlib_per_key_over_the_same_buffer_and_hash_the_same(keys, cut):
    """Keys longer than the byte-position loop pays for (a mean past 48 bytes) go through one
    zlib call each over the Arrow buffer: the same hash, slices included."""
    arr = pa.array(keys)
    assert crc_of(arr).tolist() == reference(keys).tolist()
    tail = keys[min(cut, len(keys)) :]
    assert crc_of(arr.slice(min(cut, len(keys)))).tolist() == reference(tail).tolist()
