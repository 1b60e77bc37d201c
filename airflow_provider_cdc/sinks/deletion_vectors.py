"""Delta deletion vectors, written by hand (delta-rs reads them but cannot write them,
delta-io/delta-rs#4512): the mirror masks every row version that is not its key's live row
with them, so any Delta reader that implements the ``deletionVectors`` feature sees exactly the
live rows (docs/DESIGN.md, "The mirror", invariant I16).

The format (Delta PROTOCOL.md, "Deletion Vector Format"): a file ``deletion_vector_<uuid>.bin``
in the table's root starts with a version byte (1); each vector in it is a 4-byte big-endian
size, the 4-byte little-endian magic 1681511377 and a portable RoaringTreemap (a count of 32-bit
high keys, then per key the key and a portable RoaringBitmap), then a 4-byte big-endian CRC-32
of magic and bitmap. The ``add`` action points at it with a descriptor: storage type ``u``,
the Z85 text of the uuid, the offset of the size field, the size and the row count. (The
inline example in PROTOCOL.md uses an older magic that delta-kernel rejects.)
"""

from __future__ import annotations

import array
import struct
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from pyroaring import BitMap, BitMap64

from .. import storage
from ..core.errors import StateError

MAGIC = 1681511377
FORMAT_VERSION = 1
PREFIX = "deletion_vector_"

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


def z85_encode(data: bytes) -> str:
    if len(data) % 4:
        raise ValueError("Z85 encodes whole 4-byte words")
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        word = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            word.append(_Z85[digit])
        out.extend(reversed(word))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError("Z85 text comes in 5-character words")
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for c in text[i : i + 5]:
            value = value * 85 + _Z85_INDEX[c]
        out += value.to_bytes(4, "big")
    return bytes(out)


def dv_file_name(descriptor: Mapping) -> str:
    """The file (relative to the table root) a ``u`` descriptor points at: an optional random
    prefix folder, then ``deletion_vector_<uuid>.bin``."""
    text = descriptor["pathOrInlineDv"]
    prefix, code = text[:-20], text[-20:]
    name = f"{PREFIX}{uuid.UUID(bytes=z85_decode(code))}.bin"
    return f"{prefix}/{name}" if prefix else name


def _payload(rows: np.ndarray) -> bytes:
    """Magic and the portable RoaringTreemap of ``rows`` (row indices of one file: below 2^32,
    so one 32-bit bitmap under high key 0, built from the array's buffer, no Python int per row)."""
    rows = np.asarray(rows)
    if len(rows) and int(rows.max()) >= 2**32:
        raise StateError(
            "a deletion vector of a file with 2^32 rows or more: the mirror's files are far smaller"
        )
    if not len(rows):
        return struct.pack("<IQ", MAGIC, 0)
    bitmap = BitMap(array.array("I", rows.astype(np.uint32).tobytes()))
    return struct.pack("<IQI", MAGIC, 1, 0) + bitmap.serialize()


def write_vectors(table_uri: str, vectors: Sequence[np.ndarray]) -> list[dict]:
    """Write ``vectors`` (each the sorted row indices a file masks) into one new DV file of the
    table and return their descriptors, in order. The file is invisible until a commit names it;
    a commit that does not happen leaves it to :func:`discard` or the package's vacuum."""
    body = bytearray([FORMAT_VERSION])
    descriptors = []
    for rows in vectors:
        payload = _payload(np.asarray(rows))
        descriptors.append({"offset": len(body), "sizeInBytes": len(payload), "cardinality": len(rows)})
        body += struct.pack(">I", len(payload)) + payload + struct.pack(">I", zlib.crc32(payload))
    u = uuid.uuid4()
    storage.write_bytes(storage.join(table_uri, f"{PREFIX}{u}.bin"), bytes(body))
    code = z85_encode(u.bytes)
    return [{"storageType": "u", "pathOrInlineDv": code, **d} for d in descriptors]


def read_vector(table_uri: str, descriptor: Mapping | None) -> np.ndarray:
    """The row indices a descriptor masks (sorted uint64; empty for none). StateError when the
    file is missing or damaged (size, magic or checksum), naming it."""
    if not descriptor:
        return np.zeros(0, dtype=np.uint64)
    kind = descriptor["storageType"]
    if kind == "i":
        payload = z85_decode(descriptor["pathOrInlineDv"])[: descriptor["sizeInBytes"]]
        where = "an inline deletion vector"
    else:
        if kind == "u":
            location = storage.join(table_uri, *dv_file_name(descriptor).split("/"))
        elif kind == "p":
            location = descriptor["pathOrInlineDv"]
        else:
            raise StateError(f"deletion vector of storage type {kind!r} is not one Delta defines")
        where = location
        offset = int(descriptor.get("offset") or 0)
        fs, path = storage.filesystem(location)
        try:
            with fs.open_input_file(path) as f:
                f.seek(offset)
                head = f.read(4)
                size = struct.unpack(">I", head)[0]
                payload = f.read(size)
                crc = struct.unpack(">I", f.read(4))[0]
        except (OSError, struct.error) as exc:
            raise StateError(
                f"deletion vector {where} cannot be read ({exc}); the mirror needs a re-snapshot"
            ) from exc
        if size != descriptor["sizeInBytes"] or zlib.crc32(payload) != crc:
            raise StateError(f"deletion vector {where} at offset {offset} is damaged (size or checksum)")
    if struct.unpack("<I", payload[:4])[0] != MAGIC:
        raise StateError(f"{where}: not a deletion vector (magic)")
    return np.frombuffer(BitMap64.deserialize(payload[4:]).to_array(), dtype=np.uint64)


def keep_mask(table_uri: str, descriptor: Mapping | None, rows: int) -> np.ndarray | None:
    """A boolean mask of the rows of a file of ``rows`` rows that its vector keeps (None: all)."""
    masked = read_vector(table_uri, descriptor)
    if not len(masked):
        return None
    keep = np.ones(rows, dtype=bool)
    keep[masked[masked < rows].astype(np.int64)] = False
    return keep


def referenced_files(descriptors: Iterable[Mapping | None]) -> set[str]:
    """The DV files (relative to the table root) these descriptors point at."""
    return {dv_file_name(d) for d in descriptors if d and d.get("storageType") == "u"}
