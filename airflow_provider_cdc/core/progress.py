"""Snapshot progress (I4): the value stored per (source, table), with its status transitions
(docs/DESIGN.md, "Snapshot state") and the planned key ranges, each done or with its last
committed key, so a snapshot stopped anywhere resumes after its last committed chunk.
Requests and recording are idempotent (I3); the JSON form: docs/DESIGN.md, "Persisted formats".
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from .errors import StateError
from .formats import PROGRESS
from .ranges import FULL_RANGE, ChunkRange


class Status(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    DONE = "done"
    FAILED = "failed"


#: from -> {to: the verb that does it}
TRANSITIONS: dict[Status, dict[Status, str]] = {
    Status.RUNNING: {
        Status.PAUSED: "pause",
        Status.STOPPED: "stop",
        Status.DONE: "finish",
        Status.FAILED: "fail",
    },
    Status.PAUSED: {Status.RUNNING: "resume", Status.STOPPED: "stop", Status.FAILED: "fail"},
    Status.FAILED: {Status.RUNNING: "resume", Status.STOPPED: "stop"},
    Status.STOPPED: {},
    Status.DONE: {},
}

_ADVICE = {
    Status.STOPPED: "a stopped snapshot is final; start a new snapshot to read the table again",
    Status.DONE: "the snapshot is done; start a new snapshot to read the table again",
    Status.RUNNING: "it is running; pause or stop it first",
    Status.PAUSED: "it is paused; resume it first",
    Status.FAILED: "it failed; resume it (after fixing the cause) or stop it",
}


class WorkItem(NamedTuple):
    """The next chunk of a range: read ``range`` after ``after_key`` (None = from its start)."""

    table: str
    range: ChunkRange
    after_key: tuple | None


def range_fraction(rng: ChunkRange, key: Sequence | None, upper: Sequence | None) -> float | None:
    """Share of a range read up to ``key``, by its first key column when that is a number
    (progress logs and the UI page only); None when it cannot tell."""
    if key is None:
        return None
    lo = rng.start[0] if rng.start else 0
    hi = rng.end[0] if rng.end else (upper[0] if upper else None)
    k = key[0]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi, k)) or hi <= lo:
        return None
    return min(max((k - lo) / (hi - lo), 0.0), 1.0)


@dataclass
class RangeState:
    range: ChunkRange
    done: bool = False
    last_key: tuple | None = None  # last committed key; None = nothing read yet
    last_seq: int = -1


@dataclass
class TableProgress:
    table: str
    ranges: list[RangeState]
    upper_bound: tuple | None = None  # max key when the snapshot started (inclusive)
    rows: int = 0
    chunks: int = 0
    started_at: float | None = None
    updated_at: float | None = None

    @property
    def done(self) -> bool:
        return all(r.done for r in self.ranges)

    @property
    def completed_ranges(self) -> list[ChunkRange]:
        return [r.range for r in self.ranges if r.done]

    @property
    def rows_per_second(self) -> float:
        if self.started_at is None or self.updated_at is None or self.updated_at <= self.started_at:
            return 0.0
        return self.rows / (self.updated_at - self.started_at)

    def fraction_done(self) -> float | None:
        """Share of the table read: done ranges whole, a range not started as nothing, the others
        by :func:`range_fraction`; None when a started range's share cannot be told."""
        if not self.ranges:
            return None
        parts = []
        for r in self.ranges:
            f = (
                1.0
                if r.done
                else (0.0 if r.last_key is None else range_fraction(r.range, r.last_key, self.upper_bound))
            )
            if f is None:
                return None
            parts.append(f)
        return sum(parts) / len(parts)

    def remaining(self) -> list[WorkItem]:
        return [WorkItem(self.table, r.range, r.last_key) for r in self.ranges if not r.done]

    def _coalesce(self) -> None:
        """Done ranges keep no cursor, and adjacent done ranges become one."""
        out: list[RangeState] = []
        for r in self.ranges:
            if out and out[-1].done and r.done:
                out[-1] = RangeState(ChunkRange(out[-1].range.start, r.range.end), True)
            else:
                out.append(RangeState(r.range, True) if r.done else r)
        self.ranges = out


def _now(now: float | None) -> float:
    return round(time.time() if now is None else now, 3)


@dataclass
class SnapshotProgress:
    source: str
    snapshot_id: str
    status: Status = Status.RUNNING
    tables: dict[str, TableProgress] = field(default_factory=dict)
    started_at: float | None = None
    updated_at: float | None = None
    active_seconds: float = 0.0  # time spent running (pauses excluded)
    running_since: float | None = None
    error: str | None = None
    # the DAG run reading this snapshot now (another run that finds it alive leaves the table
    # alone: two runs never read one snapshot at once), and the logical date of the run that
    # started it (a scheduled/backfill refresh for that date or an older one starts none)
    owner: str | None = None
    logical_date: str | None = None

    # --- lifecycle -----------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        source: str,
        snapshot_id: str,
        tables: Mapping[str, Sequence[ChunkRange]],
        upper_bounds: Mapping[str, Sequence | None] | None = None,
        *,
        now: float | None = None,
    ) -> SnapshotProgress:
        """A running snapshot over the planned ``tables`` (table id -> disjoint ranges in key order)."""
        t = _now(now)
        if not tables:
            raise StateError(f"snapshot {snapshot_id} of {source}: no tables to snapshot")
        bounds = upper_bounds or {}
        progress: dict[str, TableProgress] = {}
        for tid, ranges in tables.items():
            rs = list(ranges) or [FULL_RANGE]
            ub = bounds.get(tid)
            progress[tid] = TableProgress(tid, [RangeState(r) for r in rs], None if ub is None else tuple(ub))
        return cls(source, snapshot_id, Status.RUNNING, progress, t, t, 0.0, t)

    def _label(self) -> str:
        return f"snapshot {self.snapshot_id} of {self.source}"

    def _move(self, to: Status, now: float | None) -> None:
        if to == self.status:
            return
        verb = TRANSITIONS[self.status].get(to)
        if verb is None:
            allowed = (
                ", ".join(f"{v} ({self.status} -> {s})" for s, v in TRANSITIONS[self.status].items())
                or "none"
            )
            raise StateError(
                f"{self._label()}: cannot go from {self.status} to {to}; {_ADVICE[self.status]}. "
                f"Allowed now: {allowed}"
            )
        t = _now(now)
        if self.status == Status.RUNNING and self.running_since is not None:
            self.active_seconds = round(self.active_seconds + max(0.0, t - self.running_since), 3)
            self.running_since = None
        if to == Status.RUNNING:
            self.running_since = t
            self.error = None
        self.status = to
        self.updated_at = t

    def pause(self, *, now: float | None = None) -> None:
        self._move(Status.PAUSED, now)

    def resume(self, *, now: float | None = None) -> None:
        self._move(Status.RUNNING, now)

    def stop(self, *, now: float | None = None) -> None:
        self._move(Status.STOPPED, now)

    def fail(self, error: str, *, now: float | None = None) -> None:
        self._move(Status.FAILED, now)
        self.error = str(error)[:2000]

    def finish(self, *, now: float | None = None) -> None:
        """Done: every range of every table is read."""
        if self.status == Status.RUNNING:
            left = {t: len(p.remaining()) for t, p in self.tables.items() if not p.done}
            if left:
                raise StateError(
                    f"{self._label()}: cannot finish, ranges not done yet: {left}; run their chunks "
                    "(next_work()) first"
                )
        self._move(Status.DONE, now)

    @property
    def may_read(self) -> bool:
        """Chunk tasks start new work only while running."""
        return self.status == Status.RUNNING

    # --- chunks --------------------------------------------------------------------------
    def table(self, table: str) -> TableProgress:
        try:
            return self.tables[table]
        except KeyError:
            raise StateError(
                f"{self._label()} has no table {table!r}; tables: {sorted(self.tables)}"
            ) from None

    def record_chunk(self, result: Any, *, now: float | None = None) -> bool:
        """Record a committed chunk (a :class:`core.chunk.ChunkResult` or anything with its
        ``table, range, seq, after_key, last_key, rows, exhausted``). Returns False when it
        was recorded before (a retry), True when it moved the progress."""
        if self.status in (Status.DONE, Status.STOPPED):
            raise StateError(
                f"{self._label()} is {self.status}: cannot record chunk seq {result.seq} of {result.table}; "
                f"{_ADVICE[self.status]}"
            )
        tp = self.table(result.table)
        rng: ChunkRange = result.range
        state = next((r for r in tp.ranges if r.range.start == rng.start), None)
        if state is None or state.done:
            return False  # the range is done (coalesced into a done range): recorded before
        if state.range.end != rng.end:
            raise StateError(
                f"{self._label()}: chunk seq {result.seq} of {result.table} read range {rng.to_json()} "
                "but the plan has "
                f"{state.range.to_json()}; the chunk does not belong to this snapshot's plan. Re-plan "
                "with a new snapshot"
            )
        if result.seq <= state.last_seq:
            return False
        after = None if result.after_key is None else tuple(result.after_key)
        if after != state.last_key:
            raise StateError(
                f"{self._label()}: chunk seq {result.seq} of {result.table} read after key {after!r} "
                "but the last "
                f"committed key of range {rng.to_json()} is {state.last_key!r}; a chunk would be "
                "skipped or read twice. "
                "Run the next chunk from next_work()"
            )
        t = _now(now)
        if result.last_key is not None:
            state.last_key = tuple(result.last_key)
        state.last_seq = result.seq
        if result.exhausted:
            state.done = True
            tp._coalesce()
        tp.rows += int(result.rows)
        tp.chunks += 1
        tp.started_at = tp.started_at if tp.started_at is not None else t
        tp.updated_at = t
        self.updated_at = t
        return True

    def next_work(self, table: str | None = None) -> list[WorkItem]:
        """Ranges not done yet, each to be continued after its last committed key (I4)."""
        tables = [self.table(table)] if table is not None else list(self.tables.values())
        return [w for tp in tables for w in tp.remaining()]

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    @property
    def chunks(self) -> int:
        return sum(t.chunks for t in self.tables.values())

    def active_for(self, *, now: float | None = None) -> float:
        """Seconds spent running so far (pauses excluded)."""
        active = self.active_seconds
        if self.status == Status.RUNNING and self.running_since is not None:
            active += max(0.0, _now(now) - self.running_since)
        return active

    def rows_per_second(self, *, now: float | None = None) -> float:
        active = self.active_for(now=now)
        return self.rows / active if active > 0 else 0.0

    # --- JSON ----------------------------------------------------------------------------
    def to_json(self) -> str:
        tables = {}
        for tid, tp in self.tables.items():
            edges = [_lst(tp.ranges[0].range.start)] + [_lst(r.range.end) for r in tp.ranges]
            states: list[Any] = [
                1
                if r.done
                else (0 if r.last_seq < 0 and r.last_key is None else [_lst(r.last_key), r.last_seq])
                for r in tp.ranges
            ]
            contiguous = all(
                a.range.end == b.range.start for a, b in zip(tp.ranges, tp.ranges[1:], strict=False)
            )
            tables[tid] = {
                # ranges as their edges when each starts where the one before ends (a plan of
                # the whole table), else as [start, end] pairs (chosen key ranges with gaps)
                **(
                    {"e": edges}
                    if contiguous
                    else {"r": [[_lst(r.range.start), _lst(r.range.end)] for r in tp.ranges]}
                ),
                "s": states,
                "ub": _lst(tp.upper_bound),
                "rows": tp.rows,
                "chunks": tp.chunks,
                "t0": tp.started_at,
                "t1": tp.updated_at,
            }
        d = {
            **PROGRESS.stamp({}),
            "source": self.source,
            "snapshot_id": self.snapshot_id,
            "status": str(self.status),
            "t0": self.started_at,
            "t1": self.updated_at,
            "active": self.active_seconds,
            "since": self.running_since,
            "error": self.error,
            "tables": tables,
        }
        if self.owner is not None:
            d["owner"] = self.owner
        if self.logical_date is not None:
            d["ld"] = self.logical_date
        return json.dumps(d, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str, where: str = "snapshot progress") -> SnapshotProgress:
        """Read back what :meth:`to_json` wrote; ``where`` (the register or Variable it came
        from) names it in errors."""
        try:
            d = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise StateError(f"{where}: snapshot progress is not JSON ({exc}); {PROGRESS.remedy}") from exc
        d = PROGRESS.read(d, where)
        # read back from a Variable or a file: the id becomes a path component (I15)
        from .scope import check_snapshot_id

        check_snapshot_id(d.get("snapshot_id"), "snapshot progress")
        return cls._from_dict(d)

    @classmethod
    def _from_dict(cls, d: dict) -> SnapshotProgress:
        tables = {}
        for tid, t in d["tables"].items():
            if "r" in t:
                bounds = [ChunkRange(_tup(a), _tup(b)) for a, b in t["r"]]
            else:
                edges = [_tup(e) for e in t["e"]]
                bounds = [ChunkRange(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]
            ranges = []
            for i, s in enumerate(t["s"]):
                rng = bounds[i]
                if s == 1:
                    ranges.append(RangeState(rng, True))
                elif s == 0:
                    ranges.append(RangeState(rng))
                else:
                    ranges.append(RangeState(rng, False, _tup(s[0]), int(s[1])))
            tables[tid] = TableProgress(
                tid, ranges, _tup(t.get("ub")), t["rows"], t["chunks"], t.get("t0"), t.get("t1")
            )
        return cls(
            d["source"],
            d["snapshot_id"],
            Status(d["status"]),
            tables,
            d.get("t0"),
            d.get("t1"),
            d.get("active", 0.0),
            d.get("since"),
            d.get("error"),
            d.get("owner"),
            d.get("ld"),
        )


def _lst(k: tuple | None) -> list | None:
    return None if k is None else list(k)


def _tup(k: Any) -> tuple | None:
    return None if k is None else tuple(k)
