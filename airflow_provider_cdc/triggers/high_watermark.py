"""Wait, in the triggerer, until the staged changelog holds the high watermarks of some chunks.

A chunk's rows may only be emitted once its window is closed, i.e. once its high
watermark (DBLog step 3) has been captured; never earlier (core.errors.NotReadyError).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from .. import storage
from ..pipeline.snapshot import lost_message, lost_watermarks
from ..storage.layout import changelog_dir
from ..storage.staged import staged_watermarks

#: what to do about a lost high watermark (pipeline/snapshot.py discard_lost)
RESUME = (
    "Waiting cannot bring it back: resume the snapshot (airflow-cdc snapshot resume --table TABLE, "
    'or trigger the snapshot DAG with conf {"action": "resume"}), which discards these chunks '
    "and reads them again on the server the source is now."
)


def missing_watermarks(data_dir: str, source: str, watermark_ids: Iterable[str]) -> list[str]:
    """The ids of ``watermark_ids`` not in the staged changelog of ``source`` yet (the
    watermark rows only, ``op = 'w'`` pushed into the Parquet reader: a poke stays cheap)."""
    wanted = sorted({w for w in watermark_ids if w})
    if not wanted:
        return []
    found = staged_watermarks(changelog_dir(data_dir, source), wanted)
    return [w for w in wanted if w not in found]


class HighWatermarkTrigger(BaseTrigger):
    """Polls the staged changelog for ``watermark_ids``.

    Yields ``{"status": "success"}`` when all are staged; ``{"status": "pending", "missing": n}``
    after ``recheck_after`` seconds so the sensor can drain the changelog itself (captures
    do not run in the triggerer) and defer again; ``{"status": "error", "message": ...}`` on
    a read error or when ``timeout`` seconds passed.

    :param data_dir: the root of staging (a path or URI).
    :param source: the source whose staged changelog is read.
    :param watermark_ids: the high watermarks to wait for.
    :param poll_interval: seconds between two reads of the staged changelog's index.
    :param recheck_after: seconds after which to hand back to the sensor (None: never).
    :param timeout: seconds after ``started_at`` to give up with an error (None: never).
    :param started_at: when the wait began (epoch seconds; default now), kept across deferrals.
    :param storage_conn_id: the storage connection's id (never its secrets), resolved in the triggerer.
    :param high_positions: per watermark id, where the source's log stood just after it was
        written (ChunkResult.high_position): a watermark capture has staged past without finding
        it is lost (a failover), an error event with ``lost`` at once instead of a wait.
    """

    def __init__(
        self,
        *,
        data_dir: str,
        source: str,
        watermark_ids: list[str],
        poll_interval: float = 5.0,
        recheck_after: float | None = None,
        timeout: float | None = None,
        started_at: float | None = None,
        storage_conn_id: str | None = None,
        high_positions: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.source = source
        self.watermark_ids = list(watermark_ids)
        self.poll_interval = float(poll_interval)
        self.recheck_after = None if recheck_after is None else float(recheck_after)
        self.timeout = None if timeout is None else float(timeout)
        self.started_at = time.time() if started_at is None else float(started_at)
        self.storage_conn_id = storage_conn_id  # the connection's id only: never its secrets
        self.high_positions = dict(high_positions or {})

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "data_dir": self.data_dir,
                "source": self.source,
                "watermark_ids": list(self.watermark_ids),
                "poll_interval": self.poll_interval,
                "recheck_after": self.recheck_after,
                "timeout": self.timeout,
                "started_at": self.started_at,
                "storage_conn_id": self.storage_conn_id,
                "high_positions": dict(self.high_positions),
            },
        )

    def _missing(self, settings: dict[str, str] | None) -> tuple[list[str], str | None]:
        """One poll, with this trigger's storage settings for this call only: the triggerer's
        process is shared by every source's triggers, so nothing goes to its os.environ. The
        ids not staged yet, and what is wrong when some of them are lost."""
        with storage.scoped_settings(settings):
            missing = missing_watermarks(self.data_dir, self.source, self.watermark_ids)
            lost = lost_watermarks(self.data_dir, self.source, self.high_positions, missing)
        return missing, (lost_message([f"high watermark {w}" for w in lost], RESUME) if lost else None)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        entered = time.time()
        settings = None
        while True:
            try:
                if self.storage_conn_id and settings is None:  # resolved here, once per deferral
                    from ..hooks.cdc_storage import storage_settings

                    settings = await asyncio.to_thread(storage_settings, self.storage_conn_id)
                missing, lost = await asyncio.to_thread(self._missing, settings)
            except Exception as exc:  # noqa: BLE001 - surfaced to the task, which raises it
                yield TriggerEvent(
                    {
                        "status": "error",
                        "message": f"reading staged changelog of {self.source!r} "
                        f"in {self.data_dir!r} failed: {type(exc).__name__}: {exc}",
                    }
                )
                return
            if not missing:
                yield TriggerEvent({"status": "success", "watermarks": len(self.watermark_ids)})
                return
            if lost:
                yield TriggerEvent({"status": "error", "lost": True, "message": lost})
                return
            now = time.time()
            if self.timeout is not None and now - self.started_at >= self.timeout:
                yield TriggerEvent(
                    {
                        "status": "error",
                        "message": f"{len(missing)} of {len(self.watermark_ids)} high watermarks of "
                        f"source {self.source!r} "
                        f"not in the staged changelog after {self.timeout:.0f} s (first: {missing[0]}); "
                        "is the cdc_changelog DAG (capture) running?",
                    }
                )
                return
            if self.recheck_after is not None and now - entered >= self.recheck_after:
                yield TriggerEvent({"status": "pending", "missing": len(missing)})
                return
            await asyncio.sleep(self.poll_interval)
