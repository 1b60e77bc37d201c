"""Which logged changes a whole-table read already holds: the alignment of a multiset table's load
(or of verify's read) with the log (docs/DESIGN.md, "Tables without a key").

A table without a key cannot use DBLog's window: a change matches a copy by its whole row, and
the count of copies a read saw cannot be corrected by dropping keys. Instead the read is aligned
exactly: the mirror starts from the rows one snapshot saw, and a change is applied on top when
and only when that snapshot did not see its transaction.

- MariaDB/MySQL: the snapshot's binlog position (``binlog_snapshot_position``): every
  transaction before it is in the snapshot, none after.
- PostgreSQL: the WAL insert position read right after the snapshot was taken (every
  transaction the snapshot sees committed before it) and the snapshot itself
  (``pg_current_snapshot()``): a change before that position is in the snapshot when its
  transaction is visible there. A transaction that was still committing when the snapshot was
  taken has its commit record before the position and is not visible: applied.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ConfigurationError, StateError
from .position import Position, marked_position
from .visibility import REPLAYED_BEFORE, PgSnapshot


@dataclass(frozen=True)
class Alignment:
    """A whole-table read's place in the log: ``mark`` (encoded position) and, on PostgreSQL,
    the snapshot's ``visibility`` (``xmin:xmax:xip``)."""

    mark: str
    visibility: str | None = None

    @classmethod
    def of_read(cls, table: str, mark: str | None, visibility: str | None) -> Alignment:
        """The alignment of a Dialect.read_whole_table (its ``mark`` a position mark)."""
        if mark is None:
            raise StateError(f"table {table}: the whole-table read reported no log position to align it with")
        if visibility is not None and visibility.startswith(REPLAYED_BEFORE):
            raise ConfigurationError(
                f"table {table} is captured as a multiset, whose load needs the exact set of "
                "transactions its read saw, which a hot standby does not report: load it from the "
                "primary (the source's connection, without chunk_conn_id)"
            )
        marked = marked_position(mark)
        if marked is None:
            raise StateError(f"table {table}: {mark!r} is not a position mark")
        if visibility is not None:
            PgSnapshot.parse(visibility)  # checked now, not at the first apply
        return cls(marked[0].encode(), visibility)

    @property
    def position(self) -> Position:
        return Position.decode(self.mark)

    def to_text(self) -> str:
        return json.dumps({"mark": self.mark, "visibility": self.visibility}, sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> Alignment:
        doc = json.loads(text)
        return cls(str(doc["mark"]), doc.get("visibility"))

    def holds(self, positions: pa.Array | pa.ChunkedArray, txs: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Mask of the changes (encoded ``positions``, the staged ``origin.tx``) the read holds."""
        if isinstance(positions, pa.ChunkedArray):
            positions = positions.combine_chunks()
        if isinstance(txs, pa.ChunkedArray):
            txs = txs.combine_chunks()
        before = pc.fill_null(pc.less_equal(positions, pa.scalar(self.mark, pa.string())), False)
        mask = before.to_numpy(zero_copy_only=False).astype(bool)
        if self.visibility is None or not mask.any():
            return mask
        numeric = pc.fill_null(pc.utf8_is_digit(txs), False).to_numpy(zero_copy_only=False).astype(bool)
        # (a change of PostgreSQL's log always names its xid; one that does not is not assumed seen)
        xids = np.zeros(len(txs), dtype=np.int64)
        if numeric.any():
            digits = pc.cast(txs.filter(pa.array(numeric)), pa.int64())
            xids[numeric] = np.asarray(digits.to_numpy(zero_copy_only=False), dtype=np.int64)
        seen = ~PgSnapshot.parse(self.visibility).invisible(xids & ((1 << 32) - 1))
        return mask & numeric & seen
