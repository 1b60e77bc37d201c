"""A large mirror file's key index: where a write finds the stored rows of its keys without
decoding the file's key column (docs/DESIGN.md, "The mirror", "Finding the rows a write masks").

A write masks the stored row each of its keys supersedes, so it must find that row's number in
its file. Files are sorted by key and their row groups skip by key range, but a round's keys
are spread over the whole key space: 10,000 changes over 50M rows put a wanted key in every
row group, and decoding a bucket's key column (about 60 ms for a million keys) made the
apply's cost follow the table, not the changes. The index is a copy of the file's key column,
in the file's order, as an uncompressed Arrow IPC file of blocks of :data:`BLOCK` keys, its
first batch the first key of each block. A lookup reads that batch, the blocks that can hold a
wanted key, and nothing else: about 3 ms for a million-row file and 150 keys.

- Written beside the file (``_cdc_keys/<the file's path>.arrow``: a folder Delta readers and
  vacuums leave alone, as its name starts with ``_``) before the file's commit, for files of at
  least :data:`MIN_ROWS` rows whose keys are sorted; a smaller file's key column is a few row
  groups and read as it is.
- Immutable, as the file is (its name is unique): an index never describes another file. It
  names its file and row count, and a lookup that finds it missing, unreadable or for another
  file answers None, so the caller reads the key column: an index only ever saves time.
- Removed with its file by the package's vacuum (:func:`sweep`), and with a writer's files it
  could not commit (:func:`delete`).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage

log = logging.getLogger(__name__)

#: the folder below the table root (a leading ``_``: Delta's readers and vacuums skip it)
INDEX_DIR = "_cdc_keys"
SUFFIX = ".arrow"
#: keys a block: a lookup decodes one block per wanted key at most
BLOCK = 256
#: files below this many rows get no index: their key column is a few row groups
MIN_ROWS = 262_144
FORMAT = "1"
_SCHEMA_FIELD = "k"


def location(table_uri: str, rel: str) -> str:
    """Where the index of the data file ``rel`` (relative to the table root) lives."""
    return storage.join(table_uri, INDEX_DIR, *rel.split("/")) + SUFFIX


def wanted_for(keys: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a file of these keys gets an index: large enough, and sorted (a lookup bisects
    the blocks' first keys; Arrow sorts strings bytewise, as Python compares them)."""
    if len(keys) < MIN_ROWS:
        return False
    col = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if col.null_count:
        return False
    return not pc.any(pc.less(col.slice(1), col.slice(0, len(col) - 1))).as_py()


def write(table_uri: str, rel: str, keys: pa.Array | pa.ChunkedArray) -> str:
    """Write the index of the data file ``rel`` whose key column is ``keys`` (sorted; see
    :func:`wanted_for`), whole or not at all. Returns its location."""
    col = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    col = col.cast(pa.string())
    n = len(col)
    schema = pa.schema(
        [(_SCHEMA_FIELD, pa.string())],
        metadata={"format": FORMAT, "file": rel, "rows": str(n), "block": str(BLOCK)},
    )
    where = location(table_uri, rel)
    with storage.atomic_output(where) as (fs, tmp), fs.open_output_stream(tmp) as out:
        with pa.ipc.new_file(out, schema) as w:
            w.write_batch(pa.record_batch([pc.take(col, pa.array(np.arange(0, n, BLOCK)))], schema=schema))
            for start in range(0, n, BLOCK):
                w.write_batch(pa.record_batch([col.slice(start, BLOCK)], schema=schema))
    return where


class Hits(NamedTuple):
    """Where a file holds wanted keys: per match the key's index and the row, in row order;
    and the file's row count as the index knows it (the caller checks it against the file)."""

    keys: np.ndarray
    rows: np.ndarray
    file_rows: int


def _none(rows: int) -> Hits:
    return Hits(np.zeros(0, np.int64), np.zeros(0, np.int64), rows)


def lookup(table_uri: str, rel: str, keys: pa.Array, wanted: Sequence[str] | None = None) -> Hits | None:
    """Rows of the data file ``rel`` that hold one of ``keys`` (distinct), or None when the
    file has no usable index (the caller reads its key column). ``wanted``: the same keys as
    Python strings, when the caller holds them already (a bucket's files share them)."""
    where = location(table_uri, rel)
    try:
        fs, p = storage.filesystem(where)
        with fs.open_input_file(p) as fh:
            # a remote store answers each batch read with a request: one read of the whole
            source = fh if storage.is_local(where) else pa.BufferReader(fh.read())
            reader = pa.ipc.open_file(source)
            meta = reader.schema.metadata or {}
            if meta.get(b"format") != FORMAT.encode() or meta.get(b"file") != rel.encode():
                log.warning("key index %s is not the index of %s; reading the file's keys", where, rel)
                return None
            block = int(meta[b"block"])
            rows = int(meta[b"rows"])
            firsts = reader.get_batch(0).column(0).to_pylist()
            if reader.num_record_batches != len(firsts) + 1 or len(firsts) != -(-rows // block):
                log.warning("key index %s is incomplete; reading the file's keys", where)
                return None
            if not firsts:
                return _none(rows)
            lowest = firsts[0]
            blocks = sorted(
                {
                    bisect.bisect_right(firsts, k) - 1
                    for k in (keys.to_pylist() if wanted is None else wanted)
                    if k and k >= lowest
                }
            )
            if not blocks:
                return _none(rows)
            parts = [reader.get_batch(1 + b).column(0) for b in blocks]
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException, ValueError, KeyError) as exc:
        log.warning("key index %s unreadable (%s); reading the file's keys", where, exc)
        return None
    sizes = np.array([len(a) for a in parts], dtype=np.int64)
    idx = pc.index_in(pa.concat_arrays(parts), value_set=keys)
    hit = pc.indices_nonzero(pc.is_valid(idx))
    at = hit.to_numpy().astype(np.int64)
    first_row = np.repeat(np.array(blocks, dtype=np.int64) * block - (np.cumsum(sizes) - sizes), sizes)
    return Hits(pc.take(idx, hit).to_numpy().astype(np.int64), at + first_row[at], rows)


def delete(table_uri: str, rels: Iterable[str]) -> None:
    """Remove the indexes of data files that were never committed (absent is fine)."""
    for rel in rels:
        try:
            storage.delete(location(table_uri, rel))
        except OSError:  # noqa: PERF203 - the sweep removes what is left
            log.warning("could not delete the key index of uncommitted %s; vacuum removes it", rel)


def sweep(table_uri: str, kept: set[str], horizon_ms: float) -> int:
    """Delete the indexes whose data file is not in ``kept`` (the files a retained version
    references) and that are older than ``horizon_ms`` themselves (a writer in flight has not
    committed its file yet). Returns the number removed."""
    import pyarrow.fs as pafs

    root = storage.join(table_uri, INDEX_DIR)
    fs, base = storage.filesystem(root)
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError as exc:
        log.warning("key indexes of %s not listed (%s); the next vacuum tries again", table_uri, exc)
        return 0
    removed = 0
    now_ms = time.time() * 1000
    for info in infos:
        if info.type != pafs.FileType.File or not info.path.endswith(SUFFIX):
            continue
        rel = info.path[len(base.rstrip("/")) + 1 : -len(SUFFIX)]
        if rel in kept or storage.basename(info.path).startswith("."):
            continue
        mtime = info.mtime.timestamp() * 1000 if info.mtime is not None else now_ms
        if mtime >= horizon_ms:
            continue
        try:
            fs.delete_file(info.path)
            removed += 1
        except OSError:  # noqa: PERF203 - the next vacuum tries again
            log.warning("could not delete key index %s", info.path)
    return removed
