"""The freshness benchmark's reading of a task's own log (bench/bench_freshness.py): the DAG
file's parse and the task's work, timed from the log's lines."""

from __future__ import annotations

import json

import pytest

from bench.bench_freshness import parse_and_execute

pytestmark = pytest.mark.unit


def _log(tmp_path, events: list[tuple[str, str]]):
    path = tmp_path / "attempt=1.log"
    path.write_text("".join(json.dumps({"timestamp": t, "event": e, "level": "info"}) + "\n" for t, e in events))
    return path


def test_parse_is_up_to_the_parse_line_and_work_from_there_to_the_end_of_execute(tmp_path):
    log = _log(tmp_path, [("2026-11-28T00:04:41.000000Z", "DAG bundles loaded: dags-folder"),
                          ("2026-11-28T00:04:41.400000Z", "Worker startup parse complete"),
                          ("2026-11-28T00:04:42.100000Z", "captured 27 events"),
                          ("2026-11-28T00:04:42.650000Z", "Done. Returned value was: {}")])
    parse, work = parse_and_execute(log)
    assert parse == pytest.approx(0.4) and work == pytest.approx(1.25)


def test_a_round_that_skipped_its_follow_ups_ends_at_that_line_and_a_cut_log_gives_nothing(tmp_path):
    log = _log(tmp_path, [("2026-11-28T00:04:41.000000Z", "DAG bundles loaded: dags-folder"),
                          ("2026-11-28T00:04:41.300000Z", "Worker startup parse complete"),
                          ("2026-11-28T00:04:41.900000Z", "Skipping downstream tasks.")])
    assert parse_and_execute(log) == pytest.approx((0.3, 0.6))
    cut = _log(tmp_path, [("2026-11-28T00:04:41.000000Z", "DAG bundles loaded: dags-folder")])
    assert parse_and_execute(cut) is None
    assert parse_and_execute(tmp_path / "missing.log") is None
