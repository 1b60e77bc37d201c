"""Whether the last one-task round's capture stopped at its cap with log left behind, so the
``@log`` trigger starts the next round at once (triggers/log_activity.py).

The trigger starts a round when the source writes to the capture scope. A round whose capture
stopped at its cap (core/rounds.py, RoundCapture, or ``CDC_CAPTURE_MAX_EVENTS``) leaves log that
no new write announces: once the writers stop, it would wait for the heartbeat (minutes). So
such a round leaves a small file in the source's staging folder, and a round whose capture read
to the end removes it; while it is there the trigger starts a round every
``CDC_CHANGELOG_MIN_INTERVAL_SECONDS``. A file left by a round that died can only start a round
too many, never hold one back.
"""

from __future__ import annotations

import json
import time

from .. import storage
from ..storage.layout import staging_dir


def backlog_path(data_dir: str, source: str) -> str:
    return storage.join(staging_dir(data_dir, source), "capture_backlog.json")


def record_backlog(data_dir: str, source: str, *, left: bool, offset: str | None = None) -> None:
    """After a round's capture: ``left``, it stopped at its cap at ``offset``; else it read to the
    end of the log and the file goes."""
    path = backlog_path(data_dir, source)
    if left:
        storage.write_text(path, json.dumps({"stopped_at": offset, "at": time.time()}))
        return
    storage.delete(path)  # absent is fine: no existence check first (a request on object storage)


def backlog_left(data_dir: str, source: str) -> bool:
    """Whether the last round's capture left log behind at its cap."""
    return storage.exists(backlog_path(data_dir, source))
