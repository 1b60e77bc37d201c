"""Throttling settings of a snapshot, read again before every round.

DBLog keeps the source healthy by pacing chunks; an operator must be able to slow a
running snapshot down (or speed it up) without restarting it. The DAG reads these
settings (e.g. from the plan or the DAG-run conf) before each round, so a
change applies from the next round on; chunks in flight finish with the old values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import ConfigurationError

MAX_CHUNK_SIZE = 10_000_000
MAX_PARALLELISM = 256
MAX_DELAY_SECONDS = 86_400.0


@dataclass(frozen=True, slots=True)
class Throttle:
    chunk_size: int = 10_000  # rows per chunk SELECT
    delay_seconds: float = 0.0  # pause between rounds
    parallelism: int = 1  # chunks per round (disjoint ranges, read in parallel)

    def __post_init__(self) -> None:
        for name, hi in (("chunk_size", MAX_CHUNK_SIZE), ("parallelism", MAX_PARALLELISM)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
                raise ConfigurationError(f"throttle setting {name} must be a whole number from 1 to {hi}, got {v!r}")
        d = self.delay_seconds
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= MAX_DELAY_SECONDS:
            raise ConfigurationError(
                f"throttle setting delay_seconds must be a number of seconds from 0 to {MAX_DELAY_SECONDS:g}, got {d!r}"
            )
        object.__setattr__(self, "delay_seconds", float(d))

    FIELDS = ("chunk_size", "delay_seconds", "parallelism")

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

    def to_dict(self) -> dict:
        return asdict(self)
