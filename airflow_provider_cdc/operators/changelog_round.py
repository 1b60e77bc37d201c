"""A changelog round in one task, for the schedules that run rounds every few seconds (``@log``,
``@continuous``; dag_builders.py): capture, then apply, then the round's checks, in one task
process. Airflow spends about half a CPU second starting any task, so a round of five tasks
every few seconds kept a core busy starting them (issue 49's measurement); the work itself is
the same.

The guarantees are those of the separate tasks, in the same order and with the same code:
capture commits its offset only after its segments are staged (I6); apply moves each sink's
marker only after the sink wrote (at-least-once, absorbed by the sinks); apply takes what is
staged even when another capture holds the capture lock; a round with more rows than
``local_max_rows`` runs its apply through spark-submit, as the ``apply`` task does. A round is
one task instance (``max_active_tis_per_dag=1``): two applies of a source never run at once.

Unless ``CDC_CAPTURE_MAX_EVENTS`` is set, a round's capture stops at 90% of ``local_max_rows``
(at a transaction boundary), so under steady writes every apply stays in the worker and the next
round follows at once; a capture still ``CDC_ROUND_CATCH_UP_SECONDS`` behind after that takes the
rest in the same round, for one spark-submit apply (core/rounds.py, RoundCapture).

The follow-up tasks run only when they have something to do; the round skips the others
(Airflow's SkipMixin, as a branch does), so no process starts for them:

- ``mirror_schema_stops`` when the apply left tables waiting for a re-snapshot. It fails the
  run naming them. The round itself succeeds, so Airflow records the Asset events of the
  tables it applied (it drops a failed task's).
- ``log_retention`` when the source may soon drop log the capture has not read. It fails the
  run naming the slot or file and what to do.
- ``compact_tombstones`` (compaction, vacuum, the event log's small files) every
  ``CDC_MAINTENANCE_INTERVAL_SECONDS`` (pipeline/maintenance.py).
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk.bases.skipmixin import SkipMixin

from ..core.rounds import RoundCapture
from ..hooks.task_errors import wrap_task_methods
from ..settings import FromSettings, load
from .changelog_apply import ChangelogApplyOperator

#: the round's follow-up tasks (dag_builders.changelog_dag names them the same)
SCHEMA_STOPS = "mirror_schema_stops"
LOG_RETENTION = "log_retention"
MAINTENANCE = "compact_tombstones"


def follow_ups(result: dict[str, Any], *, maintenance_due: bool) -> list[str]:
    """The follow-up tasks a round's ``result`` calls for (the others are skipped)."""
    follow = []
    if result.get("schema_stopped"):
        follow.append(SCHEMA_STOPS)
    if result.get("retention_risk"):
        follow.append(LOG_RETENTION)
    if maintenance_due:
        follow.append(MAINTENANCE)
    return follow


def joined(first: dict[str, Any], rest: dict[str, Any] | None) -> dict[str, Any]:
    """One round's result of two captures in a row (``rest``: None when another capture took the
    lock between them): counts added, the span from the first's start to the second's end, the
    lag and retention readings the second's."""
    if rest is None:
        return first
    out = dict(rest)
    for count in ("events", "watermarks", "seconds"):
        out[count] = first[count] + rest[count]
    out["segments"] = [*first["segments"], *rest["segments"]]
    out["segment"] = rest["segment"] or first["segment"]
    out["start_offset"] = first["start_offset"]
    return out


class ChangelogRoundOperator(ChangelogApplyOperator, SkipMixin):
    """Capture the source's log to staging, then apply what is staged to the sinks (in this
    worker, or through spark-submit past ``local_max_rows``), then start only the follow-up
    tasks that have work (module docstring).

    Returns the capture's result (XCom; the ``log_retention`` task reads it) with ``apply``,
    the apply's summary (None: nothing staged past the sinks' markers), ``schema_stopped``
    (the ``mirror_schema_stops`` task reads it) and ``follow_ups``.

    :param max_events: the most events one capture stages; default CDC_CAPTURE_MAX_EVENTS, and
        unset, 90% of ``local_max_rows`` unless the capture is still CDC_ROUND_CATCH_UP_SECONDS
        behind after it (core/rounds.py, RoundCapture).
    :param segment_max_events: events per staged segment; default CDC_CAPTURE_SEGMENT_MAX_EVENTS.

    The other parameters are :class:`ChangelogApplyOperator`'s.
    """

    ui_color = "#b9dcff"
    # not given: the settings when the task runs, as ChangelogCaptureOperator's
    max_events = FromSettings("capture_max_events")
    segment_max_events = FromSettings("capture_segment_max_events")

    def __init__(
        self, *, max_events: int | None = None, segment_max_events: int | None = None, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.max_events = max_events
        self.segment_max_events = segment_max_events

    def _capture(self, hook: Any, catch_up_seconds: float) -> dict[str, Any] | None:
        """The round's capture (None: another capture holds the lock), sized by RoundCapture:
        capped under the worker's bound, the rest at once when still far behind. A capture left
        stopped at its cap is recorded, so the ``@log`` trigger starts the next round without
        waiting for a write (pipeline/round_backlog.py)."""
        from ..pipeline.round_backlog import record_backlog
        from .capture import capture_changes

        sizing = RoundCapture(self.max_events, self.local_max_rows, catch_up_seconds)
        if self.max_events is None and sizing.cap is not None:  # the default cap: less what waits
            sizing = RoundCapture(None, self.local_max_rows, catch_up_seconds, staged=self.input_rows())

        def capture(max_events: int | None) -> dict[str, Any] | None:
            return capture_changes(
                hook,
                self.data_dir,
                overrides=self.cdc_overrides,
                max_events=max_events,
                segment_max_events=self.segment_max_events,
            )

        captured = capture(sizing.cap)
        if captured is None:
            return None
        left = sizing.stopped(captured["events"])
        if left and sizing.catch_up(captured["events"], captured.get("lag_seconds")):
            self.log.info(
                "the capture stopped at %d events and is still %.0f s behind (CDC_ROUND_CATCH_UP_SECONDS="
                "%g): capturing the rest in this round",
                captured["events"],
                captured["lag_seconds"],
                sizing.catch_up_seconds,
            )
            rest = capture(None)
            captured, left = joined(captured, rest), rest is None
        record_backlog(self.data_dir, hook.source, left=left, offset=captured["end_offset"])
        return captured

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from ..hooks.cdc_source import CdcSourceHook
        from ..pipeline.maintenance import last_maintenance, maintenance_due
        from .capture import check_log_retention

        now = load(overrides=self.cdc_overrides)
        hook = CdcSourceHook.for_settings(now, None, now.explicit_source)
        captured = self._capture(hook, now.round_catch_up_seconds)
        if captured is None:
            self.log.info(
                "another capture of source %r holds the capture lock; applying what is staged", hook.source
            )
        try:
            applied = super().execute(context)  # the apply task's work, in this task
        except AirflowSkipException as nothing:
            self.log.info("apply: %s", nothing)
            applied = None
        result: dict[str, Any] = dict(captured or {"source": hook.source})
        result["apply"] = applied
        result["schema_stopped"] = (applied or {}).get("schema_stopped") or {}
        if not result.get("retention_risk"):  # else the log_retention task fails the run, naming it
            self.log.info("log retention: %s", check_log_retention(captured))
        due = maintenance_due(
            last_maintenance(self.data_dir, self.source), time.time(), now.maintenance_interval_seconds
        )
        result["follow_ups"] = follow_ups(result, maintenance_due=due)
        # skip_all_except ends execute with an exception the task runner turns into a success
        # with the others skipped; it pushes no return value then, so it is pushed here
        context["ti"].xcom_push(key="return_value", value=result)
        self.skip_all_except(context["ti"], result["follow_ups"])
        return result


wrap_task_methods(ChangelogRoundOperator)  # configuration errors fail at once (hooks/task_errors.py)
