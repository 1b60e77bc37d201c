"""When the mirrors' background maintenance (compaction, vacuum, the event log's small files)
runs under the one-task rounds of ``@log`` and ``@continuous`` (dag_builders.py): every
``CDC_MAINTENANCE_INTERVAL_SECONDS``, not every round. The time of the last maintenance that
finished is a small file in the source's staging folder, written through the storage layer.
A round that finds it missing or unreadable runs maintenance: it can only come too often,
never be lost. A snapshot that finishes removes it, so the next round compacts what the
snapshot wrote.
"""

from __future__ import annotations

import json
import time

from .. import storage
from ..storage.layout import staging_dir


def maintenance_path(data_dir: str, source: str) -> str:
    return storage.join(staging_dir(data_dir, source), "maintenance.json")


def maintenance_due(last_at: float | None, now: float, interval: float) -> bool:
    """Whether maintenance should run now: never ran (or its time is unknown), ``interval``
    seconds passed since, or the clock went back (a moved host: better once too often)."""
    if last_at is None:
        return True
    return now - last_at >= interval or now < last_at


def last_maintenance(data_dir: str, source: str) -> float | None:
    """The time (epoch s) the last maintenance of ``source`` finished; None when unknown."""
    try:  # one read a round, no existence check first (a request on object storage)
        at = json.loads(storage.read_text(maintenance_path(data_dir, source))).get("finished_at")
    except (OSError, ValueError, AttributeError):  # missing or unreadable: run it again
        return None
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


def record_maintenance(data_dir: str, source: str, at: float | None = None) -> None:
    """Record that maintenance of ``source`` finished (now, or at ``at``)."""
    at = time.time() if at is None else at
    storage.write_text(maintenance_path(data_dir, source), json.dumps({"finished_at": at}))


def request_maintenance(data_dir: str, source: str) -> None:
    """Make maintenance due at the next round: a snapshot that finished left work for it (its
    merged chunks to fold into the buckets' base, the tombstones it held back)."""
    path = maintenance_path(data_dir, source)
    if storage.exists(path):
        storage.delete(path)
