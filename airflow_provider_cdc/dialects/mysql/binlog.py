"""Binlog coordinates as values: ``BinlogOffset`` (a transaction boundary, stored as the capture
offset), the offset file's name, and the bytes of binlog between two positions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import StateError
from ...core.position import Position, binlog_epoch, binlog_file_index, binlog_major

OFFSET_FILE = "_offset.json"
_ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236  # binlog file purged / position invalid


# --------------------------------------------------------------------------- offsets


@dataclass(frozen=True, order=True)
class BinlogOffset:
    """A transaction boundary in the binlog; order = (epoch, file index, byte offset).

    ``major`` is ``epoch << 32 | file index`` (core/position.py): the epoch counts the servers
    capture followed through a failover (0 until the first), so offsets and positions of a
    promoted replica, whose binlog files are numbered on their own, sort after the old server's.
    ``server``: the @@server_id the offset was read on (None in offsets written before it was
    recorded); ``gtid``: MariaDB's GTID position there (per domain the last group before the
    offset, as ``@@gtid_binlog_pos`` prints it), which a promoted replica must hold (I14)."""

    major: int
    pos: int
    file: str
    server: int | None = field(default=None, compare=False)
    gtid: str | None = field(default=None, compare=False)

    @property
    def index(self) -> int:
        """The binlog file's index (the number in its name)."""
        return binlog_epoch(self.major)[1]

    @property
    def epoch(self) -> int:
        return binlog_epoch(self.major)[0]

    @classmethod
    def of(
        cls, file: str, pos: int, epoch: int = 0, server: int | None = None, gtid: str | None = None
    ) -> BinlogOffset:
        return cls(binlog_major(binlog_file_index(file), epoch), int(pos), file, server, gtid or None)

    def at(self, file: str, pos: int) -> BinlogOffset:
        """Another place in the same server's binlog (same epoch and server, GTID not known)."""
        return BinlogOffset.of(file, pos, self.epoch, self.server)

    def position(self) -> Position:
        return Position(self.major, self.pos, 0)

    def to_json(self, **extra: Any) -> str:
        d: dict[str, Any] = {"file": self.file, "pos": self.pos}
        if self.epoch:
            d["epoch"] = self.epoch
        if self.server is not None:
            d["server_id"] = self.server
        if self.gtid:
            d["gtid"] = self.gtid
        return json.dumps({**d, **extra}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BinlogOffset:
        try:
            d = json.loads(text)
            server = d.get("server_id")
            return cls.of(
                d["file"],
                d["pos"],
                int(d.get("epoch") or 0),
                None if server is None else int(server),
                d.get("gtid"),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateError(
                f'not a MySQL binlog offset: {text!r} (want JSON {{"file": "binlog.000001", "pos": 4}})'
            ) from exc


def binlog_bytes(files: list[tuple[str, int]], start: Position, end: Position) -> int:
    """Bytes of the binlog ``files`` ((name, size) as SHOW BINARY LOGS lists them) from ``start``
    to ``end`` (positions: file index, offset)."""
    total = 0
    for name, size in files:
        index = binlog_file_index(name)
        if start.major <= index <= end.major:
            upto = end.minor if index == end.major else size
            total += max(0, upto - (start.minor if index == start.major else 0))
    return total
