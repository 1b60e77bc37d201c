"""The end-to-end benchmark's own logic without databases: options, log parsing, the
report and its target verdicts (a wrong verdict would misreport a missed target)."""

from __future__ import annotations

from pathlib import Path

from bench import bench_e2e as b

LOG = """\
2026-11-22T00:11:24.000000Z [info     ] [DAG TEST] starting task_id=plan map_index=-1 [x] loc=dag.py:1501
2026-11-22T00:11:25.500000Z [info     ] [DAG TEST] end task task_id=plan map_index=-1 [x] loc=dag.py:1563
2026-11-22T00:11:26.000000Z [info     ] [DAG TEST] starting task_id=read_chunks map_index=0 [x] loc=dag.py:1501
2026-11-22T00:11:28.000000Z [info     ] [DAG TEST] end task task_id=read_chunks map_index=0 [x] loc=dag.py:1563
2026-11-22T00:11:28.000000Z [info     ] [DAG TEST] starting task_id=read_chunks map_index=1 [x] loc=dag.py:1501
2026-11-22T00:11:31.000000Z [info     ] [DAG TEST] end task task_id=read_chunks map_index=1 [x] loc=dag.py:1563
2026-11-22T00:11:40.000000Z [info     ] CDC_MERGE_RESULT {"chunks": 2, "rows_in": 10, "emitted": 9, "seconds": 4.5} [spark]
"""


def test_parse_defaults_and_quick():
    a = b._parse([])
    assert (a.rows, a.changes, a.dialects) == (500_000, 100_000, ["postgres", "mysql"])
    q = b._parse(["--quick", "--dialects", "mysql", "--mem-chunk-sizes", "200,100,200"])
    assert (q.rows, q.changes, q.dialects, q.mem_chunk_sizes) == (50_000, 20_000, ["mysql"], [100, 200])


def test_task_seconds_sum_mapped_instances_and_merge_summary():
    run = b.DagRun("cdc_snapshot", 20.0, Path("x.log"), 1.0, 2.0, 0.0, 5.0, LOG)
    assert run.task_seconds() == {"plan": 1.5, "read_chunks": 5.0}
    assert run.merge_summary()["emitted"] == 9


def test_task_memory_attributes_samples_to_the_task_that_ran():
    import datetime as dt

    def at(text: str) -> float:
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp()

    mb = 2**20
    samples = [(at("2026-11-22T00:11:23"), 100 * mb, 0), (at("2026-11-22T00:11:25"), 150 * mb, 0),
               (at("2026-11-22T00:11:27"), 400 * mb, 0), (at("2026-11-22T00:11:29.5"), 420 * mb, 9 * mb),
               (at("2026-11-22T00:11:30"), 300 * mb, 0)]
    run = b.DagRun("cdc_snapshot", 20.0, Path("x.log"), 1.0, 2.0, 0.0, 5.0, LOG, samples)
    mem = run.task_memory()
    assert mem["plan"] == {"airflow_peak_mb": 150.0, "rise_mb": 50.0, "spark_peak_mb": 0.0}
    # two mapped instances: the larger peak and the larger rise (the second starts at 400 MB: +20)
    assert mem["read_chunks"] == {"airflow_peak_mb": 420.0, "rise_mb": 250.0, "spark_peak_mb": 9.0}


def _result(kind: str, *, ratio: float, drop: float, fixed: float, mem_x: float, cl_ratio: float = 0.1) -> dict:
    chunk_bytes = 1_000_000.0
    return {
        "kind": kind, "rows": 1000, "changes": 100, "row_bytes": 100.0,
        "raw_dump_rps": 1000.0, "raw_dump_s": 1.0, "snap_idle_rps": 1000.0 * ratio, "snap_idle_s": 1 / ratio,
        "snap_idle_ratio": ratio, "fixed_cost_s": fixed, "snap_idle_tasks": {"plan": 1.0},
        "tps_before": 100.0, "tps_during": 100.0 * (1 - drop / 100), "tps_after": 100.0, "tps_drop_pct": drop,
        "raw_drain_eps": 100.0, "raw_drain_events": 100, "raw_drain_s": 1.0, "capture_alone_eps": 50.0,
        "changelog_eps": 10.0, "changelog_events": 100, "changelog_s": 10.0, "changelog_ratio": cl_ratio,
        "changelog_small_s": 5.0,
        "chunk_mem": [{"size": 50_000, "rows": 10_000, "rss_before": 0, "peak": int(mem_x * chunk_bytes),
                       "chunk_bytes": chunk_bytes, "peak_above_mb": mem_x * chunk_bytes / 2**20, "x_chunk": mem_x}],
        "capture_alone": {"peak": 2**20, "rss_before": 0, "events": 100},
        "mem_snapshot_airflow_mb": 1.0, "mem_capture_airflow_mb": 1.0, "mem_merge_spark_mb": 1.0, "mem_apply_spark_mb": 1.0,
    }


def test_render_verdicts_follow_the_figures():
    a = b._parse(["--quick"])
    mach = {"cpus": 2, "mem_gib": 24.0, "os": "Debian", "python": "3.11", "load_start": [1.0, 1.0, 1.0]}
    good = _result("postgres", ratio=0.6, drop=5.0, fixed=4.0, mem_x=2.0, cl_ratio=0.8)
    bad = _result("mysql", ratio=0.4, drop=12.0, fixed=6.0, mem_x=3.5, cl_ratio=0.5)
    md = b.render([good, bad], a, mach, "load average: 1.00", "t")
    targets = md.split("## Targets")[1]
    lines = [line for line in targets.splitlines() if line.startswith("| ") and "postgres" not in line]
    assert len(lines) == 5
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:] == ["met", "**MISSED**"], line
    assert "| **ratio snapshot / raw dump, idle** | **0.60** | **0.40** |" in md
    # 100 events in 10 s, of which 5 s a run with nothing to do costs: 20 events/s net, 0.2x the drain
    assert "| changelog net of a run with ~nothing to do (events/s, ratio) | 20 (0.20) | 20 (0.20) |" in md
    assert "| the same round run after run in one warm process, `dag.test()` (s): first, then the best of the rest | - | - |" in md
    warm = dict(good, fixed_cost_warm_s=[4.0, 1.5, 1.25])
    assert "| 4.0, then 1.2 |" in b.render([warm], a, mach, "load average: 1.00", "t")
    quick = dict(good, changelog_small_s=12.0)  # the run took less than an empty one: no net figure
    assert "- (within the fixed cost)" in b.render([quick], a, mach, "load average: 1.00", "t")


def test_bench_large_splits_a_runs_fixed_cost_from_its_reads_and_merges():
    from bench.bench_large import fixed_cost

    spans = {"plan": [0.0, 4.0], "read_chunks": [5.0, 18.0], "merge_while_reading": [5.0, 23.0],
             "round": [23.5, 24.0], "merge": [26.0, 39.0], "commit": [40.0, 41.0]}
    # reads and merges cover 5-23 and 26-39 (overlaps counted once): 31 s of a 46 s run
    assert fixed_cost(46.0, spans) == (31.0, 15.0)
    assert fixed_cost(10.0, {"plan": [0.0, 4.0]}) == (0.0, 10.0)
