"""A reference model of a source database running DBLog chunks among concurrent writers.

Used by the window property tests (and reusable by anyone who must prove a merge agrees
with :func:`core.window.merge_window`, e.g. the Spark job). The model:

* a database of tables ``key -> row``; a transaction buffers its writes and applies them
  at commit (what other sessions see under MVCC); committed changes go to the log at
  ``Position(commit number, 0, index in transaction)``, i.e. in commit order;
* rolled-back transactions leave no trace; writes are upserts (insert or update) and
  deletes, on a small key space so keys are deleted and reused often;
* a chunk worker per planned key range runs DBLog steps 1-3 as separate steps (low
  watermark commit, non-stale SELECT of committed rows, high watermark commit), keyset
  chunk after chunk until a chunk comes back short; an attempt may fail after any step
  (its watermarks stay in the log as orphans) and is retried with fresh ids;
* a scheduler interleaves all steps of all actors in an order drawn by hypothesis.

:func:`check_invariants` checks I1 (no r row is stale: it equals the source row as of its
high watermark, and per key output positions strictly grow) and I2 (the mirror built from
the log after the capture start plus the merged r events equals the source).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from airflow_provider_cdc.core.events import ChangeEvent, LogEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import encode_key
from airflow_provider_cdc.core.window import WindowChunk, mirror_apply, mirror_rows

TABLES = ("public.t", "app.u")
NKEYS = 12
FAIL_MODES = ("lw", "read", "hw")  # attempt dies after this step; "hw" = result lost after hw


def ek(k: int) -> str:
    return encode_key([k])


@dataclass
class Database:
    tables: dict[str, dict[int, dict]] = field(default_factory=lambda: {t: {} for t in TABLES})
    log: list[LogEvent] = field(default_factory=list)
    commits: int = 0
    wm_seq: int = 0

    def commit(self, changes: Sequence[tuple[str, str, int, int]]) -> None:
        """Apply a transaction's buffered writes and log them at its commit position."""
        self.commits += 1
        idx = 0
        for table, kind, key, val in changes:
            rows = self.tables[table]
            cur = rows.get(key)
            if kind == "w":
                row = {"id": key, "v": val}
                rows[key] = row
                op = "u" if cur is not None else "c"
                self.log.append(ChangeEvent(table, op, ek(key), Position(self.commits, 0, idx), cur, row, self.commits))
                idx += 1
            elif cur is not None:  # delete of a missing row changes nothing
                del rows[key]
                self.log.append(ChangeEvent(table, "d", ek(key), Position(self.commits, 0, idx), cur, None, self.commits))
                idx += 1
        if idx == 0:
            self.commits -= 1  # an empty transaction writes no commit record

    def watermark(self) -> str:
        self.wm_seq += 1
        self.commits += 1
        wid = f"wm-{self.wm_seq:04d}"
        self.log.append(WatermarkEvent(wid, Position(self.commits, 0, 0), self.commits))
        return wid

    def select(self, table: str, lo: int | None, hi: int | None, after: int | None, limit: int) -> list[tuple[int, dict]]:
        """Non-stale keyset read of committed rows: ``key > after`` inside [lo, hi), key order."""
        keys = sorted(
            k
            for k in self.tables[table]
            if (lo is None or k >= lo) and (hi is None or k < hi) and (after is None or k > after)
        )
        return [(k, dict(self.tables[table][k])) for k in keys[:limit]]


class Txn:
    def __init__(self, ops: list[tuple[str, str, int, int]], abort: bool):
        self.ops, self.abort, self.step = ops, abort, 0

    def advance(self, db: Database) -> bool:
        """One step; True when finished."""
        if self.step < len(self.ops):
            self.step += 1  # the write executes; invisible to others until commit
            return False
        if not self.abort:
            db.commit(self.ops)
        return True


class ChunkWorker:
    """Keyset chunks over one planned range [lo, hi), with failing attempts retried."""

    def __init__(self, table: str, lo: int | None, hi: int | None, limit: int, failures: list[str]):
        self.table, self.lo, self.hi, self.limit = table, lo, hi, limit
        self.failures = list(failures)
        self.after: int | None = None
        self.phase = "lw"
        self.lw = self.hw = ""
        self.rows: list[tuple[int, dict]] = []
        self.results: list[WindowChunk] = []
        self.orphans: list[str] = []

    def advance(self, db: Database) -> bool:
        if self.phase == "lw":
            self.lw, step, self.phase = db.watermark(), "lw", "read"  # step 1
        elif self.phase == "read":
            self.rows = db.select(self.table, self.lo, self.hi, self.after, self.limit)  # step 2
            step, self.phase = "read", "hw"
        else:
            self.hw, step, self.phase = db.watermark(), "hw", "done"  # step 3
        if self.failures and self.failures[0] == step:
            # the attempt dies right after this step; its watermarks stay in the log as
            # orphans and the retry starts over with fresh ids
            self.failures.pop(0)
            self.orphans += [w for w in (self.lw, self.hw) if w]
            self.phase, self.lw, self.hw, self.rows = "lw", "", "", []
            return False
        if self.phase != "done":
            return False
        self.results.append(
            WindowChunk(self.table, self.lw, self.hw, [(ek(k), r) for k, r in self.rows], name=f"{self.table}#{len(self.results)}")
        )
        if len(self.rows) < self.limit:
            return True
        self.after = self.rows[-1][0]
        self.phase, self.lw, self.hw, self.rows = "lw", "", "", []
        return False


@dataclass
class Run:
    db: Database
    start: int  # log index where the capture starts (the mirror sees log[start:])
    chunks: list[WindowChunk]
    orphans: list[str]

    @property
    def captured(self) -> list[LogEvent]:
        return self.db.log[self.start :]


def ranges_from(boundaries: Sequence[int]) -> list[tuple[int | None, int | None]]:
    b = sorted(set(boundaries))
    edges: list[int | None] = [None, *b, None]
    return list(zip(edges[:-1], edges[1:], strict=True))


def simulate(
    initial: dict[str, dict[int, int]],
    before: list[tuple[list, bool]],
    txns: list[tuple[list, bool]],
    plans: dict[str, tuple[list[int], int, list[list[str]]]],
    choices: list[int],
) -> Run:
    """``initial`` is loaded and ``before`` transactions commit before the capture starts;
    then ``txns`` and one chunk worker per planned range run interleaved by ``choices``.
    ``plans``: table -> (range boundaries, chunk limit, failure modes per range)."""
    db = Database()
    for table, rows in initial.items():
        if rows:
            db.commit([(table, "w", k, v) for k, v in sorted(rows.items())])
    for ops, abort in before:
        if not abort:
            db.commit(ops)
    start = len(db.log)
    workers: list[ChunkWorker] = []
    for table, (bounds, limit, failures) in plans.items():
        for i, (lo, hi) in enumerate(ranges_from(bounds)):
            workers.append(ChunkWorker(table, lo, hi, limit, failures[i] if i < len(failures) else []))
    actors: list = [Txn(list(ops), abort) for ops, abort in txns] + list(workers)
    it = iter(choices)
    while actors:
        i = next(it, 0) % len(actors)
        if actors[i].advance(db):
            actors.pop(i)
    chunks = [c for w in workers for c in w.results]
    orphans = [o for w in workers for o in w.orphans]
    return Run(db, start, chunks, orphans)


# --- hypothesis strategies ------------------------------------------------------------

op_st = st.tuples(
    st.sampled_from(TABLES), st.sampled_from(("w", "w", "d")), st.integers(0, NKEYS - 1), st.integers(0, 99)
)
txn_st = st.tuples(st.lists(op_st, min_size=1, max_size=4), st.integers(0, 5).map(lambda x: x == 0))


@st.composite
def scenarios(draw) -> dict:
    initial = {t: draw(st.dictionaries(st.integers(0, NKEYS - 1), st.integers(0, 99), max_size=NKEYS)) for t in TABLES}
    plans = {}
    for t in TABLES:
        bounds = draw(st.lists(st.integers(1, NKEYS - 1), max_size=3, unique=True))
        limit = draw(st.integers(1, 6))
        failures = draw(st.lists(st.lists(st.sampled_from(FAIL_MODES), max_size=2), max_size=len(bounds) + 1))
        plans[t] = (bounds, limit, failures)
    return dict(
        initial=initial,
        before=draw(st.lists(txn_st, max_size=3)),
        txns=draw(st.lists(txn_st, max_size=10)),
        plans=plans,
        choices=draw(st.lists(st.integers(0, 63), max_size=150)),
    )


# --- invariants -------------------------------------------------------------------------


def state_at(log: Sequence[LogEvent]) -> Callable[[str, str, Position], dict | None]:
    """``f(table, key, pos)`` -> the source row as of just before ``pos`` (None = absent)."""
    hist: dict[tuple[str, str], list[tuple[Position, dict | None]]] = defaultdict(list)
    for ev in log:
        if isinstance(ev, ChangeEvent):
            hist[(ev.table, ev.key)].append((ev.position, ev.after))

    def f(table: str, key: str, pos: Position) -> dict | None:
        row = None
        for p, after in hist.get((table, key), ()):
            if p < pos:
                row = after
        return row

    return f


def check_invariants(run: Run, merged: list[ChangeEvent], log_view: Sequence[LogEvent] | None = None) -> None:
    """Raise AssertionError when I1 or I2 does not hold for ``merged``."""
    log_view = run.captured if log_view is None else log_view
    # I1 (a): an r row equals the source row as of its high watermark: never stale
    as_of = state_at(run.db.log)
    for ev in merged:
        assert ev.op == "r" and ev.snapshot and ev.before is None, ev
        src = as_of(ev.table, ev.key, ev.position)
        assert ev.after == src, f"stale r row {ev.table} {ev.key} at {ev.position}: {ev.after} but source had {src}"
    # I1 (b): per key, positions strictly grow in the output stream sorted by position
    seen: set[tuple[str, str, Position]] = set()
    stream = sorted({(e.table, e.key, e.position): e for e in log_view if isinstance(e, ChangeEvent)}.values(),
                    key=lambda e: e.position)
    stream = sorted([*stream, *merged], key=lambda e: e.position)
    last: dict[tuple[str, str], Position] = {}
    for ev in stream:
        k = (ev.table, ev.key)
        assert (ev.table, ev.key, ev.position) not in seen, f"two events for {k} at {ev.position}"
        seen.add((ev.table, ev.key, ev.position))
        assert k not in last or last[k] < ev.position, f"position went back for {k}"
        last[k] = ev.position
    # I2: the mirror equals the source, whatever order the events are applied in
    mirror = mirror_apply({}, stream)
    backwards = mirror_apply({}, reversed(stream))
    assert backwards == mirror, "mirror depends on apply order"
    for table in TABLES:
        want = {ek(k): row for k, row in run.db.tables[table].items()}
        got = mirror_rows(mirror, table)
        assert got == want, f"I2: mirror of {table} differs from source: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}, different {sorted(k for k in set(want) & set(got) if want[k] != got[k])}"
