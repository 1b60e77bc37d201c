"""Start changelog rounds when the source has written something: an event trigger the triggerer
runs for each source whose ``cdc_changelog`` is scheduled ``@log`` (dag_builders.py).

It reads ``Dialect.log_activity`` every ``poll_interval`` seconds (PostgreSQL: the write
counters of the publication's tables; MySQL/MariaDB: the binlog's end), read-only, on one
connection it keeps, and yields an event, which Airflow turns into an Asset event that
schedules the DAG, when the reading changed since the last round started (at most every
``min_interval`` seconds), and every ``heartbeat`` seconds otherwise, so the round's bookkeeping
(log retention, compaction) still runs on an idle source. Events that come while a round runs
are folded by the scheduler into the next run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

log = logging.getLogger(__name__)

#: rounds start this often when the dialect cannot tell whether the source wrote anything
UNKNOWN_INTERVAL = 60.0


def round_reason(
    previous: Any,
    reading: Any,
    *,
    first: bool,
    since_last: float,
    heartbeat: float,
    min_interval: float = 0.0,
    backlog: bool = False,
) -> str | None:
    """Why a round should start now (None: no round). ``previous``: the ``LogActivity`` read
    when the last round started (or when the watch started), ``reading``: this poll's (None: not
    read, or the dialect cannot tell); ``since_last``: seconds since the last round this
    trigger started. A write starts a round only ``min_interval`` seconds after the last one:
    writes in between are taken by that next round (fewer, fuller rounds). ``backlog``: the last
    round's capture stopped at its cap with log left behind (pipeline/round_backlog.py), which no
    new write may announce: the next round starts ``min_interval`` after it too."""
    if first:
        if reading is None or reading.pending_bytes is None:
            return "the watch started and the capture's position is not known"
        if reading.pending_bytes > 0:
            return f"the watch started with {reading.pending_bytes:,} bytes of log not captured"
    elif (
        reading is not None
        and previous is not None
        and reading.token != previous.token
        and since_last >= min_interval
    ):
        return "the source wrote to the capture scope"
    elif backlog and since_last >= min_interval:
        return "the last round's capture stopped at its cap: log is left to capture"
    if since_last >= heartbeat:
        return "heartbeat"
    if reading is None and since_last >= min(heartbeat, UNKNOWN_INTERVAL):
        return "the source's activity cannot be read"
    return None


class LogActivityTrigger(BaseEventTrigger):
    """Yields ``{"source", "reason", "pending_bytes"}`` when a changelog round should start.

    :param conn_id: the source's Airflow connection id (resolved in the triggerer).
    :param source: the source's name (its staging folder).
    :param data_dir: the root of staging (a path or URI), where MySQL's committed offset is.
    :param poll_interval: seconds between two readings of the source.
    :param heartbeat: seconds after which a round starts even on an idle source.
    :param min_interval: seconds between the starts of two rounds at least (writes in between
        wait for the next one).
    :param storage_conn_id: the storage connection's id (never its secrets), resolved in the triggerer.
    """

    def __init__(
        self,
        *,
        conn_id: str,
        source: str,
        data_dir: str,
        poll_interval: float = 2.0,
        heartbeat: float = 600.0,
        min_interval: float = 0.0,
        storage_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.source = source
        self.data_dir = data_dir
        self.poll_interval = float(poll_interval)
        self.heartbeat = float(heartbeat)
        self.min_interval = float(min_interval)
        self.storage_conn_id = storage_conn_id
        self._dialect = None
        self._storage: dict[str, str] | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "conn_id": self.conn_id,
                "source": self.source,
                "data_dir": self.data_dir,
                "poll_interval": self.poll_interval,
                "heartbeat": self.heartbeat,
                "min_interval": self.min_interval,
                "storage_conn_id": self.storage_conn_id,
            },
        )

    def _read(self):
        """One reading on the kept connection (opened here on first use, or after an error)."""
        from .. import storage

        if self._dialect is None:
            from ..hooks.cdc_source import CdcSourceHook

            if self.storage_conn_id:
                from ..hooks.cdc_storage import storage_settings

                self._storage = storage_settings(self.storage_conn_id)
            hook = CdcSourceHook(self.conn_id, source=self.source, tables=(), all_tables=False)
            self._dialect = hook.get_dialect(source=self.source)
        with storage.scoped_settings(self._storage):
            return self._dialect.log_activity(self.data_dir)

    def _backlog(self) -> bool:
        """Whether the last round's capture left log behind at its cap (a file in staging)."""
        from .. import storage
        from ..pipeline.round_backlog import backlog_left

        with storage.scoped_settings(self._storage):
            return backlog_left(self.data_dir, self.source)

    def _backlog_safely(self) -> bool:
        try:
            return self._backlog()
        except Exception as exc:  # noqa: BLE001 - the writes and the heartbeat still start rounds
            log.warning("source %r: the capture's backlog record could not be read: %s", self.source, exc)
            return False

    def _close(self) -> None:
        d, self._dialect = self._dialect, None
        if d is not None:
            try:
                d.close()
            except Exception:  # noqa: BLE001 - closing a connection that failed already
                pass

    async def run(self) -> AsyncIterator[TriggerEvent]:
        previous, first, last_round = None, True, time.monotonic()
        try:
            while True:
                try:
                    reading = await asyncio.to_thread(self._read)
                except Exception as exc:  # noqa: BLE001 - the heartbeat's round shows the error in Airflow
                    log.warning("source %r: its log activity could not be read: %s", self.source, exc)
                    reading = None
                    await asyncio.to_thread(self._close)
                now = time.monotonic()
                since_last = now - last_round
                # read only when it could start a round: the reading is known and min_interval passed
                backlog = (
                    reading is not None
                    and not first
                    and since_last >= self.min_interval
                    and await asyncio.to_thread(self._backlog_safely)
                )
                reason = round_reason(
                    previous,
                    reading,
                    first=first,
                    since_last=since_last,
                    heartbeat=self.heartbeat,
                    min_interval=self.min_interval,
                    backlog=bool(backlog),
                )
                if reading is not None and (first or previous is None or reason is not None):
                    previous = reading  # what the next round is compared with
                first = False
                if reason is not None:
                    last_round = now
                    log.info("source %r: a changelog round starts: %s", self.source, reason)
                    yield TriggerEvent(
                        {
                            "source": self.source,
                            "reason": reason,
                            "pending_bytes": None if reading is None else reading.pending_bytes,
                        }
                    )
                await asyncio.sleep(self.poll_interval)
        finally:
            await asyncio.to_thread(self._close)
