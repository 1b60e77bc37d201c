"""Source positions: totally ordered, comparable as plain values, sortable as strings.

A position is three unsigned integers ``(major, minor, index)``:

* PostgreSQL: ``(commit LSN, 0, index of the change inside its transaction)``. LSNs are
  not unique (BEGIN shares its first change's LSN), so the commit LSN plus the order
  inside the transaction is the total order of committed changes.
* MySQL/MariaDB: ``(epoch << 32 | binlog file index, offset of the rows event, row index inside
  the event)``. The binlog is written in commit order, so file + offset is commit order. The
  epoch (0 until then) counts the servers capture followed through a failover (I14): a promoted
  replica numbers its binlog files on its own, so its positions carry the next epoch and sort
  after every position of the server before.

``encode()`` gives a fixed-width lowercase hex string (16 + 16 + 8 digits) whose string
order equals the tuple order, so Parquet columns, Spark joins and file names compare
positions as plain strings.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

_MAX64 = (1 << 64) - 1
_MAX32 = (1 << 32) - 1
ENCODED_LENGTH = 40


@dataclass(frozen=True, order=True, slots=True)
class Position:
    major: int
    minor: int = 0
    index: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.major <= _MAX64 and 0 <= self.minor <= _MAX64 and 0 <= self.index <= _MAX32):
            raise ValueError(f"position out of range: {self.major}/{self.minor}/{self.index}")

    def encode(self) -> str:
        return f"{self.major:016x}{self.minor:016x}{self.index:08x}"

    @classmethod
    def decode(cls, text: str) -> Position:
        if len(text) != ENCODED_LENGTH:
            raise ValueError(f"not an encoded position (want {ENCODED_LENGTH} hex digits): {text!r}")
        return cls(int(text[:16], 16), int(text[16:32], 16), int(text[32:], 16))

    def is_after(self, other: Position) -> bool:
        return self > other

    # --- PostgreSQL -------------------------------------------------------------------
    @classmethod
    def pg(cls, commit_lsn: int | str, index: int = 0) -> Position:
        return cls(lsn_to_int(commit_lsn) if isinstance(commit_lsn, str) else commit_lsn, 0, index)

    # --- MySQL / MariaDB --------------------------------------------------------------
    @classmethod
    def binlog(cls, file_name_or_index: str | int, offset: int, row: int = 0, epoch: int = 0) -> Position:
        idx = (
            binlog_file_index(file_name_or_index)
            if isinstance(file_name_or_index, str)
            else file_name_or_index
        )
        return cls(binlog_major(idx, epoch), offset, row)

    def __str__(self) -> str:  # readable in logs
        return f"{self.major:X}/{self.minor:X}/{self.index}"


ZERO = Position(0, 0, 0)


def lsn_to_int(lsn: str) -> int:
    """``'16/B374D848'`` -> int."""
    try:
        hi, lo = lsn.split("/")
        return (int(hi, 16) << 32) | int(lo, 16)
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"not a PostgreSQL LSN: {lsn!r} (want e.g. '16/B374D848')") from exc


def int_to_lsn(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


#: MySQL/MariaDB: a position's major is ``epoch << BINLOG_EPOCH_SHIFT | binlog file index``
BINLOG_EPOCH_SHIFT = 32


def binlog_major(file_index: int, epoch: int = 0) -> int:
    """The major of a binlog position: the file index in the low 32 bits, the server's epoch above."""
    if not 0 <= file_index <= _MAX32 or epoch < 0:
        raise ValueError(f"binlog file index {file_index} or epoch {epoch} out of range")
    return (epoch << BINLOG_EPOCH_SHIFT) | file_index


def binlog_epoch(major: int) -> tuple[int, int]:
    """(epoch, file index) of a binlog position's major."""
    return major >> BINLOG_EPOCH_SHIFT, major & _MAX32


@functools.lru_cache(maxsize=256)  # a few names, asked for every binlog event
def binlog_file_index(name: str) -> int:
    """``'binlog.000042'`` -> 42 (the numeric suffix orders binlog files)."""
    suffix = name.rsplit(".", 1)[-1]
    if not suffix.isdigit():
        raise ValueError(f"not a binlog file name: {name!r} (want e.g. 'binlog.000042')")
    return int(suffix)


#: the prefix of a watermark id that names a log position instead of a watermark row: under the
#: ``log`` watermark strategy (docs/DESIGN.md, "Watermarks without writes") a chunk's window is
#: bounded by positions read from the source, so nothing is written to it
POSITION_MARK = "pos-"


def position_mark(position: Position, ts_ms: int) -> str:
    """The watermark id of ``position`` (``ts_ms``: when the source was there, for the rows
    emitted at it): ``pos-<encoded position>-<ts_ms>``."""
    return f"{POSITION_MARK}{position.encode()}-{int(ts_ms)}"


def marked_position(watermark_id: str) -> tuple[Position, int] | None:
    """(position, ts_ms) of a position mark; None for any other watermark id."""
    if not watermark_id.startswith(POSITION_MARK):
        return None
    body = watermark_id[len(POSITION_MARK) :]
    enc, _, ts = body.partition("-")
    if len(enc) != ENCODED_LENGTH or not ts.isdigit():
        raise ValueError(f"not a position mark: {watermark_id!r}")
    return Position.decode(enc), int(ts)


#: PostgreSQL's WAL page headers (MAXALIGNed XLogPageHeaderData / XLogLongPageHeaderData): a
#: page starts with the short one, a segment's first page with the long one
PG_PAGE_HEADER, PG_SEGMENT_HEADER = 24, 40


def next_record_start(end_lsn: int, block_size: int, segment_size: int) -> int:
    """PostgreSQL: where the WAL record after one that ends at ``end_lsn`` starts. Flush and replay
    positions are record ends; the insert position is such a start: past the page header when
    the end falls on a page boundary. Every record that starts before the one is before the
    other too, so positions compare the same once taken as starts (an idle server whose WAL
    ends on a page boundary otherwise never reaches its own insert position)."""
    if end_lsn % block_size:
        return end_lsn
    return end_lsn + (PG_SEGMENT_HEADER if end_lsn % segment_size == 0 else PG_PAGE_HEADER)


def standby_mark(replayed: int, received: int | None, block_size: int, segment_size: int) -> Position:
    """The position a chunk read on a PostgreSQL hot standby lands at, from the replay and receive
    positions read right after its snapshot. A record's redo (a commit made visible) is done
    before the replay position moves past it, so a snapshot may already see the commit whose
    record starts at the replay position: when the standby holds WAL past it (received beyond,
    or not known), that record's events sort before the mark, not after the chunk's rows."""
    start = next_record_start(replayed, block_size, segment_size)
    in_redo = received is None or received > replayed
    return just_before(Position.pg(start + 1 if in_redo else start))


def just_before(position: Position) -> Position:
    """The greatest position below ``position`` (as the three numbers were one integer)."""
    n = (position.major << 96) | (position.minor << 32) | position.index
    if n == 0:
        raise ValueError("no position is before the zero position")
    n -= 1
    return Position(n >> 96, (n >> 32) & _MAX64, n & _MAX32)


def parse_position(text: str, setting: str = "position") -> Position:
    """A source position as a user writes it, as the position *after* everything committed at
    it: an encoded position (40 hex digits, as the event log's ``source.position``), a
    PostgreSQL LSN (``'16/B374D848'``: every transaction committed at or before it), or a
    binlog file and offset (``'binlog.000042:1234'``: every event at or before that offset; the
    epoch of a server capture reached through a failover as ``'binlog.000042:1234@1'``).
    ValueError names ``setting`` and the forms."""
    raw = (text or "").strip()
    try:
        if len(raw) == ENCODED_LENGTH and all(c in "0123456789abcdef" for c in raw):
            return Position.decode(raw)
        if "/" in raw and ":" not in raw:
            return Position.pg(lsn_to_int(raw), _MAX32)
        if ":" in raw:
            file_part, _, rest = raw.rpartition(":")
            offset, _, epoch = rest.partition("@")
            return Position.binlog(file_part, int(offset), _MAX32, int(epoch or 0))
    except ValueError:
        pass
    raise ValueError(
        f"{setting} {text!r} is not a source position: give a PostgreSQL LSN ('16/B374D848'), a "
        "binlog file and offset ('binlog.000042:1234'), or an encoded position (40 lowercase hex "
        "digits, as the event log's source.position)"
    )
