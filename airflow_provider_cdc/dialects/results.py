"""What a dialect's calls return (a chunk read, a whole-table read, a log batch, the log's
retention and activity) and the connection parameters every dialect takes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from ..core.errors import ConfigurationError
from ..core.event_batch import EventBatch
from ..core.events import LogEvent
from ..core.row_digest import DIGEST_NULL, DIGEST_SIZED  # noqa: F401 - the dialects' SQL builds them
from .registry import get_profile, known_names

_SIZED = frozenset({bytes, str, bytearray, memoryview})


def value_bytes(row: Sequence[Any]) -> int:
    """The size a driver row's values take, as counted against ``batch_max_bytes``: the
    length of every bytes and str value (numbers, dates: a few bytes, not counted)."""
    n = 0
    for v in row:
        if v.__class__ in _SIZED:
            n += len(v)
    return n


@dataclass(frozen=True)
class ConnectionParams:
    scheme: str  # a registered dialect's name or alias (dialects/registry.py): postgres, mysql...
    host: str = "127.0.0.1"
    port: int | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    database: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_uri(cls, uri: str) -> ConnectionParams:
        """``scheme://user:password@host:port/database?extra``: the scheme (``+driver`` ignored)
        names a registered database by its name or an alias (``postgresql``, ``mariadb``); the
        params carry the database's dialect name."""
        parts = urlsplit(uri)
        scheme = parts.scheme.split("+")[0].lower()
        try:
            profile = get_profile(scheme)
        except ConfigurationError:
            raise ConfigurationError(
                f"connection URI scheme {parts.scheme!r} not supported; use one of "
                f"{', '.join(f'{n}://' for n in known_names())}"
            ) from None
        return cls(
            scheme=profile.name,
            host=parts.hostname or "127.0.0.1",
            port=parts.port,
            user=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            database=parts.path.lstrip("/") or None,
            extra=dict(parse_qsl(parts.query)),
        )


@dataclass(frozen=True)
class ChunkReadResult:
    rows: int
    last_key: tuple | None  # canonical key values of the last row, None if no rows
    #: the position mark (core.position.position_mark) of the snapshot the SELECT read
    #: (PostgreSQL always, MariaDB under watermark strategy "log"): under "log" both bounds of
    #: the chunk's window
    snapshot_mark: str | None = None
    #: PostgreSQL: the snapshot the SELECT read (core/visibility.py)
    visibility: str | None = None


@dataclass(frozen=True)
class ReadSnapshot:
    """What a chunk read records of the snapshot its SELECT read (``stream_query``'s
    ``snapshot`` list): its position mark (PostgreSQL always, MariaDB under strategy "log")
    and, on PostgreSQL, its visibility."""

    mark: str | None
    visibility: str | None = None


@dataclass(frozen=True)
class WholeTableRead:
    """A whole-table read (:meth:`Dialect.read_whole_table`): the staged files in read order
    with their rows, and the position mark of the one snapshot every file was read in."""

    files: tuple[tuple[str, int], ...]
    mark: str | None
    #: PostgreSQL: which transactions the snapshot saw (core/visibility.py); None elsewhere
    visibility: str | None = None

    @property
    def rows(self) -> int:
        return sum(n for _p, n in self.files)


@dataclass(frozen=True)
class LogBatch:
    events: list[LogEvent] | EventBatch  # in position order, whole transactions only
    end_offset: str  # opaque: where the next read starts; safe to commit after staging
    start_offset: str
    #: the read stopped short of the end it aimed at (a step bound or ``max_events``): after
    #: staging and committing, read again from ``end_offset``
    more: bool = False


@dataclass(frozen=True)
class CaptureResult:
    events: int
    watermarks: int
    segment: str | None  # the last segment staged by this run (None: nothing captured)
    start_offset: str
    end_offset: str
    seconds: float
    segments: tuple[str, ...] = ()  # every segment staged by this run, in position order
    newest_ts_ms: int | None = None  # commit time of the newest event staged by this run


@dataclass(frozen=True)
class LogRetention:
    """How far a capture's committed offset is behind the source's log, and how long the
    source keeps the log it still needs (``Dialect.log_retention``). The policy that turns
    it into a warning is pipeline.capture.capture_lag."""

    holder: str  # what keeps the log for the capture, e.g. "replication slot 'x'"
    lag_bytes: int  # log written past the committed offset
    lost: bool = False  # the source already dropped log the capture needs
    limit_bytes: int | None = None  # a size limit of the retained log (None: none)
    safe_bytes: int | None = None  # log the source may still write before it drops what the capture needs
    limit_seconds: float | None = None  # an age limit of the retained log (None: none)
    setting: str = ""  # the source setting that sets the limit
    fix: str = ""  # what to do about it, in the source's terms
    #: nothing bounds the log the holder may keep (PostgreSQL max_slot_wal_keep_size = -1): why
    #: that can fill the source's disk and what to set ("": bounded, or the source cannot tell)
    unbounded: str = ""


@dataclass(frozen=True)
class LogActivity:
    """A cheap, read-only reading of whether the source wrote anything the capture may need
    (``Dialect.log_activity``), for the trigger that starts changelog rounds
    (triggers/log_activity.py). ``token`` changes whenever the tables in the capture scope
    (or, where the source cannot tell tables apart, its log) were written; ``pending_bytes``
    is the log past the capture's committed offset (None: no offset yet, or unknown)."""

    token: str
    pending_bytes: int | None = None


#: A segment handler of ``Dialect.read_log``: stages events of whole transactions.
SegmentSink = Callable[[list[LogEvent] | EventBatch], None]

#: what a replica's read floor stands for (:meth:`Dialect.read_no_older_than`), said when it is not reached
READ_FLOOR_SNAPSHOT = "the snapshot's start"
READ_FLOOR_MIRROR = "what the mirror has applied"
