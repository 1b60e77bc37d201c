"""The mirror as of a source position (time travel by position, not only by Delta version).

Every commit that writes rows records the source position it brings the mirror to
(``cdc.position`` in its commitInfo: the newest position among its rows; a TRUNCATE's sweep the
TRUNCATE's). Maintenance (compaction, splits, vacuum, fences) changes no row's content and
records none. The version for a position P is the newest whose recorded positions, up to and
including its own, are all at or before P. It equals the source's table at P exactly when the
table had no change in between: the event log (named by position ranges) is checked for a
change of the table after that version's position and at or before P. Versions hold a table's
keys only once its snapshot copied them: a version during a snapshot is partial.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc

from .. import storage
from ..core.position import Position
from ..core.schema import TableName
from ..storage.layout import mirror_dir
from .mirror_table import _open

POSITION_INFO = "cdc.position"


@dataclass(frozen=True)
class VersionAt:
    """The mirror version for a position: the Delta ``version`` (read it with any Delta reader's
    time travel), the source ``position`` it was brought to, when it was committed, and whether
    the table had no change between that position and the one asked (``exact``; None when the
    event log cannot tell: no event log kept)."""

    table: str
    asked: str
    version: int
    position: str
    committed_ms: int
    exact: bool | None
    changes_between: int

    def describe(self) -> str:
        at = str(Position.decode(self.position))
        if self.exact:
            return f"{self.table}: Delta version {self.version} equals the source at {self.asked} ({at})"
        if self.exact is None:
            return (
                f"{self.table}: Delta version {self.version} holds the source as of {at}; whether the table "
                f"changed between that and {self.asked} is unknown (no event log)"
            )
        return (
            f"{self.table}: no version equals the source at {self.asked}: {self.changes_between} change(s) "
            f"of the table after {at} (Delta version {self.version}) and at or before it were applied "
            "together with later ones"
        )


def _history(path: str) -> list[dict]:
    dt = _open(path)
    return [] if dt is None else sorted(dt.history(), key=lambda h: h["version"])


def version_at(data_dir: str, source: str, table: str | TableName, position: Position) -> VersionAt | None:
    """The mirror version of ``table`` for the source ``position`` (None: no version the log
    still holds was brought to a position at or before it)."""
    t = table if isinstance(table, TableName) else TableName.parse(table)
    want = position.encode()
    best: tuple[int, str, int] | None = None
    reached: str | None = None
    for h in _history(mirror_dir(data_dir, source, t)):
        recorded = h.get(POSITION_INFO)
        if recorded and (reached is None or recorded > reached):
            reached = recorded
        if reached is None:  # no row written yet
            continue
        if reached > want:
            break
        best = (int(h["version"]), reached, int(h.get("timestamp") or 0))
    if best is None:
        return None
    changes = changes_between(data_dir, source, t, best[1], want)
    return VersionAt(
        t.id,
        str(position),
        best[0],
        best[1],
        best[2],
        None if changes is None else changes == 0,
        changes or 0,
    )


def changes_between(data_dir: str, source: str, table: TableName, after: str, upto: str) -> int | None:
    """Changes of ``table`` in the event log with a position after ``after`` and at or before
    ``upto`` (None: the table has no event log). Reads only the files whose position range
    overlaps (their names carry it), and of them the position column."""
    from ..storage.staged import read_table
    from .event_log import _changelog_range, event_files, table_dir

    folder = table_dir(data_dir, source, table)
    names = event_files(folder)
    if not names:
        return None
    count = 0
    for name in names:
        span = _changelog_range(name)
        if span is None or span[1] <= after or span[0] > upto:
            continue
        # the nested column alone (pyarrow names it by its leaf)
        pos = read_table(storage.join(folder, name), columns=["source.position"]).column(0)
        count += pc.sum(pc.and_(pc.greater(pos, after), pc.less_equal(pos, upto))).as_py() or 0
    return count
