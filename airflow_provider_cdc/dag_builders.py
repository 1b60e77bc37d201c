"""The provider's two DAGs, built for one source: the environment's (dags/cdc_snapshot.py,
dags/cdc_changelog.py) or each source of the sources config (dags/cdc_sources.py).

``overrides`` are a source's ``CDC_*`` values (sources_config.py); every task of the DAGs
gets them as ``cdc_overrides`` and reads its settings as the environment with them on top,
when it runs. Only what Airflow needs while parsing (schedules, the sensor's mode, the
chunk tasks' parallelism, the Spark connection) is read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from . import settings
from .assets import EVENTS, MIRROR, log_asset, table_alias
from .core.rounds import RoundSchedule
from .operators.capture import ChangelogCaptureOperator
from .operators.changelog_apply import ChangelogApplyOperator
from .operators.changelog_round import ChangelogRoundOperator
from .operators.snapshot import (
    SnapshotChunkOperator,
    SnapshotCommitOperator,
    SnapshotPlanOperator,
    record_snapshot_failure,
)
from .operators.snapshot_merge import SnapshotMergeOperator, SnapshotMergeWhileReadingOperator
from .sensors.high_watermark import HighWatermarkSensor

SNAPSHOT_DOC = """cdc_snapshot: DBLog watermark snapshot of source tables, one bounded job per DAG run.

Trigger with a conf (a Debezium-style signal), e.g.::

    airflow dags trigger cdc_snapshot \\
        -c '{"action": "start", "tables": ["public.orders"], "chunk_size": 50000, "parallelism": 4}'
    airflow dags trigger cdc_snapshot -c '{"action": "pause", "tables": ["public.orders"]}'
    airflow dags trigger cdc_snapshot -c '{"action": "resume", "tables": ["public.orders"]}'
    airflow dags trigger cdc_snapshot -c '{"action": "stop", "tables": ["public.orders"]}'

Scheduled runs (``CDC_SNAPSHOT_SCHEDULE``) default to ``"action": "refresh"``: tables whose
snapshot is done, stopped or missing start a new one, running or failed ones continue,
paused ones stay paused.

``chunk_size``: rows per chunk, fixed; left out (or ``"auto"``), each chunk is sized from the
ones before it to about CDC_CHUNK_TARGET_SECONDS and CDC_CHUNK_TARGET_MB.
Other keys: ``key_ranges`` (only these key ranges), ``where`` (filter condition),
``delay_seconds`` (throttle between chunks). A bad conf fails the ``plan`` task with a
message naming the setting, before anything is written.

plan -> read_chunks (mapped over the planned key ranges; each range chunk by chunk:
low watermark, SELECT, high watermark), and beside them merge_while_reading (merges and
commits chunks whose high watermark is staged while later ones are read, in batches of at
least CDC_MERGE_WHILE_READING_ROWS rows) -> round (the chunk list as a file) ->
wait_high_watermarks (drains the changelog itself when cdc_changelog is not running) ->
merge (DBLog steps 4-5, writes the event log and the mirror: spark-submit, or in the
worker when the round has at most CDC_LOCAL_MAX_ROWS rows) -> commit.

Pausing: the ``pause`` action (or ``airflow-cdc``) stops chunk tasks before
their next chunk; pausing the DAG in Airflow stops new tasks from being scheduled (and
running chunk tasks stop too where the API server reports the pause). Chunks read so far
are merged and kept; ``resume`` continues after the last committed chunk.

Environment (airflow_provider_cdc/settings.py; read when the tasks run, except
CDC_SNAPSHOT_SCHEDULE, CDC_SPARK_CONN_ID, CDC_SPARK_CONF, CDC_MAX_PARALLEL_CHUNKS and the
CDC_SENSOR_* settings, which Airflow needs when it parses this file):
CDC_SOURCE_CONN_ID (default cdc_source), CDC_SOURCE (staging name; default
the conn id), CDC_TABLES (comma list, default tables when the conf has none),
CDC_DATA_DIR (default $AIRFLOW_HOME/cdc-data), CDC_SNAPSHOT_SCHEDULE (optional cron for periodic refresh),
CDC_SPARK_CONN_ID (default spark_default), CDC_SPARK_CONF (JSON of Spark settings),
CDC_SINKS (default events,mirror), CDC_LOCAL_MAX_ROWS (rounds up to this many rows merge
in the worker without a spark-submit; default 100000, 0 = always Spark),
CDC_MAX_PARALLEL_CHUNKS (chunk tasks at once per run, default 4),
CDC_SENSOR_DEFERRABLE (true/false: wait_high_watermarks waits in the triggerer between
pokes instead of poking in its worker slot; unset = Airflow's [operators] default_deferrable),
CDC_SENSOR_POKE_INTERVAL (seconds between the sensor's checks, default 5; a deferred
sensor drains the changelog again every 6 intervals), CDC_SENSOR_TIMEOUT (seconds the
sensor waits in all, default 21600).
"""

CHANGELOG_DOC = """cdc_changelog: capture the source's changelog to staging, then apply it to the sinks.

Short schedule, one active run (two with ``@log``: the next run is queued while this one
ends; every task runs one at a time), never waits for snapshots (I5). With ``@log`` and
``@continuous`` a round is one task, ``round``: capture, then apply, in one process; its
follow-ups ``mirror_schema_stops`` and ``log_retention`` run only to fail the run when they
have something to report, and ``compact_tombstones`` every CDC_MAINTENANCE_INTERVAL_SECONDS
(default 300); the round skips the others. A periodic schedule runs the tasks below. The capture holds the
source's capture lock (an advisory lock on the source) so it never runs at the same
time as another capture, e.g. the snapshot DAG's sensor draining the log; when the lock
is held, the capture task is skipped and the apply still runs. The apply (a spark-submit,
or in the worker for at most CDC_LOCAL_MAX_ROWS staged rows) is skipped when nothing
staged is newer than what the sinks have. ``log_retention`` logs how far the capture is
behind its source's log (also Airflow metrics ``cdc.capture.lag_bytes`` / ``lag_seconds`` /
``retention_at_risk`` / ``retention_unbounded``, tagged by source) and fails the run, naming the
replication slot or binlog file and what to do, when the source may soon drop log the capture
has not read. When nothing bounds the log the source keeps (PostgreSQL's default
``max_slot_wal_keep_size = -1``) it warns instead, without failing: ``retention_unbounded`` is 1,
and ``airflow cdc status`` and the CDC page show the warning with the setting to change.

Schedules and backfills: each run captures the log up to now and applies it; a run is not
tied to its interval's data. ``airflow backfill create`` works (e.g. to catch up after the
DAG was off) and its intervals run one at a time in logical-date order: a backfill run's
first task, ``earlier_intervals_done`` (only with a periodic schedule), waits until the run of
the previous interval has finished (a backfill ignores ``max_active_runs``), and every other task has
``max_active_tis_per_dag=1``, so two captures or two applies never overlap.

Environment (read when the tasks run, airflow_provider_cdc/settings.py, except the
schedule and the Spark connection/conf, read when the file is parsed):
CDC_SOURCE_CONN_ID (default cdc_source), CDC_SOURCE (default the conn id), CDC_DATA_DIR (default
$AIRFLOW_HOME/cdc-data), CDC_CHANGELOG_SCHEDULE (default every minute; "none" for manual only;
"@log": a round starts when the source writes to the capture scope, watched by the triggerer
every CDC_CHANGELOG_POLL_SECONDS, default 2, at most every CDC_CHANGELOG_MIN_INTERVAL_SECONDS,
default 5, and every CDC_CHANGELOG_HEARTBEAT_SECONDS, default 600, on an idle source),
CDC_SPARK_CONN_ID (default spark_default), CDC_SPARK_CONF (JSON of Spark settings),
CDC_SINKS (default events,mirror), CDC_LOCAL_MAX_ROWS (default 100000; 0 = always Spark),
CDC_CAPTURE_MAX_EVENTS (cap per capture; default unbounded),
CDC_CAPTURE_SEGMENT_MAX_EVENTS (events per staged segment, cut at transaction boundaries;
default the connection's ``segment_max_events`` extra or 20,000; 0 = one segment per run).
"""


def _data_only(overrides: Mapping[str, str]) -> dict[str, str]:
    """A source's values as given: the tasks render their fields (data_dir, conn ids, tables,
    Spark conf...) as Jinja templates, so a value holding ``{{ conn.x.password }}`` would
    become a secret in a path or a log. Refused here too, for callers other than the sources
    config's parser (which refuses them first, naming the file and key)."""
    from .sources_config import refuse_templates

    for var, value in overrides.items():
        refuse_templates(value, f"{var} of the DAG's source")
    return dict(overrides)


def connection_options(conn_id: str) -> tuple[str, str, dict[str, Any]] | None:
    """(dialect, server, CDC options of the extra) of Airflow connection ``conn_id``, for
    sources_config.read_sources(connections=...): slot, publication and server_id names set
    in connection extras are then checked for collisions between sources too. None when the
    connection cannot be read here (then only the names derived from source names are).
    Read from the connection as ``CdcSourceHook.connection_params`` reads it, without building
    those (the dialects import pyarrow, and this runs when cdc_sources.py is parsed)."""
    from .dialects.registry import get_profile
    from .hooks.cdc_source import CdcSourceHook

    try:
        hook = CdcSourceHook(conn_id)
        conn = hook.connection
        scheme, options, _driver = hook._split_extra(conn)  # the extra checked, the dialect named
        port = int(conn.port) if conn.port else get_profile(scheme).default_port
        return scheme, f"{conn.host or '127.0.0.1'}:{port}/{conn.schema or ''}", options
    except Exception:  # noqa: BLE001 - a connection the parser cannot see is checked when its tasks run
        return None


def _outlets(source: str, sinks: str, kinds: tuple[str, ...] = (EVENTS, MIRROR)) -> list:
    """The Asset aliases a writer of ``sinks`` emits its tables' Asset events through."""
    names = settings.sink_names(sinks)
    return [table_alias(source, kind) for kind in kinds if kind in names]


def _round_file_task(overrides: Mapping[str, str]):
    """The snapshot DAG's ``round`` task: the round's chunk list as a JSON file for the merge job."""

    @task(task_id="round")
    def write_round(results) -> str:
        """The round's chunk list as a JSON file for the merge job (XCom stays small)."""
        import json

        from airflow.sdk import get_current_context
        from airflow.sdk.exceptions import AirflowSkipException

        from airflow_provider_cdc import settings, storage
        from airflow_provider_cdc.core.chunk import flatten_chunk_results
        from airflow_provider_cdc.hooks.cdc_storage import apply_storage_connection
        from airflow_provider_cdc.storage.layout import round_path

        now = settings.load(overrides=overrides)  # at run time, like the operators
        apply_storage_connection(now.storage_conn_id)
        flat = flatten_chunk_results(results)
        if not flat:
            raise AirflowSkipException("no chunks to merge in this run (pause/stop, or nothing left)")
        path = round_path(now.data_dir, now.source, get_current_context()["run_id"])
        storage.write_text(path, json.dumps(flat))
        return path

    return write_round


def _high_watermark_sensor(parse: settings.Settings, chunks, given: dict) -> HighWatermarkSensor:
    """The snapshot DAG's wait for the chunks' high watermarks in the changelog."""
    return HighWatermarkSensor(
        task_id="wait_high_watermarks",
        chunks=chunks,
        # poke: a reschedule-mode sensor can lose its tries to an Airflow race while the
        # capture lock is held for minutes (apache/airflow#71172); waiting must never fail a run
        mode="poke",
        poke_interval=parse.sensor_poke_interval,
        timeout=parse.sensor_timeout,
        **({} if parse.sensor_deferrable is None else {"deferrable": parse.sensor_deferrable}),
        **given,
    )


def snapshot_dag(
    dag_id: str = "cdc_snapshot",
    overrides: Mapping[str, str] | None = None,
    *,
    throttle: Mapping[str, Any] | None = None,
    tags: tuple[str, ...] = (),
) -> DAG:
    """The snapshot DAG of one source. ``throttle``: default chunk_size / parallelism /
    delay_seconds of its snapshots (a run's conf wins)."""
    overrides = _data_only(overrides or {})
    parse = settings.load(overrides=overrides)
    with DAG(
        dag_id=dag_id,
        description="DBLog watermark snapshot (start / pause / resume / stop by trigger conf)",
        schedule=parse.snapshot_schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        # a pause/stop run must be able to run next to the snapshot run it pauses
        max_active_runs=3,
        # a task that fails for good marks the run's snapshots failed, with its error
        default_args={
            "retries": 2,
            "retry_delay": timedelta(seconds=10),
            "on_failure_callback": record_snapshot_failure,
        },
        tags=["cdc", "snapshot", *tags],
        doc_md=SNAPSHOT_DOC,
    ) as dag:
        given = {"cdc_overrides": overrides} if overrides else {}
        plan = SnapshotPlanOperator(
            task_id="plan", retries=0, conf_defaults=dict(throttle or {}) or None, **given
        )

        chunks = SnapshotChunkOperator.partial(
            task_id="read_chunks",
            max_active_tis_per_dagrun=parse.max_parallel_chunks,
            **given,
        ).expand(work=plan.output)

        # merges committed chunks while later ones are read (DBLog needs only each chunk's own
        # high watermark); the round's merge below takes what is left
        early = SnapshotMergeWhileReadingOperator(
            task_id="merge_while_reading",
            work=plan.output,
            conn_id=parse.spark_conn_id,
            conf=parse.spark_conf,
            retries=0,  # an optimisation: what it leaves, the round's merge takes
            **given,
        )
        round_file = _round_file_task(overrides)(chunks.output)
        early >> round_file

        wait = _high_watermark_sensor(parse, chunks.output, given)

        merge = SnapshotMergeOperator(
            task_id="merge",
            round_file=round_file,
            conn_id=parse.spark_conn_id,
            conf=parse.spark_conf,
            outlets=_outlets(parse.source, parse.sinks),
            **given,
        )

        # a mirror Asset event when a table's snapshot is done and converged
        commit = SnapshotCommitOperator(
            task_id="commit",
            chunks=chunks.output,
            outlets=_outlets(parse.source, parse.sinks, (MIRROR,)),
            **given,
        )

        round_file >> wait >> merge >> commit
    return dag


def changelog_schedule(parse: settings.Settings):
    """The changelog DAG's schedule: the setting as given, or for ``@log`` the source's log
    Asset, watched in the triggerer (triggers/log_activity.py)."""
    if not RoundSchedule(parse.changelog_schedule).on_log:
        return parse.changelog_schedule
    from .triggers.log_activity import LogActivityTrigger

    trigger = LogActivityTrigger(
        conn_id=parse.conn_id,
        source=parse.source,
        data_dir=parse.data_dir,
        poll_interval=parse.changelog_poll_seconds,
        heartbeat=parse.changelog_heartbeat_seconds,
        min_interval=parse.changelog_min_interval_seconds,
        storage_conn_id=parse.storage_conn_id,
    )
    return [log_asset(parse.source, trigger)]


@task.sensor(
    task_id="earlier_intervals_done",
    mode="poke",
    poke_interval=5,
    timeout=6 * 3600,
    max_active_tis_per_dag=None,  # every run's gate may wait at once: no gate blocks an earlier one
)
def earlier_intervals_done() -> bool:
    """A backfill run starts its work only once the run of the previous interval has
    finished: backfill intervals run one at a time, in logical-date order (a backfill
    ignores max_active_runs). Other runs pass at once."""
    from airflow.sdk import get_current_context

    from airflow_provider_cdc.sensors.high_watermark import previous_run_active

    ctx = get_current_context()
    return previous_run_active(ctx["dag_run"], ctx["ti"]) is None


@task(task_id="log_retention")
def log_retention(capture_result: dict | None) -> str:
    """Fail the run loudly when the source may soon drop log the capture has not read (a
    replication slot near max_slot_wal_keep_size, a binlog file near its expiry); the
    message names the slot or file and what to do. Otherwise log how far behind the
    capture is. Beside apply, not before it: a warning never holds back the catch-up."""
    from airflow_provider_cdc.operators.capture import check_log_retention

    return check_log_retention(capture_result)


@task(task_id="mirror_schema_stops")
def mirror_schema_stops(apply_result: dict | None) -> None:
    """Fail the run when the apply left tables whose mirror waits for a re-snapshot (a
    schema change it cannot follow), naming them and what to do. A task of its own so
    the apply succeeds and Airflow records the Asset events of the tables it applied."""
    from airflow_provider_cdc.operators.changelog_apply import raise_schema_stops

    raise_schema_stops(apply_result)


def _round_operators(parse: settings.Settings, one_task: bool, given: dict) -> tuple:
    """The changelog DAG's capture and apply: one ``round`` task for both, or two tasks."""
    if one_task:
        capture = apply = ChangelogRoundOperator(
            task_id="round",
            conn_id=parse.spark_conn_id,
            conf=parse.spark_conf,
            outlets=_outlets(parse.source, parse.sinks),
            **given,
        )
    else:
        capture = ChangelogCaptureOperator(task_id="capture", **given)
        apply = ChangelogApplyOperator(
            task_id="apply",
            trigger_rule="none_failed",  # also after a capture skipped for the lock: apply what is staged
            conn_id=parse.spark_conn_id,
            conf=parse.spark_conf,
            outlets=_outlets(parse.source, parse.sinks),
            **given,
        )
    return capture, apply


def _compaction_task(overrides: Mapping[str, str], one_task: bool):
    """The changelog DAG's ``compact_tombstones`` task (the mirrors' background compaction)."""

    # multiple_outputs=False: the dict is keyed by table ids, which must not become XCom keys
    # (a key is a URL path segment of the Task SDK API; a table may be named "a/b?é")
    @task(task_id="compact_tombstones", trigger_rule="none_failed", multiple_outputs=False)
    def compact_tombstones(data_dir: str, source: str) -> dict[str, int]:
        """The mirrors' background compaction: change files folded into their buckets'
        base within the round's budget, buckets split past their unit, and tombstones of
        deletes the mirror has applied removed for every table whose snapshot cannot merge
        chunks any more (not running, paused or failed). Stopped snapshots count as
        finished: a merge of theirs still in flight is fenced (sinks/mirror_fencing.py).
        Every mirror is vacuumed, and the event log's applied small files are merged."""
        from airflow_provider_cdc import airflow_variables, settings
        from airflow_provider_cdc.hooks.cdc_storage import apply_storage_connection
        from airflow_provider_cdc.sinks.mirror_compaction import compact_inactive

        apply_storage_connection(overrides=overrides)
        now = settings.load(overrides=overrides)
        removed = compact_inactive(
            data_dir,
            source,
            lambda table_id: airflow_variables.status(source, table_id, data_dir),
            retention_hours=now.mirror_retention_hours,
            budget_rows=now.mirror_compact_budget_rows,
            log_retention_hours=now.mirror_log_retention_hours,
        )
        from airflow_provider_cdc.sinks import registry

        registry.maintain(settings.sink_names(now.sinks), data_dir, source)  # the event log's small files
        if one_task:  # the round starts this task again CDC_MAINTENANCE_INTERVAL_SECONDS from now
            from airflow_provider_cdc.pipeline.maintenance import record_maintenance

            record_maintenance(data_dir, source)
        return removed

    return compact_tombstones


def changelog_dag(
    dag_id: str = "cdc_changelog", overrides: Mapping[str, str] | None = None, *, tags: tuple[str, ...] = ()
) -> DAG:
    """The changelog DAG of one source."""
    overrides = _data_only(overrides or {})
    parse = settings.load(overrides=overrides)
    rounds = RoundSchedule(parse.changelog_schedule)
    with DAG(
        dag_id=dag_id,
        description="Changelog capture (logical slot / binlog) to staging, then apply to the sinks",
        schedule=changelog_schedule(parse),
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        # @log: two, so the next round's capture may start while this one applies (core/rounds.py);
        # every task still runs one at a time (max_active_tis_per_dag=1 below)
        max_active_runs=rounds.max_active_runs,
        # Backfill runs ignore max_active_runs (a backfill has its own, default 10) but every
        # task honours max_active_tis_per_dag: across all runs, one capture, one apply and one
        # compaction at a time, taken in logical-date order by the scheduler.
        default_args={"retries": 3, "retry_delay": timedelta(seconds=10), "max_active_tis_per_dag": 1},
        tags=["cdc", "changelog", *tags],
        doc_md=CHANGELOG_DOC,
        # the task arguments below that are templates read the settings when the task runs
        user_defined_macros={"cdc_settings": partial(settings.load, overrides=overrides)},
    ) as dag:
        given = {"cdc_overrides": overrides} if overrides else {}

        one_task = rounds.one_task
        capture, apply = _round_operators(parse, one_task, given)

        now = {"data_dir": "{{ cdc_settings().data_dir }}", "source": "{{ cdc_settings().source }}"}
        if rounds.periodic:  # only a periodic schedule can be backfilled
            earlier_intervals_done() >> capture
        if not one_task:
            capture >> apply
        # one-task rounds: the three below follow the round, which skips those without work
        apply >> _compaction_task(overrides, one_task)(**now)
        mirror_schema_stops(apply.output)  # after apply (its XCom), a leaf of its own
        log_retention(capture.output)  # after capture (its XCom), a leaf of its own
    return dag


VERIFY_DOC = """cdc_verify: compare one table's mirror with its source (what ``airflow cdc verify`` does), as
a DAG run: the CDC page's verify button triggers it.

Trigger with ``{"table": "schema.table"}`` and nothing else: the source, its connection and
its data location are this DAG's own (the sources config's entry, or the environment), never
a conf's or a Variable's. The table passes the one scope check (the docs' security page: not a
system table, not the watermark table, inside the capture scope) before anything is read.
One run at a time (``max_active_runs=1``, the task ``max_active_tis_per_dag=1``), inside
Airflow's pools and parallelism; the page starts no second run of a table while one is
queued or running. The result is recorded for the page (and ``airflow cdc status``).
"""


def verify_dag(
    dag_id: str = "cdc_verify", overrides: Mapping[str, str] | None = None, *, tags: tuple[str, ...] = ()
) -> DAG:
    """The verify DAG of one source (the CDC page's verify; issue 46): one table per run."""
    overrides = _data_only(overrides or {})
    with DAG(
        dag_id=dag_id,
        description='Verify one table\'s mirror against the source (conf: {"table": "schema.table"})',
        schedule=None,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,  # each run scans a whole table on the source: one at a time
        default_args={"retries": 0},
        tags=["cdc", "verify", *tags],
        doc_md=VERIFY_DOC,
    ) as dag:

        @task(task_id="verify", max_active_tis_per_dag=1)
        def verify_table() -> dict:
            """Verify the conf's table of this DAG's source and record the result for the page."""
            from airflow.sdk import get_current_context

            from airflow_provider_cdc.operators.verify import verify_for_dag

            return verify_for_dag(get_current_context()["dag_run"].conf, overrides)

        verify_table()
    return dag


REFRESH_DOC = """cdc_refresh: tables refreshed whole instead of captured (CDC_REFRESH_TABLES), tables
without any key included. Each refresh reads its table in one consistent snapshot of the source
(PostgreSQL: physical ``ctid`` ranges in one transaction) and publishes it as one new version of
a plain Delta table (``output/<source>/refreshed/<table>``): readers see the previous version or
the new one, never part of a refresh. Nothing is created or changed on the source.

Schedule: CDC_REFRESH_SCHEDULE (unset: trigger by hand). Conf: none (every refresh table), or
``{"tables": ["schema.table"]}`` to refresh some of them. One run at a time.
"""


def refresh_dag(
    dag_id: str = "cdc_refresh", overrides: Mapping[str, str] | None = None, *, tags: tuple[str, ...] = ()
) -> DAG:
    """The whole-table refresh DAG of one source (pipeline/refresh.py)."""
    overrides = _data_only(overrides or {})
    parse = settings.load(overrides=overrides)
    with DAG(
        dag_id=dag_id,
        description="Refresh tables without a key whole (CDC_REFRESH_TABLES)",
        schedule=parse.refresh_schedule,
        start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,  # each run reads whole tables on the source: one at a time
        default_args={"retries": 1, "retry_delay": timedelta(minutes=1)},
        tags=["cdc", "refresh", *tags],
        doc_md=REFRESH_DOC,
    ) as dag:

        @task(task_id="refresh", max_active_tis_per_dag=1)
        def refresh_tables() -> dict:
            """Refresh the source's refresh tables (or the conf's among them)."""
            from airflow.sdk import get_current_context

            from airflow_provider_cdc.operators.refresh import refresh_for_dag

            return refresh_for_dag(get_current_context()["dag_run"].conf, overrides)

        refresh_tables()
    return dag
