"""XA transactions: a prepared one's events persisted under the staging folder until its
XA COMMIT (staged then) or XA ROLLBACK (dropped), across captures; the log reader's ``xa``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Protocol

from ... import storage
from ...core.events import LogEvent
from ...storage.layout import changelog_dir
from .binlog import BinlogOffset
from .held import XA_DIR, GroupReader, HeldGroup, Xid

log = logging.getLogger(__name__)


class XaReader(GroupReader, Protocol):
    def binlog_major(self, file: str) -> int:
        """The major of positions in binlog ``file`` of the server read now."""


class MyXa:
    """Prepared XA transactions, kept until they end: the log reader's ``xa``."""

    def __init__(self, reader: XaReader) -> None:
        self.reader = reader
        #: the staging root (bound by the offsets' load and commit); None: a folder of this process
        self.data_dir: str | None = None
        self._tmp: str | None = None
        self._resolved: list[tuple[BinlogOffset, list[str]]] = []  # deleted once the offset passes them

    def root(self) -> str:
        """Where prepared XA transactions wait for their XA COMMIT: ``<changelog dir>/_xa``
        once load_offset or commit_offset named the data dir, else a folder of this process
        (a prepare and a commit read by this dialect object still meet there)."""
        if self.data_dir is not None:
            return storage.join(changelog_dir(self.data_dir, self.reader.source), XA_DIR)
        tmp = self._tmp
        if tmp is None:
            import tempfile

            tmp = self._tmp = tempfile.mkdtemp(prefix="cdc-mysql-xa-")
            log.warning(
                "source %r: read_log without a data dir: prepared XA transactions are kept in %s, "
                "which does not outlive this process",
                self.reader.source,
                tmp,
            )
        return tmp

    def manifest(self, xid: Xid, start: tuple[int, int]) -> str:
        return storage.join(self.root(), f"x-{xid.key}.{start[0]:08d}-{start[1]:012d}.json")

    def _prepared(self, xid: Xid, major: int, pos: int) -> list[tuple[tuple[int, int], str]]:
        """The manifests of ``xid`` prepared before (major, pos), oldest first (a position's major:
        the file index with the server's epoch above it, so a prepare read on the server before a
        failover is found at its commit on the promoted replica)."""
        root, prefix = self.root(), f"x-{xid.key}."
        found = []
        for name in storage.list_names(root, suffix=".json"):
            if name.startswith(prefix):
                idx, _, off = name[len(prefix) : -len(".json")].partition("-")
                at = (int(idx), int(off))
                if at < (major, pos):
                    found.append((at, storage.join(root, name)))
        return sorted(found)

    def _done(self, manifests: list[str], ev_end: BinlogOffset) -> None:
        """Delete these manifests and their parts once the offset passes ``ev_end`` (commit_offset)."""
        self._resolved.append((ev_end, manifests))

    def commit(
        self, xid: Xid, file: str, pos: int, ev_end: BinlogOffset, where: str
    ) -> Iterator[tuple[list[LogEvent], int]]:
        """The events of the XA transaction ``xid`` (its latest prepare before this commit),
        placed at the commit's position in their order."""
        prepared = self._prepared(xid, self.reader.binlog_major(file), pos)
        if not prepared:
            self.reader.refuse(
                f"XA COMMIT of {xid} at {where}, but this capture never read its XA PREPARE (it came "
                "before the "
                f"capture's first offset, or {self.root()} lost it): its changes are not staged"
            )
            return
        self._done([m for _, m in prepared], ev_end)
        group = HeldGroup.load(self.reader, prepared[-1][1])
        log.info(
            "source %r: XA transaction %s committed at %s: %d event(s) staged at the commit's position",
            self.reader.source,
            xid,
            where,
            group.count,
        )
        yield from group.drain(rollback=False, at=(self.reader.binlog_major(file), pos))

    def forget(self, xid: Xid, file: str, pos: int, ev_end: BinlogOffset) -> None:
        prepared = self._prepared(xid, self.reader.binlog_major(file), pos)
        if prepared:
            self._done([m for _, m in prepared], ev_end)

    def cleanup(self, offset: str) -> None:
        """Drop the staged XA transactions resolved before ``offset`` (just committed)."""
        resolved = self._resolved
        if not resolved:
            return
        upto = BinlogOffset.from_json(offset)
        keep = []
        for ev_end, manifests in resolved:
            if ev_end > upto:
                keep.append((ev_end, manifests))
                continue
            for m in manifests:
                try:
                    parts = json.loads(storage.read_text(m)).get("dir")
                except FileNotFoundError:
                    continue
                if parts:
                    storage.delete_dir(storage.join(storage.parent(m), parts))
                storage.delete(m)
        self._resolved = keep
