"""Snapshot operators: plan (control + range planning), chunk (DBLog steps 1-3 over one
range), commit (progress after the merge).

A snapshot DAG run is a bounded job: plan -> chunk tasks mapped over the planned ranges
-> high-watermark sensor -> Spark merge -> commit. State that must survive a failure:

* the snapshot's progress (``progress_store``: one register per (source, table) in the data
  directory, changed only through its compare-and-set update, shown as a Variable): written
  by plan and commit, by a chunk task that finds its DAG paused and by the failure callback,
  read by the chunk tasks between chunks (pause/stop);
* a JSON sidecar next to every staged chunk, written after its high watermark: the
  chunk is *committed*. A retried or resumed chunk task continues after the last
  committed chunk of its range (I4); chunk files without a sidecar belong to a failed
  attempt, and their watermarks are orphans the merge ignores.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from airflow.sdk import BaseOperator

from .. import progress_store, settings, storage
from ..core.arrow_types import mirror_schema
from ..core.chunk import ChunkResult
from ..core.errors import ConfigurationError, StateError
from ..core.progress import SnapshotProgress
from ..core.ranges import ChunkRange
from ..core.schema import TableName, TableSchema
from ..hooks.cdc_source import CdcSourceMixin
from ..pipeline.snapshot import (  # noqa: F401 - part of this module's API
    SEQ_STRIDE,
    RangeState,
    check_advanced,
    is_partial,
    key_reached,
    min_key,
    mirror_needs_rebuild,
    new_snapshot_id,
    plan_table_ranges,
    range_state,
    read_plan,
    read_sidecars,
    reconcile_mirror,
    sidecar_path,
    write_sidecar,
)
from ..pipeline.snapshot_conf import ACTIONS, CONF_KEYS, SnapshotConf, check_scope, parse_snapshot_conf  # noqa: F401
from ..progress_store import DONE, FAILED, PAUSED, RUNNING, STOPPED
from ..settings import FromSettings, load, sink_names
from ..storage.layout import plan_path, schema_path

log = logging.getLogger(__name__)

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


def pause_for_dag_pause(source: str, table_id: str, snapshot_id: str, data_dir: str) -> bool:
    """The DAG was paused under a running chunk task: the snapshot moves to ``paused``, so
    its status matches what Airflow shows, and ``resume`` (after unpausing) continues it.
    Returns True when this call paused it (parallel chunk tasks may race to do so; a stop
    or failure stored meanwhile stays: the pause applies to a running snapshot only)."""
    paused = []

    def change(p: SnapshotProgress | None) -> SnapshotProgress | None:
        paused.clear()
        if p is None or p.snapshot_id != snapshot_id or p.status != RUNNING:
            return None
        p.pause()
        paused.append(True)
        return p

    progress_store.update(source, table_id, data_dir, change)
    if not paused:
        return False
    log.info("table %s: snapshot %s paused because the DAG was paused; resume it after unpausing", table_id,
             snapshot_id)
    return True


def mark_failed(source: str, snapshots: Sequence[tuple[str, str]], error: str, data_dir: str) -> list[str]:
    """Move the given (table, snapshot id) pairs that are still current and running or
    paused to ``failed`` with ``error`` (one that was done or stopped meanwhile stays so).
    Returns the tables it changed."""
    changed = []
    for table_id, snapshot_id in sorted(set(snapshots)):
        failed = []

        def change(p: SnapshotProgress | None, snapshot_id: str = snapshot_id, failed: list = failed):
            failed.clear()
            if p is None or p.snapshot_id != snapshot_id or p.status not in (RUNNING, PAUSED):
                return None
            p.fail(error)
            failed.append(True)
            return p

        progress_store.update(source, table_id, data_dir, change)
        if not failed:
            continue
        changed.append(table_id)
        log.error("table %s: snapshot %s failed: %s", table_id, snapshot_id, error)
    return changed


def record_snapshot_failure(context: Any) -> None:
    """``on_failure_callback`` of the snapshot DAG's tasks (Airflow calls it once a task has
    failed for good, after its last retry): the snapshots this run works on (the plan
    task's work items) go to ``failed`` with the error, so ``airflow-cdc status`` shows
    what the run shows. ``resume`` (after fixing the cause) continues them."""
    from .. import settings

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
    if not snapshots:
        return
    hook = getattr(task, "hook", None)
    now = settings.load(overrides=getattr(task, "cdc_overrides", None))
    source = getattr(hook, "source", None) or getattr(task, "source", None) or now.source
    data_dir = getattr(task, "data_dir", None) or now.data_dir
    error = f"task {ti.task_id} failed: {context.get('exception') or 'unknown error'}"
    mark_failed(source, snapshots, error, data_dir)


class _SourceOperator(CdcSourceMixin, BaseOperator):
    """The snapshot's operators: the source parameters of every task (CdcSourceMixin), named
    again here because the chunk task is mapped (CdcSourceMixin's docstring)."""

    def __init__(self, *, data_dir: str | None = None, cdc_conn_id: str | None = None, source: str | None = None,
                 cdc_overrides: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(data_dir=data_dir, cdc_conn_id=cdc_conn_id, source=source, cdc_overrides=cdc_overrides,
                         **kwargs)


# ----------------------------------------------------------------------- plan
class SnapshotPlanOperator(_SourceOperator):
    """Validate the run's conf, apply its action, and return the work items to map over.

    ``start``: describe the tables, stage their schemas, take the max key as the upper
    bound, plan ranges, store the plan next to the chunks and the progress (running) in
    the progress store. ``resume``: continue every range after its last committed chunk (with
    the throttle of this conf). ``pause``/``stop``: change the status only (running chunk
    tasks stop before their next chunk) and return no work.
    """

    template_fields: Sequence[str] = ("conf", "data_dir", "cdc_conn_id", "source", "default_tables")
    ui_color = "#e0d4ff"
    default_tables = FromSettings("tables")  # not given: CDC_TABLES when the task runs
    sinks = FromSettings("sinks")  # CDC_SINKS when the task runs: a mirror's limits are checked at plan
    _context: Any = None
    _run_id: str | None = None
    _logical_date: str | None = None

    def __init__(
        self, *, conf: dict | None = None, default_tables: Sequence[str] | str | None = None,
        conf_defaults: dict | None = None, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.conf = conf
        self.default_tables = default_tables
        #: throttle keys (chunk_size, parallelism, delay_seconds) a run's conf falls back to
        self.conf_defaults = dict(conf_defaults or {})
        unknown = sorted(set(self.conf_defaults) - {"chunk_size", "parallelism", "delay_seconds"})
        if unknown:
            raise ConfigurationError(f"{type(self).__name__}: conf_defaults may hold chunk_size, parallelism and "
                                     f"delay_seconds, not {unknown}")

    def execute(self, context: Any) -> list[dict]:
        conf = self.conf
        dag_run = context.get("dag_run") if context else None
        if conf is None:
            conf = (getattr(dag_run, "conf", None) or {}) if dag_run is not None else {}
        run_type = str(getattr(getattr(dag_run, "run_type", ""), "value", getattr(dag_run, "run_type", ""))).lower()
        scheduled = run_type.endswith(("scheduled", "backfill", "backfill_job"))
        if self.conf_defaults and isinstance(conf, dict) and conf.get("action") not in ("pause", "stop"):
            conf = {**self.conf_defaults, **conf}
        req = parse_snapshot_conf(  # before anything is written
            conf, self.default_tables, default_action="refresh" if scheduled else "start"
        )
        check_scope(req, load(overrides=self.cdc_overrides))  # also before anything is written
        self._context = context
        self._run_id = (context.get("run_id") if context else None) or getattr(dag_run, "run_id", None)
        self._logical_date = _iso_utc(
            (context.get("logical_date") if context else None) or getattr(dag_run, "logical_date", None)
        )
        source = self.hook.source
        stored = {t.id: progress_store.load(source, t.id, self.data_dir) for t in req.tables}
        log.info("snapshot %s of %s on source %r", req.action, ", ".join(stored), source)
        if req.action in ("pause", "stop"):
            return self._pause_or_stop(req, stored)
        if req.action == "start":
            for tid, p in stored.items():
                if p is not None and p.status in (RUNNING, PAUSED, FAILED):
                    raise StateError(
                        f"table {tid} has a {p.status} snapshot {p.snapshot_id} on source {source!r}; "
                        "resume it with action=resume, or stop it first with action=stop"
                    )
            return self._start(req, req.tables, stored)
        if req.action == "refresh":
            fresh = [
                t for t in req.tables
                if (stored[t.id] is None or stored[t.id].status in (DONE, STOPPED)) and self._due(t.id, stored[t.id])
            ]
            for t in req.tables:
                if stored[t.id] is not None and stored[t.id].status == PAUSED:
                    log.info("table %s: snapshot %s is paused; left paused", t.id, stored[t.id].snapshot_id)
            going = {
                t.id: stored[t.id]
                for t in req.tables
                if stored[t.id] is not None and stored[t.id].status in (RUNNING, FAILED)
            }
            work = []
            for t in fresh:  # each keeps the chunk settings of the snapshot before it
                work += self._start(self._inherit(req, t, stored[t.id]), [t], stored)
            return work + self._resume(req, going)
        return self._resume(req, stored)

    def _due(self, table_id: str, p: SnapshotProgress | None) -> bool:
        """A refresh starts a new snapshot only for a logical date after the one of the run
        that started the last snapshot: a second run for the same date (a cleared run, a
        backfill over dates already done) or an older one starts none."""
        if p is None or p.logical_date is None or self._logical_date is None:
            return True
        if datetime.fromisoformat(self._logical_date) > datetime.fromisoformat(p.logical_date):
            return True
        log.info(
            "table %s: snapshot %s was started for logical date %s; this run (%s) starts no other",
            table_id, p.snapshot_id, p.logical_date, self._logical_date,
        )
        return False

    def _inherit(self, req: SnapshotConf, table: TableName, prior: SnapshotProgress | None) -> SnapshotConf:
        """A refresh keeps the chunk settings (chunk_size, parallelism, where, delay_seconds)
        of the snapshot before it, so of the last manual start, unless its conf gives new ones."""
        if prior is None:
            return req
        try:
            plan = read_plan(self.data_dir, self.hook.source, table, prior.snapshot_id)
        except StateError:
            log.info("table %s: the plan of snapshot %s is gone; refreshing with this run's settings", table,
                     prior.snapshot_id)
            return req
        changes: dict[str, Any] = {
            k: plan[k] for k in ("chunk_size", "parallelism") if k not in req.given and plan.get(k) is not None
        }
        if "where" not in req.given and plan.get("where"):
            changes["where"] = {table.id: plan["where"]}
        delay = req.delay_seconds if "delay_seconds" in req.given else (plan.get("delay_seconds") or None)
        return replace(req, request=replace(req.request, **changes), delay_seconds=delay)

    def _owner_alive(self, p: SnapshotProgress) -> bool:
        """True when another DAG run that is still queued or running reads this snapshot."""
        if not p.owner or p.owner == self._run_id:
            return False
        ti = (self._context or {}).get("ti")
        get_state = getattr(ti, "get_dagrun_state", None)
        if get_state is None:
            return False
        try:
            state = get_state(ti.dag_id, p.owner)
        except Exception as exc:  # noqa: BLE001 - e.g. the owner run was deleted
            log.info("table %s: state of run %s unknown (%s); taking the snapshot over", p.snapshot_id, p.owner, exc)
            return False
        return str(getattr(state, "value", state)).lower() in ("queued", "running")

    def _pause_or_stop(self, req: SnapshotConf, stored: dict[str, SnapshotProgress | None]) -> list[dict]:
        changed = {}
        for tid, p in stored.items():  # every transition is checked before any is saved
            if p is None:
                raise StateError(
                    f"table {tid} has no snapshot on source {self.hook.source!r}; nothing to {req.action}"
                )
            before = p.status
            p.pause() if req.action == "pause" else p.stop()
            if p.status != before:
                changed[tid] = p
            else:
                log.info("table %s: snapshot %s is already %s", tid, p.snapshot_id, p.status)
        for tid in changed:
            def change(q: SnapshotProgress | None, tid: str = tid) -> SnapshotProgress:
                if q is None:
                    raise StateError(f"table {tid}: its snapshot was removed meanwhile; nothing to {req.action}")
                q.pause() if req.action == "pause" else q.stop()
                return q

            p = progress_store.update(self.hook.source, tid, self.data_dir, change)
            if p.status == STOPPED:
                # the stopped snapshot's merge in flight must not commit another batch
                from ..sinks.mirror_delta import fence_out_merges

                fence_out_merges(self.data_dir, self.hook.source, tid, p.snapshot_id)
            log.info(
                "table %s: snapshot %s is now %s (progress kept: %d rows)",
                tid,
                p.snapshot_id,
                p.status,
                p.rows,
            )
        return []

    def _start(self, req: SnapshotConf, tables: Sequence[TableName],
               stored: dict[str, SnapshotProgress | None]) -> list[dict]:
        source = self.hook.source
        request = req.request
        plans = []
        with self.hook.get_dialect() as dialect:
            dialect.check_prerequisites()
            # read-only: every table is checked before anything is written (a conf narrows the
            # capture scope, never widens it; system and unreadable tables are refused, named)
            dialect.check_snapshot_tables(tables)
            for table in tables:
                schema = dialect.describe_table(table)
                if "mirror" in sink_names(self.sinks):
                    mirror_schema(schema)  # a table the Delta mirror cannot hold fails here, named
                ranges = plan_table_ranges(dialect, schema, request)
                why = mirror_needs_rebuild(self.data_dir, source, schema)
                if why and is_partial(request, table):
                    raise ConfigurationError(
                        f"table {table}: its mirror cannot take the source's current schema ({why}); snapshot the "
                        "whole table (no 'keys', 'key_ranges' or 'where') to rebuild it"
                    )
                plans.append((table, schema, ranges))
            dialect.ensure_watermark_table()
            # The changelog must exist before the first low watermark, or the windows are
            # never captured: creates the slot/publication (PG) or records the binlog start.
            dialect.load_offset(self.data_dir)
            # The convergence mark (I9), before the upper bounds: once a whole-table snapshot
            # is done, every live row of the table was re-emitted after this mark (a chunk at
            # its high watermark) or changed after it (a row above the bound was inserted after
            # the bound was read), so mirror rows older than the mark are ghosts (commit step).
            converge_mark = f"converge-{uuid.uuid4().hex}"
            dialect.write_watermark(converge_mark)
            # The upper bound only after that: a row inserted above the max key is then
            # in the changelog for sure. Read before the changelog existed, a row inserted
            # in between would be in neither the chunks (above the bound) nor the log.
            plans = [(t, s, r, dialect.max_key(s, request.where_for(t))) for t, s, r in plans]
        work = []
        for table, schema, ranges, upper in plans:
            sid = new_snapshot_id()
            plan = {
                "table": table.id,
                "snapshot_id": sid,
                "ranges": [json.loads(r.to_json()) for r in ranges],
                "upper_bound": None if upper is None else list(upper),
                "where": request.where_for(table),
                # whole-table snapshots only: one limited by keys, ranges or a filter does not
                # re-emit the rows outside what it read, so it cannot tell ghosts from them
                "converge_watermark": None if is_partial(request, table) else converge_mark,
                "chunk_size": request.chunk_size,
                "parallelism": request.parallelism,
                "delay_seconds": req.delay_seconds or 0.0,
            }
            # the mirror takes the table's current schema: new columns added, or (a changed
            # type, a stop after a schema change) rebuilt empty for this snapshot to fill
            reconcile_mirror(self.data_dir, source, schema, whole_table=not is_partial(request, table))
            storage.write_text(schema_path(self.data_dir, source, table), schema.to_json())
            storage.write_text(plan_path(self.data_dir, source, table, sid), json.dumps(plan))
            started = SnapshotProgress.start(source, sid, {table.id: ranges}, {table.id: upper})
            started.owner, started.logical_date = self._run_id, self._logical_date
            read_as = stored.get(table.id)

            def claim(q: SnapshotProgress | None, started: SnapshotProgress = started, read_as=read_as,
                      table: TableName = table) -> SnapshotProgress:
                # another plan run (or a resume) got to this table since this one read it: it wins
                if (q is not None and q.status in (RUNNING, PAUSED, FAILED)) or (
                        (q is None) != (read_as is None) or (q is not None and q.snapshot_id != read_as.snapshot_id)):
                    raise StateError(
                        f"table {table.id}: snapshot {q.snapshot_id if q else None} ({q.status if q else 'none'}) "
                        f"was stored by another run while this one planned; this run starts no snapshot of it"
                    )
                return started

            progress_store.update(source, table.id, self.data_dir, claim)
            log.info(
                "table %s: snapshot %s planned %d range(s) up to key %s, chunk size %d",
                table.id,
                sid,
                len(ranges),
                upper,
                plan["chunk_size"],
            )
            work += self._work_items(plan, range(len(ranges)))
        return work

    def _resume(self, req: SnapshotConf, stored: dict[str, SnapshotProgress | None]) -> list[dict]:
        source = self.hook.source
        for tid, p in stored.items():
            if p is None:
                raise StateError(
                    f"table {tid} has no snapshot on source {source!r} to resume; use action=start"
                )
            if p.status == STOPPED:
                raise StateError(
                    f"table {tid}: snapshot {p.snapshot_id} was stopped; a stopped snapshot starts over: use action=start"
                )
        work = []
        for tid, p in stored.items():
            if p.status == DONE:
                log.info("table %s: snapshot %s is done; nothing to resume", tid, p.snapshot_id)
                continue
            if self._owner_alive(p):
                log.warning(
                    "table %s: snapshot %s is being read by DAG run %s, which is still running; this run leaves "
                    "it alone (two runs never read one snapshot at once). Resume again once that run has ended",
                    tid, p.snapshot_id, p.owner,
                )
                continue
            table = TableName.parse(tid)
            plan = read_plan(self.data_dir, source, table, p.snapshot_id)
            if "chunk_size" in req.given:  # throttle settings may change between runs
                plan["chunk_size"] = req.request.chunk_size
            if req.delay_seconds is not None:
                plan["delay_seconds"] = req.delay_seconds
            storage.write_text(plan_path(self.data_dir, source, table, p.snapshot_id), json.dumps(plan))
            sidecars = read_sidecars(self.data_dir, source, table, p.snapshot_id)
            todo = []
            for i in range(len(plan["ranges"])):
                st = range_state(sidecars, i, plan.get("upper_bound"))
                if not st.exhausted or st.unmerged:
                    todo.append(i)
            def change(q: SnapshotProgress | None, sid: str = p.snapshot_id, tid: str = tid,
                       done_reading: bool = not todo) -> SnapshotProgress:
                if q is None or q.snapshot_id != sid:
                    raise StateError(f"table {tid}: snapshot {sid} was replaced by another run meanwhile; "
                                     "this run resumes nothing of it")
                q.resume()
                if done_reading and q.table(tid).done:
                    q.finish()
                q.owner = self._run_id or q.owner
                return q

            progress_store.update(source, tid, self.data_dir, change)
            log.info(
                "table %s: resuming snapshot %s, %d of %d range(s) left",
                tid,
                p.snapshot_id,
                len(todo),
                len(plan["ranges"]),
            )
            work += self._work_items(plan, todo)
        return work

    @staticmethod
    def _work_items(plan: dict, indexes: Any) -> list[dict]:
        return [
            {
                "table": plan["table"],
                "snapshot_id": plan["snapshot_id"],
                "range_index": i,
                "ranges_total": len(plan["ranges"]),
                "range": plan["ranges"][i],
                "upper_bound": plan.get("upper_bound"),
                "where": plan.get("where"),
                "chunk_size": plan["chunk_size"],
                "delay_seconds": plan.get("delay_seconds") or 0.0,
            }
            for i in indexes
        ]


# ----------------------------------------------------------------------- chunk
def _fraction(rng: ChunkRange, key: Sequence | None, upper: Sequence | None) -> float | None:
    """Share of a numeric key range already read (for progress logs only)."""
    if key is None:
        return None
    lo = rng.start[0] if rng.start else 0
    hi = rng.end[0] if rng.end else (upper[0] if upper else None)
    k = key[0]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (lo, hi, k)) or hi <= lo:
        return None
    return min(max((k - lo) / (hi - lo), 0.0), 1.0)


class SnapshotChunkOperator(_SourceOperator):
    """Read one planned range chunk by chunk, each chunk between a fresh pair of watermarks.

    Continues after the last committed chunk of the range (retry, resume); stops early
    when the snapshot is paused or stopped (Variable) or the DAG is paused. Returns the
    ChunkResult dicts of the range that are not merged yet (this run's and earlier ones').
    """

    template_fields: Sequence[str] = ("work", "data_dir", "cdc_conn_id", "source")
    ui_color = "#d4f0d4"

    def __init__(self, *, work: dict, check_dag_paused: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.work = work
        self.check_dag_paused = check_dag_paused

    _ran_while_paused = False

    def _should_stop(self, context: Any, table_id: str, snapshot_id: str) -> str | None:
        p = progress_store.load(self.hook.source, table_id, self.data_dir)
        if p is None or p.snapshot_id != snapshot_id:
            return f"snapshot {snapshot_id} of {table_id} is no longer the current one"
        if not p.may_read:
            return f"snapshot {snapshot_id} of {table_id} is {p.status}"
        run_id = context.get("run_id") if context else None
        if p.owner and run_id and p.owner != run_id:
            return f"snapshot {snapshot_id} of {table_id} is read by DAG run {p.owner} now"
        # A task that starts while its DAG is paused was run on purpose (dag.test(),
        # `airflow tasks test`, a run forced through): only a pause that happens while
        # it runs stops it.
        if self.check_dag_paused and not self._ran_while_paused and _dag_is_paused(context):
            # the snapshot's status says so too (`airflow-cdc status`); resume continues it
            pause_for_dag_pause(self.hook.source, table_id, snapshot_id, self.data_dir)
            return "the DAG was paused"
        return None

    def execute(self, context: Any) -> list[dict]:
        from ..pipeline.snapshot import snapshot_chunk

        w = self.work
        source = self.hook.source
        table = TableName.parse(w["table"])
        snapshot_id, ri = w["snapshot_id"], int(w["range_index"])
        rng = ChunkRange.from_json(json.dumps(w["range"]))
        upper = w.get("upper_bound")
        chunk_size, delay = int(w["chunk_size"]), float(w.get("delay_seconds") or 0)
        st = range_state(read_sidecars(self.data_dir, source, table, snapshot_id), ri, upper)
        results = list(st.unmerged)
        label = f"{table} range {ri + 1}/{w['ranges_total']}"
        if st.exhausted:
            log.info("%s already read (%d rows in %d chunks)", label, st.rows, st.chunks)
            return results
        self._ran_while_paused = self.check_dag_paused and _dag_is_paused(context)
        reason = self._should_stop(context, table.id, snapshot_id)
        if reason:  # before connecting at all
            log.info("not reading %s: %s", label, reason)
            return results
        schema = TableSchema.from_json(storage.read_text(schema_path(self.data_dir, source, table)))
        seq, after_key = st.next_seq, st.after_key
        rows_total, n, t0, rows_run = st.rows, st.chunks, time.monotonic(), 0
        if st.chunks:
            log.info("%s: continuing after %d committed chunk(s), after key %s", label, st.chunks, after_key)
        with self.hook.get_dialect() as dialect:
            from ..pipeline.schema_changes import chunk_schema

            staged = schema
            while True:
                if n > st.chunks:
                    reason = self._should_stop(context, table.id, snapshot_id)
                    if reason:
                        log.info("%s: stopping before chunk %d: %s", label, n + 1, reason)
                        break
                # each chunk reads the table's columns as they are now: an ADD or DROP COLUMN
                # while the snapshot runs neither fails it nor leaves a column behind (a DROP
                # between this and the SELECT fails the task once; its retry reads on)
                schema = chunk_schema(dialect, self.data_dir, source, staged)
                res = snapshot_chunk(
                    dialect,
                    schema,
                    rng,
                    data_dir=self.data_dir,
                    snapshot_id=snapshot_id,
                    seq=seq,
                    chunk_size=chunk_size,
                    after_key=after_key,
                    where=w.get("where"),
                    upper_bound=upper,
                )
                if res.rows and after_key is not None and res.last_key is not None:
                    check_advanced(dialect, schema, label, after_key, res.last_key)
                if not res.exhausted and key_reached(res.last_key, upper):
                    # past the snapshot's upper bound: later rows reach the sinks through the changelog
                    res = replace(res, exhausted=True)
                write_sidecar(res, ri)  # the chunk is committed
                results.append(res.to_dict())
                n, seq = n + 1, seq + 1
                rows_total += res.rows
                rows_run += res.rows
                if res.last_key is not None:
                    after_key = res.last_key
                elapsed = time.monotonic() - t0
                frac = 1.0 if res.exhausted else _fraction(rng, after_key, upper)
                log.info(
                    "%s: chunk %d of %s (%s), %d rows, %d rows in range, %.0f rows/s",
                    label,
                    n,
                    f"~{max(n, math.ceil(n / frac))}" if frac else "?",
                    f"{frac:.0%}" if frac is not None else "?%",
                    res.rows,
                    rows_total,
                    rows_run / elapsed if elapsed > 0 else 0.0,
                )
                if res.exhausted:
                    break
                if delay:
                    time.sleep(delay)
        return results


# ---------------------------------------------------------------------- commit
class SnapshotCommitOperator(_SourceOperator):
    """After the merge wrote the round: mark its chunks merged and record them in the
    snapshot's progress; a snapshot whose ranges are all read and merged is done.
    Idempotent: a retried commit records nothing twice (SnapshotProgress.record_chunk)."""

    template_fields: Sequence[str] = ("chunks", "data_dir", "cdc_conn_id", "source")
    ui_color = "#ffd9b3"

    def __init__(self, *, chunks: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chunks = chunks

    def _compact(self, source: str, tid: str, sid: str | None = None) -> dict[str, Any]:
        """Every chunk of the snapshot is merged. First convergence (I9, whole-table
        snapshots): mirror rows older than the plan's convergence mark were neither re-emitted
        by a chunk nor changed since, so the source no longer has them (a TRUNCATE, lost
        events, drift): they go, behind a horizon (sinks.mirror_delta.sweep). Then tombstones
        up to what the mirror has applied go. Safe against any writer still in flight (the
        horizon fence in sinks/mirror_delta.py), idempotent and retried on commit conflicts;
        a snapshot started after this reads its chunks later than those deletes. The
        compaction is the changelog rounds' one, within their budget: a large snapshot's
        buckets are folded over the next rounds, not all in this task."""
        from ..sinks.base import read_marker
        from ..sinks.mirror_delta import compact_buckets, sweep, vacuum
        from ..storage.layout import changelog_dir, mirror_dir
        from ..storage.staged import staged_watermarks

        table = TableName.parse(tid)
        converged: dict[str, Any] = {}
        if sid is not None:  # (a no-op without a Delta mirror)
            mark = read_plan(self.data_dir, source, table, sid).get("converge_watermark")
            if mark:
                found = staged_watermarks(changelog_dir(self.data_dir, source), [mark])
                if mark in found:
                    gone = sweep(mirror_dir(self.data_dir, source, table), found[mark][0],
                                 reason=f"snapshot {sid} convergence")
                    converged = {"converged_at": found[mark][0], "swept_rows": gone}
                    log.info("table %s: snapshot %s converged: %d mirror row(s) the source no longer has removed",
                             tid, sid, gone)
                else:
                    log.warning("table %s: convergence mark %s of snapshot %s is not staged; mirror rows the source "
                                "no longer has (if any) stay", tid, mark, sid)
        applied = read_marker(self.data_dir, source, "mirror")
        if applied is not None:
            now = settings.load(overrides=self.cdc_overrides)
            path = mirror_dir(self.data_dir, source, table)
            removed = compact_buckets(path, tombstones_upto=applied.encode(),
                                      budget_rows=now.mirror_compact_budget_rows)["tombstones"]
            vacuum(path, now.mirror_retention_hours)
            log.info("table %s: snapshot done, %d mirror tombstone(s) compacted away", tid, removed)
        return converged

    def execute(self, context: Any) -> dict[str, Any]:
        from ..core.chunk import flatten_chunk_results

        source = self.hook.source
        touched: dict[tuple[str, str], int] = {}
        for c in flatten_chunk_results(self.chunks):
            sc = sidecar_path(c["path"])
            if not storage.exists(sc):
                raise StateError(
                    f"chunk {c['path']} has no committed sidecar {sc}; was the staging folder changed?"
                )
            data = json.loads(storage.read_text(sc))
            if not data["merged"]:
                write_sidecar(ChunkResult.from_dict(data["result"]), data["range_index"], merged=True)
            key = (c["table"], c["snapshot_id"])
            touched[key] = touched.get(key, 0) + 1
        summary = {}
        done: dict[str, dict[str, Any]] = {}  # tables whose snapshot finished here: a mirror Asset event each
        for (tid, sid), count in touched.items():
            p = progress_store.load(source, tid, self.data_dir)
            if p is None or p.snapshot_id != sid:
                log.info(
                    "table %s: merged %d chunk(s) of snapshot %s, which is no longer current", tid, count, sid
                )
                continue
            if p.status in (STOPPED, DONE):
                log.info(
                    "table %s: snapshot %s is %s; merged %d chunk(s), progress unchanged",
                    tid,
                    sid,
                    p.status,
                    count,
                )
                if p.status == DONE:  # a retry after `done` was stored: compaction is not skipped
                    self._compact(source, tid, sid)
                tp = p.table(tid)
                summary[tid] = {"status": str(p.status), "rows": tp.rows, "chunks": tp.chunks}
                continue
            sidecars = read_sidecars(self.data_dir, source, TableName.parse(tid), sid)
            outcome = {"recorded": 0, "finished": False}

            def record(q: SnapshotProgress | None, sid: str = sid, tid: str = tid, sidecars=sidecars,
                       outcome: dict = outcome) -> SnapshotProgress | None:
                # applied to what is stored now: a pause, stop or takeover that landed meanwhile stays
                outcome.update(recorded=0, finished=False)
                if q is None or q.snapshot_id != sid or q.status in (STOPPED, DONE):
                    return None
                for s in sidecars:  # seq order = keyset order inside each range
                    if s["merged"]:
                        outcome["recorded"] += q.record_chunk(ChunkResult.from_dict(s["result"]))
                if q.status == RUNNING and q.table(tid).done:
                    q.finish()
                    outcome["finished"] = True
                return q

            p = progress_store.update(source, tid, self.data_dir, record)
            if p is None or p.snapshot_id != sid:
                continue
            recorded, finished = outcome["recorded"], outcome["finished"]
            if finished:
                done[tid] = {"snapshot_id": sid, "snapshot_done": True, "rows": p.table(tid).rows,
                             **self._compact(source, tid, sid)}
            tp = p.table(tid)
            log.info(
                "table %s: snapshot %s %s, %d new chunk(s) recorded, %d rows in %d chunks merged, %.0f rows/s",
                tid,
                sid,
                p.status,
                recorded,
                tp.rows,
                tp.chunks,
                p.rows_per_second(),
            )
            summary[tid] = {"status": str(p.status), "rows": tp.rows, "chunks": tp.chunks}
        if done:
            self._emit_done(context, source, done)
        return summary

    def _emit_done(self, context: Any, source: str, done: dict[str, dict[str, Any]]) -> None:
        """A mirror Asset event per table whose snapshot finished (and converged) here: the
        point a consumer of the whole table waits for (assets.py). Never fails the commit."""
        from ..assets import emit_table_events
        from ..pipeline.committed import MIRROR, table_extra

        try:
            extra = {tid: table_extra(self.data_dir, source, tid, MIRROR, **e) for tid, e in done.items()}
            emit_table_events(context, self.outlets, source, {MIRROR: extra})
        except Exception:  # noqa: BLE001 - the progress is stored; only the notification is lost
            log.exception("could not emit the Asset events of the finished snapshot(s) %s", sorted(done))
