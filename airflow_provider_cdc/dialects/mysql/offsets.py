"""Where capture stands: binlog coordinates (and GTID) stored after each staged segment,
and the binlog the server still holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pymysql
import pymysql.cursors

from ... import storage
from ...core.errors import SourceError, StateError
from ...core.position import Position, binlog_epoch, binlog_file_index, binlog_major
from ...storage.layout import changelog_dir
from ...storage.source_server import resync_pending
from ..base import LogRetention
from .held import XA_DIR

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
    def of(cls, file: str, pos: int, epoch: int = 0, server: int | None = None, gtid: str | None = None
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
            return cls.of(d["file"], d["pos"], int(d.get("epoch") or 0), None if server is None else int(server),
                          d.get("gtid"))
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


class MyOffsets:
    """The offset file, the binlog's end, and its retention."""

    def offset_position(self, offset: str) -> Position:
        """A committed offset is a transaction boundary: every event before it was read."""
        return BinlogOffset.from_json(offset).position()

    # --- changelog --------------------------------------------------------------------
    def binlog_end(self, epoch: int = 0) -> BinlogOffset:
        """The current end of the binlog (file and position), always a transaction boundary;
        ``epoch``: the one capture gives this server's positions."""
        rows = self._query(self.flavour.status_sql)
        if not rows or not rows[0][0]:
            raise SourceError(
                f"{self.flavour.status_sql} returned nothing: binary logging is off on the source "
                f"(start the server with --log-bin; see check_prerequisites())"
            )
        return BinlogOffset.of(rows[0][0], rows[0][1], epoch)

    def _gtid(self) -> str | None:
        try:
            return str(self._query(self.flavour.gtid_sql)[0][0] or "") or None
        except pymysql.err.MySQLError:
            return None

    def current_position(self) -> Position:
        """The binlog's end, in the epoch capture gives this server (:meth:`server_epoch`)."""
        epoch = self.server_epoch(self._server_id())
        return self.binlog_end(epoch).position()

    def _offset_path(self, data_dir: str) -> str:
        return storage.join(changelog_dir(data_dir, self.source), OFFSET_FILE)

    def load_offset(self, data_dir: str) -> str:
        """The committed offset; when there is none yet, start at the current end of the
        binlog and commit that at once, so a later crash cannot skip what came between.

        The offset names the server it was read on (@@server_id). Another server (a promoted
        replica, a restore) is followed only where the GTID position of the offset is proven to
        be in its binlog: capture goes on right after it, in the next epoch (I14,
        :meth:`_follow_failover`); otherwise SourceChangedError says what happened. After
        ``airflow-cdc resync`` capture starts anew at this server's end, in the next epoch."""
        self.require_capture_scope()
        self.refuse_uncapturable(sorted(self.tables or ()))
        self.__dict__["_data_dir"] = data_dir  # prepared XA transactions wait under its changelog folder
        directory = changelog_dir(data_dir, self.source)
        p = self._offset_path(data_dir)
        server = self._server_id()
        old = BinlogOffset.from_json(storage.read_text(p)) if storage.exists(p) else None
        if old is not None and (old.server == server or not resync_pending(directory)):
            if old.server is None:  # written before offsets named their server: taken as this one's
                old = replace(old, server=server)
                self.commit_offset(old.to_json(), data_dir)
            elif old.server != server:
                old = self._follow_failover(old, server, directory)
                self.commit_offset(old.to_json(), data_dir)
            self._record_server(directory, old)
            return old.to_json()
        epoch = 0 if old is None else old.epoch + 1  # after a resync: after every position of the old server
        end = replace(self.binlog_end(epoch), server=server, gtid=self._gtid())
        # XA transactions prepared before a fresh start were never read: none may match a later commit
        storage.delete_dir(storage.join(directory, XA_DIR))
        text = end.to_json()
        self.commit_offset(text, data_dir)
        self._record_server(directory, end)
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
        lag = 0 if lost else binlog_bytes(files, Position.binlog(start.index, start.pos),
                                          Position.binlog(end.index, end.pos))
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
        """Binlog bytes from ``start`` to ``end`` (files purged since count as nothing; a
        ``start`` on the server before a failover counts from this server's oldest file)."""
        if end <= start:
            return 0
        (start_epoch, start_index), (end_epoch, end_index) = binlog_epoch(start.major), binlog_epoch(end.major)
        first = Position(start_index, start.minor) if start_epoch == end_epoch else Position(0, 0)
        return binlog_bytes([(r[0], int(r[1])) for r in self._query("SHOW BINARY LOGS")], first,
                            Position(end_index, end.minor))

    def _check_not_purged(self, start: BinlogOffset) -> None:
        files = [r[0] for r in self._query("SHOW BINARY LOGS")]
        if start.file not in files:
            oldest = files[0] if files else "none"
            raise SourceError(
                f"source {self.source!r}: binlog file {start.file} of the committed offset (pos {start.pos}) is no "
                f"longer on the server (oldest binlog: {oldest}); the changes since were purged. Re-snapshot the "
                f"captured tables and reset the capture offset (delete {OFFSET_FILE} in the changelog staging dir)."
            )
