"""Dates and timestamps Python's ``datetime`` cannot hold (BC, far years, infinities, MySQL's
zero and partial dates), as exact integers: their canonical text and their typed Arrow form,
lossless both ways and ordered (the encoding: docs/operations.md, the type table's notes).
"""

from __future__ import annotations

import re

INF_DATE, NINF_DATE = 2**31 - 1, -(2**31)
INF_TS, NINF_TS = 2**63 - 1, -(2**63)
US_PER_DAY = 86_400_000_000


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm; his
    ``(y >= 0 ? y : y - 399) / 400`` emulates floor division with C's truncating one, which
    Python's ``//`` already is: kept, it moved dates before March of year 0 by a day)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = z // 146097  # floor division (see days_from_civil)
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return y + (m <= 2), m, d


ZERO_DATE_BASE = days_from_civil(100_000, 1, 1)
_ZERO_SPAN = (10_000 * 13 + 13) * 32  # every (year 0-9999, month 0-12, day 0-31)

_DATE_RE = re.compile(r"^(-?)(\d{4,})-(\d\d)-(\d\d)$")
_TS_RE = re.compile(r"^(-?)(\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(Z?)$")


def year_text(y: int) -> str:
    return f"-{-y:04d}" if y < 0 else f"{y:04d}"


def _is_zero(y: int, m: int, d: int) -> bool:
    return m == 0 or d == 0


def date_to_days(text: str) -> int:
    """Canonical date text -> days (see the module docstring). ValueError when not canonical."""
    if text == "infinity":
        return INF_DATE
    if text == "-infinity":
        return NINF_DATE
    m = _DATE_RE.match(text)
    if m is None:
        raise ValueError(f"not a canonical date: {text!r}")
    y, mo, d = int(m.group(2)) * (-1 if m.group(1) else 1), int(m.group(3)), int(m.group(4))
    if _is_zero(y, mo, d):
        if not 0 <= y <= 9999 or mo > 12 or d > 31:
            raise ValueError(f"not a canonical date: {text!r}")
        return ZERO_DATE_BASE + (y * 13 + mo) * 32 + d
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        raise ValueError(f"not a canonical date: {text!r}")
    return days_from_civil(y, mo, d)


def days_to_text(days: int) -> str:
    if days == INF_DATE:
        return "infinity"
    if days == NINF_DATE:
        return "-infinity"
    if ZERO_DATE_BASE <= days < ZERO_DATE_BASE + _ZERO_SPAN:
        n = days - ZERO_DATE_BASE
        ym, d = divmod(n, 32)
        y, mo = divmod(ym, 13)
        return f"{y:04d}-{mo:02d}-{d:02d}"
    y, mo, d = civil_from_days(days)
    return f"{year_text(y)}-{mo:02d}-{d:02d}"


def ts_to_micros(text: str) -> int:
    """Canonical timestamp text (``Z`` suffix or none) -> microseconds since the epoch."""
    if text == "infinity":
        return INF_TS
    if text == "-infinity":
        return NINF_TS
    m = _TS_RE.match(text)
    if m is None:
        raise ValueError(f"not a canonical timestamp: {text!r}")
    day = date_to_days(f"{m.group(1)}{m.group(2)}-{m.group(3)}-{m.group(4)}")
    hh, mm, ss = int(m.group(5)), int(m.group(6)), int(m.group(7))
    if hh > 23 or mm > 59 or ss > 59:
        raise ValueError(f"not a canonical timestamp: {text!r}")
    frac = int((m.group(8) or "").ljust(6, "0"))
    return day * US_PER_DAY + ((hh * 60 + mm) * 60 + ss) * 1_000_000 + frac


def micros_to_text(us: int, tz: bool) -> str:
    if us == INF_TS:
        return "infinity"
    if us == NINF_TS:
        return "-infinity"
    day, rest = divmod(us, US_PER_DAY)
    secs, frac = divmod(rest, 1_000_000)
    hh, rem = divmod(secs, 3600)
    mm, ss = divmod(rem, 60)
    return f"{days_to_text(day)}T{hh:02d}:{mm:02d}:{ss:02d}.{frac:06d}{'Z' if tz else ''}"


def canonical_to_pg(text: str) -> str:
    """The inverse of :func:`pg_bc_to_canonical` for binding: an astronomical year before 1
    back to PostgreSQL's ``YYYY-MM-DD ... BC`` input (``Z`` becomes ``+00``); others as they are."""
    if text in ("infinity", "-infinity"):
        return text
    body = text[:-1] + "+00" if text.endswith("Z") else text
    if not (body.startswith("-") or body.startswith("0000-")):
        return body
    ymd, sep, rest = body.replace("T", " ", 1).partition(" ")
    y, mo, d = ymd.rsplit("-", 2)
    year = int(y)  # "-0043" or "0000"
    return f"{1 - year:04d}-{mo}-{d}" + (f" {rest}" if sep else "") + " BC"


def pg_bc_to_canonical(text: str) -> str | None:
    """PostgreSQL's ``YYYY-MM-DD[ time][+00] BC`` -> the astronomical-year canonical form
    (``-0043-...``), without the zone suffix (callers add ``Z``). None when not BC."""
    if not text.endswith(" BC"):
        return None
    body = text[:-3]
    ymd, sep, rest = body.partition(" ")
    y, mo, d = ymd.split("-")
    year = 1 - int(y)
    return f"{year_text(year)}-{mo}-{d}" + (f" {rest}" if sep else "")
