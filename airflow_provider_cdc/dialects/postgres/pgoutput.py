"""A parser for PostgreSQL's ``pgoutput`` logical replication protocol (version 1).

Only what capture needs: Begin, Commit, Relation, Insert, Update, Delete, Truncate, and
the messages that are skipped (Origin, Type, logical decoding Message). Column values
stay in the text format the server renders them in (no ``binary`` option): the dialect
decodes them with the same per-type functions the chunk SELECT uses, so a row read by
either path encodes to the same canonical values.

Reference: https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: value markers inside tuple data
NULL = None


class _Unchanged:
    """An unchanged TOASTed value ('u'): the server did not send it."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED = _Unchanged()
PG_EPOCH_MS = 946_684_800_000  # 2000-01-01 in ms since 1970-01-01

U32 = struct.Struct("!I")
_U16 = struct.Struct("!H")
BEGIN = struct.Struct("!QqI")  # final (commit) lsn, commit ts (us since 2000), xid
COMMIT = struct.Struct("!BQQq")  # flags, commit lsn, end lsn, ts
_REL_COL = struct.Struct("!B")


class ProtocolError(ValueError):
    """A message this parser does not understand (a newer protocol or a bug)."""


@dataclass(frozen=True, slots=True)
class Begin:
    commit_lsn: int
    ts_ms: int
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    ts_ms: int


@dataclass(frozen=True, slots=True)
class RelationColumn:
    name: str
    type_oid: int
    typmod: int
    is_key: bool  # part of the replica identity key


@dataclass(frozen=True, slots=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str  # d(efault) n(othing) f(ull) i(ndex)
    columns: tuple[RelationColumn, ...]


@dataclass(frozen=True, slots=True)
class Insert:
    relid: int
    new: list


@dataclass(frozen=True, slots=True)
class Update:
    relid: int
    old: list | None  # key columns ('K') or the full old row ('O'), None when not sent
    old_kind: str | None  # 'K', 'O' or None
    new: list


@dataclass(frozen=True, slots=True)
class Delete:
    relid: int
    old: list
    old_kind: str


@dataclass(frozen=True, slots=True)
class Truncate:
    relids: tuple[int, ...]
    cascade: bool
    restart_identity: bool


@dataclass(frozen=True, slots=True)
class Skipped:
    kind: str


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | Skipped


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(b"\x00", pos)
    return buf[pos:end].decode("utf-8"), end + 1


def _tuple(buf: bytes, pos: int) -> tuple[list, int]:
    """TupleData -> list of str | None | UNCHANGED (text values, decoded as UTF-8)."""
    n = (buf[pos] << 8) | buf[pos + 1]
    pos += 2
    out: list = [None] * n
    unpack = U32.unpack_from
    for i in range(n):
        kind = buf[pos]
        if kind == 0x74:  # 't'
            (length,) = unpack(buf, pos + 1)
            pos += 5
            out[i] = buf[pos : pos + length].decode("utf-8")
            pos += length
        elif kind == 0x6E:  # 'n'
            pos += 1
        elif kind == 0x75:  # 'u'
            out[i] = UNCHANGED
            pos += 1
        else:
            raise ProtocolError(f"tuple value kind {chr(kind)!r} not supported (binary mode is not used)")
    return out, pos


def parse(buf: bytes) -> Message:
    """One pgoutput message (the payload of an XLogData message)."""
    kind = buf[0:1]
    if kind == b"B":
        lsn, ts, xid = BEGIN.unpack_from(buf, 1)
        return Begin(lsn, ts // 1000 + PG_EPOCH_MS, xid)
    if kind == b"C":
        _flags, lsn, end, ts = COMMIT.unpack_from(buf, 1)
        return Commit(lsn, end, ts // 1000 + PG_EPOCH_MS)
    if kind == b"I":
        (relid,) = U32.unpack_from(buf, 1)
        if buf[5:6] != b"N":
            raise ProtocolError(f"Insert without new tuple: {buf[:8]!r}")
        new, _ = _tuple(buf, 6)
        return Insert(relid, new)
    if kind == b"U":
        (relid,) = U32.unpack_from(buf, 1)
        pos = 5
        old, old_kind = None, None
        marker = buf[pos : pos + 1]
        if marker in (b"K", b"O"):
            old_kind = marker.decode()
            old, pos = _tuple(buf, pos + 1)
            marker = buf[pos : pos + 1]
        if marker != b"N":
            raise ProtocolError(f"Update without new tuple: {buf[:8]!r}")
        new, _ = _tuple(buf, pos + 1)
        return Update(relid, old, old_kind, new)
    if kind == b"D":
        (relid,) = U32.unpack_from(buf, 1)
        old_kind = buf[5:6].decode()
        if old_kind not in ("K", "O"):
            raise ProtocolError(f"Delete without old tuple: {buf[:8]!r}")
        old, _ = _tuple(buf, 6)
        return Delete(relid, old, old_kind)
    if kind == b"R":
        (relid,) = U32.unpack_from(buf, 1)
        namespace, pos = _cstring(buf, 5)
        name, pos = _cstring(buf, pos)
        ident = chr(buf[pos])
        (ncols,) = _U16.unpack_from(buf, pos + 1)
        pos += 3
        cols = []
        for _ in range(ncols):
            flags = buf[pos]
            col, pos = _cstring(buf, pos + 1)
            oid, typmod = struct.unpack_from("!Ii", buf, pos)
            pos += 8
            cols.append(RelationColumn(col, oid, typmod, bool(flags & 1)))
        return Relation(relid, namespace or "pg_catalog", name, ident, tuple(cols))
    if kind == b"T":
        (n,) = U32.unpack_from(buf, 1)
        options = buf[5]
        relids = struct.unpack_from(f"!{n}I", buf, 6)
        return Truncate(tuple(relids), bool(options & 1), bool(options & 2))
    if kind in (b"O", b"Y", b"M"):
        return Skipped(kind.decode())
    raise ProtocolError(f"unknown pgoutput message {kind!r} (protocol version 1 expected)")


# --- many messages at once: tuple data as columns (dialects/postgres/pgbatch.py) ---------------------------
class TupleColumns:
    """The TupleData of ``n`` messages, parsed together: for column ``j``, ``kinds[j]`` is each
    message's value kind (``t``, ``n``, ``u`` as bytes), ``starts[j]``/``lengths[j]`` where
    its text lies in the buffer; ``end`` is where each message's tuple ends."""

    __slots__ = ("buf", "kinds", "starts", "lengths", "end")

    def __init__(self, buf, kinds, starts, lengths, end) -> None:
        self.buf, self.kinds, self.starts, self.lengths, self.end = buf, kinds, starts, lengths, end

    def text(self, j: int, rows=None):
        """Column ``j`` as a string array (null where the value is not ``t``), of ``rows``
        (indexes into the messages; None: all)."""

        kinds, starts, lengths = self.kinds[j], self.starts[j], self.lengths[j]
        if rows is not None:
            kinds, starts, lengths = kinds[rows], starts[rows], lengths[rows]
        return text_array(self.buf, starts, lengths, kinds == 0x74)


def text_array(buf, starts, lengths, valid):
    """Slices of ``buf`` (``starts``/``lengths``, numpy) -> an Arrow string array, null where
    not ``valid``, checked to be UTF-8 as the one-message parser's decode does."""
    import numpy as np
    import pyarrow as pa

    from ...core.arrow_types import gather_slices, slices_array

    data, offsets = gather_slices(buf, starts, np.where(valid, lengths, 0))
    arr = slices_array(pa.string(), data, offsets, valid)
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ProtocolError(f"a column value is not valid UTF-8 ({exc})") from exc
    return arr


def be32(buf, at):
    """The big-endian unsigned 32-bit integers at offsets ``at`` of ``buf`` (numpy)."""
    import numpy as np

    return (
        (buf[at].astype(np.int64) << 24)
        | (buf[at + 1].astype(np.int64) << 16)
        | (buf[at + 2].astype(np.int64) << 8)
        | buf[at + 3]
    )


def parse_tuples(buf, pos, ncols: int) -> TupleColumns:
    """The TupleData starting at ``pos`` (numpy int64, one per message) of messages held in
    ``buf`` (numpy uint8, with at least 4 bytes of padding after the last message), every
    tuple of ``ncols`` columns (one relation): a column at a time over all messages."""
    import numpy as np

    n = len(pos)
    got = (buf[pos].astype(np.int64) << 8) | buf[pos + 1]
    if n and (got != ncols).any():
        raise ProtocolError(f"a tuple has {int(got[got != ncols][0])} columns, its relation {ncols}")
    p = pos + 2
    kinds = np.empty((ncols, n), dtype=np.uint8)
    starts = np.empty((ncols, n), dtype=np.int64)
    lengths = np.zeros((ncols, n), dtype=np.int64)
    limit = len(buf) - 4
    for j in range(ncols):
        k = buf[p]
        is_t = k == 0x74
        ln = np.where(is_t, be32(buf, np.minimum(p + 1, limit)), 0)
        kinds[j], starts[j], lengths[j] = k, p + 5, ln
        p = p + 1 + np.where(is_t, 4 + ln, 0)
        unknown = (k != 0x74) & (k != 0x6E) & (k != 0x75)
        if unknown.any():
            raise ProtocolError(
                f"tuple value kind {chr(int(k[unknown][0]))!r} not supported (binary mode is not used)"
            )
        if (p > limit).any():
            raise ProtocolError("a tuple runs past the end of its message")
    return TupleColumns(buf, kinds, starts, lengths, p)
