"""The snapshot's lifecycle and its chunk loop, without Airflow (docs/DESIGN.md, "Snapshot state"
and "Components"): one :class:`SnapshotController` a task applies a run's conf, reads a planned
range chunk by chunk with its stop checks, and commits merged chunks, converging and compacting
the mirror of a finished snapshot. The operators only translate a task's context into its callbacks.
"""

from __future__ import annotations

import json
import logging
import math
import os
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
from ..core.plans import SnapshotPlan, WorkItem
from ..core.position import Position, marked_position
from ..core.progress import SnapshotProgress, Status, range_fraction
from ..core.schema import TableName, TableSchema
from ..core.throttle import PROBE_ROWS, ChunkSizer, ChunkSizing, size_text
from ..dialects.base import Dialect
from ..sinks import registry
from ..storage.layout import changelog_dir, schema_path
from . import snapshot as steps
from .multiset import load_table, loaded
from .snapshot_conf import SnapshotConf
from .snapshot_state import SourceProgress

log = logging.getLogger(__name__)

RUNNING, PAUSED, STOPPED, DONE, FAILED = (
    Status.RUNNING,
    Status.PAUSED,
    Status.STOPPED,
    Status.DONE,
    Status.FAILED,
)


def pause_for_dag_pause(progress: SourceProgress, table_id: str, snapshot_id: str) -> bool:
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

    progress.update(table_id, change)
    if paused:
        log.info(
            "table %s: snapshot %s paused because the DAG was paused; resume it after unpausing",
            table_id,
            snapshot_id,
        )
    return bool(paused)


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


def read_floor(plan: SnapshotPlan | dict) -> Position | None:
    """How far a replica that chunks are read from must have replayed before a chunk of the
    snapshot ``plan`` (None: no such bound): past the plan's ``read_floor`` (the changelog's start
    lies before it) and, under watermark strategy "log", past the convergence mark (a chunk's
    mark older than it would have its rows swept away by convergence)."""
    fields = plan if isinstance(plan, dict) else plan.to_dict()  # (a plan's fields, or some of them)
    mark = marked_position(fields.get("converge_watermark") or "")
    floors = [mark[0]] if mark else []
    if fields.get("read_floor"):
        floors.append(Position.decode(fields["read_floor"]))
    return max(floors, default=None)


class SnapshotController:
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
        """A refresh keeps the chunk settings (chunk_size, parallelism, where, delay_seconds)
        of the snapshot before it, so of the last manual start, unless its conf gives new ones."""
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
        changes: dict[str, Any] = {
            k: getattr(plan, k)
            for k in ("chunk_size", "parallelism")
            if k not in req.given and getattr(plan, k) is not None
        }
        if "where" not in req.given and plan.where:
            changes["where"] = {table.id: plan.where}
        delay = req.delay_seconds if "delay_seconds" in req.given else (plan.delay_seconds or None)
        return replace(req, request=replace(req.request, **changes), delay_seconds=delay)

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
            read_floor = dialect.read_floor()
            if read_floor is not None:  # the upper bounds below are read there too
                dialect.read_no_older_than(read_floor)
            # The upper bound only after that: a row inserted above the max key is then
            # in the changelog for sure. Read before the changelog existed, a row inserted
            # in between would be in neither the chunks (above the bound) nor the log.
            plans = [(t, s, r, dialect.max_key(s, request.where_for(t))) for t, s, r in plans]
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
                read_floor=None if read_floor is None else read_floor.encode(),
                chunk_size=request.chunk_size,
                parallelism=request.parallelism,
                delay_seconds=req.delay_seconds,
            )
            # the mirror takes the table's current schema: new columns added, or (a changed
            # type, a stop after a schema change) rebuilt empty for this snapshot to fill
            steps.reconcile_mirror(self.data_dir, self.source, schema, whole_table=not partial)
            storage.write_text(schema_path(self.data_dir, self.source, table), schema.to_json())
            steps.write_plan(self.data_dir, self.source, plan)
            started = SnapshotProgress.start(self.source, sid, {table.id: ranges}, {table.id: upper})
            started.owner, started.logical_date = self.run_id, self.logical_date
            read_as = stored.get(table.id)

            def claim(
                q: SnapshotProgress | None,
                started: SnapshotProgress = started,
                read_as=read_as,
                table: TableName = table,
            ) -> SnapshotProgress:
                # another plan run (or a resume) got to this table since this one read it: it wins
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
            log.info(
                "table %s: snapshot %s planned %d range(s) up to key %s, chunk size %s",
                table.id,
                sid,
                len(ranges),
                upper,
                "adaptive" if plan.chunk_size is None else f"{plan.chunk_size:,} (fixed)",
            )
            work += [w.to_dict() for w in plan.work_items(range(len(ranges)))]
        return work

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
            if "chunk_size" in req.given:  # throttle settings may change between runs
                plan = plan.with_throttle(chunk_size=req.request.chunk_size)
            if req.delay_seconds is not None:
                plan = plan.with_throttle(delay_seconds=req.delay_seconds)
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

    # ------------------------------------------------------------------ chunk loop
    def stop_reason(self, table_id: str, snapshot_id: str) -> str | None:
        """Why this run must not read another chunk of ``snapshot_id`` (None: read on): the
        authority's answer to "is this attempt still live?"."""
        p = self.progress.load(table_id)
        if p is None or p.snapshot_id != snapshot_id:
            return f"snapshot {snapshot_id} of {table_id} is no longer the current one"
        if not p.may_read:
            return f"snapshot {snapshot_id} of {table_id} is {p.status}"
        if p.owner and self.run_id and p.owner != self.run_id:
            return f"snapshot {snapshot_id} of {table_id} is read by DAG run {p.owner} now"
        return None

    def chunk_gate(
        self, table_id: str, snapshot_id: str, dag_paused: Callable[[], bool] = lambda: False
    ) -> Callable[[], str | None]:
        """The check a chunk task makes before each chunk: :meth:`stop_reason`, and a pause
        of its DAG that happened while it runs (the snapshot is then paused too, so its status
        says so and resume continues it). A task that starts while its DAG is paused was run
        on purpose (dag.test(), a test run, a run forced through): that pause does not stop it."""
        started_paused = dag_paused()

        def stop() -> str | None:
            reason = self.stop_reason(table_id, snapshot_id)
            if reason is None and not started_paused and dag_paused():
                pause_for_dag_pause(self.progress, table_id, snapshot_id)
                reason = "the DAG was paused"
            return reason

        return stop

    def _await_replica(
        self,
        dialect: Dialect,
        table_id: str,
        snapshot_id: str,
        label: str,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> str | None:
        """Chunks read from a replica: its lag is logged before each chunk and throttles the
        snapshot (it waits while the replica is more than half its bound behind); a replica still
        beyond ``max_replica_lag_seconds`` after that long pauses the snapshot (resume continues
        it). Returns why it paused, None to read on."""
        bound = dialect.max_replica_lag_seconds
        start = clock()
        while True:
            lag = dialect.replica_lag()
            if lag is None:
                return None
            behind, seconds = lag
            log.info("%s: the replica is %d bytes, %.1f s behind the source", label, behind, seconds)
            if seconds <= bound / 2:
                return None
            if clock() - start >= bound:
                break
            sleep(min(5.0, bound / 10))
        behind_text = (
            "has stopped replicating (its SQL or I/O thread is not running)"
            if seconds == float("inf")
            else f"is {seconds:.0f} s behind the source, beyond max_replica_lag_seconds={bound:g}"
        )
        why = (
            f"the replica chunks are read from {behind_text}; the snapshot is paused: resume it once "
            "the replica has caught up"
        )

        def change(p: SnapshotProgress | None) -> SnapshotProgress | None:
            if p is None or p.snapshot_id != snapshot_id or p.status != RUNNING:
                return None
            p.pause()
            return p

        self.progress.update(table_id, change)
        return why

    def read_range(
        self, work: WorkItem | dict, *, dag_paused: Callable[[], bool] = lambda: False
    ) -> list[dict]:
        """Read one planned range (a work item) chunk by chunk, each between a fresh pair of
        watermarks, after its last committed chunk (retry, resume). Stops before the next
        chunk when the snapshot is no longer live (:meth:`stop_reason`) or ``dag_paused()``
        turns true while it runs (the snapshot is then paused too). Returns the ChunkResult
        dicts of the range not merged yet (this run's and earlier ones').

        The work item's ``chunk_size`` fixes each chunk's rows; None sizes each chunk from the
        ones read before it (:class:`ChunkSizer`: ``self.chunk_sizing``'s duration and bytes
        targets), starting from the last committed chunk of the range on a retry or resume."""
        from .schema_changes import chunk_schema

        work = WorkItem.from_dict(work)
        table = TableName.parse(work.table)
        snapshot_id, ri, rng, upper = work.snapshot_id, work.range_index, work.range, work.upper_bound
        delay = work.delay_seconds
        sidecars = steps.read_sidecars(self.data_dir, self.source, table, snapshot_id)
        # a chunk whose high watermark a failover lost is read again, and the range after it
        sidecars = steps.discard_lost(self.data_dir, self.source, sidecars, ri)
        st = steps.range_state(sidecars, ri, upper)
        results = list(st.unmerged)
        label = f"{table} range {ri + 1}/{work.ranges_total}"
        if st.exhausted:
            log.info("%s already read (%d rows in %d chunks)", label, st.rows, st.chunks)
            return results
        stop = self.chunk_gate(table.id, snapshot_id, dag_paused)
        reason = stop()
        if reason:  # before connecting at all
            log.info("not reading %s: %s", label, reason)
            return results
        staged = TableSchema.from_json(storage.read_text(schema_path(self.data_dir, self.source, table)))
        seq, after_key = st.next_seq, st.after_key
        rows_total, n, t0, rows_run = st.rows, st.chunks, time.monotonic(), 0
        if st.chunks:
            log.info("%s: continuing after %d committed chunk(s), after key %s", label, st.chunks, after_key)
        floor = read_floor(steps.load_plan(self.data_dir, self.source, table, snapshot_id))
        with self.connect() as dialect:
            if floor is not None:
                dialect.read_no_older_than(floor)
            # a retry or resume goes on with the size its last committed chunk had (the range
            # continues after that chunk's key whatever its size): no restart from the default
            last = [s["result"]["rows"] for s in sidecars if s["range_index"] == ri][-1:]
            sizer = ChunkSizer(
                self.chunk_sizing,
                fixed=work.chunk_size,
                start=last[0] if last else None,
                target_bytes_cap=dialect.batch_max_bytes,
            )
            if sizer.adaptive and not last:
                self._probe(dialect, sizer, chunk_schema(dialect, self.data_dir, self.source, staged), work,
                            after_key, label)
            while True:
                if n > st.chunks:
                    reason = stop()
                    if reason:
                        log.info("%s: stopping before chunk %d: %s", label, n + 1, reason)
                        break
                reason = self._await_replica(dialect, table.id, snapshot_id, label)
                if reason:
                    log.warning("%s: stopping before chunk %d: %s", label, n + 1, reason)
                    break
                # each chunk reads the table's columns as they are now: an ADD or DROP COLUMN
                # while the snapshot runs neither fails it nor leaves a column behind (a DROP
                # between this and the SELECT fails the task once; its retry reads on)
                schema = chunk_schema(dialect, self.data_dir, self.source, staged)
                size, started = sizer.size, self.clock()
                res = steps.snapshot_chunk(
                    dialect,
                    schema,
                    rng,
                    data_dir=self.data_dir,
                    snapshot_id=snapshot_id,
                    seq=seq,
                    chunk_size=size,
                    after_key=after_key,
                    where=work.where,
                    upper_bound=upper,
                )
                took = self.clock() - started
                if res.rows and after_key is not None and res.last_key is not None:
                    steps.check_advanced(dialect, schema, label, after_key, res.last_key)
                if not res.exhausted and steps.key_reached(res.last_key, upper):
                    # past the snapshot's upper bound: later rows reach the sinks through the changelog
                    res = replace(res, exhausted=True)
                steps.write_sidecar(res, ri)  # the chunk is committed
                results.append(res.to_dict())
                n, seq = n + 1, seq + 1
                rows_total += res.rows
                rows_run += res.rows
                if res.last_key is not None:
                    after_key = res.last_key
                elapsed = time.monotonic() - t0
                frac = 1.0 if res.exhausted else range_fraction(rng, after_key, upper)
                staged_bytes = steps.staged_bytes(res.path) if sizer.adaptive else None
                if not res.exhausted:
                    sizer.observe(res.rows, took, staged_bytes)
                log.info(
                    "%s: chunk %d of %s (%s), %d of %d rows%s in %.2f s, %d rows in range, %.0f rows/s%s",
                    label,
                    n,
                    f"~{max(n, math.ceil(n / frac))}" if frac else "?",
                    f"{frac:.0%}" if frac is not None else "?%",
                    res.rows,
                    size,
                    "" if staged_bytes is None else f", {size_text(staged_bytes)}",
                    took,
                    rows_total,
                    rows_run / elapsed if elapsed > 0 else 0.0,
                    "" if res.exhausted else f"; next chunk {sizer.describe()}",
                )
                if res.exhausted:
                    break
                if delay:
                    time.sleep(delay)
        return results

    def _probe(
        self, dialect, sizer: ChunkSizer, schema: TableSchema, work: WorkItem, after_key, label: str
    ) -> None:
        """Before a range's first adaptive chunk: read its first rows twice as a chunk read
        would (no watermarks: nothing of it is kept; at most CDC_CHUNK_MAX_ROWS), a few rows
        then :data:`PROBE_ROWS`, to scratch files removed after, and size that first chunk from
        what the further rows cost (the difference: a read's own cost, tens of ms on a new
        connection, is not a row's) and their bytes, instead of from a fixed start (measured:
        the start size's chunks took 0.3x the duration target)."""
        import tempfile

        limit = min(PROBE_ROWS, sizer.sizing.max_rows)  # CDC_CHUNK_MAX_ROWS bounds every read
        few = max(1, limit // 20)
        with tempfile.TemporaryDirectory(prefix="cdc-probe-") as scratch:
            reads = []
            for n in (few, limit):
                path = os.path.join(scratch, f"probe-{n}.parquet")
                started = self.clock()
                res = dialect.read_chunk(
                    schema,
                    work.range,
                    after_key=after_key,
                    limit=n,
                    path=path,
                    where=work.where,
                    upper_bound=work.upper_bound,
                )
                reads.append((res.rows, self.clock() - started))
            (rows_few, took_few), (rows, took) = reads
            if rows < limit or rows <= rows_few:  # the range has fewer rows: the start size reads them all
                return
            per_row = (took - took_few) / (rows - rows_few)
            if per_row <= 0:  # the larger read was not slower (a busy moment in the first): its average
                per_row = took / rows
            sizer.probe(rows, per_row * rows, steps.staged_bytes(path))
        log.info("%s: a probe read %d then %d rows in %.3f and %.3f s; first chunk %s", label, rows_few,
                 rows, took_few, took, sizer.describe())

    # ------------------------------------------------------------------ commit
    def commit(self, chunks: Any, *, finish: bool = True) -> tuple[dict[str, dict], dict[str, dict]]:
        """After the merge wrote the round: mark its chunks merged and record them in the
        snapshot's progress; a snapshot whose ranges are all read and merged is done, then
        converged and compacted. Idempotent: a retried commit records nothing twice
        (SnapshotProgress.record_chunk). Returns (summary per table, tables finished here
        with what a notification of them says). ``finish=False`` (a merge while reading)
        records only: the round's commit finishes the snapshot and announces it."""
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
        summary: dict[str, dict] = {}
        done: dict[str, dict[str, Any]] = {}
        for (tid, sid), count in touched.items():
            p = self.progress.load(tid)
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
                if p.status == DONE and finish:  # a retry after `done` was stored: compaction is not skipped
                    self.converge_and_compact(tid, sid)
                tp = p.table(tid)
                summary[tid] = {"status": str(p.status), "rows": tp.rows, "chunks": tp.chunks}
                continue
            sidecars = steps.read_sidecars(self.data_dir, self.source, TableName.parse(tid), sid)
            outcome = {"recorded": 0, "finished": False}

            def record(
                q: SnapshotProgress | None,
                sid: str = sid,
                tid: str = tid,
                sidecars=sidecars,
                outcome: dict = outcome,
            ) -> SnapshotProgress | None:
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
                continue
            if outcome["finished"]:
                done[tid] = {
                    "snapshot_id": sid,
                    "snapshot_done": True,
                    "rows": p.table(tid).rows,
                    **self.converge_and_compact(tid, sid),
                }
            tp = p.table(tid)
            log.info(
                "table %s: snapshot %s %s, %d new chunk(s) recorded, %d rows in %d chunks merged, %.0f "
                "rows/s",
                tid,
                sid,
                p.status,
                outcome["recorded"],
                tp.rows,
                tp.chunks,
                p.rows_per_second(),
            )
            summary[tid] = {"status": str(p.status), "rows": tp.rows, "chunks": tp.chunks}
        return summary, done

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
