"""Wait until the staged changelog holds the high watermarks of the chunks of a round.

The merge may emit a chunk's rows only after its window (low -> high watermark) is in
the staged changelog. With ``drain=True`` the sensor runs a capture itself under the
source's capture lock, so a snapshot finishes even when the cdc_changelog DAG is not
running; if the changelog DAG is capturing, the lock is taken and the sensor just waits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, conf

from ..core.chunk import flatten_chunk_results
from ..core.errors import NotReadyError, WatermarkLostError
from ..hooks.cdc_source import CdcSourceMixin
from ..settings import load

log = logging.getLogger(__name__)


def previous_run_active(dag_run: Any, ti: Any) -> str | None:
    """For a backfill run: the run id of the previous run (by logical date) while it is still
    queued or running, else None. Other run types never wait (None)."""
    if not str(getattr(dag_run, "run_type", "")).lower().endswith("backfill"):
        return None
    prev = ti.get_previous_dagrun()
    if prev is None or str(prev.state).lower().rsplit(".", 1)[-1] not in ("queued", "running"):
        return None
    log.info("waiting for the previous interval's run %s (%s) to finish first", prev.run_id, prev.state)
    return prev.run_id


def deferrable_from_env() -> bool | None:
    """``CDC_SENSOR_DEFERRABLE`` (true/false); None when unset: Airflow's
    ``[operators] default_deferrable`` decides."""
    return load().sensor_deferrable


def poke_interval_from_env() -> float:
    """``CDC_SENSOR_POKE_INTERVAL``: seconds between the sensor's checks, a number > 0."""
    return load().sensor_poke_interval


class HighWatermarkSensor(CdcSourceMixin, BaseSensorOperator):
    """Succeeds when every high watermark of ``chunks`` is staged.

    :param chunks: ChunkResult dicts (usually the XCom of the mapped chunk task).
    :param drain: run a capture (under the capture lock) when a watermark is missing.
    :param deferrable: wait in the triggerer; the trigger hands back every
        ``poke_interval * 6`` seconds so the sensor can drain again.
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param cdc_conn_id: the source's Airflow connection; default CDC_SOURCE_CONN_ID.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    """

    template_fields: Sequence[str] = ("chunks", "data_dir", "source", "cdc_conn_id")
    ui_color = "#fff2b3"

    def __init__(
        self,
        *,
        chunks: Any,
        drain: bool = True,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,  # data_dir, cdc_conn_id, source, cdc_overrides (CdcSourceMixin)
    ) -> None:
        kwargs.setdefault("poke_interval", 5)
        super().__init__(**kwargs)
        self.chunks = chunks
        self.drain = drain
        self.deferrable = deferrable

    def _watermark_ids(self) -> list[str]:
        return sorted({c["high_watermark"] for c in flatten_chunk_results(self.chunks)})

    def poke(self, context: Any) -> bool:
        from ..triggers.high_watermark import missing_watermarks  # storage, pyarrow: not at parse

        ids = self._watermark_ids()
        missing = missing_watermarks(self.data_dir, self.hook.source, ids)
        self._raise_lost(missing)
        if missing and self.drain:
            from ..pipeline.capture import run_capture

            if run_capture(self.hook, self.data_dir) is None:
                log.info("the changelog of %r is being captured elsewhere; waiting for it", self.hook.source)
            missing = missing_watermarks(self.data_dir, self.hook.source, ids)
            self._raise_lost(missing)
        if missing:
            log.info("%d of %d high watermarks not staged yet (e.g. %s)", len(missing), len(ids), missing[0])
            return False
        log.info("all %d high watermarks are staged", len(ids))
        return True

    def _raise_lost(self, missing: list[str]) -> None:
        """WatermarkLostError when a failover lost some of the ``missing`` high watermarks."""
        if not missing:
            return
        from ..pipeline.snapshot import chunk_names, lost_chunks, lost_message
        from ..triggers.high_watermark import RESUME

        lost = lost_chunks(self.data_dir, self.hook.source, flatten_chunk_results(self.chunks), missing)
        if lost:
            raise WatermarkLostError(lost_message(chunk_names(lost), RESUME))

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        if self.poke(context):
            return None
        self._defer()

    def _defer(self) -> None:
        from ..triggers.high_watermark import HighWatermarkTrigger

        timeout = self.timeout.total_seconds() if isinstance(self.timeout, timedelta) else self.timeout
        self.defer(
            trigger=HighWatermarkTrigger(
                data_dir=self.data_dir,
                source=self.hook.source,
                watermark_ids=self._watermark_ids(),
                poll_interval=float(self.poke_interval),
                recheck_after=float(self.poke_interval) * 6 if self.drain else None,
                timeout=float(timeout) if timeout else None,
                storage_conn_id=load(overrides=self.cdc_overrides).storage_conn_id,
                high_positions={
                    c["high_watermark"]: c["high_position"]
                    for c in flatten_chunk_results(self.chunks)
                    if c.get("high_position")
                },
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """Back from the trigger. Returns (as XCom) how the deferred wait ended: the
        trigger's last event status ("success": it saw the watermarks staged; "pending":
        the sensor's own poke after a recheck did) and how many watermarks it waited for."""
        if event and event.get("status") == "error" and event.get("lost"):
            raise WatermarkLostError(event["message"])
        if not event or event.get("status") == "error":
            raise NotReadyError((event or {}).get("message", "high watermark trigger ended without an event"))
        if event.get("status") == "pending" and not self.poke(context):
            self._defer()  # raises TaskDeferred: back to the triggerer
        log.info("high watermarks staged: %s", event)
        return {"trigger_event": event.get("status"), "watermarks": len(self._watermark_ids())}
