"""Chunk planning: what a snapshot reads (DBLog step 2, planned up front).

:class:`KeysetPredicate` (a dialect renders it), :class:`SnapshotRequest` (validated),
:func:`plan_ranges` (disjoint ranges covering the key space exactly) and
:func:`chunk_predicates` with the snapshot's inclusive upper bound (docs/DESIGN.md, "One chunk
of a snapshot"). Keys are canonical values, compared only by the database.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .errors import ConfigurationError
from .plans import MAX_PARALLELISM, THROTTLE_KEYS, Throttle
from .ranges import FULL_RANGE, ChunkRange, keyset_condition, keyset_params
from .schema import TableName, TableSchema

KEYSET_OPS = (">", ">=", "<", "<=")


# --- keyset predicates -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeysetPredicate:
    """``(columns) <op> (key)`` in key order: a lexicographic comparison on the primary key."""

    columns: tuple[str, ...]  # unquoted primary-key column names, in key order
    op: str
    key: tuple

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "key", tuple(self.key))
        if self.op not in KEYSET_OPS:
            raise ConfigurationError(
                f"keyset operator must be one of {', '.join(KEYSET_OPS)}, got {self.op!r}"
            )
        if not self.columns:
            raise ConfigurationError("keyset predicate needs at least one key column")
        if len(self.key) != len(self.columns):
            raise ConfigurationError(
                f"key {list(self.key)!r} has {len(self.key)} value(s) but the primary key "
                f"{list(self.columns)} "
                f"has {len(self.columns)} column(s); give one value per key column"
            )

    def sql(self, quote: Callable[[str], str], *, row_values: bool, placeholder: str = "%s") -> str:
        """The condition text; bind :meth:`params` with it."""
        return keyset_condition(
            [quote(c) for c in self.columns], self.op, row_values=row_values, placeholder=placeholder
        )

    def params(self, *, row_values: bool, convert: Callable[[str, Any], Any] | None = None) -> list:
        """Bind values in the order :meth:`sql` expects; ``convert(column, value)`` maps a
        canonical value to what the driver binds (e.g. base64 -> bytes)."""
        vals = (
            list(self.key)
            if convert is None
            else [convert(c, v) for c, v in zip(self.columns, self.key, strict=True)]
        )
        return keyset_params(vals, row_values=row_values)


def chunk_predicates(
    primary_key: Sequence[str],
    rng: ChunkRange,
    *,
    after_key: Sequence | None = None,
    upper_bound: Sequence | None = None,
) -> list[KeysetPredicate]:
    """The predicates of one keyset chunk inside ``rng``: ``key > after_key`` (or
    ``key >= rng.start``), ``key < rng.end``, and ``key <= upper_bound``. All are ANDed.
    The one builder of chunk conditions: every dialect's chunk SELECT renders these."""
    pk = tuple(primary_key)
    out: list[KeysetPredicate] = []
    if after_key is not None:
        out.append(KeysetPredicate(pk, ">", tuple(after_key)))
    elif rng.start is not None:
        out.append(KeysetPredicate(pk, ">=", rng.start))
    if rng.end is not None:
        out.append(KeysetPredicate(pk, "<", rng.end))
    if upper_bound is not None:  # also under an end: a range given by a conf may reach past it
        out.append(KeysetPredicate(pk, "<=", tuple(upper_bound)))
    return out


def render_predicates(
    predicates: Sequence[KeysetPredicate],
    quote: Callable[[str], str],
    *,
    row_values: bool,
    placeholder: str = "%s",
    convert: Callable[[str, Any], Any] | None = None,
) -> tuple[str, list]:
    """``(sql, params)`` of the predicates ANDed; ``("", [])`` when there are none."""
    parts = [p.sql(quote, row_values=row_values, placeholder=placeholder) for p in predicates]
    params: list = []
    for p in predicates:
        params += p.params(row_values=row_values, convert=convert)
    return " AND ".join(parts), params


# --- the request ---------------------------------------------------------------------------


def validate_where(where: str, setting: str = "where") -> str:
    """The optional row filter: untrusted input (anyone who may trigger the DAG sets it),
    allowed only as a plain row condition (core/filters.py); every query renders it with its
    literals bound. Checked here without the table's columns (the plan checks those)."""
    from .filters import check_filter

    return check_filter(where, setting=setting)


def _int_setting(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be a whole number from {lo} to {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigurationError(f"{name} must be from {lo} to {hi}, got {value}")
    return value


def _all_int(key: tuple | None) -> bool:
    return key is not None and all(isinstance(v, int) and not isinstance(v, bool) for v in key)


@dataclass(frozen=True)
class SnapshotRequest:
    """What to snapshot. ``keys``: table id -> chosen primary keys; ``ranges``: table id ->
    key ranges; a table in neither is read whole. ``where`` is one filter for every table
    or table id -> filter."""

    tables: tuple[TableName, ...]
    keys: Mapping[str, tuple[tuple, ...]] = field(default_factory=dict)
    ranges: Mapping[str, tuple[ChunkRange, ...]] = field(default_factory=dict)
    where: str | Mapping[str, str] | None = None
    #: how fast to read: its chunk_size (None, conf ``"auto"`` or absent, adapts it: core/throttle.py),
    #: parallelism (chunk tasks, so key ranges planned) and delay_seconds
    throttle: Throttle = Throttle()

    def __post_init__(self) -> None:
        tables = tuple(t if isinstance(t, TableName) else TableName.parse(str(t)) for t in self.tables)
        if not tables:
            raise ConfigurationError("snapshot request names no tables; give at least one as 'schema.table'")
        ids = [t.id for t in tables]
        dups = sorted({i for i in ids if ids.count(i) > 1})
        if dups:
            raise ConfigurationError(f"snapshot request names table(s) {dups} more than once")
        object.__setattr__(self, "tables", tables)
        keys = {
            t: tuple(tuple(k) if isinstance(k, (list, tuple)) else (k,) for k in ks)
            for t, ks in dict(self.keys).items()
        }
        ranges = {
            t: tuple(r if isinstance(r, ChunkRange) else _range_from(r, t) for r in rs)
            for t, rs in dict(self.ranges).items()
        }
        for setting, per_table in (("keys", keys), ("ranges", ranges)):
            unknown = sorted(set(per_table) - set(ids))
            if unknown:
                raise ConfigurationError(
                    f"{setting} given for table(s) {unknown} that the request does not name; tables: {ids}"
                )
            for t, items in per_table.items():
                if not items:
                    raise ConfigurationError(
                        f"{setting} for table {t} is empty; omit the table from {setting!r} to read it whole"
                    )
        both = sorted(set(keys) & set(ranges))
        if both:
            raise ConfigurationError(
                f"table(s) {both} have both chosen keys and key ranges; give one or the other"
            )
        for t, rs in ranges.items():
            _check_ranges(t, rs)
        object.__setattr__(self, "keys", keys)
        object.__setattr__(self, "ranges", ranges)
        if isinstance(self.where, Mapping):
            unknown = sorted(set(self.where) - set(ids))
            if unknown:
                raise ConfigurationError(
                    f"where given for table(s) {unknown} that the request does not name; tables: {ids}"
                )
            object.__setattr__(
                self, "where", {t: validate_where(w, f"where[{t}]") for t, w in self.where.items()}
            )
        elif self.where is not None:
            object.__setattr__(self, "where", validate_where(self.where))

    def where_for(self, table: TableName | str) -> str | None:
        tid = table.id if isinstance(table, TableName) else table
        return self.where.get(tid) if isinstance(self.where, Mapping) else self.where

    def requested_ranges(self, table: TableName | str) -> tuple[ChunkRange, ...]:
        """The key space to read: the given ranges, the chosen keys as ranges, or the whole table."""
        tid = table.id if isinstance(table, TableName) else table
        if tid in self.ranges:
            return self.ranges[tid]
        if tid in self.keys:
            return tuple(keys_to_ranges(self.keys[tid], table=tid))
        return (FULL_RANGE,)

    def check_schema(self, schema: TableSchema) -> None:
        """Chosen keys and range bounds must have one value per primary-key column."""
        tid, n = schema.table.id, len(schema.primary_key)
        for k in self.keys.get(tid, ()):
            if len(k) != n:
                raise ConfigurationError(
                    f"chosen key {list(k)!r} of table {tid} has {len(k)} value(s); primary key "
                    f"{list(schema.primary_key)} has {n}"
                )
        for r in self.ranges.get(tid, ()):
            for b in (r.start, r.end):
                if b is not None and len(b) != n:
                    raise ConfigurationError(
                        f"key range bound {list(b)!r} of table {tid} has {len(b)} value(s); primary key "
                        f"{list(schema.primary_key)} has {n}"
                    )
                if b is not None:
                    check_bound_types(schema, b, "key range bound")
        for k in self.keys.get(tid, ()):
            check_bound_types(schema, k, "chosen key")

    # --- DAG-run conf ---------------------------------------------------------------------
    #: the settings :meth:`from_dict` takes: this dataclass's fields (set below the class)
    FIELDS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], default_schema: str | None = None) -> SnapshotRequest:
        """From JSON-like settings (a DAG-run conf): ``{"tables": ["public.t"], "ranges":
        {"public.t": [{"start": [1], "end": [100]}]}, "keys": {"public.t": [[5], [7]]}, ...}``."""
        if not isinstance(d, Mapping):
            raise ConfigurationError(
                f"snapshot request must be a mapping of settings, got {type(d).__name__}"
            )
        unknown = sorted(set(d) - set(cls.FIELDS))
        if unknown:
            raise ConfigurationError(f"unknown snapshot setting(s) {unknown}; known: {list(cls.FIELDS)}")
        tables = d.get("tables")
        if isinstance(tables, str):
            tables = [tables]
        if not isinstance(tables, (list, tuple)):
            raise ConfigurationError(f"'tables' must be a list of 'schema.table' names, got {tables!r}")
        names = tuple(TableName.parse(str(t), default_schema) for t in tables)

        def by_id(setting: str) -> dict:
            raw = d.get(setting) or {}
            if not isinstance(raw, Mapping):
                raise ConfigurationError(f"{setting!r} must map 'schema.table' to a list, got {raw!r}")
            out = {}
            for t, v in raw.items():
                if not isinstance(v, (list, tuple)):
                    raise ConfigurationError(f"{setting}[{t!r}] must be a list, got {v!r}")
                out[TableName.parse(str(t), default_schema).id] = v
            return out

        where = d.get("where")
        if isinstance(where, Mapping):
            where = {TableName.parse(str(t), default_schema).id: w for t, w in where.items()}
        return cls(names, by_id("keys"), by_id("ranges"), where, Throttle.checked(d))

    def to_dict(self) -> dict:
        return {
            "tables": [t.id for t in self.tables],
            "keys": {t: [list(k) for k in ks] for t, ks in self.keys.items()},
            "ranges": {
                t: [{"start": _lst(r.start), "end": _lst(r.end)} for r in rs] for t, rs in self.ranges.items()
            },
            "where": dict(self.where) if isinstance(self.where, Mapping) else self.where,
            **self.throttle.to_dict(),
        }


SnapshotRequest.FIELDS = (*(f.name for f in fields(SnapshotRequest) if f.name != "throttle"), *THROTTLE_KEYS)


def _lst(k: tuple | None) -> list | None:
    return None if k is None else list(k)


def _bound(v: Any) -> tuple | None:
    if v is None:
        return None
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


def _range_from(r: Any, table: str) -> ChunkRange:
    if isinstance(r, Mapping) and set(r) <= {"start", "end"}:
        return ChunkRange(_bound(r.get("start")), _bound(r.get("end")))
    if isinstance(r, (list, tuple)) and len(r) == 2:
        return ChunkRange(_bound(r[0]), _bound(r[1]))
    raise ConfigurationError(
        f"key range {r!r} of table {table} must be {{'start': [..] or null, 'end': [..] or null}} "
        "(start inclusive, end exclusive) or a [start, end] pair"
    )


def check_ranges_ranked(table: str, ranges: Sequence[ChunkRange], rank: Callable[[tuple], int]) -> None:
    """Key ranges in the database's order (``rank``: the dense rank of a bound, from
    ``Dialect.key_ranks``): each must be non-empty (start below end) and no two may overlap
    (touching is fine: end is exclusive). Any key type, text keys under their collation too."""
    for r in ranges:
        if r.start is not None and r.end is not None and not rank(r.start) < rank(r.end):
            raise ConfigurationError(
                f"key range {r.to_json()} of table {table} is empty or inverted in the database's "
                "order of the key: "
                "start must be below end (end is exclusive)"
            )
    ordered = sorted(ranges, key=lambda r: -1 if r.start is None else rank(r.start))
    for a, b in zip(ordered, ordered[1:], strict=False):
        if a.end is None or b.start is None or rank(b.start) < rank(a.end):
            raise ConfigurationError(
                f"key ranges {a.to_json()} and {b.to_json()} of table {table} overlap; give disjoint ranges"
            )


_BOUND_TYPES = {
    "int16": (int,),
    "int32": (int,),
    "int64": (int,),
    "uint64": (int,),
    "float32": (int, float, str),
    "float64": (int, float, str),  # "NaN", "Infinity" as text
    "bool": (bool,),
}


def check_bound_types(schema: TableSchema, key: Sequence, what: str) -> None:
    """Each value of a key given in a conf must have the JSON type of its column's canonical
    form (core/schema.py): integers for integer keys, strings for text, dates, decimals..."""
    for col, v in zip(schema.primary_key, key, strict=True):
        t = schema.column(col).type
        want = _BOUND_TYPES.get(t, (str,) if not t.startswith("decimal") else (str, int, float))
        if v is None or (isinstance(v, bool) and bool not in want) or not isinstance(v, want):
            names = "/".join(x.__name__ for x in want).replace("str", "string").replace("int", "integer")
            raise ConfigurationError(
                f"{what} {list(key)!r} of table {schema.table}: column {col!r} is {t}, so its value "
                "must be a "
                f"{names} (the key's canonical JSON form), got {v!r}"
            )


def _check_ranges(table: str, ranges: Sequence[ChunkRange]) -> None:
    """Empty or overlapping ranges are refused where Python can order the bounds the way the
    database does (integer keys); text keys are ordered by the database's collation, so
    their ranges are taken as given."""
    for r in ranges:
        if _all_int(r.start) and _all_int(r.end) and not r.start < r.end:
            raise ConfigurationError(
                f"key range {r.to_json()} of table {table} is empty: start must be below end (end is "
                "exclusive)"
            )
    if len(ranges) > 1 and all(
        (r.start is None or _all_int(r.start)) and (r.end is None or _all_int(r.end)) for r in ranges
    ):
        lo = lambda r: (0, ()) if r.start is None else (1, r.start)  # noqa: E731
        ordered = sorted(ranges, key=lo)
        for a, b in zip(ordered, ordered[1:], strict=False):
            if a.end is None or b.start is None or b.start < a.end:
                raise ConfigurationError(
                    f"key ranges {a.to_json()} and {b.to_json()} of table {table} overlap; give "
                    "disjoint ranges"
                )


# --- range planning -----------------------------------------------------------------------


def keys_to_ranges(keys: Sequence[Sequence], *, table: str = "the table") -> list[ChunkRange]:
    """Chosen keys -> the fewest ranges that hold exactly them: runs of consecutive integers in
    the last key column (same leading columns) become one ``[first, last + 1)`` range.

    Only keys whose last column is an integer have such a successor; for text, UUID or other
    keys give key ranges instead (an exclusive end the database can compare).
    """
    ks = sorted({tuple(k) for k in keys})
    if not ks:
        raise ConfigurationError(f"no chosen keys for {table}; omit 'keys' to read the table whole")
    for k in ks:
        if not k or isinstance(k[-1], bool) or not isinstance(k[-1], int):
            raise ConfigurationError(
                f"chosen key {list(k)!r} of {table}: chosen keys need an integer last key column; "
                "for text, UUID or other keys give key ranges (start inclusive, end exclusive) instead"
            )
    out: list[ChunkRange] = []
    first = prev = ks[0]
    for k in ks[1:]:
        if k[:-1] == prev[:-1] and k[-1] == prev[-1] + 1:
            prev = k
            continue
        out.append(ChunkRange(first, (*prev[:-1], prev[-1] + 1)))
        first = prev = k
    out.append(ChunkRange(first, (*prev[:-1], prev[-1] + 1)))
    return out


def even_ranges(min_key: int, max_key: int, parts: int, within: ChunkRange = FULL_RANGE) -> list[ChunkRange]:
    """Split a single integer key evenly: ``parts`` ranges over [min_key, max_key] (the keys
    the table has inside ``within``). The first range starts at ``within.start`` and the last
    ends at ``within.end``, so the plan covers ``within`` exactly, whatever lies outside
    [min_key, max_key]."""
    _int_setting("parts", parts, 1, MAX_PARALLELISM * 64)
    for name, v in (("min_key", min_key), ("max_key", max_key)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigurationError(
                f"even split needs an integer {name}, got {v!r}; use sampled keys for other key types"
            )
    if min_key > max_key:
        raise ConfigurationError(f"even split: min_key {min_key} is above max_key {max_key}")
    span = max_key - min_key + 1
    bounds = sorted({min_key + math.ceil(i * span / parts) for i in range(1, parts)})
    return _between([(b,) for b in bounds if min_key < b <= max_key], within)


def sampled_ranges(
    sample: Sequence[Sequence], parts: int, within: ChunkRange = FULL_RANGE
) -> list[ChunkRange]:
    """Boundaries at the quantiles of keys the database sampled or walked from its index,
    in the database's order (``Dialect.sample_keys``): ranges then hold about as many rows
    each, however skewed the keys are, and text/UUID/composite keys never have to be
    compared in Python. The sample must lie inside ``within``."""
    _int_setting("parts", parts, 1, MAX_PARALLELISM * 64)
    keys = [tuple(k) for k in sample]
    n = len(keys)
    bounds: list[tuple] = []
    for i in range(1, parts):
        if not n:
            break
        b = keys[min(n - 1, (i * n) // parts)]
        if (not bounds or b != bounds[-1]) and b != within.start and b != keys[0]:
            bounds.append(b)
    return _between(bounds, within)


def _between(bounds: Sequence[tuple], within: ChunkRange) -> list[ChunkRange]:
    edges: list[tuple | None] = [within.start, *bounds, within.end]
    return [ChunkRange(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def plan_ranges(
    parts: int,
    *,
    within: ChunkRange = FULL_RANGE,
    min_max: tuple[Any, Any] | None = None,
    sample: Sequence[Sequence] | None = None,
) -> list[ChunkRange]:
    """Up to ``parts`` disjoint ranges covering ``within`` exactly, no gaps.

    A sample (keys in the database's order) wins when given: it follows the real key
    distribution. Otherwise ``min_max`` of a single integer key is split evenly. With
    neither, or ``parts == 1``, the one range ``within``.
    """
    _int_setting("parts", parts, 1, MAX_PARALLELISM * 64)
    if parts == 1:
        return [within]
    if sample:
        return sampled_ranges(sample, parts, within)
    if min_max is not None and min_max[0] is not None:
        lo, hi = (v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v for v in min_max)
        if isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool):
            return even_ranges(lo, hi, parts, within)
        raise ConfigurationError(
            f"even split needs a single integer key, got min/max {min_max!r}; pass sampled keys for "
            "text, UUID or composite keys"
        )
    return [within]
