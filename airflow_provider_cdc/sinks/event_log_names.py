"""The event log's file names and which files are live: a changelog file ``c-{first}-{last}``
claims its range, and a file whose events another holds is superseded (a re-read after a
failover, a compaction's inputs)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..core.position import ENCODED_LENGTH


def _changelog_range(name: str) -> tuple[str, str] | None:
    """(first, last) encoded positions of a changelog file ``c-{first}-{last}.parquet`` (or
    ``c-{first}-{last}.g{version}.parquet``, the same batch retyped: sinks/event_log_table.py)."""
    stem = name.removesuffix(".parquet").split(".")[0]
    parts = stem.split("-")
    if len(parts) == 3 and parts[0] == "c" and len(parts[1]) == len(parts[2]) == ENCODED_LENGTH:
        return parts[1], parts[2]
    return None


def superseded(
    names: list[str], held: Callable[[str], tuple[str, str] | None] | None = None
) -> dict[str, str]:
    """Changelog files merged into a larger one (:func:`compact_table`) that still wait for
    deletion: name -> the file that holds their events. A file is merged into another when the
    other's name covers its name's range and, with ``held`` (a file's name -> the first and last
    position of the events it holds, None when it holds none), the events the other holds cover
    the positions of its own: a name alone is a claim (a batch re-read after a failover was once
    named for more than it held, and hid the files it overlapped)."""
    ranges = sorted(
        ((r[0], r[1], n) for n in names if (r := _changelog_range(n)) is not None),
        key=lambda x: (x[0], _neg(x[1])),
    )
    memo: dict[str, tuple[str, str] | None] = {}

    def holds(name: str) -> tuple[str, str] | None:
        if name not in memo:
            memo[name] = held(name) if held is not None else _changelog_range(name)
        return memo[name]

    out: dict[str, str] = {}
    for i, (first, last, name) in enumerate(ranges):
        mine = None
        for other_first, other_last, other in ranges[:i]:  # sorted by first: covers come earlier
            if other_first > first or other_last < last or other in out:
                continue
            mine = mine or holds(name)
            theirs = holds(other)
            if mine is None or (theirs is not None and theirs[0] <= mine[0] and theirs[1] >= mine[1]):
                out[name] = other
                break
    return out


def _neg(hex_text: str) -> str:
    """A key that sorts hex text descending."""
    return hex_text.translate(str.maketrans("0123456789abcdef", "fedcba9876543210"))


def live_files(names: list[str], folder: str | None = None) -> list[str]:
    """Of a folder's listing without a Delta log (written before the event log had one), the
    files a reader takes: every file but those merged into a larger one (they hold the same
    events; they stay for a while for readers that listed them). With ``folder`` what each file
    holds is checked, not only its name (:func:`superseded`)."""
    gone = superseded(names, None if folder is None else held_in(folder))
    return [n for n in names if n not in gone]


def held_in(folder: str) -> Callable[[str], tuple[str, str] | None]:
    """A file of ``folder`` -> the first and last position of the events it holds (None: none),
    from its Parquet statistics, or its position column where they are missing."""

    def held(name: str) -> tuple[str, str] | None:
        fs, p = storage.filesystem(storage.join(folder, name))
        with fs.open_input_file(p) as fh:
            f = pq.ParquetFile(fh)
            meta = f.metadata
            if meta.num_rows == 0:
                return None
            column = next(
                (i for i in range(meta.num_columns) if meta.schema.column(i).path == "source.position"), None
            )
            lows, highs = [], []
            for g in range(meta.num_row_groups):
                st = meta.row_group(g).column(column).statistics if column is not None else None
                if st is None or not st.has_min_max:
                    positions = pc.struct_field(f.read(columns=["source"])["source"], "position")
                    lo, hi = pc.min_max(positions).values()
                    return (lo.as_py(), hi.as_py()) if lo.is_valid else None
                lows.append(st.min)
                highs.append(st.max)
            return min(lows), max(highs)

    return held
