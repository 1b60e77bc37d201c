"""Changelog capture: drain the source's log to staging, then commit the offset (I6)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from ..hooks.cdc_source import CdcSourceMixin
from ..settings import FromSettings, load, sink_names

if TYPE_CHECKING:  # pyarrow: imported when the task runs, not when the DAG file is parsed
    from ..pipeline.retention import RetentionPolicy

log = logging.getLogger(__name__)


class ChangelogCaptureOperator(CdcSourceMixin, BaseOperator):
    """Drain the changelog of one source to ``{data_dir}/staging/{source}/changelog``.

    Returns the CaptureResult as a dict (XCom).

    :param max_events: the most events one run stages; default CDC_CAPTURE_MAX_EVENTS.
    :param segment_max_events: events per staged segment, which bounds the task's memory; default
        CDC_CAPTURE_SEGMENT_MAX_EVENTS, else the connection's ``segment_max_events`` extra, else
        20,000; 0: one segment per run.
    :param skip_if_locked: when another capture of the source holds the lock, skip the task
        (True) or fail it (False).
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param cdc_conn_id: the source's Airflow connection; default CDC_SOURCE_CONN_ID.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    """

    template_fields: Sequence[str] = ("cdc_conn_id", "data_dir", "source", "max_events", "segment_max_events")
    ui_color = "#c9e4ff"
    # not given: the settings when the task runs (settings.py)
    max_events = FromSettings("capture_max_events")
    segment_max_events = FromSettings("capture_segment_max_events")

    def __init__(
        self,
        *,
        max_events: int | None = None,
        segment_max_events: int | None = None,
        skip_if_locked: bool = True,
        **kwargs: Any,  # data_dir, cdc_conn_id, source, cdc_overrides (CdcSourceMixin)
    ) -> None:
        super().__init__(**kwargs)
        self.max_events = max_events
        self.segment_max_events = segment_max_events
        self.skip_if_locked = skip_if_locked

    def execute(self, context: Any) -> dict[str, Any]:
        result = capture_changes(
            self.hook,
            self.data_dir,
            overrides=getattr(self, "cdc_overrides", None),
            max_events=_opt_int(self.max_events),
            segment_max_events=_opt_int(self.segment_max_events),
        )
        if result is None:
            msg = (
                f"another capture of source {self.hook.source!r} holds the capture lock; nothing "
                "captured this run"
            )
            if self.skip_if_locked:
                from airflow.sdk.exceptions import AirflowSkipException

                raise AirflowSkipException(msg)
            from ..core.errors import StateError

            raise StateError(msg + "; retry later")
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """OpenLineage (lineage.py): the captured tables in (those with a staged schema), the
        staged changelog out."""
        from .. import storage
        from ..core.schema import TableName
        from ..lineage import tables_lineage
        from ..storage.layout import changelog_dir, schema_path, schemas_dir

        source = self.hook.source
        tables = self.hook.tables
        if tables is None:  # every table of the database: those capture has staged a schema of
            folder = schemas_dir(self.data_dir, source)
            names = storage.list_names(folder, suffix=".json") if storage.exists(folder) else []
            tables = [t for n in names if (t := TableName.from_path_segment(n[: -len(".json")])) is not None]
        tables = [t if isinstance(t, TableName) else TableName.parse(str(t)) for t in tables]
        tables = [t for t in tables if storage.exists(schema_path(self.data_dir, source, t))]
        return tables_lineage(
            self.hook.connection_params(),
            self.data_dir,
            source,
            tables,
            staging=changelog_dir(self.data_dir, source),
            staging_is_output=True,
        )


def capture_changes(
    hook: Any,
    data_dir: str,
    *,
    overrides: dict[str, str] | None = None,
    max_events: int | None = None,
    segment_max_events: int | None = None,
) -> dict[str, Any] | None:
    """Drain the log of ``hook``'s source to staging, then commit the offset (I6); the lag's
    metrics and Variable recorded. Returns the capture's result as a dict (XCom), None when
    another capture of the source holds the capture lock."""
    from ..pipeline.capture import run_capture

    try:
        done = run_capture(
            hook,
            data_dir,
            max_events=max_events,
            segment_max_events=segment_max_events,
            retention=_retention(hook, data_dir, overrides),
        )
    except Exception as exc:
        _record_failure(hook.source, exc)
        raise
    if done is None:
        return None
    result, lag = done
    if lag is not None:
        _emit_lag_metrics(lag)
        from .. import airflow_variables

        airflow_variables.save_lag(lag.source, lag.record(time.time()))
    return {
        "source": hook.source,
        "events": result.events,
        "watermarks": result.watermarks,
        "segment": result.segment,
        "segments": list(result.segments),
        "start_offset": result.start_offset,
        "end_offset": result.end_offset,
        "seconds": round(result.seconds, 3),
        # read by the changelog DAG's check_log_retention, which fails the run loudly on a risk
        "lag_bytes": None if lag is None else lag.bytes,
        "lag_seconds": None if lag is None else round(lag.seconds, 3),
        "log_holder": None if lag is None else lag.holder,
        "retention_risk": None if lag is None else lag.risk,
        # nothing bounds the log the source keeps for this capture (a warning, not a failure)
        "retention_warning": None if lag is None else lag.warning,
    }


def _retention(hook: Any, data_dir: str, overrides: dict[str, str] | None) -> RetentionPolicy | None:
    """Staging retention after the capture: the sinks' markers and the snapshots' stored
    progress hold what they still need (pipeline/retention.py)."""
    now = load(overrides=overrides)
    if now.staging_retention_hours is None:
        return None
    from .. import airflow_variables
    from ..pipeline.retention import RetentionPolicy

    source = hook.source

    def snapshot_of(table_id: str) -> tuple[str, str, float | None] | None:
        p = airflow_variables.load(source, table_id, data_dir)
        return None if p is None else (p.snapshot_id, str(p.status), p.updated_at)

    return RetentionPolicy(now.staging_retention_hours * 3600, tuple(sink_names(now.sinks)), snapshot_of)


def _record_failure(source: str, exc: BaseException) -> None:
    """Where status and the CDC page look: the capture of ``source`` is failing, and why."""
    from .. import airflow_variables
    from ..error_text import safe_error_text

    try:
        airflow_variables.save_capture_failure(source, f"{type(exc).__name__}: {safe_error_text(exc)}")
    except Exception:  # noqa: BLE001 - the capture's own error is what the task raises
        log.warning("could not record the failed capture of %r for status", source, exc_info=True)
    _emit_failing(source, True)


def _emit_failing(source: str, failing: bool) -> None:
    """``cdc.capture.failing``: 1 while the source's captures fail, 0 after one succeeds (an
    alert rule on it needs no log reading)."""
    try:
        from airflow.sdk.observability.stats import gauge
    except ImportError:  # an Airflow without the Task SDK's metrics
        return
    try:
        gauge("cdc.capture.failing", 1 if failing else 0, tags={"source": source})
    except Exception:  # noqa: BLE001 - a metrics backend's failure never fails the capture
        log.warning("could not emit cdc.capture.failing for %r", source, exc_info=True)


def _emit_lag_metrics(lag) -> None:
    """``cdc.capture.lag_bytes`` / ``lag_seconds`` / ``retention_at_risk``, tagged with the source
    (StatsD or OpenTelemetry, as Airflow's [metrics] section configures)."""
    try:
        from airflow.sdk.observability.stats import gauge
    except ImportError:  # an Airflow without the Task SDK's metrics
        return
    tags = {"source": lag.source}
    _emit_failing(lag.source, False)
    gauge("cdc.capture.lag_bytes", lag.bytes, tags=tags)
    gauge("cdc.capture.lag_seconds", lag.seconds, tags=tags)
    gauge("cdc.capture.retention_at_risk", 1 if lag.risk else 0, tags=tags)
    # 1: nothing bounds the log the source keeps for this capture (max_slot_wal_keep_size = -1)
    gauge("cdc.capture.retention_unbounded", 1 if getattr(lag, "warning", None) else 0, tags=tags)
    if lag.replica is not None:  # -1: the replica does not replicate
        gauge("cdc.replica.lag_seconds", -1 if lag.replica[1] == float("inf") else lag.replica[1], tags=tags)


def check_log_retention(capture_result: dict | None) -> str:
    """The changelog DAG's ``log_retention`` task, beside apply: raise (failing the run) when the
    capture's source may soon drop log it has not captured; else describe the lag."""
    from ..core.errors import RetentionError
    from ..pipeline.capture import Lag

    if not capture_result or capture_result.get("lag_bytes") is None:
        return "no lag reading (capture skipped, or the source cannot tell)"
    lag = Lag(
        capture_result["source"],
        capture_result["log_holder"],
        capture_result["lag_bytes"],
        capture_result["lag_seconds"],
        capture_result.get("retention_risk"),
    )
    if lag.risk:
        raise RetentionError(f"source {lag.source!r}: {lag.risk}")
    warning = capture_result.get("retention_warning")
    return lag.describe() + (f"; WARNING: {warning}" if warning else "")


def _opt_int(value: Any) -> int | None:
    """A templated optional integer: None, "" or "None" -> None."""
    return int(value) if value not in (None, "", "None") else None
