"""What a source leaves on its server (a PostgreSQL slot and publication; MariaDB/MySQL: nothing,
its offset is a file in staging), shown and removed by hand (``airflow-cdc status --live``,
``airflow-cdc drop-source``): a slot nothing reads any more keeps WAL and can fill the disk.
"""

from __future__ import annotations

import logging

from .. import storage
from ..core.errors import StateError
from ..dialects.base import Dialect, LogRetention
from .locks import capture_lock, lock_key

log = logging.getLogger(__name__)


def log_holder(dialect: Dialect) -> LogRetention | None:
    """The source's replication slot as its server sees it now (the WAL it holds, whether a limit
    bounds it); None when the source holds no log on its server (MariaDB) or has no slot."""
    if dialect.slot_name is None:
        return None
    return dialect.log_retention("")


def drop_source(dialect: Dialect, data_dir: str) -> list[str]:
    """Drop what the source holds: PostgreSQL its replication slot and publication, MariaDB its
    committed binlog offset. Under the source's capture lock, so never under a running capture
    (StateError then). Returns what was removed, in words. The staged changelog and the outputs
    are left in ``data_dir``; on PostgreSQL capturing the source again into the same data location
    is refused until ``airflow-cdc resync`` records the gap (what was committed meanwhile is in no
    slot), then a repair or a new snapshot of its tables fills it."""
    with capture_lock(dialect.params, lock_key(dialect, data_dir), dialect.source) as acquired:
        if not acquired:
            raise StateError(
                f"source {dialect.source!r}: a capture holds its capture lock, so nothing was dropped. "
                "Pause the "
                "changelog DAG (cdc_changelog), wait for its running capture to finish, then run "
                "drop-source again"
            )
        done: list[str] = []
        slot = dialect.slot_name
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
        path = dialect.offset_path(data_dir)
        if path and storage.exists(path):
            storage.delete(path)
            done.append(f"binlog offset {path} forgotten")
        else:
            done.append("no binlog offset was stored")
        return done

