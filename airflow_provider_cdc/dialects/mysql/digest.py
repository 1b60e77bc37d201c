"""verify's range digests computed by MySQL/MariaDB (core/row_digest.py, the digest forms): each
row's columns become their digest text in SQL, the row's MD5 is cut to 64 bits, and one
aggregate returns a key range's row count and the XOR of its rows' digests; the dialect's ``digests``.

FLOAT and DOUBLE have no digest form here: the server prints them its own way and has no
function that shows their bits, so a table holding one is compared row by row (in Python).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core import temporal
from ...core.schema import Column, TableSchema
from ..base import DIGEST_NULL, DIGEST_SIZED
from ..digests import Digests
from .server import MyServer

_EPOCH_TO_DAYS = 719528  # TO_DAYS('1970-01-01')


def _zero_day(ident: str) -> str:
    """A zero or partial date's day number (core/temporal.py: date_to_days)."""
    return f"({temporal.ZERO_DATE_BASE} + (YEAR({ident}) * 13 + MONTH({ident})) * 32 + DAYOFMONTH({ident}))"


def digest_text_sql(col: Column, ident: str) -> str | None:
    """The SQL of ``col``'s digest text (NULL when the value is), None when its type has none.
    Every statement goes through %-formatting: a literal % is written %%."""
    t = col.type
    if t in ("int16", "int32", "int64", "uint64"):  # + 0: BIT and YEAR as their numbers
        return f"CAST({ident} + 0 AS CHAR)"
    if t.startswith("decimal"):
        return f"CAST({ident} AS CHAR)"
    if t in ("string", "uuid", "json"):
        return f"CONVERT({ident} USING utf8mb4)"
    if t == "binary":
        return f"LOWER(HEX({ident}))"
    if t == "time":
        return f"TIME_FORMAT({ident}, '%%H:%%i:%%s.%%f')"
    zero = f"MONTH({ident}) = 0 OR DAYOFMONTH({ident}) = 0"
    # (CAST AS SIGNED: the server's arithmetic on fractional temporals is DECIMAL, printed with a fraction)
    if t == "date":
        return (
            f"CAST(CAST(CASE WHEN {zero} THEN {_zero_day(ident)} ELSE TO_DAYS({ident}) - "
            f"{_EPOCH_TO_DAYS} END "
            "AS SIGNED) AS CHAR)"
        )
    if t in ("timestamp", "timestamptz"):  # TIMESTAMP read in the session's UTC
        clock = (
            f"((HOUR({ident}) * 60 + MINUTE({ident})) * 60 + SECOND({ident})) * 1000000 + "
            f"MICROSECOND({ident})"
        )
        return (
            f"CAST(CAST(CASE WHEN {zero} THEN {_zero_day(ident)} * {temporal.US_PER_DAY} + {clock} "
            f"ELSE TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {ident}) END AS SIGNED) AS CHAR)"
        )
    return None  # float32, float64


class MyDigest(Digests):
    """Range digests: the dialect's ``digests`` (dialects/digests.py)."""

    def __init__(self, dialect: Any, server: MyServer) -> None:
        super().__init__(dialect)
        self.server = server

    def digest_problems(self, schema: TableSchema) -> list[str]:
        return [
            f"column {c.name!r} ({c.source_type or c.type}): no digest form for {c.type}"
            for c in schema.columns
            if digest_text_sql(c, self.server.quote_ident(c.name)) is None
        ]

    def _row_digest_sql(self, schema: TableSchema) -> str:
        """The SQL of a row's 64-bit digest."""
        pieces = []
        for col in schema.columns:
            text = digest_text_sql(col, self.server.quote_ident(col.name))
            value = (
                f"CONCAT(LENGTH({text}), ':', {text})" if col.type in DIGEST_SIZED else f"CONCAT({text}, ',')"
            )
            pieces.append(f"IF({text} IS NULL, '{DIGEST_NULL}', {value})")
        return f"CAST(CONV(LEFT(MD5(CONCAT({', '.join(pieces)})), 16), 16, 10) AS UNSIGNED)"

    def range_digest_query(
        self, schema: TableSchema, *, after_key: Sequence | None, upto_key: Sequence | None
    ) -> tuple[str, list[Any]]:
        where, params = self.digest_where(schema, after_key, upto_key)
        sql = (
            f"SELECT COUNT(*), BIT_XOR({self._row_digest_sql(schema)}) FROM "  # noqa: S608
            f"{self.server.quote_table(schema.table)}{where}"
        )
        return sql, params

    def row_digests_query(
        self, schema: TableSchema, *, after_key: Sequence | None, limit: int
    ) -> tuple[str, list[Any]]:
        where, params = self.digest_where(schema, after_key, None)
        pk = ", ".join(self.server.quote_ident(k) for k in schema.primary_key)
        sql = (
            f"SELECT {pk}, {self._row_digest_sql(schema)} FROM {self.server.quote_table(schema.table)}"  # noqa: S608
            f"{where} "
            f"ORDER BY {pk} LIMIT %s"
        )
        return sql, [*params, int(limit)]
