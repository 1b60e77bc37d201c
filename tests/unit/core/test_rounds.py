"""The changelog rounds' schedule is decided by one object (core/rounds.py)."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.rounds import RoundSchedule

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("given", "on_log", "one_task", "periodic", "runs"),
    [
        ("@log", True, True, False, 2),
        (" @LOG ", True, True, False, 2),
        ("@continuous", False, True, False, 1),
        ("* * * * *", False, False, True, 1),
        ("@hourly", False, False, True, 1),
        ("@once", False, False, False, 1),
        (None, False, False, False, 1),
    ],
)
def test_each_schedule_answers_every_question_the_dag_asks(given, on_log, one_task, periodic, runs):
    r = RoundSchedule(given)
    assert (r.on_log, r.one_task, r.periodic, r.max_active_runs) == (on_log, one_task, periodic, runs)
