"""DBLog window merge: hand-written cases, and property tests against the reference model
(tests/unit/core/dblog_model.py) that check I1 and I2 over random interleavings."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.errors import NotReadyError, WatermarkError
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.window import (
    MirrorRow,
    WindowChunk,
    locate_watermarks,
    merge_window,
    mirror_apply,
    mirror_rows,
    window_drops,
)

from . import dblog_model as model
from .hyp import cases

T = "public.t"


def P(n: int, i: int = 0) -> Position:
    return Position(n, 0, i)


def upd(n: int, key: int, v: int, table: str = T, op: str = "u") -> ChangeEvent:
    return ChangeEvent(table, op, model.ek(key), P(n), None, None if op == "d" else {"id": key, "v": v})


def wm(wid: str, n: int, ts: int = 0) -> WatermarkEvent:
    return WatermarkEvent(wid, P(n), ts)


def rows(*keys: int, v: int = 0) -> dict:
    return {model.ek(k): {"id": k, "v": v} for k in keys}


def keys_of(events) -> list[str]:
    return [e.key for e in events]


# --- hand-written cases ---------------------------------------------------------------


def test_key_changed_inside_window_is_dropped_others_survive_at_hw():
    log = [upd(1, 1, 5), wm("lw", 2), upd(3, 2, 6), wm("hw", 4, ts=99), upd(5, 3, 7)]
    out = merge_window([WindowChunk(T, "lw", "hw", rows(1, 2, 3))], log)
    assert keys_of(out) == ["[1]", "[3]"]  # 1 changed before lw, 3 after hw: both kept
    for ev in out:
        assert (ev.op, ev.snapshot, ev.watermark, ev.position, ev.ts_ms, ev.before) == ("r", True, "hw", P(4), 99, None)
    assert out[0].after == {"id": 1, "v": 0}


def test_delete_and_insert_in_window_drop_the_key():
    log = [wm("lw", 1), upd(2, 1, 0, op="d"), upd(3, 2, 9, op="c"), wm("hw", 4)]
    assert merge_window([WindowChunk(T, "lw", "hw", rows(1, 2, 3))], log) == merge_window(
        [WindowChunk(T, "lw", "hw", rows(3))], log
    )


def test_same_key_in_another_table_does_not_drop():
    log = [wm("lw", 1), upd(2, 1, 5, table="public.other"), wm("hw", 3)]
    assert keys_of(merge_window([WindowChunk(T, "lw", "hw", rows(1))], log)) == ["[1]"]


def test_rows_as_pairs_or_mapping_give_the_same_result():
    log = [wm("lw", 1), upd(2, 2, 5), wm("hw", 3)]
    r = rows(1, 2, 3)
    assert merge_window([WindowChunk(T, "lw", "hw", list(r.items()))], log) == merge_window([WindowChunk(T, "lw", "hw", r)], log)


def test_orphan_watermarks_of_failed_attempts_are_ignored():
    # attempt 1 wrote lw1 and died; attempt 2 wrote lw1b..hw1b and is the chunk
    log = [wm("lw1", 1), upd(2, 1, 5), wm("lw1b", 3), upd(4, 2, 5), wm("hw1b", 5), wm("orphan-hw", 6)]
    out = merge_window([WindowChunk(T, "lw1b", "hw1b", rows(1, 2, 3))], log)
    assert keys_of(out) == ["[1]", "[3]"]


def test_duplicate_segment_first_position_counts():
    seg = [wm("lw", 1), upd(2, 1, 5), wm("hw", 3)]
    later = [upd(4, 2, 5), wm("lw", 5), upd(6, 3, 1), wm("hw", 7)]  # ids seen again later
    out = merge_window([WindowChunk(T, "lw", "hw", rows(1, 2, 3))], seg + later + seg)
    assert keys_of(out) == ["[2]", "[3]"] and out[0].position == P(3)
    assert locate_watermarks(seg + later, ["lw", "hw", "nope"]) == {"lw": P(1), "hw": P(3)}
    assert locate_watermarks(later + seg, ["hw"]) == {"hw": P(3)}  # earliest, whatever the order


def test_parallel_chunks_with_overlapping_windows_in_any_order():
    a = WindowChunk(T, "lwA", "hwA", rows(1, 2), name="A")
    b = WindowChunk(T, "lwB", "hwB", rows(10, 11), name="B")
    c = WindowChunk("app.u", "lwC", "hwC", rows(1, 2), name="C")
    log = [wm("lwB", 1), wm("lwA", 2), upd(3, 11, 0), upd(4, 1, 0), wm("hwB", 5), upd(6, 2, 0),
           wm("lwC", 7), wm("hwA", 8), upd(9, 1, 0, table="app.u"), wm("hwC", 10)]
    out = merge_window([c, a, b], log)
    assert [(e.table, e.key, e.watermark) for e in out] == [
        (T, "[10]", "hwB"), ("app.u", "[2]", "hwC")
    ]
    # a round gives the same as each chunk alone
    alone = [e for ch in (a, b, c) for e in merge_window([ch], log)]
    assert sorted(alone, key=lambda e: (e.position, e.key)) == sorted(out, key=lambda e: (e.position, e.key))


def test_high_watermark_not_in_log_is_not_ready_and_nothing_is_emitted():
    log = [wm("lwA", 1), wm("hwA", 2), wm("lwB", 3)]
    a = WindowChunk(T, "lwA", "hwA", rows(1), name="A")
    b = WindowChunk(T, "lwB", "hwB", rows(2), name="B")
    with pytest.raises(NotReadyError, match=r"chunk B of table public\.t: high watermark 'hwB' is not in the changelog yet"):
        merge_window([a, b], log)
    with pytest.raises(NotReadyError, match="nor is its low watermark"):
        merge_window([WindowChunk(T, "x", "y", rows(1))], log)


def test_low_watermark_missing_or_after_high_is_a_watermark_error():
    a = WindowChunk(T, "lw", "hw", rows(1), name="A")
    with pytest.raises(WatermarkError, match=r"chunk A .* low watermark 'lw' is not") as exc:
        merge_window([a], [wm("hw", 2)])
    assert not isinstance(exc.value, NotReadyError)
    with pytest.raises(WatermarkError, match="is not before high watermark"):
        merge_window([a], [wm("hw", 2), wm("lw", 3)])


def test_empty_inputs():
    assert merge_window([], [wm("x", 1)]) == []
    assert merge_window([WindowChunk(T, "lw", "hw", {})], [wm("lw", 1), wm("hw", 2)]) == []


def test_mirror_apply_newer_wins_and_tombstones_block_older_writes():
    ins = ChangeEvent(T, "c", "[1]", P(1), None, {"v": 1})
    dele = ChangeEvent(T, "d", "[1]", P(3), {"v": 1}, None)
    stale = ChangeEvent(T, "r", "[1]", P(2), None, {"v": 2}, snapshot=True)
    same = ChangeEvent(T, "u", "[1]", P(3), None, {"v": 9})
    st_ = mirror_apply({}, [ins, dele, stale, same])
    assert st_ == {(T, "[1]"): MirrorRow(P(3), None)}
    assert mirror_rows(st_) == {} and mirror_rows(mirror_apply({}, [stale, ins]), T) == {"[1]": {"v": 2}}


# --- the reference model: I1 and I2 -------------------------------------------------------


def _run(sc: dict) -> model.Run:
    return model.simulate(sc["initial"], sc["before"], sc["txns"], sc["plans"], sc["choices"])


@pytest.mark.slow  # tens of seconds (pytest --durations)
@cases(scale=1.0)
@given(model.scenarios())
def test_reference_model_invariants_hold(sc):
    run = _run(sc)
    merged = merge_window(run.chunks, run.captured)
    model.check_invariants(run, merged)
    assert not {e.watermark for e in merged} & set(run.orphans)
    # step 4 alone names exactly the rows step 5 left out
    drops = window_drops(run.chunks, run.captured)
    for c, gone in zip(run.chunks, drops, strict=True):
        kept = {e.key for e in merged if e.watermark == c.high_watermark}
        assert gone == set(dict(c.rows)) - kept
    # a round merged at once == each chunk merged alone
    alone = [e for c in run.chunks for e in merge_window([c], run.captured)]
    assert sorted(alone, key=lambda e: (e.position, e.table, e.key)) == sorted(merged, key=lambda e: (e.position, e.table, e.key))


@pytest.mark.slow  # tens of seconds (pytest --durations)
@cases(scale=0.4)
@given(model.scenarios(), st.integers(0, 10_000), st.integers(1, 15), st.randoms(use_true_random=False))
def test_redelivered_segments_and_chunk_order_do_not_change_the_result(sc, at, length, rnd):
    run = _run(sc)
    log = run.captured
    at = at % (len(log) + 1)
    dup = log[:at] + log[at : at + length] + log[at:]  # a segment delivered twice
    chunks = list(run.chunks)
    rnd.shuffle(chunks)
    merged = merge_window(chunks, dup)
    key = lambda e: (e.position, e.table, e.key)  # noqa: E731
    assert sorted(merged, key=key) == sorted(merge_window(run.chunks, log), key=key)
    model.check_invariants(run, merged, dup)


@cases(scale=0.15)
@given(model.scenarios(), st.data())
def test_a_chunk_whose_hw_is_not_captured_yet_is_not_ready(sc, data):
    run = _run(sc)
    if not run.chunks:
        return
    victim = data.draw(st.sampled_from(run.chunks))
    cut = next(i for i, e in enumerate(run.captured) if isinstance(e, WatermarkEvent) and e.id == victim.high_watermark)
    with pytest.raises(NotReadyError, match=victim.high_watermark):
        merge_window([victim], run.captured[:cut])
    with pytest.raises(NotReadyError):  # the round as a whole: nothing emitted
        merge_window(run.chunks, run.captured[:cut])


def _racy_scenario() -> dict:
    """An update commits between a chunk's SELECT and its high watermark."""
    return dict(
        initial={T: {1: 10, 2: 20}, "app.u": {}},
        before=[],
        txns=[([(T, "w", 1, 11)], False)],
        plans={T: ([], 10, []), "app.u": ([], 10, [])},
        # worker T: lw, read; then the txn: op, commit; then the rest
        choices=[1, 1, 0, 0],
    )


def test_checker_catches_a_merge_that_ignores_the_window():
    run = _run(_racy_scenario())
    merged = merge_window(run.chunks, run.captured)
    model.check_invariants(run, merged)  # the real merge drops key 1
    assert "[1]" not in keys_of(e for e in merged if e.table == T)
    naive = [ChangeEvent(c.table, "r", k, locate_watermarks(run.captured, [c.high_watermark])[c.high_watermark], None, a,
                         snapshot=True, watermark=c.high_watermark) for c in run.chunks for k, a in c.rows]
    with pytest.raises(AssertionError, match="stale r row public.t \\[1\\]"):
        model.check_invariants(run, naive)


def test_checker_catches_a_lost_chunk():
    run = _run(_racy_scenario())
    merged = merge_window(run.chunks, run.captured)
    with pytest.raises(AssertionError, match=r"I2: mirror of public.t differs from source: missing \['\[2\]'\]"):
        model.check_invariants(run, [e for e in merged if e.key != "[2]"])


def test_model_exercises_retries_orphans_and_drops():
    """Guard against a vacuous model: across seeds the interesting cases really happen."""
    rnd = random.Random(7)
    dropped = orphans = multi_chunk = 0
    for _ in range(300):
        sc = dict(
            initial={t: {k: rnd.randrange(99) for k in range(model.NKEYS) if rnd.random() < 0.7} for t in model.TABLES},
            before=[],
            txns=[([(rnd.choice(model.TABLES), rnd.choice("wwd"), rnd.randrange(model.NKEYS), rnd.randrange(99))
                    for _ in range(3)], False) for _ in range(8)],
            plans={t: ([4, 8], 2, [[rnd.choice(model.FAIL_MODES)]]) for t in model.TABLES},
            choices=[rnd.randrange(64) for _ in range(150)],
        )
        run = _run(sc)
        merged = merge_window(run.chunks, run.captured)
        model.check_invariants(run, merged)
        dropped += sum(len(dict(c.rows)) for c in run.chunks) - len(merged)
        orphans += len(run.orphans)
        multi_chunk += len(run.chunks) > 6
    assert dropped > 50 and orphans > 300 and multi_chunk > 100, (dropped, orphans, multi_chunk)


def trunc(n: int, table: str = T) -> ChangeEvent:
    return ChangeEvent(table, "t", None, P(n), None, None)


def test_a_truncate_inside_the_window_drops_the_whole_chunk_outside_it_nothing():
    chunks = [WindowChunk(T, "lw1", "hw1", rows(1, 2)), WindowChunk(T, "lw2", "hw2", rows(3, 4)),
              WindowChunk("public.other", "lw3", "hw3", rows(5))]
    log = [wm("lw1", 1), wm("lw3", 2), trunc(3), wm("hw1", 4), wm("hw3", 5), wm("lw2", 6), wm("hw2", 7), trunc(8)]
    out = merge_window(chunks, log)
    assert [(e.table, e.key) for e in out] == [("public.other", "[5]"), (T, "[3]"), (T, "[4]")]
    assert window_drops(chunks, log)[0] == {"[1]", "[2]"}


def test_mirror_apply_truncate_removes_older_rows_and_refuses_older_events():
    state = mirror_apply({}, [upd(1, 1, 10, op="c"), upd(2, 2, 20, op="c"), trunc(5), upd(6, 3, 30, op="c")])
    assert mirror_rows(state, T) == {"[3]": {"id": 3, "v": 30}}
    mirror_apply(state, [ChangeEvent(T, "r", "[1]", P(4), None, {"id": 1, "v": 10}, snapshot=True)])  # late chunk row
    assert mirror_rows(state, T) == {"[3]": {"id": 3, "v": 30}}
