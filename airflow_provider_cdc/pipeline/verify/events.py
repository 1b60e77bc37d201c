"""Is the event log consistent (I1)? A table's events replayed per key."""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...core.position import Position
from ...core.schema import TableName
from ...sinks.event_log import read_events as read_event_log


@dataclass
class EventLogReport:
    table: str
    events: int = 0  # after de-duplication by (key, position)
    duplicates: int = 0  # identical copies removed (allowed: I3 de-duplicates them)
    keys: int = 0
    violation_count: int = 0
    violations: list[str] = field(default_factory=list)  # the first few, described

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def summary(self) -> str:
        return (
            f"event log of {self.table}: {self.events} events over {self.keys} keys, "
            f"{self.duplicates} duplicate copies, {self.violation_count} violations"
        )


def check_events(
    table_id: str, events: Iterable[dict], *, primary_key: tuple[str, ...] = (), max_violations: int = 20
) -> EventLogReport:
    """Replay events (dicts with op, key, position, before, after; rows as canonical JSON text or
    dicts) per key in position order and report what I1 forbids (see the module docstring)."""
    return check_event_tuples(
        table_id,
        (
            (
                e["key"],
                e["position"].encode() if isinstance(e["position"], Position) else e["position"],
                e["op"],
                e.get("before"),
                e.get("after"),
            )
            for e in events
        ),
        primary_key=primary_key,
        max_violations=max_violations,
    )


def _obj(row: Any) -> dict | None:
    return json.loads(row) if isinstance(row, str) else row


def _same(a: Any, b: Any) -> bool:
    """Equal rows, comparing the canonical JSON text first and parsing only when it differs.
    Images from either side of an ADD or DROP COLUMN are compared on the columns both have
    (a column added later has no value in the earlier image; a dropped one none in the later)."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    x, y = _obj(a), _obj(b)
    if x.keys() == y.keys():
        return x == y
    return all(x[c] == y[c] for c in x.keys() & y.keys())


def check_event_tuples(
    table_id: str,
    events: Iterable[tuple[str, str, str, Any, Any]],
    *,
    primary_key: tuple[str, ...] = (),
    max_violations: int = 20,
    gaps: Sequence[tuple[str, str]] = (),
) -> EventLogReport:
    """:func:`check_events` on ``(key, encoded position, op, before, after)`` tuples. ``gaps``:
    (from, to) encoded positions between which the log was lost and resynced (a failover,
    storage/source_server.py): a key's history is not followed across one."""
    rep = EventLogReport(table_id)
    per_key: dict[str, list] = {}
    truncates: list[str] = []  # positions of TRUNCATE events (op "t", no key): every key is gone there
    for ev in events:
        if ev[2] == "t":
            truncates.append(ev[1])
            continue
        if ev[2] == "g":  # a gap (resync): its ends are in ``gaps``
            continue
        lst = per_key.get(ev[0])
        if lst is None:
            per_key[ev[0]] = [ev]
        else:
            lst.append(ev)

    def violation(text: str) -> None:
        rep.violation_count += 1
        if len(rep.violations) < max_violations:
            rep.violations.append(text)

    rep.keys = len(per_key)
    truncates = sorted(set(truncates))
    rep.events += len(truncates)
    for key, evs in per_key.items():
        if len(evs) == 1:
            rep.events += 1
            continue
        evs.sort(key=lambda e: e[1])
        prev = None
        for ev in evs:
            _, pos, op, before, after = ev
            if prev is not None and truncates:
                # a TRUNCATE between the previous event and this one deleted the key there
                i = bisect.bisect_left(truncates, pos) - 1
                if i >= 0 and truncates[i] > prev[1]:
                    prev = (key, truncates[i], "d", None, None)
            if prev is not None and any(prev[1] < g_to and pos > g_from for g_from, g_to in gaps):
                prev = None  # the events between them may be lost: the resync's repair re-read the key
            if prev is not None and prev[1] == pos:
                if prev[2] == op and _same(prev[3], before) and _same(prev[4], after):
                    rep.duplicates += 1
                else:
                    violation(
                        f"key {key}: two different events at position {_readable(pos)}: {prev[2]} and {op}"
                    )
                continue
            rep.events += 1
            problem = None if prev is None else _problem(prev, ev, primary_key)
            if problem:
                violation(f"key {key}: {op} at {_readable(pos)}: {problem}")
            prev = ev
    return rep


def _problem(prev: tuple, ev: tuple, primary_key: tuple[str, ...]) -> str | None:
    """What I1 forbids in event ``ev`` of a key after its event ``prev`` (None: nothing)."""
    _, _pos, op, before, after = ev
    pop, pafter, ppos = prev[2], prev[4], prev[1]
    live = pop != "d"
    if op == "c" and live:
        return f"create of a live key (previous {pop} at {_readable(ppos)})"
    if op in ("u", "d", "r") and not live:
        return f"{op} after a delete at {_readable(ppos)}" + (
            " (resurrected by a chunk row)" if op == "r" else ""
        )
    if op == "r" and not _same(after, pafter):
        return f"chunk row is not the state at its position (stale; previous {pop} at {_readable(ppos)})"
    if op in ("u", "d") and before is not None and pafter is not None and not _same(before, pafter):
        if _full(_obj(before), _obj(pafter), primary_key):
            return f"before-image differs from the previous after-image ({pop} at {_readable(ppos)})"
    return None


def _full(before: dict, after: dict, primary_key: tuple[str, ...]) -> bool:
    """A before-image is comparable when it has every column (REPLICA IDENTITY FULL / binlog
    FULL); a key-only before-image (PostgreSQL's default identity) is not."""
    return bool(set(before) & (set(after) - set(primary_key))) and (
        not primary_key or set(before) != set(primary_key)
    )


def _readable(encoded: str) -> str:
    try:
        return str(Position.decode(encoded))
    except ValueError:
        return encoded


def check_event_log(
    data_dir: str, source: str, table: TableName, *, primary_key: tuple[str, ...] = ()
) -> EventLogReport:
    """Read the event log of ``table`` and check it per key (I1); see :func:`check_events`."""
    from ...storage.layout import events_dir
    from ...storage.source_server import read_gaps

    t = read_event_log(data_dir, source, table)
    cols = [t[c].to_pylist() for c in ("key", "position", "op", "before", "after")]
    gaps = [(g.get("from") or "", g.get("to") or "~") for g in read_gaps(events_dir(data_dir, source))]
    return check_event_tuples(table.id, zip(*cols, strict=True), primary_key=primary_key, gaps=gaps)
