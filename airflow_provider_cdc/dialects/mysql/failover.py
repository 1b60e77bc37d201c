"""The server behind a MariaDB source changes (I14): a promoted GTID replica is followed from the
GTID position capture stands at, in the next epoch of positions; anything else stops capture
with SourceChangedError naming what happened (``airflow-cdc resync`` then starts anew). The
dialect's ``failover``.

Positions are ``(epoch << 32 | binlog file index, offset, row)`` (core/position.py). A promoted
replica (``--log-slave-updates``) writes the old primary's transactions into binlog files of its
own, numbered on their own, so its file and offset say nothing about the old server's. Its
positions carry the next epoch: every one of them sorts after every position read from the
server before (changes, watermarks and chunk marks alike), whatever the two files are called.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pymysql

from ... import storage
from ...core.errors import SourceChangedError, StateError
from ...storage.source_server import read_server, write_server
from .binlog import _ER_MASTER_FATAL_ERROR_READING_BINLOG, BinlogOffset
from .server import MyServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GtidState:
    """A MariaDB GTID position (``@@gtid_binlog_pos``): per domain the last group,
    ``domain-server-sequence``."""

    groups: tuple[tuple[int, int, int], ...] = ()  # (domain, server_id, sequence), by domain

    @classmethod
    def parse(cls, text: str | None) -> GtidState:
        found: dict[int, tuple[int, int, int]] = {}
        for part in (text or "").split(","):
            part = part.strip()
            if not part:
                continue
            try:
                d, s, n = (int(x) for x in part.split("-"))
            except ValueError:
                raise StateError(
                    f"not a MariaDB GTID position: {text!r} (want e.g. '0-1-42,1-2-7')"
                ) from None
            found[d] = (d, s, n)
        return cls(tuple(found[d] for d in sorted(found)))

    def after(self, gtid: str) -> GtidState:
        """The position once the group ``gtid`` (``d-s-n``) is read."""
        (group,) = GtidState.parse(gtid).groups
        return GtidState(tuple(sorted([*(g for g in self.groups if g[0] != group[0]), group])))

    def domain(self, domain: int) -> tuple[int, int, int] | None:
        return next((g for g in self.groups if g[0] == domain), None)

    def __str__(self) -> str:
        return ",".join(f"{d}-{s}-{n}" for d, s, n in self.groups)


class MyFailover:
    """Which server the binlog is read from, and following a promoted replica."""

    def __init__(self, server: MyServer, *, capture_server_id: int, resync_hint: str) -> None:
        self.server = server
        self.capture_server_id = capture_server_id  # the replication id the binlog stream reads with
        self.resync_hint = resync_hint  # what a SourceChangedError tells the user to do

    def server_identity(self) -> dict:
        """Which server this is: its ``server_id`` (each server of a replication topology has its
        own) and, as ``system_identifier``, the GTID domains of its binlog (MariaDB: the same on a
        primary and its replicas; resync refuses a server of other domains)."""
        sid = self.server.server_id()
        if not self.server.flavour.is_mariadb:
            return {"system_identifier": "mysql", "server_id": sid}
        state = GtidState.parse(self.server.query("SELECT @@global.gtid_binlog_state")[0][0])
        domains = ",".join(sorted({str(d) for d, _s, _n in state.groups}))
        return {"system_identifier": f"mariadb-gtid-domains:{domains}", "server_id": sid}

    def record_server(self, directory: str, offset: BinlogOffset) -> None:
        """``_server.json`` beside the changelog (storage/source_server.py): what resync records as
        the servers before and after a gap."""
        identity = {**self.server_identity(), "epoch": offset.epoch}
        if read_server(directory) != identity:
            write_server(directory, identity)

    def follow_failover(self, old: BinlogOffset, server: int, directory: str) -> BinlogOffset:
        """I14: the committed offset ``old`` was read on another server. Capture goes on here only
        from the GTID position ``old`` recorded: this server's binlog must hold that group (the
        same domain, server and sequence; the server checks it, in strict mode, when it is asked
        to send its binlog from there). The new offset is where the first group after it starts
        here (or the end of this binlog), in the next epoch. Otherwise SourceChangedError."""
        what = (
            f"source {self.server.source!r}: MariaDB at {self.server.params.host}:{self.server.params.port} "
            f"(server_id {server}) is not "
            f"the server capture read before (server_id {old.server})"
        )
        if not self.server.flavour.is_mariadb:
            raise SourceChangedError(
                f"{what}; following a MySQL failover by its GTIDs is not implemented, so capture "
                f"stops. {self.resync_hint}"
            )
        ours = GtidState.parse(old.gtid)
        if not ours.groups:
            raise SourceChangedError(
                f"{what}, and the committed offset records no GTID position that could be found "
                f"on it. {self.resync_hint}"
            )
        if len(ours.groups) > 1:
            raise SourceChangedError(
                f"{what}. Capture stands at GTID position {ours}, in {len(ours.groups)} domains; this "
                "version proves "
                f"where capture goes on in one domain only, so it stops. {self.resync_hint}"
            )
        domain, _sid, seq = ours.groups[0]
        here = GtidState.parse(self.server.gtid())
        have = here.domain(domain)
        if have is None:
            raise SourceChangedError(
                f"{what}, and its binlog has no GTID of domain {domain} (its GTID position: "
                f"{here or 'empty'}), while "
                f"capture stands at {ours}: it is not a replica of the server captured before (a fresh "
                "server, or "
                "another topology), so nothing proves its binlog continues the captured one. "
                f"{self.resync_hint}"
            )
        if have[2] < seq:
            raise SourceChangedError(
                f"{what}, and its binlog ends at GTID {GtidState((have,))} in domain {domain}, before "
                f"{ours} where capture "
                "stands: changes capture staged are not on it (a replica promoted before it had "
                "applied them, or "
                "another server), so nothing proves its binlog continues the captured one. "
                f"{self.resync_hint}"
            )
        start = self._gtid_continuation(str(ours), what)
        new = BinlogOffset.of(start.file, start.pos, old.epoch + 1, server, old.gtid)
        self._drop_uncommitted_segments(directory, old)
        log.warning(
            "source %r: MariaDB server_id %s at %s:%s replaces server_id %s (a failover): its binlog "
            "holds GTID "
            "%s where capture stood (%s:%s there), so capture goes on from %s:%s on it, positions in "
            "epoch %d",
            self.server.source,
            server,
            self.server.params.host,
            self.server.params.port,
            old.server,
            ours,
            old.file,
            old.pos,
            new.file,
            new.pos,
            new.epoch,
        )
        return new

    def _gtid_continuation(self, gtid: str, what: str) -> BinlogOffset:
        """Where this server's binlog goes on after GTID position ``gtid``: the start of the first
        group the server sends to a replica at that position (``MASTER_USE_GTID``, strict mode:
        it refuses a GTID its binlog does not hold, or holds only in purged files), or the end
        of its binlog when there is none."""
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import MariadbGtidEvent, RotateEvent

        end = self.server.binlog_end()
        stream = BinLogStreamReader(
            connection_settings=self.server.stream_settings(),
            server_id=self.capture_server_id,
            blocking=False,
            is_mariadb=True,
            auto_position=gtid,
            only_events=[RotateEvent, MariadbGtidEvent],
            enable_logging=False,
        )
        file = None
        try:
            for ev in stream:
                ev.packet.event = None
                if isinstance(ev, RotateEvent):
                    file = ev.next_binlog
                else:
                    return BinlogOffset.of(file or stream.log_file, ev.packet.log_pos - ev.packet.event_size)
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] == _ER_MASTER_FATAL_ERROR_READING_BINLOG:
                raise SourceChangedError(
                    f"{what}, and it cannot send its binlog from GTID {gtid}, where capture stands: "
                    f"{exc.args[-1]} "
                    f"(the group is not in its binlog, or only in purged files). {self.resync_hint}"
                ) from exc
            raise
        finally:
            stream.close()
        return end

    def _drop_uncommitted_segments(self, directory: str, committed: BinlogOffset) -> None:
        """Segments staged from the old server past its committed offset (a capture that died
        before committing): capture reads those changes again on the new server, at positions of
        the new epoch, so the old copies go."""
        from ...storage.staged import list_segments

        for first, _last, path in list_segments(directory):
            if first >= committed.position():
                log.info(
                    "source %r: removing %s, staged past the committed offset on the old server",
                    self.server.source,
                    path,
                )
                storage.delete(path)
