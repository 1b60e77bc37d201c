"""The mirror's bucket tree: a key's bucket is its key hash modulo the roots; a bucket past its unit
splits into two children (docs/DESIGN.md, "The mirror")."""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigurationError

BUCKET_COLUMN = "__bucket"
BUCKETS_PROPERTY = "cdc.buckets"
DEFAULT_BUCKETS = 8
MAX_BUCKETS = 4096
WRITER_APP_ID = "cdc-mirror"


def check_buckets(n: int, setting: str = "buckets") -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_BUCKETS:
        raise ConfigurationError(
            f"{setting} must be a whole number from 1 to {MAX_BUCKETS}, got {n!r}; "
            "a mirror's bucket count is fixed when it is created"
        )
    return n


def _crc_table() -> np.ndarray:
    """The byte table of CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), as zlib's."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, np.uint32(0xEDB88320) ^ (table >> 1), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()
#: mean key bytes past which one ``zlib.crc32`` call per key (over the Arrow buffer, no Python
#: string) beats the byte-position loop: 1M keys of 5, 40 and 44 bytes 0.04-0.08 s, 0.21 s and
#: 0.20 s against 0.17, 0.26 and 0.23 s; 200k keys of 190 bytes 0.36 s against 0.10 s
_VECTOR_MAX_MEAN_BYTES = 48


def crc_of(keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """zlib's crc32 of each canonical key's UTF-8 bytes (the same in every process and engine,
    unlike Python's salted ``hash``), computed over the Arrow buffers a byte position at a
    time for every key that long: no Python object per key. Keys are taken longest first, so
    the keys still hashing at a position are a prefix. Keys longer on average than
    :data:`_VECTOR_MAX_MEAN_BYTES` take one ``zlib.crc32`` call each over the same buffer."""
    arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    if arr.null_count:
        raise ValueError("a canonical key is never null")
    if not any(f(arr.type) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                                     pa.types.is_large_binary)):
        arr = arr.cast(pa.large_string())  # a string view, say
    wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64 if wide else np.int32)
    offsets = offsets[arr.offset : arr.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = offsets[1:].astype(np.int64) - starts
    if lengths.mean() > _VECTOR_MAX_MEAN_BYTES:  # long keys: zlib's per-key C loop is the faster
        mv = memoryview(data)
        return np.fromiter(
            (zlib.crc32(mv[a:b]) for a, b in zip(starts.tolist(), (starts + lengths).tolist(), strict=True)),
            dtype=np.uint64,
            count=n,
        )
    order = np.argsort(-lengths, kind="stable")
    starts, lengths = starts[order], lengths[order]
    longest = int(lengths[0])
    # keys longer than each byte position: a prefix of the longest-first order
    active = np.searchsorted(-lengths, -np.arange(longest), side="left")
    crc = np.full(n, 0xFFFFFFFF, dtype=np.uint32)
    for i in range(longest):
        k = int(active[i])
        c = crc[:k]
        crc[:k] = _CRC_TABLE[(c ^ data[starts[:k] + i]) & 0xFF] ^ (c >> 8)
    out = np.empty(n, dtype=np.uint64)
    out[order] = crc ^ np.uint32(0xFFFFFFFF)
    return out


def bucket_of(keys: pa.Array | pa.ChunkedArray, buckets: int) -> pa.Array:
    """The root bucket of each canonical key: crc32 mod ``buckets`` (also the partitions of
    verify's spill files)."""
    if buckets == 1:
        return pa.array(np.zeros(len(keys), dtype=np.int32))
    return pa.array((crc_of(keys) % buckets).astype(np.int32))


def level_of(node: int, roots: int) -> int:
    """The tree level of bucket ``node`` (module docstring): level l holds ids
    N·(2^l - 1) .. N·(2^(l+1) - 1) - 1."""
    level = 0
    while node >= roots * (2 ** (level + 1) - 1):
        level += 1
    return level


def node_id(level: int, residue: int, roots: int) -> int:
    return roots * (2**level - 1) + residue


def parent_of(node: int, roots: int) -> int | None:
    level = level_of(node, roots)
    if level == 0:
        return None
    residue = node - node_id(level, 0, roots)
    return node_id(level - 1, residue % (roots * 2 ** (level - 1)), roots)


def children_of(node: int, roots: int) -> tuple[int, int]:
    level = level_of(node, roots)
    residue = node - node_id(level, 0, roots)
    return node_id(level + 1, residue, roots), node_id(level + 1, residue + roots * 2**level, roots)


def split_nodes(nodes: Iterable[int], roots: int) -> frozenset[int]:
    """The split (inner) nodes of a tree whose leaves with files are ``nodes``: their ancestors."""
    inner: set[int] = set()
    for n in nodes:
        p = parent_of(n, roots)
        while p is not None and p not in inner:
            inner.add(p)
            p = parent_of(p, roots)
    return frozenset(inner)


def node_of(crc: np.ndarray, roots: int, inner: Iterable[int] = ()) -> np.ndarray:
    """The leaf bucket of each key hash ``crc`` (:func:`crc_of`) in the tree whose split
    nodes are ``inner``."""
    ids = (crc % roots).astype(np.int64)
    inner_arr = np.fromiter(inner, dtype=np.int64)
    if inner_arr.size == 0:
        return ids.astype(np.int32)
    active = np.isin(ids, inner_arr)
    level = 0
    while active.any():
        level += 1
        where = np.flatnonzero(active)
        ids[where] = roots * (2**level - 1) + (crc[where] % (roots * 2**level)).astype(np.int64)
        active[where] = np.isin(ids[where], inner_arr)
    return ids.astype(np.int32)


def nodes_of_keys(keys: pa.Array | pa.ChunkedArray, roots: int, inner: Iterable[int] = ()) -> pa.Array:
    """The leaf bucket of each canonical key."""
    if roots == 1 and not inner:
        return pa.array(np.zeros(len(keys), dtype=np.int32))
    return pa.array(node_of(crc_of(keys), roots, inner))


#: file name prefixes: compaction's resolved base files (and every file written before
#: merge-on-read) and the change files writes append
BASE_PREFIX, CHANGE_PREFIX = "part-", "chg-"
