"""Snapshot operators: plan (the run's conf applied), chunk (DBLog's steps over one range),
commit (progress after the merge). The glue between a task's context and the snapshot
controller (pipeline/snapshot_controller.py), which holds the lifecycle, the chunk loop and
the commit; the snapshot's state is its progress (pipeline/snapshot_state.py, compare-and-set).

A snapshot DAG run is a bounded job: plan -> chunk tasks mapped over the planned ranges
-> high-watermark sensor -> Spark merge -> commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from ..core.errors import ConfigurationError
from ..core.plans import THROTTLE_KEYS, WorkItem
from ..core.progress import SnapshotProgress
from ..core.schema import TableName
from ..hooks.cdc_source import CdcSourceMixin
from ..pipeline.snapshot_conf import ACTIONS, CONF_KEYS, SnapshotConf, check_scope, parse_snapshot_conf  # noqa: F401
from ..settings import FromSettings, load, sink_names

if TYPE_CHECKING:
    from ..pipeline.snapshot_controller import SnapshotController

log = logging.getLogger(__name__)

#: part of this module's API, from pipeline/snapshot.py: imported when first used (it imports
#: pyarrow and the dialects; the DAG files that import this module are parsed by every task)
_SNAPSHOT_API = frozenset({"SEQ_STRIDE", "plan_table_ranges", "read_plan", "read_sidecars", "sidecar_path"})


def __getattr__(name: str) -> Any:
    if name in _SNAPSHOT_API:
        from ..pipeline import snapshot

        return getattr(snapshot, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _iso_utc(value: Any) -> str | None:
    """A run's logical date as an ISO string in UTC (None: the run has none)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def _dag_is_paused(context: Any) -> bool:
    """Airflow's own DAG pause, asked through the Task SDK (tasks have no DB access; the
    API server answers). Where that call is not served this returns False. Either way a
    paused DAG schedules no new task instances, so the pause takes effect between tasks;
    this check adds "between chunks" inside a running chunk task."""
    ti = context.get("ti") if context else None
    if ti is None or not hasattr(ti, "get_dag"):
        return False
    try:
        return bool(ti.get_dag(ti.dag_id).is_paused)
    except Exception as exc:  # noqa: BLE001 - best effort, see docstring
        log.debug("could not read the paused state of DAG %s: %s", getattr(ti, "dag_id", "?"), exc)
        return False


def _run_alive(context: Any) -> Any:
    """``owner_alive(p)`` for the controller: whether DAG run ``p.owner`` of this DAG is still
    queued or running, asked through the Task SDK (unknown: not alive, so it is taken over)."""
    ti = (context or {}).get("ti")

    def alive(p: SnapshotProgress) -> bool:
        get_state = getattr(ti, "get_dagrun_state", None)
        if get_state is None:
            return False
        try:
            state = get_state(ti.dag_id, p.owner)
        except Exception as exc:  # noqa: BLE001 - e.g. the owner run was deleted
            log.info(
                "snapshot %s: state of run %s unknown (%s); taking the snapshot over",
                p.snapshot_id,
                p.owner,
                exc,
            )
            return False
        return str(getattr(state, "value", state)).lower() in ("queued", "running")

    return alive


def pause_for_dag_pause(source: str, table_id: str, snapshot_id: str, data_dir: str) -> bool:
    """pipeline.snapshot_controller.pause_for_dag_pause on this source's published progress."""
    from .. import airflow_variables
    from ..pipeline import snapshot_controller as controller

    return controller.pause_for_dag_pause(
        airflow_variables.for_source(source, data_dir), table_id, snapshot_id
    )


def mark_failed(source: str, snapshots: Sequence[tuple[str, str]], error: str, data_dir: str) -> list[str]:
    """pipeline.snapshot_controller.mark_failed on this source's published progress. The error
    is stored without row values and through the secrets masker (error_text.py); the snapshot
    ids come from XCom and must be snapshot ids before they reach a path (I15)."""
    from .. import airflow_variables
    from ..core.errors import ConfigurationError
    from ..core.scope import check_snapshot_id
    from ..error_text import safe_error_text
    from ..pipeline import snapshot_controller as controller

    valid = []
    for table_id, snapshot_id in snapshots:
        try:
            valid.append(
                (table_id, check_snapshot_id(snapshot_id, f"the plan's work item of table {table_id}"))
            )
        except ConfigurationError as exc:
            log.warning("not marked failed: %s", exc)
    return controller.mark_failed(
        airflow_variables.for_source(source, data_dir), valid, safe_error_text(error)
    )


def record_snapshot_failure(context: Any) -> None:
    """``on_failure_callback`` of the snapshot DAG's tasks (Airflow calls it once a task has
    failed for good, after its last retry): the snapshots this run works on (the plan
    task's work items) go to ``failed`` with the error, so ``airflow-cdc status`` shows
    what the run shows. ``resume`` (after fixing the cause) continues them."""
    from .. import settings
    from ..error_text import safe_error_text

    ti = context.get("ti")
    task = context.get("task")
    if ti is None:
        return
    try:
        work = ti.xcom_pull(task_ids="plan") or []
    except Exception as exc:  # noqa: BLE001 - a callback must not hide the task's own error
        log.warning("could not read the plan of this run to mark its snapshots failed: %s", exc)
        return
    if isinstance(work, dict):
        work = [work]
    snapshots = [(w["table"], w["snapshot_id"]) for w in work if isinstance(w, dict) and "snapshot_id" in w]
    hook = getattr(task, "hook", None)
    now = settings.load(overrides=getattr(task, "cdc_overrides", None))
    source = getattr(hook, "source", None) or getattr(task, "source", None) or now.source
    data_dir = getattr(task, "data_dir", None) or now.data_dir
    exc = context.get("exception")
    error = f"task {ti.task_id} failed: {safe_error_text(exc) if exc is not None else 'unknown error'}"
    if not snapshots:  # failed before planning anything (a bad conf): the source keeps the record
        from .. import airflow_variables

        try:
            airflow_variables.save_run_failure(source, str(ti.run_id), str(ti.task_id), error)
        except Exception as rec:  # noqa: BLE001 - a callback must not hide the task's own error
            log.warning("could not record the failed snapshot run of %r: %s", source, rec)
        return
    mark_failed(source, snapshots, error, data_dir)


class _SourceOperator(CdcSourceMixin, BaseOperator):
    """The snapshot's operators: the source parameters of every task (CdcSourceMixin), named
    again here because the chunk task is mapped (CdcSourceMixin's docstring)."""

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        cdc_conn_id: str | None = None,
        source: str | None = None,
        cdc_overrides: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            data_dir=data_dir, cdc_conn_id=cdc_conn_id, source=source, cdc_overrides=cdc_overrides, **kwargs
        )

    def controller(
        self, context: Any, *, sinks: Any = None, run_id: str | None = None, **kwargs: Any
    ) -> SnapshotController:
        """The snapshot controller of this task's source and run: the source's progress (the
        authority, each write published to a Variable), its connection, the settings."""
        from .. import airflow_variables
        from ..pipeline.snapshot_controller import SnapshotController

        source, now = self.hook.source, load(overrides=self.cdc_overrides)
        return SnapshotController(
            source=source,
            data_dir=self.data_dir,
            progress=airflow_variables.for_source(source, self.data_dir),
            connect=self.hook.get_dialect,
            sinks=sink_names(sinks or now.sinks),
            compact_budget_rows=now.mirror_compact_budget_rows,
            retention_hours=now.mirror_retention_hours,
            chunk_sizing=now.chunk_sizing,
            run_id=run_id or (context or {}).get("run_id"),
            **kwargs,
        )


# ----------------------------------------------------------------------- plan
class SnapshotPlanOperator(_SourceOperator):
    """Validate the run's conf, apply its action, and return the work items to map over.

    ``start``: describe the tables, stage their schemas, take the max key as the upper
    bound, plan ranges, store the plan next to the chunks and the progress (running) in
    the progress store. ``resume``: continue every range after its last committed chunk (with
    the throttle of this conf). ``pause``/``stop``: change the status only (running chunk
    tasks stop before their next chunk) and return no work.

    :param conf: the run's conf (``action``, ``tables``, throttle keys...; untrusted, validated).
    :param default_tables: the tables a conf without ``tables`` snapshots; default CDC_TABLES.
    :param conf_defaults: throttle keys (chunk_size, parallelism...) under the run's conf.
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param cdc_conn_id: the source's Airflow connection; default CDC_SOURCE_CONN_ID.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    """

    template_fields: Sequence[str] = ("conf", "data_dir", "cdc_conn_id", "source", "default_tables")
    ui_color = "#e0d4ff"
    default_tables = FromSettings("tables")  # not given: CDC_TABLES when the task runs
    sinks = FromSettings("sinks")  # CDC_SINKS when the task runs: a mirror's limits are checked at plan

    def __init__(
        self,
        *,
        conf: dict | None = None,
        default_tables: Sequence[str] | str | None = None,
        conf_defaults: dict | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.conf = conf
        self.default_tables = default_tables
        #: throttle keys (chunk_size, parallelism, delay_seconds) a run's conf falls back to
        self.conf_defaults = dict(conf_defaults or {})
        unknown = sorted(set(self.conf_defaults) - set(THROTTLE_KEYS))
        if unknown:
            raise ConfigurationError(
                f"{type(self).__name__}: conf_defaults may hold chunk_size, parallelism and "
                f"delay_seconds, not {unknown}"
            )  # THROTTLE_KEYS, in the words of the docs

    def execute(self, context: Any) -> list[dict]:
        conf = self.conf
        dag_run = context.get("dag_run") if context else None
        if conf is None:
            conf = (getattr(dag_run, "conf", None) or {}) if dag_run is not None else {}
        run_type = str(
            getattr(getattr(dag_run, "run_type", ""), "value", getattr(dag_run, "run_type", ""))
        ).lower()
        scheduled = run_type.endswith(("scheduled", "backfill", "backfill_job"))
        if self.conf_defaults and isinstance(conf, dict) and conf.get("action") not in ("pause", "stop"):
            conf = {**self.conf_defaults, **conf}
        req = parse_snapshot_conf(  # before anything is written
            conf, self.default_tables, default_action="refresh" if scheduled else "start"
        )
        # the one scope check (I15), also before anything is written
        check_scope(req, load(overrides=self.cdc_overrides), self.hook.capture_scope())
        run_id = (context.get("run_id") if context else None) or getattr(dag_run, "run_id", None)
        logical_date = _iso_utc(
            (context.get("logical_date") if context else None) or getattr(dag_run, "logical_date", None)
        )
        work = self.controller(
            context,
            run_id=run_id,
            logical_date=logical_date,
            owner_alive=_run_alive(context),
            sinks=self.sinks,
        ).apply(req)
        from .. import airflow_variables

        try:  # a run of this source plans again: an earlier run's failure is over
            airflow_variables.clear_run_failure(self.hook.source)
        except Exception as exc:  # noqa: BLE001 - the record is for status; the plan stands
            log.warning("could not clear the failed-run record of %r: %s", self.hook.source, exc)
        return work


# ----------------------------------------------------------------------- chunk
class SnapshotChunkOperator(_SourceOperator):
    """Read one planned range chunk by chunk, each chunk between a fresh pair of watermarks
    (SnapshotController.read_range): after the last committed chunk of the range (retry,
    resume); stops early when the snapshot is paused or stopped, or the DAG is paused.
    Returns the ChunkResult dicts of the range that are not merged yet.

    :param work: one WorkItem dict of the plan task's XCom (a range of one table).
    :param check_dag_paused: stop before the next chunk when the DAG is paused.
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param cdc_conn_id: the source's Airflow connection; default CDC_SOURCE_CONN_ID.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    """

    template_fields: Sequence[str] = ("work", "data_dir", "cdc_conn_id", "source")
    ui_color = "#d4f0d4"

    def __init__(self, *, work: dict, check_dag_paused: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.work = work
        self.check_dag_paused = check_dag_paused

    def execute(self, context: Any) -> list[dict]:
        dag_paused = (lambda: _dag_is_paused(context)) if self.check_dag_paused else (lambda: False)
        return self.controller(context).read_range(WorkItem.from_dict(self.work), dag_paused=dag_paused)

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """OpenLineage (lineage.py): the range's source table in, the snapshot's chunks out."""
        from ..lineage import tables_lineage
        from ..storage.layout import snapshot_dir

        work = WorkItem.from_dict(self.work)
        table = TableName.parse(work.table)
        return tables_lineage(
            self.hook.connection_params(),
            self.data_dir,
            self.hook.source,
            [table],
            staging=snapshot_dir(self.data_dir, self.hook.source, table, work.snapshot_id),
            staging_is_output=True,
        )


# ---------------------------------------------------------------------- commit
class SnapshotCommitOperator(_SourceOperator):
    """After the merge wrote the round: mark its chunks merged and record them in the
    snapshot's progress; a snapshot whose ranges are all read and merged is done.
    Idempotent: a retried commit records nothing twice (SnapshotProgress.record_chunk).

    :param chunks: the ChunkResult dicts the round merged (the chunk tasks' XCom).
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param cdc_conn_id: the source's Airflow connection; default CDC_SOURCE_CONN_ID.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    """

    template_fields: Sequence[str] = ("chunks", "data_dir", "cdc_conn_id", "source")
    ui_color = "#ffd9b3"

    def __init__(self, *, chunks: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chunks = chunks

    def execute(self, context: Any) -> dict[str, Any]:
        summary, done = self.controller(context).commit(self.chunks)
        if done:
            self._emit_done(context, self.hook.source, done)
            self._request_maintenance()
        return summary

    def _request_maintenance(self) -> None:
        """The changelog's next round compacts (pipeline/maintenance.py): the finished snapshot
        left its chunks to fold and its tombstones to remove. Never fails the commit."""
        from ..pipeline.maintenance import request_maintenance

        try:
            request_maintenance(self.data_dir, self.hook.source)
        except OSError:
            log.warning(
                "could not ask for the mirrors' maintenance; it runs on its own cadence", exc_info=True
            )

    def _emit_done(self, context: Any, source: str, done: dict[str, dict[str, Any]]) -> None:
        """A mirror Asset event per table whose snapshot finished (and converged) here: the
        point a consumer of the whole table waits for (assets.py). Never fails the commit."""
        from ..assets import emit_table_events
        from ..core.events import MIRROR
        from ..pipeline.committed import table_extra

        try:
            extra = {tid: table_extra(self.data_dir, source, tid, MIRROR, **e) for tid, e in done.items()}
            emit_table_events(context, self.outlets, source, {MIRROR: extra})
        except Exception:  # noqa: BLE001 - the progress is stored; only the notification is lost
            log.exception("could not emit the Asset events of the finished snapshot(s) %s", sorted(done))
