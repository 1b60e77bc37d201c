"""What a source leaves on its server (a PostgreSQL slot and publication; MariaDB/MySQL: nothing,
its offset is a file in staging), shown and removed by hand (``airflow-cdc status --live``,
``airflow-cdc drop-source``): a slot nothing reads any more keeps WAL and can fill the disk.
"""

from __future__ import annotations

import logging
from typing import Any

from .. import storage
from ..core.errors import StateError
from ..dialects.base import Dialect, LogRetention
from .locks import capture_lock, lock_key

log = logging.getLogger(__name__)


def held_objects(dialect: Dialect, data_dir: str) -> list[str]:
    """What ``dialect``'s source holds, in words (the objects drop-source removes)."""
    held = getattr(dialect, "held_objects", None)
    if held is not None:  # PostgreSQL: what exists on the server now, and whose it is
        return held()
    path = _offset_path(dialect, data_dir)
    return [f"binlog offset {path}"] if path else []


def log_holder(dialect: Dialect) -> LogRetention | None:
    """The source's replication slot as its server sees it now (the WAL it holds, whether a limit
    bounds it); None when the source holds no log on its server (MariaDB) or has no slot."""
    if getattr(dialect, "slot_name", None) is None:
        return None
    return dialect.log_retention("")


def drop_source(dialect: Dialect, data_dir: str) -> list[str]:
    """Drop what the source holds: PostgreSQL its replication slot and publication, MariaDB its
    committed binlog offset. Under the source's capture lock, so never under a running capture
    (StateError then). Returns what was removed, in words. The staged changelog and the outputs
    are left in ``data_dir``; capturing the source again starts from the log's end, after a new
    snapshot of its tables."""
    with capture_lock(dialect.params, lock_key(dialect, data_dir)) as acquired:
        if not acquired:
            raise StateError(
                f"source {dialect.source!r}: a capture holds its capture lock, so nothing was dropped. "
                "Pause the "
                "changelog DAG (cdc_changelog), wait for its running capture to finish, then run "
                "drop-source again"
            )
        done: list[str] = []
        slot = getattr(dialect, "slot_name", None)
        if slot is not None:
            # a slot of that name this package did not make is refused before anything is dropped
            done.append(
                f"replication slot {slot!r} " + ("dropped" if dialect.drop_slot() else "did not exist")
            )
            if dialect.drop_publication():
                done.append(f"publication {dialect.publication_name!r} dropped (if it existed)")
            else:
                done.append(
                    f"publication {dialect.publication_name!r} left: another role owns it (drop it as that "
                    "role if nothing else uses it)"
                )
            return done
        path = _offset_path(dialect, data_dir)
        if path and storage.exists(path):
            storage.delete(path)
            done.append(f"binlog offset {path} forgotten")
        else:
            done.append("no binlog offset was stored")
        return done


def _offset_path(dialect: Any, data_dir: str) -> str | None:
    fn = getattr(dialect, "_offset_path", None)
    return fn(data_dir) if callable(fn) else None
