"""What crosses a snapshot's tasks, typed: the snapshot conf's keys (one list), each throttle
setting's bounds and default (one definition), the :class:`Throttle` that carries them (one
form from a run's conf through the request, the plan and the work item to the chunk reader),
the plan (``plan.json``) and a chunk task's work item (XCom). ``to_dict``/``from_dict`` are the
one place either becomes JSON; the shapes are the ones the DAG's tasks and the stored plans
have always had (the throttle's keys flat beside the rest).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from .errors import ConfigurationError
from .ranges import ChunkRange

# --- the conf keys -------------------------------------------------------------------------
#: a DAG's throttle: the conf keys a DAG may give defaults for (sources config, ``throttle=``)
THROTTLE_KEYS = ("chunk_size", "parallelism", "delay_seconds")
#: the throttle settings a resume's conf changes on a planned snapshot (its ranges were planned
#: for its parallelism, which stays)
RESUMABLE_KEYS = ("chunk_size", "delay_seconds")
#: the keys of a snapshot DAG run's conf, the one list: the control action, what to read
#: (``key_ranges`` is :class:`~.planning.SnapshotRequest`'s ``ranges``), then the throttle
CONF_KEYS = ("action", "tables", "key_ranges", "keys", "where", *THROTTLE_KEYS)

# --- the throttle settings: bounds and defaults, defined once -------------------------------
MAX_CHUNK_SIZE = 10_000_000
MAX_PARALLELISM = 256
MAX_DELAY_SECONDS = 86_400.0
#: the conf and throttle value of ``chunk_size`` that asks for the adaptive size explicitly
#: (e.g. to override a DAG throttle's fixed size for one run)
AUTO = "auto"
DEFAULT_CHUNK_SIZE: int | None = None  # adaptive (core/throttle.py ChunkSizer)
DEFAULT_PARALLELISM = 1
DEFAULT_DELAY_SECONDS = 0.0


def chunk_size_value(value: Any, setting: str = "chunk_size") -> int | None:
    """A ``chunk_size`` as given (a conf, a throttle, a plan): a row count fixes the size; ``None``
    or ``"auto"`` means adaptive (None). Anything else is a ConfigurationError naming ``setting``."""
    if value is None or (isinstance(value, str) and value.strip().lower() == AUTO):
        return DEFAULT_CHUNK_SIZE
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHUNK_SIZE:
        raise ConfigurationError(
            f"{setting} must be a whole number from 1 to {MAX_CHUNK_SIZE} (a fixed row count per chunk) or "
            f"{AUTO!r} (sized by CDC_CHUNK_TARGET_SECONDS / CDC_CHUNK_TARGET_MB), got {value!r}"
        )
    return value


def parallelism_value(value: Any, setting: str = "parallelism", *, one_message: bool = False) -> int:
    """Chunk tasks per round, 1 to :data:`MAX_PARALLELISM`. A conf's error tells a value that is
    not a whole number from one out of range; a throttle's (``one_message``) says both alike."""
    whole = not isinstance(value, bool) and isinstance(value, int)
    if not whole or (one_message and not 1 <= value <= MAX_PARALLELISM):
        raise ConfigurationError(
            f"{setting} must be a whole number from 1 to {MAX_PARALLELISM}, got {value!r}"
        )
    if not 1 <= value <= MAX_PARALLELISM:
        raise ConfigurationError(f"{setting} must be from 1 to {MAX_PARALLELISM}, got {value}")
    return value


def delay_seconds_value(value: Any, setting: str = "throttle setting delay_seconds") -> float:
    """The pause between chunks, 0 to :data:`MAX_DELAY_SECONDS` seconds; None: the default."""
    if value is None:
        return DEFAULT_DELAY_SECONDS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_DELAY_SECONDS:
        raise ConfigurationError(
            f"{setting} must be a number of seconds from 0 to {MAX_DELAY_SECONDS:g}, got {value!r}"
        )
    return float(value)


# --- the throttle: one form from the conf to the chunk reader ------------------------------
@dataclass(frozen=True, slots=True)
class Throttle:
    """How fast a snapshot reads: a DAG's throttle (the sources config, ``throttle=``, defaults
    of a run's conf keys of the same names), a request's, a plan's and a work item's."""

    chunk_size: int | None = DEFAULT_CHUNK_SIZE  # rows per chunk SELECT; None: adaptive (ChunkSizer)
    delay_seconds: float = DEFAULT_DELAY_SECONDS  # pause between chunks
    parallelism: int = DEFAULT_PARALLELISM  # chunks per round (disjoint ranges, read in parallel)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "chunk_size", chunk_size_value(self.chunk_size, "throttle setting chunk_size")
        )
        parallelism_value(self.parallelism, "throttle setting parallelism", one_message=True)
        object.__setattr__(self, "delay_seconds", delay_seconds_value(self.delay_seconds))

    FIELDS = THROTTLE_KEYS

    @classmethod
    def checked(cls, d: Mapping[str, Any], owner: str = "") -> Throttle:
        """From the flat keys of a conf, a plan or a work item (a missing or None key: its
        default), each checked under the name ``owner`` + key (``"the plan's "``)."""
        parallelism = d.get("parallelism")
        return cls(
            chunk_size_value(d.get("chunk_size"), f"{owner}chunk_size"),
            delay_seconds_value(d.get("delay_seconds") or None, f"{owner}delay_seconds"),
            parallelism_value(
                DEFAULT_PARALLELISM if parallelism is None else parallelism, f"{owner}parallelism"
            ),
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Throttle:
        return cls().merge(d)

    def merge(self, overrides: Mapping[str, Any] | None) -> Throttle:
        """These settings with ``overrides`` applied (missing or ``None`` values keep ours)."""
        if not overrides:
            return self
        if not isinstance(overrides, Mapping):
            raise ConfigurationError(f"throttle settings must be a mapping, got {type(overrides).__name__}")
        unknown = sorted(set(overrides) - set(self.FIELDS))
        if unknown:
            raise ConfigurationError(f"unknown throttle setting(s) {unknown}; known: {list(self.FIELDS)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    def inherit(self, older: Throttle, given: Iterable[str]) -> Throttle:
        """These settings where ``given`` names them, ``older``'s for the rest (a refresh keeps
        the throttle of the snapshot before it)."""
        given = frozenset(given)
        return replace(self, **{k: getattr(older, k) for k in THROTTLE_KEYS if k not in given})

    def resumed(self, newer: Throttle, given: Iterable[str]) -> Throttle:
        """A planned snapshot's throttle with what a resume's conf gives (:data:`RESUMABLE_KEYS`)."""
        given = frozenset(given)
        return replace(self, **{k: getattr(newer, k) for k in RESUMABLE_KEYS if k in given})

    def chunk_rows(self) -> str:
        """The chunk size as a log line says it."""
        return "adaptive" if self.chunk_size is None else f"{self.chunk_size:,} (fixed)"

    def to_dict(self) -> dict:
        return asdict(self)


# --- the plan and its work items -------------------------------------------------------------
def _key(v: Any) -> tuple | None:
    return None if v is None else tuple(v)


def _range(r: ChunkRange | Mapping) -> ChunkRange:
    return r if isinstance(r, ChunkRange) else ChunkRange(_key(r.get("start")), _key(r.get("end")))


def _range_json(r: ChunkRange) -> dict:
    return json.loads(r.to_json())


@dataclass(frozen=True)
class WorkItem:
    """One chunk task's input: a planned range of a snapshot and how to read it (XCom)."""

    table: str
    snapshot_id: str
    range_index: int
    ranges_total: int
    range: ChunkRange
    upper_bound: tuple | None = None  # inclusive: the table's largest key when the snapshot started
    where: str | None = None
    throttle: Throttle = Throttle()  # its chunk_size (None: each chunk sized from the ones before it)

    def __post_init__(self) -> None:
        object.__setattr__(self, "range", _range(self.range))
        object.__setattr__(self, "upper_bound", _key(self.upper_bound))
        object.__setattr__(self, "range_index", int(self.range_index))
        object.__setattr__(self, "ranges_total", int(self.ranges_total))

    @classmethod
    def from_dict(cls, d: WorkItem | Mapping[str, Any]) -> WorkItem:
        if isinstance(d, WorkItem):
            return d
        if not isinstance(d, Mapping):
            raise ConfigurationError(f"a work item must be a mapping, got {type(d).__name__}")
        return cls(
            **{f.name: d[f.name] for f in fields(cls) if f.name in d and f.name != "throttle"},
            throttle=Throttle.checked(d, "the work item's "),
        )

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "range_index": self.range_index,
            "ranges_total": self.ranges_total,
            "range": _range_json(self.range),
            "upper_bound": None if self.upper_bound is None else list(self.upper_bound),
            "where": self.where,
            **self.throttle.to_dict(),
        }


@dataclass(frozen=True)
class SnapshotPlan:
    """A table's snapshot as planned (``plan.json`` next to its chunks): the ranges in plan
    order, the upper bound, the filter, the convergence mark and the read floor, and the
    throttle (``chunk_size``, ``delay_seconds`` may change on resume)."""

    table: str
    snapshot_id: str
    ranges: tuple[ChunkRange, ...]
    upper_bound: tuple | None = None
    where: str | None = None
    #: whole-table snapshots only: the mark mirror rows older than are ghosts once it is done
    converge_watermark: str | None = None
    converge_visibility: str | None = None
    read_floor: str | None = None  # an encoded Position a replica must have replayed past
    throttle: Throttle = Throttle()

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranges", tuple(_range(r) for r in self.ranges))
        object.__setattr__(self, "upper_bound", _key(self.upper_bound))

    @classmethod
    def from_dict(cls, d: SnapshotPlan | Mapping[str, Any]) -> SnapshotPlan:
        if isinstance(d, SnapshotPlan):
            return d
        return cls(
            **{f.name: d[f.name] for f in fields(cls) if f.name in d and f.name != "throttle"},
            throttle=Throttle.checked(d, "the plan's "),
        )

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "snapshot_id": self.snapshot_id,
            "ranges": [_range_json(r) for r in self.ranges],
            "upper_bound": None if self.upper_bound is None else list(self.upper_bound),
            "where": self.where,
            "converge_watermark": self.converge_watermark,
            "converge_visibility": self.converge_visibility,
            "read_floor": self.read_floor,
            **self.throttle.to_dict(),
        }

    def resumed(self, throttle: Throttle, given: Iterable[str]) -> SnapshotPlan:
        """The plan with what a resume's conf gives of ``throttle`` (:data:`RESUMABLE_KEYS`)."""
        return replace(self, throttle=self.throttle.resumed(throttle, given))

    def work_items(self, indexes: Iterable[int]) -> list[WorkItem]:
        """The chunk tasks' inputs: one per range of this plan to read."""
        return [
            WorkItem(
                self.table,
                self.snapshot_id,
                i,
                len(self.ranges),
                self.ranges[i],
                self.upper_bound,
                self.where,
                self.throttle,
            )
            for i in indexes
        ]


def work_item_dicts(items: Sequence[WorkItem]) -> list[dict]:
    """The work items as XCom carries them."""
    return [w.to_dict() for w in items]
