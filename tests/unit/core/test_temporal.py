"""core/temporal.py: day numbers of the proleptic Gregorian calendar, BC and year 0 included."""

from __future__ import annotations

import datetime as dt

import pytest

from airflow_provider_cdc.core import temporal

MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def _days_in(y: int, m: int) -> int:
    leap = y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)  # astronomical years: year 0 is a leap year
    return 29 if m == 2 and leap else MONTH_DAYS[m - 1]


@pytest.mark.slow  # tens of seconds (pytest --durations)
def test_every_day_from_year_minus_5000_to_3000_is_the_day_after_the_one_before_and_round_trips():
    """Consecutive dates get consecutive day numbers and each number gives its date back
    (the era arithmetic once moved days around March of years -1, -401, -801...: year 0's
    January 1st read back as January 2nd)."""
    prev, jumps, wrong = None, [], []
    for y in range(-5000, 3000):
        for m in range(1, 13):
            for d in range(1, _days_in(y, m) + 1):
                n = temporal.days_from_civil(y, m, d)
                if prev is not None and n != prev + 1:
                    jumps.append((y, m, d, n - prev))
                prev = n
                if temporal.civil_from_days(n) != (y, m, d):
                    wrong.append((y, m, d, temporal.civil_from_days(n)))
    assert jumps == [] and wrong == [], (jumps[:5], wrong[:5])


def test_anchors_and_canonical_text():
    assert temporal.days_from_civil(1970, 1, 1) == 0
    assert temporal.days_from_civil(1, 1, 1) == (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days == -719_162
    assert temporal.days_from_civil(0, 1, 1) == -719_162 - 366  # 1 BC was a leap year
    for text in ("0000-01-01", "0000-02-29", "-0001-03-01", "-0043-03-15", "-4713-11-24", "9999-12-31"):
        assert temporal.days_to_text(temporal.date_to_days(text)) == text
    us = temporal.ts_to_micros("0000-01-01T10:00:00.500000")
    assert temporal.micros_to_text(us, tz=False) == "0000-01-01T10:00:00.500000"
