"""The sustained-writes benchmark's figures (bench/bench_sustained.py): lag, applied and
committed counts from the staged changelog's positions and commit times and the marker's
readings; per-minute rates; the trend's verdict."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_provider_cdc.core.position import Position
from bench.bench_sustained import Reading, per_minute, readings, trend

pytestmark = pytest.mark.unit


def _pos(lsn: int) -> bytes:
    return Position(lsn, 0, 0).encode().encode()


def test_lag_is_the_age_of_the_oldest_committed_change_not_applied():
    # five changes committed at 1.0, 2.0, 3.0, 4.0 and 9.0 s, given out of order
    positions = np.array([_pos(30), _pos(10), _pos(20), _pos(40), _pos(90)])
    ts_ms = np.array([3000, 1000, 2000, 4000, 9000])
    polls = [(0.5, None), (2.5, None), (3.5, _pos(20)), (5.0, _pos(40)), (9.5, _pos(40)), (10.0, _pos(90))]
    got = readings(positions, ts_ms, polls)
    assert [r.applied for r in got] == [0, 0, 2, 4, 4, 5]
    assert [r.committed for r in got] == [0, 2, 3, 4, 5, 5]
    # nothing committed yet; 1.0 s unapplied for 1.5 s; 3.0 s for 0.5 s; all applied; 9.0 for 0.5; all
    assert [r.lag_s for r in got] == pytest.approx([0.0, 1.5, 0.5, 0.0, 0.5, 0.0])


def test_a_change_staged_out_of_time_order_still_counts_from_its_own_commit():
    # position order is commit order on both databases, but commit times can tie or step back
    positions = np.array([_pos(1), _pos(2)])
    ts_ms = np.array([2000, 1000])
    [r] = readings(positions, ts_ms, [(3.0, _pos(1))])
    assert r.applied == 1 and r.lag_s == pytest.approx(2.0)  # the unapplied one committed at 1.0


def test_minutes_rates_and_a_growing_lag_is_said_to_fall_behind():
    steady = [Reading(t, 2.0, int(100 * t), int(100 * t) + 200) for t in range(0, 180)]
    m = per_minute(steady, 0, 180)
    assert [x["minute"] for x in m] == [1, 2, 3]
    assert m[0]["committed_per_s"] == pytest.approx(100) and m[0]["applied_per_s"] == pytest.approx(100)
    assert m[2]["lag_p99_s"] == 2.0 and m[2]["backlog"] == 200
    assert trend(steady, 0, 180)["kept_up"] is True
    growing = [Reading(t, t / 10, 50 * t, 100 * t) for t in range(0, 180)]  # 6 s more lag each minute
    tr = trend(growing, 0, 180)
    assert tr["slope_s_per_min"] == pytest.approx(6.0) and tr["kept_up"] is False


def test_the_staged_positions_are_read_as_fixed_width_bytes_without_watermarks(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bench import bench_sustained

    files = []
    for n, rows in enumerate([[(5, "c", 1000), (6, "w", 1001), (7, "u", 1002)], [(9, "d", 2000)]]):
        path = tmp_path / f"seg{n}.parquet"
        pq.write_table(pa.table({"position": [Position(p, 0, 0).encode() for p, _, _ in rows],
                                 "op": [o for _, o, _ in rows], "ts_ms": [t for _, _, t in rows]}), path)
        files.append((None, None, str(path)))
    monkeypatch.setattr("airflow_provider_cdc.storage.staged.list_segments", lambda _dir: files)
    positions, ts_ms = bench_sustained.staged_changes(str(tmp_path), "s")
    assert positions.tolist() == [_pos(5), _pos(7), _pos(9)] and ts_ms.tolist() == [1000, 1002, 2000]
