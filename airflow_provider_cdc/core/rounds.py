"""How the changelog DAG's rounds start, decided once from ``CDC_CHANGELOG_SCHEDULE``: every
question the DAG builder asks of it (a task per step or one task a round, how many runs at once,
whether intervals can be backfilled, whether the source's log starts them) is answered here, so no
other module compares schedule strings."""

from __future__ import annotations

from dataclasses import dataclass

#: rounds started by the source's writes to the capture scope (the triggerer watches its log)
LOG = "@log"
#: a round starts as soon as the one before ended
CONTINUOUS = "@continuous"
#: Airflow's single run
ONCE = "@once"


@dataclass(frozen=True)
class RoundSchedule:
    """``CDC_CHANGELOG_SCHEDULE`` as given (None: no schedule, rounds by hand only)."""

    given: str | None

    @property
    def _key(self) -> str:
        return (self.given or "").strip().lower()

    @property
    def on_log(self) -> bool:
        """Rounds start when the source writes (the DAG is scheduled on its log's Asset)."""
        return self._key == LOG

    @property
    def one_task(self) -> bool:
        """A round is one task (capture and apply in one process, the follow-ups only when they
        have work): the schedules that run rounds every few seconds, where starting five tasks a
        round would cost more than the round's work."""
        return self._key in (LOG, CONTINUOUS)

    @property
    def periodic(self) -> bool:
        """It has intervals (a cron or preset), so its runs can be backfilled."""
        return bool(self._key) and self._key not in (LOG, CONTINUOUS, ONCE)

    @property
    def max_active_runs(self) -> int:
        """Runs at once: two for ``@log``, so the next round's capture may start while this one
        applies (and a stale count of one running run never holds back queued Asset events);
        one otherwise. Every task still runs one at a time."""
        return 2 if self.on_log else 1
