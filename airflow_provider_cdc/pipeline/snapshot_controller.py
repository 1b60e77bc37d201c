"""The snapshot's lifecycle and its chunk loop, without Airflow (docs/DESIGN.md, "Snapshot state"
and "Components"): one :class:`SnapshotController` a task applies a run's conf, reads a planned
range chunk by chunk with its stop checks, and commits merged chunks, converging and compacting
the mirror of a finished snapshot. The operators only translate a task's context into its callbacks.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

from .. import storage
from ..core.chunk import ChunkResult, flatten_chunk_results
from ..core.errors import StateError
from ..core.plans import SnapshotPlan
from ..core.progress import SnapshotProgress
from ..core.schema import TableName
from ..core.throttle import ChunkSizing
from ..dialects.base import Dialect
from ..sinks import registry
from ..storage.layout import changelog_dir, schema_path
from . import snapshot as steps
from .multiset import load_table, loaded
from .snapshot_conf import SnapshotConf
from .snapshot_reads import (  # noqa: F401 - pause_for_dag_pause and read_floor: their callers import them here
    DONE,
    FAILED,
    PAUSED,
    RUNNING,
    STOPPED,
    ChunkLoop,
    pause_for_dag_pause,
    read_floor,
)
from .snapshot_state import SourceProgress

log = logging.getLogger(__name__)



def mark_failed(progress: SourceProgress, snapshots: Iterable[tuple[str, str]], error: str) -> list[str]:
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

        progress.update(table_id, change)
        if failed:
            changed.append(table_id)
            log.error("table %s: snapshot %s failed: %s", table_id, snapshot_id, error)
    return changed


def work_items(plan: SnapshotPlan | dict, indexes: Iterable[int]) -> list[dict]:
    """The chunk tasks' inputs: one WorkItem per range of ``plan`` to read, as XCom carries it."""
    return [w.to_dict() for w in SnapshotPlan.from_dict(plan).work_items(indexes)]


class SnapshotController(ChunkLoop):
    """The snapshots of one source, as one run (``run_id``, ``logical_date``) sees them.

    ``connect()`` opens the source (a Dialect, a context manager); ``sinks`` names the
    sinks the snapshot feeds ("mirror": its limits are checked at plan); a finished
    snapshot's mirror is compacted within ``compact_budget_rows`` and vacuumed after
    ``retention_hours``; ``owner_alive(p)`` says whether another run that still runs reads
    snapshot ``p`` (the orchestrator knows); ``chunk_sizing``: the targets and bounds of the
    adaptive chunk size (CDC_CHUNK_TARGET_SECONDS and the others), ``clock`` times each chunk.
    """

    def __init__(
        self,
        *,
        source: str,
        data_dir: str,
        progress: SourceProgress,
        connect: Callable[[], AbstractContextManager[Dialect]],
        sinks: Sequence[str] = ("mirror",),
        compact_budget_rows: int = 4_000_000,
        retention_hours: float = 1.0,
        run_id: str | None = None,
        logical_date: str | None = None,
        owner_alive: Callable[[SnapshotProgress], bool] = lambda p: False,
        chunk_sizing: ChunkSizing | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if progress.source != source:
            raise StateError(f"the progress of source {progress.source!r} cannot serve source {source!r}")
        self.source, self.data_dir, self.progress = source, data_dir, progress
        self.connect, self.sinks = connect, tuple(sinks)
        self.compact_budget_rows, self.retention_hours = compact_budget_rows, retention_hours
        self.run_id, self.logical_date = run_id, logical_date
        self._owner_alive = owner_alive
        self.chunk_sizing, self.clock = chunk_sizing or ChunkSizing(), clock

    # ------------------------------------------------------------------ lifecycle
    def apply(self, req: SnapshotConf) -> list[dict]:
        """Apply a run's parsed conf; the work items of the ranges to read (none for pause/stop)."""
        stored = {t.id: self.progress.load(t.id) for t in req.tables}
        log.info("snapshot %s of %s on source %r", req.action, ", ".join(stored), self.source)
        if req.action in ("pause", "stop"):
            return self._pause_or_stop(req, stored)
        if req.action == "start":
            for tid, p in stored.items():
                if p is not None and p.status in (RUNNING, PAUSED, FAILED):
                    raise StateError(
                        f"table {tid} has a {p.status} snapshot {p.snapshot_id} on source {self.source!r}; "
                        "resume it with action=resume, or stop it first with action=stop"
                    )
            return self._start(req, req.tables, stored)
        if req.action == "refresh":
            fresh = [
                t
                for t in req.tables
                if (stored[t.id] is None or stored[t.id].status in (DONE, STOPPED))
                and self._due(t.id, stored[t.id])
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
        if p is None or p.logical_date is None or self.logical_date is None:
            return True
        if datetime.fromisoformat(self.logical_date) > datetime.fromisoformat(p.logical_date):
            return True
        log.info(
            "table %s: snapshot %s was started for logical date %s; this run (%s) starts no other",
            table_id,
            p.snapshot_id,
            p.logical_date,
            self.logical_date,
        )
        return False

    def _inherit(self, req: SnapshotConf, table: TableName, prior: SnapshotProgress | None) -> SnapshotConf:
        """A refresh keeps the throttle and the filter of the snapshot before it, so of the last
        manual start, unless its conf gives new ones."""
        if prior is None:
            return req
        try:
            plan = steps.load_plan(self.data_dir, self.source, table, prior.snapshot_id)
        except StateError:
            log.info(
                "table %s: the plan of snapshot %s is gone; refreshing with this run's settings",
                table,
                prior.snapshot_id,
            )
            return req
        changes: dict[str, Any] = {"throttle": req.request.throttle.inherit(plan.throttle, req.given)}
        if "where" not in req.given and plan.where:
            changes["where"] = {table.id: plan.where}
        return replace(req, request=replace(req.request, **changes))

    def _owner_elsewhere(self, p: SnapshotProgress) -> bool:
        """True when another run that is still queued or running reads this snapshot."""
        return bool(p.owner) and p.owner != self.run_id and self._owner_alive(p)

    def _pause_or_stop(self, req: SnapshotConf, stored: dict[str, SnapshotProgress | None]) -> list[dict]:
        changed = []
        for tid, p in stored.items():  # every transition is checked before any is saved
            if p is None:
                raise StateError(
                    f"table {tid} has no snapshot on source {self.source!r}; nothing to {req.action}"
                )
            before = p.status
            p.pause() if req.action == "pause" else p.stop()
            if p.status != before:
                changed.append(tid)
            else:
                log.info("table %s: snapshot %s is already %s", tid, p.snapshot_id, p.status)
        for tid in changed:

            def change(q: SnapshotProgress | None, tid: str = tid) -> SnapshotProgress:
                if q is None:
                    raise StateError(
                        f"table {tid}: its snapshot was removed meanwhile; nothing to {req.action}"
                    )
                q.pause() if req.action == "pause" else q.stop()
                return q

            p = self.progress.update(tid, change)
            if p.status == STOPPED:
                # the stopped snapshot's merge in flight must not commit another batch
                from ..sinks.mirror_fencing import fence_out_merges

                fence_out_merges(self.data_dir, self.source, tid, p.snapshot_id)
            log.info(
                "table %s: snapshot %s is now %s (progress kept: %d rows)",
                tid,
                p.snapshot_id,
                p.status,
                p.rows,
            )
        return []

    def _start(
        self, req: SnapshotConf, tables: Sequence[TableName], stored: dict[str, SnapshotProgress | None]
    ) -> list[dict]:
        request = req.request
        plans, converge_mark, converge_visibility, floor = self._plan_under_capture(request, tables)
        work = []
        for table, schema, ranges, upper in plans:
            sid = steps.new_snapshot_id()
            partial = steps.is_partial(request, table)
            # a snapshot of key ranges (no filter, no chosen keys) of a one-integer key converges
            # inside its ranges: a repair after a lost delete re-reads its ranges, not the table
            converges = not partial or steps.converges_in_ranges(request, table, schema)
            plan = SnapshotPlan(
                table=table.id,
                snapshot_id=sid,
                ranges=tuple(ranges),
                upper_bound=upper,
                where=request.where_for(table),
                # whole-table snapshots, and key ranges of an integer key (swept inside them):
                # one limited by keys or a filter does not re-emit the rows outside what it
                # read, so it cannot tell ghosts from them
                converge_watermark=converge_mark if converges else None,
                converge_visibility=converge_visibility if converges else None,
                read_floor=None if floor is None else floor.encode(),
                throttle=request.throttle,
            )
            # the mirror takes the table's current schema: new columns added, or (a changed
            # type, a stop after a schema change) rebuilt empty for this snapshot to fill
            steps.reconcile_mirror(self.data_dir, self.source, schema, whole_table=not partial)
            storage.write_text(schema_path(self.data_dir, self.source, table), schema.to_json())
            steps.write_plan(self.data_dir, self.source, plan)
            started = SnapshotProgress.start(self.source, sid, {table.id: ranges}, {table.id: upper})
            started.owner, started.logical_date = self.run_id, self.logical_date
            self._claim(table, started, stored.get(table.id))
            log.info(
                "table %s: snapshot %s planned %d range(s) up to key %s, chunk size %s",
                table.id,
                sid,
                len(ranges),
                upper,
                plan.throttle.chunk_rows(),
            )
            work += [w.to_dict() for w in plan.work_items(range(len(ranges)))]
        return work

    def _plan_under_capture(self, request, tables: Sequence[TableName]) -> tuple[list, Any, Any, Any]:
        """The tables' ranges planned with capture started: (plans of (table, schema, ranges,
        upper bound), the convergence mark, its visibility, the replicas' read floor). Checks
        every table before anything is written; loads the multiset (keyless) tables whole."""
        with self.connect() as dialect:
            dialect.check_prerequisites()
            # read-only: every table is checked before anything is written (a conf narrows the
            # capture scope, never widens it; system and unreadable tables are refused, named)
            dialect.check_snapshot_tables(tables)
            plans, multisets = steps.plan_tables(
                dialect, tables, request, self.sinks, self.data_dir, self.source
            )
            dialect.prepare_watermarks()
            # The changelog must exist before the first low watermark, or the windows are
            # never captured: creates the slot/publication (PG) or records the binlog start.
            dialect.load_offset(self.data_dir)
            for table in multisets:  # (capture started: their changes from here on are in the log)
                res = load_table(dialect, self.data_dir, self.source, table)
                done = loaded(self.source, res, self.run_id, self.logical_date)
                self.progress.update(table.id, lambda _q, done=done: done)
            # The convergence mark (DESIGN.md, I9 Convergence), before the upper bounds: once a
            # whole-table snapshot is done, every live row of the table was re-emitted after
            # this mark (a chunk at its high watermark) or changed after it (a row above the
            # bound was inserted after the bound was read), so mirror rows older than the mark
            # are ghosts (commit step).
            converge_mark = dialect.mark(f"converge-{uuid.uuid4().hex}")
            # where commit order is not visibility order (PostgreSQL), a change committed before
            # the mark may still be unseen by the chunks: the sweep then starts before it
            converge_visibility = dialect.visibility()
            # chunks read from a replica first see everything before this (it follows the mark
            # and the changelog's start): a replica behind the changelog's start would read rows
            # older than any change the log holds for them
            floor = dialect.read_floor()
            if floor is not None:  # the upper bounds below are read there too
                dialect.read_no_older_than(floor)
            # The upper bound only after that: a row inserted above the max key is then
            # in the changelog for sure. Read before the changelog existed, a row inserted
            # in between would be in neither the chunks (above the bound) nor the log.
            plans = [(t, s, r, dialect.max_key(s, request.where_for(t))) for t, s, r in plans]
        return plans, converge_mark, converge_visibility, floor

    def _claim(self, table: TableName, started: SnapshotProgress, read_as: SnapshotProgress | None) -> None:
        """Store ``started`` as the table's snapshot unless another plan run (or a resume) got to
        the table since this one read it as ``read_as``: that one wins (StateError)."""

        def claim(q: SnapshotProgress | None) -> SnapshotProgress:
            if (q is not None and q.status in (RUNNING, PAUSED, FAILED)) or (
                (q is None) != (read_as is None)
                or (q is not None and q.snapshot_id != read_as.snapshot_id)
            ):
                raise StateError(
                    f"table {table.id}: snapshot {q.snapshot_id if q else None} ("
                    f"{q.status if q else 'none'}) "
                    f"was stored by another run while this one planned; this run starts no snapshot of it"
                )
            return started

        self.progress.update(table.id, claim)

    def _resume(self, req: SnapshotConf, stored: dict[str, SnapshotProgress | None]) -> list[dict]:
        for tid, p in stored.items():
            if p is None:
                raise StateError(
                    f"table {tid} has no snapshot on source {self.source!r} to resume; use action=start"
                )
            if p.status == STOPPED:
                raise StateError(
                    f"table {tid}: snapshot {p.snapshot_id} was stopped; a stopped snapshot starts "
                    "over: use action=start"
                )
        work = []
        for tid, p in stored.items():
            if p.status == DONE:
                log.info("table %s: snapshot %s is done; nothing to resume", tid, p.snapshot_id)
                continue
            if self._owner_elsewhere(p):
                log.warning(
                    "table %s: snapshot %s is being read by DAG run %s, which is still running; this "
                    "run leaves "
                    "it alone (two runs never read one snapshot at once). Resume again once that run "
                    "has ended",
                    tid,
                    p.snapshot_id,
                    p.owner,
                )
                continue
            table = TableName.parse(tid)
            plan = steps.load_plan(self.data_dir, self.source, table, p.snapshot_id)
            plan = plan.resumed(req.request.throttle, req.given)  # its throttle may change between runs
            steps.write_plan(self.data_dir, self.source, plan)
            sidecars = steps.read_sidecars(self.data_dir, self.source, table, p.snapshot_id)
            todo = [
                i
                for i in range(len(plan.ranges))
                if not (st := steps.range_state(sidecars, i, plan.upper_bound)).exhausted or st.unmerged
            ]

            def change(
                q: SnapshotProgress | None,
                sid: str = p.snapshot_id,
                tid: str = tid,
                done_reading: bool = not todo,
            ) -> SnapshotProgress:
                if q is None or q.snapshot_id != sid:
                    raise StateError(
                        f"table {tid}: snapshot {sid} was replaced by another run meanwhile; "
                        "this run resumes nothing of it"
                    )
                q.resume()
                if done_reading and q.table(tid).done:
                    q.finish()
                q.owner = self.run_id or q.owner
                return q

            self.progress.update(tid, change)
            log.info(
                "table %s: resuming snapshot %s, %d of %d range(s) left",
                tid,
                p.snapshot_id,
                len(todo),
                len(plan.ranges),
            )
            work += [w.to_dict() for w in plan.work_items(todo)]
        return work

    # ------------------------------------------------------------------ commit
    def commit(self, chunks: Any, *, finish: bool = True) -> tuple[dict[str, dict], dict[str, dict]]:
        """After the merge wrote the round: mark its chunks merged and record them in the
        snapshot's progress; a snapshot whose ranges are all read and merged is done, then
        converged and compacted. Idempotent: a retried commit records nothing twice
        (SnapshotProgress.record_chunk). Returns (summary per table, tables finished here
        with what a notification of them says). ``finish=False`` (a merge while reading)
        records only: the round's commit finishes the snapshot and announces it."""
        summary: dict[str, dict] = {}
        done: dict[str, dict[str, Any]] = {}
        for (tid, sid), count in _mark_merged(chunks).items():
            entry, finished = self._record_merged(tid, sid, count, finish)
            if entry is not None:
                summary[tid] = entry
            if finished is not None:
                done[tid] = finished
        return summary, done

    def _record_merged(
        self, tid: str, sid: str, count: int, finish: bool
    ) -> tuple[dict | None, dict[str, Any] | None]:
        """Record one table's merged chunks in its progress (what :meth:`commit` does per table):
        its summary (None: the snapshot is no longer current) and, when it finished here, what a
        notification of it says."""
        p = self.progress.load(tid)
        if p is None or p.snapshot_id != sid:
            log.info("table %s: merged %d chunk(s) of snapshot %s, no longer current", tid, count, sid)
            return None, None
        if p.status in (STOPPED, DONE):
            log.info(
                "table %s: snapshot %s is %s; merged %d chunk(s), progress unchanged",
                tid,
                sid,
                p.status,
                count,
            )
            if p.status == DONE and finish:  # a retry after `done` was stored: compaction is not skipped
                self.converge_and_compact(tid, sid)
            tp = p.table(tid)
            return {"status": str(p.status), "rows": tp.rows, "chunks": tp.chunks}, None
        sidecars = steps.read_sidecars(self.data_dir, self.source, TableName.parse(tid), sid)
        outcome = {"recorded": 0, "finished": False}

        def record(q: SnapshotProgress | None) -> SnapshotProgress | None:
            # applied to what is stored now: a pause, stop or takeover that landed meanwhile stays
            outcome.update(recorded=0, finished=False)
            if q is None or q.snapshot_id != sid or q.status in (STOPPED, DONE):
                return None
            for s in sidecars:  # seq order = keyset order inside each range
                if s["merged"]:
                    outcome["recorded"] += q.record_chunk(ChunkResult.from_dict(s["result"]))
            if finish and q.status == RUNNING and q.table(tid).done:
                q.finish()
                outcome["finished"] = True
            return q

        p = self.progress.update(tid, record)
        if p is None or p.snapshot_id != sid:
            return None, None
        finished = None
        if outcome["finished"]:
            finished = {
                "snapshot_id": sid,
                "snapshot_done": True,
                "rows": p.table(tid).rows,
                **self.converge_and_compact(tid, sid),
            }
        tp = p.table(tid)
        log.info(
            "table %s: snapshot %s %s, %d new chunk(s) recorded, %d rows in %d chunks merged, %.0f rows/s",
            tid,
            sid,
            p.status,
            outcome["recorded"],
            tp.rows,
            tp.chunks,
            p.rows_per_second(),
        )
        return {"status": str(p.status), "rows": tp.rows, "chunks": tp.chunks}, finished

    def converge_and_compact(self, tid: str, sid: str | None = None) -> dict[str, Any]:
        """Every chunk of the snapshot is merged. First convergence (whole-table snapshots): rows
        older than the plan's convergence mark were neither re-emitted by a chunk nor changed
        since, so the source no longer has them (a TRUNCATE, lost events, drift): each sink that
        keeps rows removes them (sinks/registry.py converge; the Delta mirror behind a horizon).
        Then each sink's upkeep once a snapshot is done (the mirror folds its tombstones within
        the changelog rounds' compaction budget). Idempotent."""
        from ..core.window import lowered_low
        from ..storage.staged import staged_watermarks
        from .windows import staged_log

        table = TableName.parse(tid)
        converged: dict[str, Any] = {}
        plan = None if sid is None else steps.load_plan(self.data_dir, self.source, table, sid)
        mark = None if plan is None else plan.converge_watermark
        if mark:
            changelog = changelog_dir(self.data_dir, self.source)
            found = staged_watermarks(changelog, [mark])
            if mark in found:
                vis, at = plan.converge_visibility, found[mark][0]
                at = lowered_low(vis, at, at, staged_log(changelog, [vis], at))
                within = None if steps.covers_every_key(plan.ranges) else plan.ranges
                why = {"reason": f"snapshot {sid} convergence", "within": within}
                gone = registry.converge(self.sinks, self.data_dir, self.source, table, at, **why)
                converged = {"converged_at": at, "swept_rows": gone}
                log.info("table %s: snapshot %s converged: %d row(s) the source lost removed", tid, sid, gone)
            else:
                log.warning(
                    "table %s: convergence mark %s of snapshot %s is not staged; rows the source no longer "
                    "has (if any) stay",
                    tid,
                    mark,
                    sid,
                )
        upkeep = {"budget_rows": self.compact_budget_rows, "retention_hours": self.retention_hours}
        registry.after_snapshot(self.sinks, self.data_dir, self.source, table, **upkeep)
        return converged


def _mark_merged(chunks: Any) -> dict[tuple[str, str], int]:
    """Mark each chunk's sidecar merged (once); the chunks per (table, snapshot id)."""
    touched: dict[tuple[str, str], int] = {}
    for c in flatten_chunk_results(chunks):
        sc = steps.sidecar_path(c["path"])
        if not storage.exists(sc):
            raise StateError(
                f"chunk {c['path']} has no committed sidecar {sc}; was the staging folder changed?"
            )
        data = json.loads(storage.read_text(sc))
        if not data["merged"]:
            steps.write_sidecar(ChunkResult.from_dict(data["result"]), data["range_index"], merged=True)
        key = (c["table"], c["snapshot_id"])
        touched[key] = touched.get(key, 0) + 1
    return touched
