"""``profiled``: run a function under cProfile when asked, for the benches' ``--profile``."""

from __future__ import annotations

import cProfile
import io
import pstats
from typing import Any


def profiled(enabled: bool, fn, *args, **kwargs) -> tuple[Any, str]:
    """``fn(*args, **kwargs)`` and, when ``enabled``, its 12 costliest functions by own time."""
    if not enabled:
        return fn(*args, **kwargs), ""
    prof = cProfile.Profile()
    result = prof.runcall(fn, *args, **kwargs)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    return result, out.getvalue()
