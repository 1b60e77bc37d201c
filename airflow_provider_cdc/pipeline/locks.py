"""One capture per source, enforced by the source database itself (DBLog's leader lease): a
session-level lock keyed by what it protects (the slot, or the staged offset file), released
by the server when the holder's connection closes (docs/DESIGN.md, "Components").
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ..dialects import ConnectionParams, Dialect, get_dialect

log = logging.getLogger(__name__)


def lock_key(dialect: Dialect, data_dir: str) -> str:
    """What a capture of ``dialect`` into ``data_dir`` must hold alone: the dialect's
    ``capture_lock_key`` (PostgreSQL the slot, MariaDB the offset file, else the source's name)."""
    return dialect.capture_lock_key(data_dir)


def lock_name(key: str) -> str:
    """MySQL lock names are at most 64 characters: long keys are hashed."""
    name = f"airflow_provider_cdc.capture.{key}"
    if len(name) > 64:
        name = "airflow_provider_cdc.capture." + hashlib.sha256(key.encode()).hexdigest()[:32]
    return name


@contextmanager
def capture_lock(params: ConnectionParams, key: str, source: str | None = None) -> Iterator[bool]:
    """Yield True while this process holds the capture lock ``key`` (:func:`lock_key`); False if
    another capture holds it (never waits: the caller skips this round or re-checks later)."""
    name = lock_name(key)
    # one connection builder (TLS and extras kept); ``source`` names the source in its errors
    dialect = get_dialect(params, **({"source": source} if source else {}))
    conn = dialect.open_session()
    acquire, release = dialect.lock_acquire_sql, dialect.lock_release_sql
    try:
        with conn.cursor() as cur:
            cur.execute(acquire, (name,))
            got = bool(cur.fetchone()[0])
        if not got:
            log.info("capture lock %r (%s) is held by another capture", name, key)
        try:
            yield got
        finally:
            if got:
                try:
                    with conn.cursor() as cur:
                        cur.execute(release, (name,))
                except Exception:  # noqa: BLE001 - closing the session below releases it anyway
                    log.warning(
                        "could not release capture lock %r explicitly; closing the session releases it", name
                    )
    finally:
        conn.close()
