"""Snapshot progress: transitions, chunk recording, resume, JSON round trip, old versions."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.errors import StateError
from airflow_provider_cdc.core.formats import PROGRESS
from airflow_provider_cdc.core.planning import even_ranges
from airflow_provider_cdc.core.progress import TRANSITIONS, SnapshotProgress, Status, WorkItem
from airflow_provider_cdc.core.ranges import FULL_RANGE, ChunkRange

from .hyp import cases

T = "public.orders"
U = "shop.items"


def new(now: float = 1000.0) -> SnapshotProgress:
    return SnapshotProgress.start(
        "src", "snap1", {T: even_ranges(1, 100, 2), U: [FULL_RANGE]}, {T: (100,), U: ("zz",)}, now=now
    )


def chunk(table, rng, seq, after, last, rows, exhausted) -> ChunkResult:
    return ChunkResult("src", table, "snap1", seq, f"lw{seq}", f"hw{seq}", f"/p/{seq}", rng, after, last, rows, exhausted)


# --- transitions -------------------------------------------------------------------------------


VERBS = {
    Status.RUNNING: lambda p: p.resume(now=2000),
    Status.PAUSED: lambda p: p.pause(now=2000),
    Status.STOPPED: lambda p: p.stop(now=2000),
    Status.FAILED: lambda p: p.fail("boom", now=2000),
    Status.DONE: lambda p: p.finish(now=2000),
}


def in_status(status: Status) -> SnapshotProgress:
    p = SnapshotProgress.start("src", "snap1", {T: [FULL_RANGE]}, now=1000)
    p.record_chunk(chunk(T, FULL_RANGE, 0, None, (5,), 5, True), now=1500)
    path = {Status.RUNNING: [], Status.PAUSED: [Status.PAUSED], Status.STOPPED: [Status.STOPPED],
            Status.FAILED: [Status.FAILED], Status.DONE: [Status.DONE]}[status]
    for s in path:
        VERBS[s](p)
    assert p.status == status
    return p


@pytest.mark.parametrize("frm", list(Status))
@pytest.mark.parametrize("to", list(Status))
def test_transition_table(frm, to):
    p = in_status(frm)
    if to == frm or to in TRANSITIONS[frm]:
        VERBS[to](p)
        assert p.status == to
    else:
        with pytest.raises(StateError, match=f"snapshot snap1 of src: cannot go from {frm} to {to}; ") as exc:
            VERBS[to](p)
        assert p.status == frm  # nothing changed
        assert "Allowed now" in str(exc.value)


def test_invalid_transition_says_what_to_do():
    p = in_status(Status.STOPPED)
    with pytest.raises(StateError, match="a stopped snapshot is final; start a new snapshot"):
        p.resume()
    p = in_status(Status.DONE)
    with pytest.raises(StateError, match="the snapshot is done"):
        p.pause()


def test_finish_needs_every_range_done():
    p = new()
    with pytest.raises(StateError, match=r"cannot finish, ranges not done yet: \{'public.orders': 2, 'shop.items': 1\}"):
        p.finish()
    assert p.status == Status.RUNNING


def test_fail_keeps_the_error_and_resume_clears_it():
    p = new()
    p.fail("connection reset", now=1100)
    assert p.error == "connection reset" and not p.may_read
    p.resume(now=1200)
    assert p.error is None and p.may_read


# --- chunks and resume ---------------------------------------------------------------------------


def test_record_chunks_resume_and_coalesce():
    p = new()
    r0, r1 = p.tables[T].ranges[0].range, p.tables[T].ranges[1].range
    assert (r0, r1) == (ChunkRange(None, (51,)), ChunkRange((51,), None))
    assert p.next_work(T) == [WorkItem(T, r0, None), WorkItem(T, r1, None)]
    assert p.record_chunk(chunk(T, r0, 0, None, (10,), 10, False), now=1010)
    assert p.record_chunk(chunk(T, r1, 1, None, (60,), 10, False), now=1020)
    assert not p.record_chunk(chunk(T, r0, 0, None, (10,), 10, False), now=1030)  # retried record: ignored
    assert p.next_work(T) == [WorkItem(T, r0, (10,)), WorkItem(T, r1, (60,))]
    assert p.record_chunk(chunk(T, r1, 2, (60,), (100,), 40, True), now=1040)
    assert p.next_work(T) == [WorkItem(T, r0, (10,))]
    assert p.record_chunk(chunk(T, r0, 3, (10,), (50,), 40, True), now=1050)
    tp = p.tables[T]
    assert tp.done and tp.completed_ranges == [FULL_RANGE]  # coalesced into one
    assert (tp.rows, tp.chunks, tp.started_at, tp.updated_at) == (100, 4, 1010, 1050)
    assert tp.rows_per_second == pytest.approx(100 / 40)
    assert not p.record_chunk(chunk(T, r1, 9, (100,), None, 0, True))  # late duplicate of a done range
    assert p.next_work() == [WorkItem(U, FULL_RANGE, None)]
    assert p.record_chunk(chunk(U, FULL_RANGE, 4, None, None, 0, True), now=1060)
    p.finish(now=1070)
    assert p.status == Status.DONE and p.rows == 100 and p.chunks == 5
    assert p.rows_per_second() == pytest.approx(100 / 70)


def test_record_refuses_a_skipped_chunk_or_a_foreign_range():
    p = new()
    r0 = p.tables[T].ranges[0].range
    p.record_chunk(chunk(T, r0, 0, None, (10,), 10, False))
    with pytest.raises(StateError, match=r"read after key \(20,\) but the last committed key .* is \(10,\)"):
        p.record_chunk(chunk(T, r0, 1, (20,), (30,), 10, False))
    with pytest.raises(StateError, match="does not belong to this snapshot's plan"):
        p.record_chunk(chunk(T, ChunkRange(None, (40,)), 1, (10,), (30,), 10, False))
    with pytest.raises(StateError, match="has no table 'x.y'"):
        p.record_chunk(chunk("x.y", r0, 1, None, None, 0, True))


def test_in_flight_chunk_is_recorded_while_paused_but_not_after_stop():
    p = new()
    r0 = p.tables[T].ranges[0].range
    p.pause()
    assert not p.may_read
    assert p.record_chunk(chunk(T, r0, 0, None, (10,), 10, False))
    p.stop()
    with pytest.raises(StateError, match="is stopped: cannot record chunk seq 1"):
        p.record_chunk(chunk(T, r0, 1, (10,), (20,), 10, False))


def test_active_time_excludes_pauses():
    p = new(now=0)
    p.pause(now=10)
    p.resume(now=100)
    p.record_chunk(chunk(T, p.tables[T].ranges[0].range, 0, None, (10,), 200, False), now=110)
    assert p.rows_per_second(now=110) == pytest.approx(200 / 20)


# --- JSON -------------------------------------------------------------------------------------------


def test_json_round_trip_is_compact():
    p = new()
    r0 = p.tables[T].ranges[0].range
    p.record_chunk(chunk(T, r0, 0, None, (10,), 10, False), now=1010)
    p.record_chunk(chunk(T, p.tables[T].ranges[1].range, 1, None, (99,), 49, True), now=1011)
    p.pause(now=1012)
    text = p.to_json()
    assert json.loads(text)["version"] == PROGRESS.version and " " not in text.replace("public.orders", "")
    q = SnapshotProgress.from_json(text)
    assert q == p and q.to_json() == text


key_st = st.one_of(st.tuples(st.integers()), st.tuples(st.text(max_size=5), st.integers(0, 9)))


@cases(scale=0.1)
@given(st.lists(st.sampled_from(["rec", "done", "pause", "resume", "fail"]), max_size=30), st.integers(1, 30))
def test_json_round_trip_any_state(steps, nranges):
    p = SnapshotProgress.start("s", "id", {T: even_ranges(0, 1000, nranges)}, {T: (1000,)}, now=0)
    seq = 0
    for i, step in enumerate(steps):
        work = p.next_work(T)
        if step in ("rec", "done") and work and p.status != Status.STOPPED:
            w = work[i % len(work)]
            last = (w.after_key[0] + 1,) if w.after_key else (w.range.start[0] if w.range.start else 0,)
            p.record_chunk(chunk(T, w.range, seq, w.after_key, last, 1, step == "done"), now=i)
            seq += 1
        elif step in ("pause", "resume", "fail"):
            to = {"pause": Status.PAUSED, "resume": Status.RUNNING, "fail": Status.FAILED}[step]
            if to in TRANSITIONS[p.status]:
                getattr(p, step)(*(["x"] if step == "fail" else []), now=i)
        q = SnapshotProgress.from_json(p.to_json())
        assert q == p
    # coalesced: no two adjacent done ranges survive, and the ranges still tile the key space
    rs = p.tables[T].ranges
    assert not any(a.done and b.done for a, b in zip(rs, rs[1:], strict=False))
    assert rs[0].range.start is None and rs[-1].range.end is None
    assert all(a.range.end == b.range.start for a, b in zip(rs, rs[1:], strict=False))


def test_a_finished_large_plan_stays_small():
    p = SnapshotProgress.start("s", "id", {T: even_ranges(0, 10**9, 256)}, now=0)
    for i, w in enumerate(p.next_work(T)):
        p.record_chunk(chunk(T, w.range, i, None, (i,), 10, True))
    assert len(p.to_json()) < 300


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"version": 99}', "format version 99, written by a newer airflow-provider-cdc .*Upgrade"),
        ('{"version": 1}', "format version 1, which this airflow-provider-cdc does not read .*Move the snapshot"),
        ("{}", "no format version"),
        ("not json", "not JSON"),
    ],
)
def test_unreadable_progress_is_a_clear_error(text, message):
    with pytest.raises(StateError, match=f"^control/x: .*{message}"):
        SnapshotProgress.from_json(text, "control/x")


def test_record_accepts_chunk_result_from_xcom_dict():
    p = new()
    r0 = p.tables[T].ranges[0].range
    res = ChunkResult.from_dict(json.loads(json.dumps(chunk(T, r0, 0, None, (10,), 10, False).to_dict())))
    assert p.record_chunk(res) and p.next_work(T)[0].after_key == (10,)
    assert not p.record_chunk(replace(res, rows=99))


def test_json_round_trip_keeps_ranges_with_gaps():
    """Chosen key ranges need not touch: [1, 501) and [2501, end). Stored as edges they came
    back as [1, 501) and [501, end), so the chunks of the second range matched no range of
    the plan and were dropped as 'recorded before': the snapshot never finished."""
    ranges = [ChunkRange((1,), (501,)), ChunkRange((2501,), None)]
    p = SnapshotProgress.start("s", "id", {T: ranges}, {T: (3000,)}, now=0)
    q = SnapshotProgress.from_json(p.to_json())
    assert [r.range for r in q.tables[T].ranges] == ranges and q == p
    assert q.record_chunk(chunk(T, ranges[1], 0, None, (2700,), 200, False), now=1)
    assert q.record_chunk(chunk(T, ranges[0], 1, None, (500,), 500, True), now=2)
    q = SnapshotProgress.from_json(q.to_json())
    assert [(r.range, r.done, r.last_key) for r in q.tables[T].ranges] == [
        (ranges[0], True, None), (ranges[1], False, (2700,))]
    q.record_chunk(chunk(T, ranges[1], 2, (2700,), (3000,), 300, True), now=3)
    assert SnapshotProgress.from_json(q.to_json()) == q and all(r.done for r in q.tables[T].ranges)
