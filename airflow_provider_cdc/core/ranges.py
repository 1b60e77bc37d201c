"""Key ranges and keyset SQL fragments (DBLog step 2: select the next primary-key chunk).

Keys are tuples of canonical values in primary-key order. A :class:`ChunkRange` is
immutable, start inclusive, end exclusive, ``None`` = unbounded on that side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ConfigurationError
from .schema import TableSchema


@dataclass(frozen=True, slots=True)
class ChunkRange:
    start: tuple | None = None  # inclusive
    end: tuple | None = None  # exclusive

    def __post_init__(self) -> None:
        if self.start is not None:
            object.__setattr__(self, "start", tuple(self.start))
        if self.end is not None:
            object.__setattr__(self, "end", tuple(self.end))

    def contains(self, key: Sequence) -> bool:
        k = tuple(key)
        return (self.start is None or k >= self.start) and (self.end is None or k < self.end)

    def to_json(self) -> str:
        return json.dumps({"start": self.start, "end": self.end}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ChunkRange:
        d = json.loads(text)
        return cls(
            None if d["start"] is None else tuple(d["start"]), None if d["end"] is None else tuple(d["end"])
        )


FULL_RANGE = ChunkRange()


def keyset_condition(
    quoted_columns: Sequence[str], op: str, *, row_values: bool, placeholder: str = "%s"
) -> str:
    """SQL for ``(k1, k2, ..) <op> (?, ?, ..)`` with ``op`` in ``>``, ``>=``, ``<``, ``<=``.

    ``row_values=True`` gives the row-value form (PostgreSQL uses it as an index range);
    otherwise the expanded form ``(k1 > ?) OR (k1 = ? AND k2 > ?)`` that every optimizer
    turns into ranges. Parameters: see :func:`keyset_params`.
    """
    if op not in (">", ">=", "<", "<="):
        raise ConfigurationError(f"keyset operator must be one of >, >=, <, <=, got {op!r}")
    cols = list(quoted_columns)
    if not cols:
        raise ConfigurationError("keyset condition needs at least one key column")
    if row_values or len(cols) == 1:
        if len(cols) == 1:
            return f"{cols[0]} {op} {placeholder}"
        return f"({', '.join(cols)}) {op} ({', '.join([placeholder] * len(cols))})"
    strict = op[0]
    parts = []
    for i, col in enumerate(cols):
        last = i == len(cols) - 1
        cmp = op if last else strict
        eqs = [f"{c} = {placeholder}" for c in cols[:i]]
        parts.append("(" + " AND ".join([*eqs, f"{col} {cmp} {placeholder}"]) + ")")
    return "(" + " OR ".join(parts) + ")"


def keyset_params(key: Sequence, *, row_values: bool) -> list:
    """Bind values in the order :func:`keyset_condition` expects them."""
    k = list(key)
    if row_values or len(k) == 1:
        return k
    out: list = []
    for i in range(len(k)):
        out.extend(k[: i + 1])
    return out


#: key types whose order numpy computes exactly as the databases do
ORDERED_KEY_TYPES = ("int16", "int32", "int64")


def ranges_by_key_order(schema: TableSchema) -> bool:
    """Whether rows can be assigned to the source's key ranges by comparing keys: only where
    numpy orders keys exactly as the database does (one integer column). Text keys follow a
    collation, composite keys a row order nothing outside the database computes: verify matches
    their row digests by key instead (pipeline/verify/compare.py)."""
    pk = schema.primary_key
    return len(pk) == 1 and schema.column(pk[0]).type in ORDERED_KEY_TYPES
