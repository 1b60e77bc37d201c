"""Where capture stands: binlog coordinates (and GTID) stored after each staged segment,
and the binlog the server still holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pymysql
import pymysql.cursors

from ... import storage
from ...core.errors import SourceError, StateError
from ...core.position import Position, binlog_file_index
from ...storage.layout import changelog_dir
from ..base import LogRetention
from .held import XA_DIR

OFFSET_FILE = "_offset.json"
_ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236  # binlog file purged / position invalid


# --------------------------------------------------------------------------- offsets


@dataclass(frozen=True, order=True)
class BinlogOffset:
    """A transaction boundary in the binlog; order = (file index, byte offset)."""

    index: int
    pos: int
    file: str

    @classmethod
    def of(cls, file: str, pos: int) -> BinlogOffset:
        return cls(binlog_file_index(file), int(pos), file)

    def to_json(self, **extra: Any) -> str:
        return json.dumps({"file": self.file, "pos": self.pos, **extra}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BinlogOffset:
        try:
            d = json.loads(text)
            return cls.of(d["file"], d["pos"])
        except (ValueError, KeyError, TypeError) as exc:
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


class MyOffsets:
    """The offset file, the binlog's end, and its retention."""

    def offset_position(self, offset: str) -> Position:
        """A committed offset is a transaction boundary: every event before it was read."""
        o = BinlogOffset.from_json(offset)
        return Position.binlog(o.index, o.pos, 0)

    # --- changelog --------------------------------------------------------------------
    def binlog_end(self) -> BinlogOffset:
        """The current end of the binlog (file and position), always a transaction boundary."""
        rows = self._query(self.flavour.status_sql)
        if not rows or not rows[0][0]:
            raise SourceError(
                f"{self.flavour.status_sql} returned nothing: binary logging is off on the source "
                f"(start the server with --log-bin; see check_prerequisites())"
            )
        return BinlogOffset.of(rows[0][0], rows[0][1])

    def _gtid(self) -> str | None:
        try:
            return str(self._query(self.flavour.gtid_sql)[0][0] or "") or None
        except pymysql.err.MySQLError:
            return None

    def current_position(self) -> Position:
        end = self.binlog_end()
        return Position.binlog(end.index, end.pos, 0)

    def _offset_path(self, data_dir: str) -> str:
        return storage.join(changelog_dir(data_dir, self.source), OFFSET_FILE)

    def load_offset(self, data_dir: str) -> str:
        """The committed offset; when there is none yet, start at the current end of the
        binlog and commit that at once, so a later crash cannot skip what came between."""
        self.require_capture_scope()
        self.refuse_uncapturable(sorted(self.tables or ()))
        self.__dict__["_data_dir"] = data_dir  # prepared XA transactions wait under its changelog folder
        p = self._offset_path(data_dir)
        if storage.exists(p):
            text = storage.read_text(p)
            BinlogOffset.from_json(text)
            return text
        end = self.binlog_end()
        text = end.to_json(gtid=self._gtid())
        # XA transactions prepared before a fresh start were never read: none may match a later commit
        storage.delete_dir(storage.join(changelog_dir(data_dir, self.source), XA_DIR))
        self.commit_offset(text, data_dir)
        return text

    def commit_offset(self, offset: str, data_dir: str) -> None:
        """Atomic (storage.atomic_output): a reader sees the old or the new offset. Then the
        staged XA transactions committed or rolled back before it are deleted."""
        BinlogOffset.from_json(offset)
        storage.write_text(self._offset_path(data_dir), offset)
        self.__dict__["_data_dir"] = data_dir
        self._xa_cleanup(offset)

    def log_retention(self, offset: str) -> LogRetention | None:
        """Binlog bytes written past ``offset``, and the age after which the server purges a
        binlog file (``binlog_expire_logs_seconds``, else ``expire_logs_days``; None: never).
        The file holding the next change to capture was written to after the newest change
        captured, so the capture's lag in seconds bounds that file's age from above."""
        start = BinlogOffset.from_json(offset)
        files = [(r[0], int(r[1])) for r in self._query("SHOW BINARY LOGS")]
        end = self.binlog_end()
        lost = start.file not in [f for f, _ in files]
        lag = 0 if lost else binlog_bytes(files, Position.binlog(start.index, start.pos), Position.binlog(end.index, end.pos))
        expire, setting = None, "binlog_expire_logs_seconds"
        for name, scale in (("binlog_expire_logs_seconds", 1), ("expire_logs_days", 86400)):
            try:
                value = self._query(f"SELECT @@{name}")[0][0]  # a fixed name: no identifier from outside
            except pymysql.err.MySQLError:  # a server without it (expire_logs_days only, or neither)
                continue
            setting = name
            if value is not None and float(value) > 0:
                expire = float(value) * scale
            break
        return LogRetention(
            holder=f"binlog file {start.file!r}", lag_bytes=lag, lost=lost, limit_seconds=expire, setting=setting,
            fix=f"run the capture more often (the changelog DAG's schedule), or raise {setting}; once the file "
                f"is purged the captured tables need a re-snapshot and a new capture offset",
        )

    def log_bytes_between(self, start: Position, end: Position) -> int:
        """Binlog bytes from ``start`` to ``end`` (files purged since count as nothing)."""
        if end <= start:
            return 0
        return binlog_bytes([(r[0], int(r[1])) for r in self._query("SHOW BINARY LOGS")], start, end)

    def _check_not_purged(self, start: BinlogOffset) -> None:
        files = [r[0] for r in self._query("SHOW BINARY LOGS")]
        if start.file not in files:
            oldest = files[0] if files else "none"
            raise SourceError(
                f"source {self.source!r}: binlog file {start.file} of the committed offset (pos {start.pos}) is no "
                f"longer on the server (oldest binlog: {oldest}); the changes since were purged. Re-snapshot the "
                f"captured tables and reset the capture offset (delete {OFFSET_FILE} in the changelog staging dir)."
            )
