"""One capture per source, enforced by the source database itself (DBLog's leader lease).

Airflow's ``max_active_runs=1`` stops two runs of one DAG, but the snapshot DAG's sensor
may drain the changelog too, and a second deployment could point at the same source.
Two captures at once would both read from the committed offset and race on the commit.
So a capture holds a session-level lock on the source for its whole duration:
PostgreSQL ``pg_try_advisory_lock(hashtext(name))``, MySQL/MariaDB ``GET_LOCK(name, 0)``.
Both are released when the holding connection closes, so a killed worker cannot leave
the lock behind (the server drops the session).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ..dialects import ConnectionParams, get_dialect

log = logging.getLogger(__name__)


def lock_name(source: str) -> str:
    """MySQL lock names are at most 64 characters: long source names are hashed."""
    name = f"airflow_provider_cdc.capture.{source}"
    if len(name) > 64:
        name = "airflow_provider_cdc.capture." + hashlib.sha256(source.encode()).hexdigest()[:32]
    return name


@contextmanager
def capture_lock(params: ConnectionParams, source: str) -> Iterator[bool]:
    """Yield True while this process holds the capture lock of ``source``; False if another
    capture holds it (never waits: the caller skips this round or re-checks later)."""
    name = lock_name(source)
    dialect = get_dialect(params, source=source)  # one connection builder: TLS and extras kept
    conn = dialect.open_session()
    acquire, release = dialect.lock_acquire_sql, dialect.lock_release_sql
    try:
        with conn.cursor() as cur:
            cur.execute(acquire, (name,))
            got = bool(cur.fetchone()[0])
        if not got:
            log.info("capture lock %r of source %r is held by another capture", name, source)
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
