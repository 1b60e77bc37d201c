"""Arrow arrays built and read without a Python object per value: validity bitmaps, strings, gathers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def bitmap(mask: np.ndarray) -> pa.Buffer:
    """A numpy bool array -> an Arrow bitmap buffer (validity, a struct's null mask)."""
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _validity(values: Sequence) -> tuple[np.ndarray | None, pa.Buffer | None, int]:
    """(which values are present, their validity bitmap, how many are null); (None, None, 0)
    when none is null."""
    if None not in values:
        return None, None, 0
    valid = np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values))
    return valid, bitmap(valid), len(values) - int(valid.sum())


def string_array(values: Sequence[str | None]) -> pa.Array:
    """Python strings (None = null) -> an Arrow string array, built from buffers.

    Why not ``pa.array(values)``: pyarrow imports pandas at its first conversion of Python
    objects (``pa.array``, ``pa.scalar``, a Python value given to a compute kernel) when
    pandas is installed, as it is next to Airflow: ~60 MB of RSS and seconds of import
    in every chunk and capture task, for nothing. This builds the same array from one
    UTF-8 buffer and its offsets."""
    n = len(values)
    _, validity, nulls = _validity(values)
    if nulls:
        values = ["" if v is None else v for v in values]
    text = "".join(values)
    if text.isascii():  # one byte per character: lengths without encoding each value
        data = text.encode("ascii")
        lengths = np.fromiter(map(len, values), dtype=np.int64, count=n)
    else:
        encoded = [v.encode("utf-8") for v in values]
        data = b"".join(encoded)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    del text
    if len(data) >= 2**31:  # beyond 32-bit offsets: let pyarrow split it into chunks
        return pa.chunked_array([pa.array(values, pa.string())]).combine_chunks()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data), validity, nulls)


def int64_array(values: Sequence[int | None]) -> pa.Array:
    """Python ints (None = null) -> an Arrow int64 array, without pa.array (see string_array)."""
    n = len(values)
    _, validity, nulls = _validity(values)
    if nulls:
        values = [0 if v is None else v for v in values]
    buf = np.array(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), n, [validity, pa.py_buffer(buf)], nulls)


def binary_array(values: Sequence[bytes | None]) -> pa.Array:
    """Python bytes (None = null) -> an Arrow binary array from buffers (see :func:`string_array`)."""
    n = len(values)
    _, validity, nulls = _validity(values)
    if nulls:
        values = [b"" if v is None else v for v in values]
    data = b"".join(values)
    if len(data) >= 2**31:
        return pa.chunked_array([pa.array(values, pa.binary())]).combine_chunks()
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=n), out=offsets[1:])
    return pa.BinaryArray.from_buffers(
        pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], nulls
    )


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buf, dtype=np.uint8), count=offset + n, bitorder="little")[
        offset:
    ].astype(np.bool_)


def validity_mask(arr: pa.Array) -> np.ndarray:
    """Which values of ``arr`` are present, as numpy bools (from the validity bitmap:
    ``to_numpy`` of a boolean array imports pandas, see :func:`string_array`)."""
    n = len(arr)
    if arr.null_count == 0:
        return np.ones(n, dtype=np.bool_)
    if arr.null_count == n or arr.buffers()[0] is None:
        return np.zeros(n, dtype=np.bool_)
    return _bits(arr.buffers()[0], arr.offset, n)


def bools_to_numpy(arr: pa.Array) -> np.ndarray:
    """A boolean array -> numpy bools, null -> False (see :func:`validity_mask`)."""
    n = len(arr)
    if arr.null_count == n:
        return np.zeros(n, dtype=np.bool_)
    values = _bits(arr.buffers()[1], arr.offset, n)
    return values & validity_mask(arr) if arr.null_count else values


#: payload bytes up to which :func:`gather_slices` indexes each byte (16 bytes of index per
#: byte: at most 1 MB of temporaries), faster than Arrow's take for a few values
_SMALL_GATHER = 1 << 16


def gather_slices(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte ranges of ``buf`` (numpy uint8; ``starts``/``lengths``, numpy int64) -> their bytes
    end to end and the int64 offsets (n + 1) of each range in them, with no Python object per
    range and a small constant of memory per range, not per byte (a 64 MB value costs its
    copy, not an index of it).

    Ranges in order that do not overlap (a column's values in a message or COPY buffer): ``buf``
    is seen as a large_binary array whose values alternate range, gap, range, ... and Arrow's
    ``take`` of the even values copies each range once (a memcpy per value). Any other ranges:
    numpy copies of each range into the output (one Python step per range)."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if not total:
        return np.zeros(0, dtype=np.uint8), offsets
    if (lengths < 0).any():
        raise ValueError("gather_slices: a negative length")
    if total <= _SMALL_GATHER:  # a few KB: one numpy gather is quicker than Arrow's set-up
        return buf[np.repeat(starts - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)], offsets
    ends = starts + lengths
    nz = lengths > 0
    if not ((starts[nz] >= 0).all() and (ends[nz] <= len(buf)).all()):
        raise IndexError("gather_slices: a range outside the buffer")
    data = _take_ranges(buf, starts, ends, nz, n, total)
    if data is None:  # unordered or overlapping ranges
        data = np.empty(total, dtype=np.uint8)
        for i in np.flatnonzero(nz).tolist():
            data[offsets[i] : offsets[i + 1]] = buf[starts[i] : ends[i]]
    return data, offsets


def _take_ranges(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, nz: np.ndarray, n: int, total: int
) -> np.ndarray | None:
    """:func:`gather_slices` of ranges in order that do not overlap, by Arrow's take; None when
    the ranges are not so. Empty ranges may start anywhere: they are moved to the end of the
    range before them."""
    if not nz.all():  # an empty range (a null, an empty value) sits where the previous range ends
        first = int(starts[nz][0])
        last_end = np.maximum.accumulate(np.where(nz, ends, first))
        prev = np.empty(n, dtype=np.int64)
        prev[0], prev[1:] = first, last_end[:-1]
        starts = np.where(nz, starts, prev)
        ends = np.where(nz, ends, prev)
    bounds = np.empty(2 * n, dtype=np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    if (np.diff(bounds) < 0).any():
        return None
    buf = np.ascontiguousarray(buf, dtype=np.uint8)
    # 2n - 1 values: range 0, gap 0, range 1, ..., range n-1 (the offsets need not start at 0)
    spans = pa.Array.from_buffers(
        pa.large_binary(), 2 * n - 1, [None, pa.py_buffer(bounds), pa.py_buffer(buf)]
    )
    picked = pc.take(spans, index_array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    out_offsets = np.frombuffer(picked.buffers()[1], dtype=np.int64, count=n + 1, offset=picked.offset * 8)
    first = int(out_offsets[0])
    return np.frombuffer(picked.buffers()[2], dtype=np.uint8, count=total, offset=first)


def statistics_columns(schema: pa.Schema, keep: Sequence[str] = ()) -> list[str]:
    """The Parquet column paths to write min/max statistics for (``write_statistics=`` of a
    ParquetWriter): every leaf of a fixed-size type (numbers, booleans, dates, decimals),
    inside structs too (``after.id``), and the top-level columns named in ``keep`` (short
    texts: keys, positions); never a string or binary value of a row, nor a list. The
    writer copies a value into its statistics several times (page, chunk, encoded min and
    max): one 64 MB value cost ~380 MB while its row group was written, for statistics
    nothing reads."""
    out: list[str] = []

    def walk(field: pa.Field, path: str, top: bool) -> None:
        t = field.type
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(t.field(i), f"{path}.{t.field(i).name}", False)
        elif top and field.name in keep:
            out.append(path)
        elif not (
            pa.types.is_string(t)
            or pa.types.is_large_string(t)
            or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t)
            or pa.types.is_nested(t)
        ):
            out.append(path)

    for f in schema:
        walk(f, f.name, True)
    return out


def slices_array(
    typ: pa.DataType, data: np.ndarray, offsets: np.ndarray, valid: np.ndarray | None = None
) -> pa.Array:
    """Bytes and int64 offsets (:func:`gather_slices`) -> a string or binary array of ``typ``
    (null where not ``valid``); the large variant and a cast back past 2 GiB."""
    n = len(offsets) - 1
    nulls = 0 if valid is None else n - int(np.count_nonzero(valid))
    large = int(offsets[-1]) >= 2**31
    t = (pa.large_string() if pa.types.is_string(typ) else pa.large_binary()) if large else typ
    arr = pa.Array.from_buffers(
        t,
        n,
        [
            bitmap(valid) if nulls else None,
            pa.py_buffer(offsets if large else offsets.astype(np.int32)),
            pa.py_buffer(data),
        ],
        nulls,
    )
    return arr.cast(typ) if large else arr


def index_array(ints: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy int64 array (``valid``: False = null) -> an Arrow int64 array, without the
    Python conversion that imports pandas (:func:`string_array`)."""
    ints = np.ascontiguousarray(ints, dtype=np.int64)
    n = len(ints)
    if valid is None:
        return pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(ints)])
    return pa.Array.from_buffers(pa.int64(), n, [bitmap(valid), pa.py_buffer(ints)], n - int(valid.sum()))


def spread_index(present: np.ndarray) -> pa.Array:
    """The ``take`` indices that spread values of the ``present`` slots back to one slot each:
    slot i takes value number (present slots before i), null where not present."""
    return index_array(np.cumsum(present) - 1, present)


def release_memory() -> None:
    """Hand the memory Arrow's allocator keeps after a step (freed buffers it holds for reuse)
    back to the system: a round's tasks run in one process (``airflow dags test``, a worker that
    runs them in turn), and the next task's peak would otherwise stand on this one's leftovers."""
    pa.default_memory_pool().release_unused()
