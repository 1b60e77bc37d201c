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


#: the share of ``CDC_LOCAL_MAX_ROWS`` a one-task round's capture stops at by default: the cap
#: ends at a transaction boundary, so a transaction in flight may carry the round past it
ROUND_CAP_SHARE = 0.9


@dataclass(frozen=True)
class RoundCapture:
    """How much a one-task round captures (operators/changelog_round.py).

    Under steady writes a round's capture takes what came since the last one. Uncapped, a backlog
    that passes ``local_max_rows`` (a compaction beside the rounds is enough) makes one large
    round that starts a spark-submit beside the writers, and the mirror falls further behind while
    the JVM starts (``bench sustained``: lag p99 238 s uncapped, 37.7 s capped). So, unless
    ``CDC_CAPTURE_MAX_EVENTS`` says otherwise, a round's capture stops a little under
    ``local_max_rows`` and the apply stays in the worker; the next round follows at once.

    A capture so capped that is still ``catch_up_seconds`` behind after it (a paused pipeline, a
    backlog of minutes to days) captures the rest in the same round, uncapped: the apply then
    goes through one spark-submit, which drains millions of events faster than rounds of
    ~100,000 on an idle cluster.

    ``explicit``: ``CDC_CAPTURE_MAX_EVENTS`` (None: unset). ``local_max_rows``: the rows an apply
    runs in the worker (0: always spark-submit, so no cap helps). ``catch_up_seconds``:
    ``CDC_ROUND_CATCH_UP_SECONDS`` (0: never cap). ``staged``: rows staged already past the
    sinks' markers, which the round's apply reads too (an earlier round's apply that failed); when
    they fill the bound alone, the apply goes through spark-submit whatever is captured, so the
    capture is not capped.
    """

    explicit: int | None
    local_max_rows: int
    catch_up_seconds: float
    staged: int = 0

    @property
    def cap(self) -> int | None:
        """The first capture's ``max_events`` (None: unbounded)."""
        if self.explicit is not None:
            return self.explicit
        if self.local_max_rows <= 0 or self.catch_up_seconds <= 0:
            return None
        room = max(1, int(self.local_max_rows * ROUND_CAP_SHARE)) - self.staged
        return room if room >= 1 else None

    def stopped(self, events: int) -> bool:
        """Whether a first capture of ``events`` stopped at the cap (log may be left behind)."""
        cap = self.cap
        return cap is not None and events >= cap

    def catch_up(self, events: int, lag_seconds: float | None) -> bool:
        """After a first capture of ``events`` that left the capture ``lag_seconds`` behind (None:
        the source cannot tell): capture the rest now, uncapped? Only for the default cap (an
        explicit one is the user's bound), and only when the cap stopped the capture."""
        return (
            self.explicit is None
            and self.stopped(events)
            and lag_seconds is not None
            and lag_seconds >= self.catch_up_seconds
        )
