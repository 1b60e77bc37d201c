"""Which transactions a PostgreSQL snapshot sees, on a primary (``pg_current_snapshot()``) and
on a hot standby (:class:`ReplayedBefore`, a replay position), so a chunk's window also drops
the keys of transactions its SELECT did not see (docs/DESIGN.md, "Watermarks without writes").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .position import Position, just_before, lsn_to_int

_MASK = (1 << 32) - 1
#: the text form of :class:`ReplayedBefore`: ``replayed-before:<LSN>``
REPLAYED_BEFORE = "replayed-before:"


@dataclass(frozen=True)
class PgSnapshot:
    """``pg_current_snapshot()``: every xid below ``xmin`` is finished, ``xmax`` and above not
    yet finished when it was taken, ``xip`` the ones in between still running."""

    xmin: int
    xmax: int
    xip: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> PgSnapshot:
        try:
            xmin, xmax, xip = text.split(":")
            snap = cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))
        except ValueError:
            raise ValueError(f"not a PostgreSQL snapshot: {text!r} (want 'xmin:xmax:xip,...')") from None
        if not snap.xmin <= snap.xmax or any(not snap.xmin <= x < snap.xmax for x in snap.xip):
            raise ValueError(f"not a PostgreSQL snapshot: {text!r} (xmin <= xip < xmax)")
        return snap

    def full(self, xids: np.ndarray) -> np.ndarray:
        """32-bit xids of the log widened to 64 bits: the value nearest to ``xmax`` (the ones a
        snapshot can still be asked about lie within 2^31 of it)."""
        base = np.int64(self.xmax & ~_MASK)
        out = base + xids.astype(np.int64)
        out = np.where(out > self.xmax + (1 << 31), out - (1 << 32), out)
        return np.where(out <= self.xmax - (1 << 31), out + (1 << 32), out)

    def invisible(self, xids: np.ndarray) -> np.ndarray:
        """Mask of the 32-bit top-level xids whose transactions this snapshot does not see."""
        full = self.full(xids)
        running = np.isin(full, np.fromiter(self.xip, dtype=np.int64, count=len(self.xip)))
        return (full >= self.xmax) | running

    def visible(self, xid: int) -> bool:
        return not bool(self.invisible(np.asarray([xid & _MASK], dtype=np.int64))[0])


@dataclass(frozen=True)
class ReplayedBefore:
    """A hot standby's snapshot: it sees every transaction whose commit record starts before
    ``lsn`` (the replay position read before it was taken), and of the later ones any or none."""

    lsn: int

    @property
    def window_floor(self) -> Position:
        """Where the chunk's window starts: just before the first commit it may not have seen."""
        return just_before(Position.pg(self.lsn))

    @classmethod
    def parse(cls, text: str) -> ReplayedBefore:
        if not text.startswith(REPLAYED_BEFORE):
            raise ValueError(f"not a standby's replay position: {text!r} (want '{REPLAYED_BEFORE}<LSN>')")
        lsn = lsn_to_int(text[len(REPLAYED_BEFORE) :])
        if lsn <= 0:
            raise ValueError(f"not a standby's replay position: {text!r} (the LSN must be above 0/0)")
        return cls(lsn)

    @classmethod
    def text(cls, lsn: str) -> str:
        cls.parse(REPLAYED_BEFORE + lsn)  # checked here, not in a window hours later
        return REPLAYED_BEFORE + lsn


def parse_visibility(text: str) -> PgSnapshot | ReplayedBefore:
    """A chunk's recorded visibility: a primary's snapshot or a standby's replay position."""
    return ReplayedBefore.parse(text) if text.startswith(REPLAYED_BEFORE) else PgSnapshot.parse(text)


def first_invisible(positions: pa.Array, txs: pa.Array, snapshot: PgSnapshot, before: str) -> str | None:
    """The smallest encoded position below ``before`` of an event whose transaction (``txs``:
    the staged ``origin.tx``, the xid as text) ``snapshot`` does not see; None when there is none.
    Events without a numeric xid (watermark rows, other databases) are never such events."""
    if len(positions) == 0:
        return None
    keep = pc.and_(pc.less(positions, pa.scalar(before, pa.string())), pc.utf8_is_digit(txs))
    keep = pc.fill_null(keep, False)
    positions, txs = positions.filter(keep), txs.filter(keep)
    if len(positions) == 0:
        return None
    xids = np.asarray(pc.cast(txs, pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64) & _MASK
    mask = snapshot.invisible(xids)
    if not mask.any():
        return None
    return pc.min(positions.filter(pa.array(mask))).as_py()
