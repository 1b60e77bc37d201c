"""The chunk size of a snapshot's range: fixed by its :class:`~.plans.Throttle`'s
``chunk_size``, else adapted per range by :class:`ChunkSizer` (docs/DESIGN.md, "One chunk of a
snapshot": pace). The throttle is read again before every round (a change applies from the
next round; chunks in flight keep theirs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .plans import (
    AUTO,
    MAX_CHUNK_SIZE,
    MAX_DELAY_SECONDS,
    MAX_PARALLELISM,
    Throttle,
    chunk_size_value,
)

# the throttle, its settings' bounds and defaults are defined once, in core/plans.py
__all__ = ["AUTO", "MAX_CHUNK_SIZE", "MAX_DELAY_SECONDS", "MAX_PARALLELISM", "Throttle", "chunk_size_value"]


# --------------------------------------------------------------------- adaptive chunk size
MB = 1024 * 1024
#: rows of a range's first adaptive chunk (the fixed default of earlier versions), within the bounds
DEFAULT_START_ROWS = 10_000
#: rows a range's probe reads before its first adaptive chunk (:meth:`ChunkSizer.probe`): enough
#: that a query's own cost (a few ms) does not dominate the per-row cost it measures, a fifth
#: of the start size the first chunk had without it
PROBE_ROWS = 2_000
#: a chunk asks at most this many times the rows of the one before: one fast chunk (a cached
#: page, an idle moment) does not make a huge next one. Shrinking has no limit.
MAX_GROWTH = 2.0
#: a chunk whose rows take less than this share of the bytes a row took before entered narrower
#: rows (a property of the data, not a busy moment): its per-row duration applies at once
NARROWER = 0.5
#: weight of the newest chunk's per-row cost in the estimate: one chunk slowed down by a busy
#: moment moves the next size only part of the way, and the size follows a real change within
#: two or three chunks. Bytes per row that rise apply at once (a wide region's second chunk
#: is sized for its rows already: the bytes target bounds what a chunk stages).
SMOOTHING = 0.6
#: setting -> its variable (settings.py), for the messages
SIZING_VARS = {
    "target_seconds": "CDC_CHUNK_TARGET_SECONDS",
    "target_mb": "CDC_CHUNK_TARGET_MB",
    "min_rows": "CDC_CHUNK_MIN_ROWS",
    "max_rows": "CDC_CHUNK_MAX_ROWS",
}


@dataclass(frozen=True, slots=True)
class ChunkSizing:
    """Targets and bounds of the adaptive chunk size (CDC_CHUNK_TARGET_SECONDS and the others,
    settings.py). ``min_rows``/``max_rows`` bound the size the duration asks for; the bytes
    target caps it even below ``min_rows`` (never below one row): the staged chunk, which the
    merge reads, stays near ``target_bytes`` whatever the width of the rows."""

    target_seconds: float = 1.0
    target_bytes: int = 32 * MB
    min_rows: int = 100
    max_rows: int = 1_000_000

    def __post_init__(self) -> None:
        t = self.target_seconds
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.01 <= t <= 3600:
            raise ConfigurationError(
                f"{SIZING_VARS['target_seconds']} must be a number of seconds from 0.01 to "
                f"3600 (a chunk's duration to aim at), got {t!r}"
            )
        object.__setattr__(self, "target_seconds", float(t))
        b = self.target_bytes
        if isinstance(b, bool) or not isinstance(b, int) or not 1024 <= b <= 64 * 1024 * MB:
            raise ConfigurationError(
                f"{SIZING_VARS['target_mb']} must be a number of megabytes from 0.001 to "
                f"65536 (a staged chunk's size to aim at), got {b / MB!r} MB"
            )
        for name in ("min_rows", "max_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_CHUNK_SIZE:
                raise ConfigurationError(
                    f"{SIZING_VARS[name]} must be a whole number of rows from 1 to "
                    f"{MAX_CHUNK_SIZE}, got {v!r}"
                )
        if self.min_rows > self.max_rows:
            raise ConfigurationError(
                f"{SIZING_VARS['min_rows']} ({self.min_rows}) must not exceed "
                f"{SIZING_VARS['max_rows']} ({self.max_rows})"
            )

    @classmethod
    def parse(cls, texts: Mapping[str, str | None]) -> ChunkSizing:
        """From the settings' text (keys of :data:`SIZING_VARS`; empty or missing: the default).
        A value that is not a number is a ConfigurationError naming its variable."""
        unknown = sorted(set(texts) - set(SIZING_VARS))
        if unknown:
            raise ConfigurationError(f"unknown chunk sizing setting(s) {unknown}; known: {list(SIZING_VARS)}")
        kwargs: dict[str, Any] = {}
        for key, raw in texts.items():
            raw = (raw or "").strip()
            if not raw:
                continue
            try:
                value = float(raw) if key in ("target_seconds", "target_mb") else int(raw)
            except ValueError:
                raise ConfigurationError(f"{SIZING_VARS[key]} must be a number, got {raw!r}") from None
            if key == "target_mb":
                if not 0 < value < float("inf"):
                    raise ConfigurationError(
                        f"{SIZING_VARS[key]} must be a number of megabytes > 0, got {raw!r}"
                    )
                kwargs["target_bytes"] = int(value * MB)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def bounded(self, rows: int) -> int:
        return max(self.min_rows, min(self.max_rows, int(rows)))


class ChunkSizer:
    """The row count of each chunk of one range: fixed (``fixed``), or chosen from the chunks
    read before it in the range (pure: the caller measures and passes each chunk's rows,
    seconds and staged bytes to :meth:`observe`).

    Per-row costs (seconds, bytes) are estimated from the chunks read, moving by
    :data:`SMOOTHING` towards each new one (bytes that rise: at once). The next size is what
    meets both targets at that cost, at most :data:`MAX_GROWTH` times the last size, within
    ``min_rows``..``max_rows``; the bytes target caps it below ``min_rows`` too. ``size`` is
    the next chunk's row count, ``reason`` says what chose it: ``fixed``, ``start``,
    ``duration``, ``bytes``, ``growth cap``, ``min rows`` or ``max rows``."""

    def __init__(
        self,
        sizing: ChunkSizing | None = None,
        *,
        fixed: int | None = None,
        start: int | None = None,
        target_bytes_cap: int | None = None,
    ) -> None:
        self.sizing = sizing or ChunkSizing()
        self.fixed = fixed
        #: the bytes target in use: the setting's, or less (a source whose batches hold fewer bytes)
        self.target_bytes = min(self.sizing.target_bytes, target_bytes_cap or self.sizing.target_bytes)
        self._seconds_per_row: float | None = None
        self._bytes_per_row: float | None = None
        if fixed is not None:
            self.size, self.reason = fixed, "fixed"
        else:
            self.size, self.reason = self.sizing.bounded(start or DEFAULT_START_ROWS), "start"

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def observe(self, rows: int, seconds: float, nbytes: int | None) -> int:
        """The chunk just read held ``rows`` rows, took ``seconds`` and staged ``nbytes``
        (None: unknown). Returns the next chunk's row count (also ``self.size``)."""
        if self.fixed is not None or rows <= 0:
            return self.size
        per_row = max(0.0, float(seconds)) / rows
        narrower = (
            nbytes is not None
            and self._bytes_per_row is not None
            and max(0, int(nbytes)) / rows < NARROWER * self._bytes_per_row
        )
        self._seconds_per_row = per_row if narrower else _estimate(self._seconds_per_row, per_row)
        if nbytes is not None:
            self._bytes_per_row = _estimate(
                self._bytes_per_row, max(0, int(nbytes)) / rows, rise_at_once=True, at_once=narrower
            )
        return self._next(max(self.size, rows) * MAX_GROWTH)

    def probe(self, rows: int, seconds: float, nbytes: int | None) -> int:
        """A read of ``rows`` rows before the range's first chunk (a sample: nothing of it is
        committed) took ``seconds`` and staged ``nbytes``: the first chunk is sized from its
        per-row costs (no growth cap: a probe is not a chunk size to grow from), not from a
        fixed start. Returns that size (also ``self.size``)."""
        if self.fixed is not None or rows <= 0:
            return self.size
        self._seconds_per_row = max(0.0, float(seconds)) / rows
        if nbytes is not None:
            self._bytes_per_row = max(0, int(nbytes)) / rows
        return self._next(float("inf"))

    def _next(self, cap: float) -> int:
        """The size that meets both targets at the estimated costs, at most ``cap`` rows."""
        s = self.sizing
        want, reason = _rows_for(s.target_seconds, self._seconds_per_row), "duration"
        if want > cap:
            want, reason = cap, "growth cap"
        if want > s.max_rows:
            want, reason = s.max_rows, "max rows"
        if want < s.min_rows:
            want, reason = s.min_rows, "min rows"
        by_bytes = _rows_for(self.target_bytes, self._bytes_per_row)
        if by_bytes < want:
            want, reason = by_bytes, "bytes"
        self.size, self.reason = max(1, int(want * (1 + 1e-9))), reason  # floor, but 99,999.99... is 100,000
        return self.size

    def describe(self) -> str:
        """The next size and why, for the chunk's log line."""
        if self.fixed is not None:
            return f"{self.size:,} rows (fixed chunk_size)"
        s = self.sizing
        why = {
            "start": "start",
            "duration": f"duration target {s.target_seconds:g} s",
            "bytes": f"bytes target {size_text(self.target_bytes)}",
            "growth cap": f"growth cap {MAX_GROWTH:g}x",
            "min rows": f"bound {SIZING_VARS['min_rows']}={s.min_rows:,}",
            "max rows": f"bound {SIZING_VARS['max_rows']}={s.max_rows:,}",
        }[self.reason]
        return f"{self.size:,} rows ({why})"


def size_text(nbytes: float) -> str:
    """Bytes for a log line: ``512 B``, ``32 KB``, ``1.5 MB``."""
    for unit, scale in (("MB", MB), ("KB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _estimate(old: float | None, new: float, rise_at_once: bool = False, at_once: bool = False) -> float:
    if old is None or at_once or (rise_at_once and new >= old):
        return new
    return old + SMOOTHING * (new - old)


def _rows_for(target: float, per_row: float | None) -> float:
    return float("inf") if not per_row else target / per_row
