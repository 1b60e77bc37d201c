"""Where capture stands: the offset (binlog coordinates and GTID, binlog.py) stored after each
staged segment, the epoch of the server read now, and the binlog the server still holds; the
dialect's ``offsets``.
"""

from __future__ import annotations

from dataclasses import replace

import pymysql
import pymysql.cursors

from ... import storage
from ...core.errors import SourceError
from ...core.position import Position, binlog_epoch
from ...storage.layout import changelog_dir
from ...storage.source_server import resync_pending
from ..base import LogActivity, LogRetention
from .binlog import _ER_MASTER_FATAL_ERROR_READING_BINLOG, OFFSET_FILE, BinlogOffset, binlog_bytes
from .failover import MyFailover
from .held import XA_DIR
from .server import MyServer
from .xa import MyXa

__all__ = [
    "OFFSET_FILE",
    "_ER_MASTER_FATAL_ERROR_READING_BINLOG",
    "BinlogOffset",
    "MyOffsets",
    "binlog_bytes",
]


class MyOffsets:
    """The offset file (and the data dir it is under), the epoch of the server read now, the
    binlog's retention."""

    def __init__(self, server: MyServer, failover: MyFailover, xa: MyXa) -> None:
        self.server = server
        self.failover = failover
        self.xa = xa  # prepared XA transactions wait under the data dir; resolved ones go at a commit
        self.data_dir: str | None = None

    def bind_data_dir(self, data_dir: str) -> None:
        """The staging root whose committed offset says which epoch this server's positions
        have (a chunk task reads chunks without loading the offset)."""
        self.data_dir = self.xa.data_dir = data_dir

    def stored_offset(self) -> BinlogOffset | None:
        if self.data_dir is None:
            return None
        path = self.offset_path(self.data_dir)
        try:
            return BinlogOffset.from_json(storage.read_text(path))
        except OSError:
            if storage.exists(path):
                raise
            return None

    def server_epoch(self, server_id: int) -> int:
        """The epoch of positions read on server ``server_id``: the committed offset's for its
        server, the next one for any other (where capture goes on after following it, or after a
        resync); 0 before the first capture or without a data dir."""
        stored = self.stored_offset()
        if stored is None:
            return 0
        return stored.epoch if stored.server in (None, server_id) else stored.epoch + 1

    def chunk_epoch(self, server_id: int) -> int:
        """The epoch of a chunk read on ``server_id`` (watermark strategy "log"). Only the server
        capture reads: before capture has followed a failover, the new server's epoch is not
        settled (a second failover would give it another), so the chunk waits for it."""
        stored = self.stored_offset()
        if stored is None:
            return 0
        if stored.server is not None and stored.server != server_id:
            raise SourceError(
                f"source {self.server.source!r}: the chunk was read on MariaDB server_id {server_id}, "
                "but capture "
                f"last read server_id {stored.server} (a failover or promotion): run the capture (the "
                "changelog DAG) "
                "first, so that it follows the new server or names why it cannot; the chunk is read "
                "again after that"
            )
        return stored.epoch

    def offset_position(self, offset: str) -> Position:
        """A committed offset is a transaction boundary: every event before it was read."""
        return BinlogOffset.from_json(offset).position()

    def current_position(self) -> Position:
        """The binlog's end, in the epoch capture gives this server (:meth:`server_epoch`)."""
        epoch = self.server_epoch(self.server.server_id())
        return self.server.binlog_end(epoch).position()

    def offset_path(self, data_dir: str) -> str:
        return storage.join(changelog_dir(data_dir, self.server.source), OFFSET_FILE)

    def load_offset(self, data_dir: str) -> str:
        """The committed offset; when there is none yet, start at the current end of the
        binlog and commit that at once, so a later crash cannot skip what came between.

        The offset names the server it was read on (@@server_id). Another server (a promoted
        replica, a restore) is followed only where the GTID position of the offset is proven to
        be in its binlog: capture goes on right after it, in the next epoch (I14,
        ``MyFailover.follow_failover``); otherwise SourceChangedError says what happened. After
        ``airflow-cdc resync`` capture starts anew at this server's end, in the next epoch."""
        self.bind_data_dir(data_dir)  # prepared XA transactions wait under its changelog folder
        directory = changelog_dir(data_dir, self.server.source)
        p = self.offset_path(data_dir)
        server = self.server.server_id()
        old = BinlogOffset.from_json(storage.read_text(p)) if storage.exists(p) else None
        if old is not None and (old.server == server or not resync_pending(directory)):
            if old.server is None:  # written before offsets named their server: taken as this one's
                old = replace(old, server=server)
                self.commit_offset(old.to_json(), data_dir)
            elif old.server != server:
                old = self.failover.follow_failover(old, server, directory)
                self.commit_offset(old.to_json(), data_dir)
            self.failover.record_server(directory, old)
            return old.to_json()
        epoch = 0 if old is None else old.epoch + 1  # after a resync: after every position of the old server
        end = replace(self.server.binlog_end(epoch), server=server, gtid=self.server.gtid())
        # XA transactions prepared before a fresh start were never read: none may match a later commit
        storage.delete_dir(storage.join(directory, XA_DIR))
        text = end.to_json()
        self.commit_offset(text, data_dir)
        self.failover.record_server(directory, end)
        return text

    def commit_offset(self, offset: str, data_dir: str) -> None:
        """Atomic (storage.atomic_output): a reader sees the old or the new offset. Then the
        staged XA transactions committed or rolled back before it are deleted."""
        BinlogOffset.from_json(offset)
        storage.write_text(self.offset_path(data_dir), offset)
        self.bind_data_dir(data_dir)
        self.xa.cleanup(offset)

    def _behind(self, start: BinlogOffset) -> tuple[BinlogOffset, int | None]:
        """The binlog's end and the bytes written from ``start`` to it (None: the file of
        ``start`` was purged)."""
        files = [(r[0], int(r[1])) for r in self.server.query("SHOW BINARY LOGS")]
        end = self.server.binlog_end()
        if start.file not in [f for f, _ in files]:
            return end, None
        return end, binlog_bytes(
            files, Position.binlog(start.index, start.pos), Position.binlog(end.index, end.pos)
        )

    def log_activity(self, data_dir: str) -> LogActivity:
        """The binlog's end (any write on the server moves it: the binlog has no per-table
        counter) and the bytes past the committed offset; reads the offset, never writes it."""
        p = self.offset_path(data_dir)
        if not storage.exists(p):
            end, pending = self.server.binlog_end(), None
        else:
            end, pending = self._behind(BinlogOffset.from_json(storage.read_text(p)))
        return LogActivity(token=f"binlog {end.file}:{end.pos}", pending_bytes=pending)

    def log_retention(self, offset: str) -> LogRetention | None:
        """Binlog bytes written past ``offset``, and the age after which the server purges a
        binlog file (``binlog_expire_logs_seconds``, else ``expire_logs_days``; None: never).
        The file holding the next change to capture was written to after the newest change
        captured, so the capture's lag in seconds bounds that file's age from above."""
        start = BinlogOffset.from_json(offset)
        _end, behind = self._behind(start)
        lost = behind is None
        lag = behind or 0
        expire, setting = None, "binlog_expire_logs_seconds"
        for name, scale in (("binlog_expire_logs_seconds", 1), ("expire_logs_days", 86400)):
            try:
                value = self.server.query(f"SELECT @@{name}")[0][
                    0
                ]  # a fixed name: no identifier from outside
            except pymysql.err.MySQLError:  # a server without it (expire_logs_days only, or neither)
                continue
            setting = name
            if value is not None and float(value) > 0:
                expire = float(value) * scale
            break
        return LogRetention(
            holder=f"binlog file {start.file!r}",
            lag_bytes=lag,
            lost=lost,
            limit_seconds=expire,
            setting=setting,
            fix=f"run the capture more often (the changelog DAG's schedule), or raise {setting}; once "
            "the file "
            f"is purged the captured tables need a re-snapshot and a new capture offset",
        )

    def log_bytes_between(self, start: Position, end: Position) -> int:
        """Binlog bytes from ``start`` to ``end`` (files purged since count as nothing; a
        ``start`` on the server before a failover counts from this server's oldest file)."""
        if end <= start:
            return 0
        (start_epoch, start_index), (end_epoch, end_index) = (
            binlog_epoch(start.major),
            binlog_epoch(end.major),
        )
        first = Position(start_index, start.minor) if start_epoch == end_epoch else Position(0, 0)
        return binlog_bytes(
            [(r[0], int(r[1])) for r in self.server.query("SHOW BINARY LOGS")],
            first,
            Position(end_index, end.minor),
        )
