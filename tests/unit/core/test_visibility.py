"""Which transactions a PostgreSQL snapshot sees, and the window that also drops the keys of
transactions before it that the chunk's snapshot did not see (commit order is not visibility
order on a primary: core/visibility.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position, just_before
from airflow_provider_cdc.core.visibility import PgSnapshot, ReplayedBefore, first_invisible, parse_visibility
from airflow_provider_cdc.core.window import WindowChunk, lowered_low, merge_window, mirror_apply, mirror_rows

T = "public.t"


def test_a_snapshot_sees_finished_transactions_below_xmax_that_are_not_running():
    s = PgSnapshot.parse("100:110:102,105")
    assert [x for x in range(95, 115) if not s.visible(x)] == [102, 105, 110, 111, 112, 113, 114]
    assert PgSnapshot.parse("728:728:").visible(727) and not PgSnapshot.parse("728:728:").visible(728)
    for bad in ("1:2", "5:3:", "1:9:12", "a:b:"):
        with pytest.raises(ValueError, match="not a PostgreSQL snapshot"):
            PgSnapshot.parse(bad)


@given(st.integers(min_value=1 << 32, max_value=1 << 40), st.integers(min_value=-1000, max_value=1000))
def test_32_bit_xids_widen_to_the_epoch_of_the_snapshot(xmax, delta):
    """The log's xids are 32 bits; near an epoch boundary they still compare right."""
    s = PgSnapshot(xmax - 50, xmax, frozenset())
    full = xmax + delta
    assert int(s.full(np.asarray([full & 0xFFFFFFFF]))[0]) == full
    assert s.visible(full & 0xFFFFFFFF) == (full < xmax)


def test_first_invisible_is_the_earliest_event_before_the_bound_of_an_unseen_transaction():
    pos = pa.array([Position(1, 0, i).encode() for i in range(6)])
    txs = pa.array(["90", "105", None, "95", "120", "102"])  # None: a watermark row
    s = PgSnapshot.parse("100:110:105")
    assert first_invisible(pos, txs, s, Position(1, 0, 6).encode()) == Position(1, 0, 1).encode()
    assert first_invisible(pos, txs, s, Position(1, 0, 1).encode()) is None  # only xid 90 below it
    assert first_invisible(pa.array([], pa.string()), pa.array([], pa.string()), s, "z") is None


def ev(n: int, key: int, v: int, xid: int) -> ChangeEvent:
    return ChangeEvent(T, "u", f"[{key}]", Position(n, 0, 0), None, {"id": key, "v": v},
                       origin=(str(xid), n, None, None, None, None))


def test_a_change_committed_before_the_low_watermark_but_unseen_by_the_chunk_is_not_overwritten():
    """Transaction 728 wrote its commit record at 3 (before the low watermark at 5) but was still
    running for the chunk's snapshot (a synchronous standby had not confirmed it): the chunk holds
    the old row. With the snapshot recorded, the window reaches back to 728's change and drops
    the key; without it the old row would win at the high watermark."""
    log = [ev(2, 1, 10, 700), ev(3, 2, 21, 728), WatermarkEvent("lw", Position(5, 0, 0), 0),
           WatermarkEvent("hw", Position(8, 0, 0), 0), ev(9, 3, 31, 731)]
    chunk = {"[1]": {"id": 1, "v": 10}, "[2]": {"id": 2, "v": 20}, "[3]": {"id": 3, "v": 30}}
    blind = merge_window([WindowChunk(T, "lw", "hw", chunk)], log)
    seen = merge_window([WindowChunk(T, "lw", "hw", chunk, visibility="720:728:")], log)
    assert [e.key for e in blind] == ["[1]", "[2]", "[3]"]
    assert [e.key for e in seen] == ["[1]", "[3]"]

    def mirror(reads):
        state = mirror_apply({}, [e for e in log if isinstance(e, ChangeEvent)])
        return mirror_rows(mirror_apply(state, reads), T)

    assert mirror(blind)["[2]"] == {"id": 2, "v": 20}  # the mirror moved back in time
    assert mirror(seen) == {"[1]": {"id": 1, "v": 10}, "[2]": {"id": 2, "v": 21}, "[3]": {"id": 3, "v": 31}}


def test_just_before_is_the_greatest_smaller_position():
    assert just_before(Position(5, 0, 0)) == Position(4, (1 << 64) - 1, (1 << 32) - 1)
    assert just_before(Position(5, 3, 1)) == Position(5, 3, 0)
    with pytest.raises(ValueError):
        just_before(Position(0, 0, 0))


def test_a_standby_chunk_window_reaches_back_to_the_replay_position_read_before_its_snapshot():
    """A hot standby's ``pg_current_snapshot()`` lists no running xid (it keeps them all as
    subtransactions): "720:740:" would pass transaction 728, still running there, for seen. The
    replay position read before the snapshot (LSN 3 here) says what it saw: every commit record
    before it; the window reaches back to it, and 728's key is dropped from the chunk."""
    log = [ev(2, 1, 10, 700), ev(3, 2, 21, 728), WatermarkEvent("lw", Position(5, 0, 0), 0),
           WatermarkEvent("hw", Position(8, 0, 0), 0), ev(9, 3, 31, 731)]
    chunk = {"[1]": {"id": 1, "v": 10}, "[2]": {"id": 2, "v": 20}, "[3]": {"id": 3, "v": 30}}
    standby_snapshot = merge_window([WindowChunk(T, "lw", "hw", chunk, visibility="720:740:")], log)
    replayed = merge_window([WindowChunk(T, "lw", "hw", chunk, visibility=ReplayedBefore.text("0/3"))], log)
    assert [e.key for e in standby_snapshot] == ["[1]", "[2]", "[3]"]  # the stale row would win
    assert [e.key for e in replayed] == ["[1]", "[3]"]
    assert lowered_low(ReplayedBefore.text("0/3"), "z", "z", None) == just_before(Position(3)).encode()
    assert lowered_low(ReplayedBefore.text("0/9"), Position(5).encode(), "z", None) == Position(5).encode()
    assert parse_visibility("100:110:105") == PgSnapshot(100, 110, frozenset({105}))
    assert parse_visibility("replayed-before:1/0") == ReplayedBefore(1 << 32)
    for bad in ("replayed-before:", "replayed-before:0/0", "replayed-before:x"):
        with pytest.raises(ValueError, match="replay position|LSN"):
            parse_visibility(bad)
