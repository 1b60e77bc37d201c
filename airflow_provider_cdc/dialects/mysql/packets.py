"""The binlog stream's packets, read off the replication connection by capture itself.

Why: an OLTP writer's binlog is four events per single-row transaction (a GTID, a table map, a
rows event, an XID). mysql-replication builds a packet wrapper and an event object for each of
them in Python, ~40 µs an event, so capture of such a binlog read ~6,000 row changes a second on
an idle machine and 2,720 under load: less than one writer makes (``bench sustained``). Here
the read loop (binlog_read.py) takes the common events from the packet's bytes: MariaDB's GTID
event (three fields), the XID event (nothing to read), a table map of an id already mapped
(nothing to read: ``freeze_schema``) and a rows event the compiled walker decodes (rows_walker.py,
which needs only where the row images start). Every other event, and each of those when
anything about it is unusual (a longer post-header than the one known, extra row data, a column
count past 250, a partial row image, the watermark table), is built by mysql-replication exactly
as its own ``fetchone`` builds it (:meth:`RawStream.event`: the same wrapper, settings, filters
and bookkeeping of rotations, format descriptions and table maps).

This reads mysql-replication's private state (its connection and the settings ``fetchone``
passes on). Where any of it is missing (another version of the library), :meth:`RawStream.of`
returns None and the read iterates the library's stream as before.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pymysql

#: binlog event type codes (MySQL's and MariaDB's binlog_event.h)
ROTATE_EVENT, FORMAT_DESCRIPTION_EVENT, XID_EVENT, TABLE_MAP_EVENT = 4, 15, 16, 19
MARIADB_GTID_EVENT = 162
#: rows event type -> the walker's kind (0 write, 1 update, 2 delete); v1 (MariaDB) and v2 (MySQL)
ROWS_KIND = {23: 0, 24: 1, 25: 2, 30: 0, 31: 1, 32: 2}
#: rows event type -> the post-header length this reader knows (table id 6, flags 2, v2: extra length 2)
ROWS_POST_HEADER = {23: 8, 24: 8, 25: 8, 30: 10, 31: 10, 32: 10}
FAST_TYPES = frozenset({XID_EVENT, TABLE_MAP_EVENT, MARIADB_GTID_EVENT, *ROWS_KIND})
#: the OK byte, then the event header: timestamp, type, server id, event size, next event's position
HEADER = struct.Struct("<xIBIII")
BODY = 20  # where the post-header starts in a packet (OK byte + 19 header bytes)

_P = "_BinLogStreamReader__"
#: what the library's fetchone passes to each packet wrapper, in its order
_WRAPPER_SETTINGS = (
    "use_checksum",
    "allowed_events_in_packet",
    "only_tables",
    "ignored_tables",
    "only_schemas",
    "ignored_schemas",
    "freeze_schema",
    "ignore_decode_errors",
    "verify_checksum",
    "optional_meta_data",
    "enable_logging",
    "use_column_name_cache",
    "post_header_lengths",
)
_STATE = ("connected_stream", "connected_ctl", "allowed_events", "connect_to_stream", "connect_to_ctl")
_EXPECTED_ERRORS = (2013, 2006)  # the library's MYSQL_EXPECTED_ERROR_CODES: it connects again


class RawStream:
    """A mysql-replication stream whose packets capture reads itself."""

    def __init__(self, stream: Any, wrapper: type) -> None:
        self.stream = stream
        self._wrapper = wrapper
        self.checksum = 0
        self._post_headers: dict[int, bool] = {}

    @classmethod
    def of(cls, stream: Any) -> RawStream | None:
        """The raw view of ``stream``, or None when the library is not the one this reads."""
        try:
            from pymysqlreplication.packet import BinLogPacketWrapper
        except ImportError:  # pragma: no cover - the library is a dependency
            return None
        names = [_P + n for n in (*_WRAPPER_SETTINGS, *_STATE)]
        if not all(hasattr(stream, n) for n in names) or not hasattr(stream, "table_map"):
            return None
        return cls(stream, BinLogPacketWrapper)

    def _get(self, name: str) -> Any:
        return getattr(self.stream, _P + name)

    def _connect(self) -> None:
        if not self._get("connected_stream"):
            self._get("connect_to_stream")()
        if not self._get("connected_ctl"):
            self._get("connect_to_ctl")()
        #: bytes of the checksum at each event's end (the server's setting, read at connecting)
        self.checksum = 4 if self._get("use_checksum") else 0

    def post_header_known(self, event_type: int, known: int) -> bool:
        """Whether the server's format description declares ``known`` bytes of post-header for
        the event type (or declares none), so the body starts where this reader expects."""
        hit = self._post_headers.get(event_type)
        if hit is None:
            lengths = self._get("post_header_lengths")
            ok = not lengths or not 0 < event_type <= len(lengths) or lengths[event_type - 1] == known
            hit = self._post_headers[event_type] = ok
        return hit

    def packets(self) -> Iterator[Any]:
        """Each OK packet of the binlog dump until the server's end (the non-blocking dump's EOF),
        connecting (again) as the library's fetchone does."""
        s = self.stream
        connected_stream, connected_ctl = _P + "connected_stream", _P + "connected_ctl"
        while True:
            if not (getattr(s, connected_stream) and getattr(s, connected_ctl)):
                self._connect()
            try:
                pkt = s._stream_connection._read_packet()
            except pymysql.OperationalError as error:
                if error.args and error.args[0] in _EXPECTED_ERRORS:
                    # the library connects again from stream.log_pos (kept by the read loop)
                    s._stream_connection.close()
                    setattr(s, connected_stream, False)
                    continue
                raise
            if pkt.is_eof_packet():
                s.close()
                return
            if pkt.is_ok_packet():
                yield pkt

    def event(self, pkt: Any) -> Any:
        """The packet as mysql-replication's event (None: one it filters out), with the
        bookkeeping of the library's fetchone: rotations, format descriptions, table maps."""
        s = self.stream
        ev = self._wrapper(
            pkt,
            s.table_map,
            s._ctl_connection,
            s.mysql_version,
            *(self._get(n) for n in _WRAPPER_SETTINGS),
        )
        if ev.event_type == ROTATE_EVENT:
            s.log_pos, s.log_file = ev.event.position, ev.event.next_binlog
            if ev.timestamp != 0:
                s.table_map = {}
        elif ev.log_pos:
            s.log_pos = ev.log_pos
        if ev.event_type == FORMAT_DESCRIPTION_EVENT and ev.event is not None:
            s.mysql_version = ev.event.mysql_version
            setattr(s, _P + "post_header_lengths", ev.event.post_header_len)
            self._post_headers.clear()
        if ev.event_type == TABLE_MAP_EVENT and ev.event is not None:
            s.table_map[ev.event.table_id] = ev.event.get_table()
        if ev.event is None or ev.event.__class__ not in self._get("allowed_events"):
            return None
        return ev.event


def table_id(data: bytes) -> int:
    """The table id of a table map or rows event's packet (6 bytes after the header)."""
    return int.from_bytes(data[BODY : BODY + 6], "little")


def mariadb_gtid(data: bytes, server_id: int) -> tuple[str, int]:
    """MariaDB's GTID event: its GTID ``domain-server-sequence`` and its flags2 byte."""
    seq = int.from_bytes(data[BODY : BODY + 8], "little")
    domain = int.from_bytes(data[BODY + 8 : BODY + 12], "little")
    return f"{domain}-{server_id}-{seq}", data[BODY + 12]


def rows_body(data: bytes, event_type: int) -> tuple[int, int, bytes, bytes | None] | None:
    """Where a rows event's row images start, its column count and present-columns bitmaps
    (the second an update's), or None when the event is not in the plain form this reads."""
    pos = BODY + 8  # table id, flags
    if event_type >= 30:  # v2: extra data, of which this reads only its absence
        if int.from_bytes(data[pos : pos + 2], "little") != 2:
            return None
        pos += 2
    ncols = data[pos]
    if ncols >= 251:  # a length-coded column count past one byte
        return None
    pos += 1
    width = (ncols + 7) // 8
    present = data[pos : pos + width]
    pos += width
    present2 = None
    if ROWS_KIND[event_type] == 1:
        present2 = data[pos : pos + width]
        pos += width
    return pos, ncols, present, present2


class PacketEvents:
    """The read loop's handlers of events read from their packets: a mixin of binlog_read's
    ``_BinlogRead``, whose state (``at_event``, ``end_group``, ``mariadb_group``, ``add``) they use."""

    fast_raw: RawStream

    def on_packet(self, data: bytes, stream: Any) -> bool | None:
        """A common event read from its packet's bytes (packets.py): True when the read stops,
        False when it was handled, None when mysql-replication must build it."""
        _ts, etype, server_id, size, log_pos = HEADER.unpack_from(data)
        if etype == TABLE_MAP_EVENT:
            # a table id mapped in this server's run is the same table (freeze_schema): nothing to read
            return False if table_id(data) in stream.table_map else None
        kind = ROWS_KIND.get(etype)
        if kind is not None:
            tid = table_id(data)
            mapped = stream.table_map.get(tid)
            if mapped is None:
                stream.log_pos = log_pos
                return False  # its table map was filtered out (another schema): so is it
            walker = self.d.fast_walker(tid, mapped)
            if walker is True or not self.fast_raw.post_header_known(etype, ROWS_POST_HEADER[etype]):
                return None
            stream.log_pos = log_pos
            if self.at_event(log_pos, size):
                return True  # written after this read began: the next capture takes it
            if walker is False:  # a table capture does not take
                return self.at_end()
            return self.fast_rows(data, kind, walker, server_id, size, _ts)
        stream.log_pos = log_pos
        if self.at_event(log_pos, size):
            return True
        if etype == XID_EVENT:
            return self.end_group() or self.at_end()
        gtid, flags = mariadb_gtid(data, server_id)  # MARIADB_GTID_EVENT
        self.mariadb_group(gtid, flags)
        return self.at_end()

    def fast_rows(
        self, data: bytes, kind: int, walker: Any, server_id: int, size: int, ts: int
    ) -> bool | None:
        body = rows_body(data, data[5])
        if body is None:
            return None
        start, ncols, present, present2 = body
        end = 1 + size - self.fast_raw.checksum
        if len(data) < end:
            return None
        origin = (self.group_gtid, None, None, server_id, self.thread, self.current_file)
        at = (self.d.binlog_major(self.current_file), self.ev_start, ts * 1000, origin)
        run = walker.decode(data, start, end, ncols, (present, present2), kind, at)
        if run is None:
            return None
        if run:
            self.add(run, size)
        return self.at_end()
