"""The DBLog window merge (steps 4 and 5, docs/DESIGN.md "One chunk of a snapshot"), written
once on Arrow tables: :func:`window_survivors` (step 4) and :func:`read_events` (step 5), which
every engine calls per chunk, and :func:`merge_window`, the event-object form the property
tests drive. A window not closed yet raises :class:`NotReadyError`: never emit early.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from .errors import NotReadyError, WatermarkError
from .events import WATERMARK_OP, ChangeEvent, LogEvent, Op, WatermarkEvent
from .position import Position, just_before, marked_position
from .visibility import ReplayedBefore, first_invisible, parse_visibility

Rows = Mapping[str, dict] | Iterable[tuple[str, dict]]


@dataclass(frozen=True)
class WindowChunk:
    """One chunk as the merge needs it.

    ``table``: TableName.id; ``low_watermark`` / ``high_watermark``: the ids the chunk
    task wrote (ChunkResult.low_watermark / high_watermark); ``rows``: the chunk's rows
    as canonical key -> canonical after-row (a mapping) or as ``(key, after)`` pairs
    (e.g. straight from the staged chunk file), in key order. ``name`` only labels errors
    (e.g. the staged chunk path or ``seq``).
    """

    table: str
    low_watermark: str
    high_watermark: str
    rows: Rows
    name: str = ""
    #: PostgreSQL: the snapshot the chunk read (core/visibility.py); the window then also drops the
    #: keys of every transaction before its high watermark that this snapshot did not see
    visibility: str | None = None

    @classmethod
    def from_result(cls, result: Any, rows: Rows) -> WindowChunk:
        """From a :class:`core.chunk.ChunkResult` (or anything with its fields) and its rows."""
        return cls(
            result.table,
            result.low_watermark,
            result.high_watermark,
            rows,
            f"seq {result.seq} ({result.path})",
            getattr(result, "visibility", None),
        )

    @property
    def label(self) -> str:
        return f"chunk {self.name or self.high_watermark} of table {self.table}"


class WatermarkHit(NamedTuple):
    position: Position
    ts_ms: int


#: the op of a TRUNCATE in a log table (no key: every key of its table changed)
TRUNCATE_OP = Op.TRUNCATE.value


def window_survivors(rows: pa.Table, changes: pa.Table, *, table: str, low: str, high: str) -> pa.Table:
    """DBLog step 4 for one chunk, on Arrow.

    ``rows``: the chunk's rows (a ``key`` column; others are carried along).
    ``changes``: log rows (``table``, ``op``, ``key``, ``position`` as encoded positions,
    which sort as strings) covering at least the chunk's window; rows of other tables or
    outside the window may be present and are ignored, watermark rows (``op = "w"``) too.
    ``low`` / ``high``: the encoded positions of the chunk's low and high watermark.

    Returns the rows whose key has no change strictly between ``low`` and ``high``; no row
    at all when a TRUNCATE of ``table`` lies between them (every key changed).
    """
    pos = changes["position"]
    inside = changes.filter(
        pc.and_(pc.equal(changes["table"], table), pc.and_(pc.greater(pos, low), pc.less(pos, high)))
    )
    ops = inside["op"]
    if inside.num_rows and pc.any(pc.equal(ops, TRUNCATE_OP)).as_py():
        return rows.slice(0, 0)
    keyed = inside.filter(pc.not_equal(ops, WATERMARK_OP)) if inside.num_rows else inside
    if not keyed.num_rows:
        return rows
    conflicts = pc.unique(keyed["key"].combine_chunks())
    return rows.filter(pc.invert(pc.is_in(rows["key"], value_set=conflicts)))


def read_events(
    survivors: pa.Table,
    schema: pa.Schema,
    *,
    table: str,
    high: str,
    high_ts_ms: int,
    watermark: str,
    batch: str,
) -> pa.Table:
    """DBLog step 5 for one chunk, on Arrow: its surviving rows as ``op = "r"`` events at the
    high watermark's position, in ``schema`` (the event schema of the sinks, sinks/base.py:
    position, table, op, key, before, after, ts_ms, watermark, snapshot, batch)."""
    n = survivors.num_rows
    const = {
        "position": pa.scalar(high, pa.string()),
        "table": pa.scalar(table, pa.string()),
        "op": pa.scalar(Op.READ.value, pa.string()),
        "ts_ms": pa.scalar(int(high_ts_ms), pa.int64()),
        "watermark": pa.scalar(watermark, pa.string()),
        "snapshot": pa.scalar(True, pa.bool_()),
        "batch": pa.scalar(batch, pa.string()),
    }
    cols = []
    for f in schema:
        if f.name in const:
            cols.append(pa.repeat(const[f.name].cast(f.type), n))
        elif f.name == "before" or f.name not in survivors.column_names:  # no before-image, no origin
            cols.append(pa.nulls(n, f.type))
        else:
            cols.append(survivors[f.name].cast(f.type))
    return pa.table(cols, schema=schema)


def locate_watermarks(log_events: Iterable[LogEvent], ids: Iterable[str]) -> dict[str, Position]:
    """Position of each of ``ids`` found among the watermark events of ``log_events``.

    An id seen more than once (a re-delivered segment) counts at its earliest position.
    Ids not found are absent from the result.
    """
    return {i: hit.position for i, hit in _locate(log_events, set(ids)).items()}


def _locate(log_events: Iterable[LogEvent], wanted: set[str]) -> dict[str, WatermarkHit]:
    # a position mark names its place itself; that the log given covers it is the caller's check
    found: dict[str, WatermarkHit] = {
        i: WatermarkHit(*hit) for i in wanted if (hit := marked_position(i)) is not None
    }
    for ev in log_events:
        if type(ev) is WatermarkEvent and ev.id in wanted:
            prev = found.get(ev.id)
            if prev is None or ev.position < prev.position:
                found[ev.id] = WatermarkHit(ev.position, ev.ts_ms)
    return found


def _window(chunk: WindowChunk, found: Mapping[str, WatermarkHit]) -> tuple[WatermarkHit, WatermarkHit]:
    lw = found.get(chunk.low_watermark)
    hw = found.get(chunk.high_watermark)
    if hw is None:
        state = "its low watermark is there" if lw is not None else "nor is its low watermark"
        raise NotReadyError(
            f"{chunk.label}: high watermark {chunk.high_watermark!r} is not in the changelog yet ({state}); "
            "capture the changelog past it (the high-watermark sensor waits for this) and merge again"
        )
    if lw is None:
        raise WatermarkError(
            f"{chunk.label}: high watermark {chunk.high_watermark!r} is in the changelog at "
            f"{hw.position} but its "
            f"low watermark {chunk.low_watermark!r} is not; the changelog given to the merge must "
            "start before "
            "the chunk's low watermark (was a segment removed or the capture started after the chunk?). "
            "Re-read this chunk"
        )
    if not (
        lw.position < hw.position or (lw.position == hw.position and marked_position(chunk.low_watermark))
    ):
        raise WatermarkError(
            f"{chunk.label}: low watermark {chunk.low_watermark!r} at {lw.position} is not before high "
            "watermark "
            f"{chunk.high_watermark!r} at {hw.position}; the watermark ids are mixed up. Re-read this chunk"
        )
    return lw, hw


def lowered_low(visibility: str | None, low: str, high: str, log: Callable[[str], tuple]) -> str:
    """The low end of a chunk's window once the transactions its snapshot did not see are in it:
    ``low``, or just before the first event below ``high`` of a transaction that ``visibility``
    (core/visibility.py) does not see, when that is earlier. ``log(high)``: the staged
    (position, tx) arrays that may hold such events. Every engine's window starts here."""
    if not visibility:
        return low
    seen = parse_visibility(visibility)
    if isinstance(seen, ReplayedBefore):  # a standby's chunk: every commit from the replay position on
        return min(low, seen.window_floor.encode())
    positions, txs = log(high)
    first = first_invisible(positions, txs, seen, high)
    if first is None or first > low:
        return low
    return just_before(Position.decode(first)).encode()


def merge_window(chunks: Sequence[WindowChunk], log_events: Iterable[LogEvent]) -> list[ChangeEvent]:
    """DBLog steps 4-5 for a round of chunks; returns the surviving rows as ``r`` events.

    Input: ``chunks`` (see :class:`WindowChunk`) and ``log_events``: the staged changelog
    (``ChangeEvent`` / ``WatermarkEvent``), covering every chunk's window, in position
    order (duplicates allowed; the result does not depend on their order).

    Output: for each chunk in order of its high watermark position, its surviving rows in
    the chunk's row order, each as ``ChangeEvent(table, op="r", key, position=hw position,
    before=None, after=row, ts_ms=hw event's ts_ms, snapshot=True, watermark=hw id)``.

    Raises :class:`NotReadyError` when a high watermark is not in the log, and
    :class:`WatermarkError` when a low watermark is missing or not before its high
    watermark; nothing is emitted then, for any chunk of the round.
    """
    with _gc_paused():  # many small objects, no cycles: the cyclic GC would only rescan the heap
        windows, rows_of, gone_of = _step4(chunks, log_events)
        out: list[ChangeEvent] = []
        read = Op.READ.value
        for i in sorted(range(len(chunks)), key=lambda j: windows[j][1].position):
            # step 5: survivors at the high watermark
            chunk, hw, rows, gone = chunks[i], windows[i][1], rows_of[i], gone_of[i]
            table, hw_id, hw_pos, ts = chunk.table, chunk.high_watermark, hw.position, hw.ts_ms
            if gone:
                out += [
                    ChangeEvent(table, read, k, hw_pos, None, a, ts, True, hw_id)
                    for k, a in rows.items()
                    if k not in gone
                ]
            else:
                out += [
                    ChangeEvent(table, read, k, hw_pos, None, a, ts, True, hw_id) for k, a in rows.items()
                ]
    return out


def window_drops(chunks: Sequence[WindowChunk], log_events: Iterable[LogEvent]) -> list[set[str]]:
    """DBLog step 4 only: per chunk (in the given order), the keys its window removes.
    Same checks and errors as :func:`merge_window`."""
    with _gc_paused():
        return _step4(chunks, log_events)[2]


def _step4(
    chunks: Sequence[WindowChunk], log_events: Iterable[LogEvent]
) -> tuple[list[tuple[WatermarkHit, WatermarkHit]], list[Mapping[str, dict]], list[set[str]]]:
    events = log_events if isinstance(log_events, (list, tuple)) else list(log_events)
    wanted = {c.low_watermark for c in chunks} | {c.high_watermark for c in chunks}
    found = _locate(events, wanted)
    windows = [_window(c, found) for c in chunks]  # raises before anything is emitted
    if not chunks:
        return [], [], []
    # the log side as Arrow, once: every engine's step 4 is window_survivors
    change_events = [ev for ev in events if type(ev) is ChangeEvent]
    changes = pa.table(
        {
            "position": pa.array([ev.position.encode() for ev in change_events], pa.string()),
            "table": pa.array([ev.table for ev in change_events], pa.string()),
            "op": pa.array([ev.op for ev in change_events], pa.string()),
            "key": pa.array([ev.key for ev in change_events], pa.string()),
            "tx": pa.array([ev.origin[0] if ev.origin else None for ev in change_events], pa.string()),
        }
    )
    rows_of: list[Mapping[str, dict]] = []
    gone_of: list[set[str]] = []
    for chunk, (lw, hw) in zip(chunks, windows, strict=True):
        rows = chunk.rows if isinstance(chunk.rows, Mapping) else dict(chunk.rows)
        keys = pa.table({"key": pa.array(list(rows), pa.string())})
        low = lowered_low(
            chunk.visibility,
            lw.position.encode(),
            hw.position.encode(),
            lambda before: (changes["position"], changes["tx"]),
        )
        kept = window_survivors(keys, changes, table=chunk.table, low=low, high=hw.position.encode())
        rows_of.append(rows)
        gone_of.append(set(rows) - set(kept["key"].to_pylist()) if kept.num_rows != len(rows) else set())
    return windows, rows_of, gone_of


@contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# --- reference mirror semantics ---------------------------------------------------------


class MirrorRow(NamedTuple):
    """The mirror's state of one key: the position it was written at and the row
    (``None`` = tombstone of a delete, kept so an older event cannot resurrect the row)."""

    position: Position
    after: dict | None


MirrorState = MutableMapping[tuple[str, str], MirrorRow]


def mirror_apply(state: MirrorState, events: Iterable[ChangeEvent]) -> MirrorState:
    """Apply events to ``state`` ((table, key) -> MirrorRow) the way every sink must.

    An event is applied only if its position is newer than the stored one, so writers in
    any order and re-deliveries converge to the same state; a delete becomes a tombstone.
    A TRUNCATE (``t``) at P removes every row of its table older than P and leaves the
    table's horizon ``(table, None) -> MirrorRow(P, None)``: no event older than P is
    applied to that table any more. Returns ``state`` (changed in place).
    """
    delete, truncate = Op.DELETE.value, Op.TRUNCATE.value
    for ev in events:
        horizon = state.get((ev.table, None))
        if horizon is not None and not ev.position > horizon.position:
            continue
        if ev.op == truncate:
            for k in [
                k
                for k, v in state.items()
                if k[0] == ev.table and k[1] is not None and v.position < ev.position
            ]:
                del state[k]
            state[(ev.table, None)] = MirrorRow(ev.position, None)
            continue
        k = (ev.table, ev.key)
        cur = state.get(k)
        if cur is not None and not ev.position > cur.position:
            continue
        state[k] = MirrorRow(ev.position, None if ev.op == delete else ev.after)
    return state


def mirror_rows(state: Mapping[tuple[str, str], MirrorRow], table: str | None = None) -> dict[Any, dict]:
    """The live rows of a mirror state (tombstones left out): ``key -> row`` for one
    ``table``, or ``(table, key) -> row`` for all."""
    if table is None:
        return {k: v.after for k, v in state.items() if v.after is not None}
    return {k[1]: v.after for k, v in state.items() if v.after is not None and k[0] == table}
