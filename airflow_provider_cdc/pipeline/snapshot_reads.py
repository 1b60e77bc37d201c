"""The snapshot's chunk loop (docs/DESIGN.md, "Snapshot state"): a planned range read chunk by
chunk with its stop checks, a replica awaited, the first chunk sized by a probe. A mixin of
pipeline/snapshot_controller.SnapshotController (``self`` is the controller)."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import replace

from .. import storage
from ..core.chunk import ChunkResult
from ..core.plans import SnapshotPlan, WorkItem
from ..core.position import Position, marked_position
from ..core.progress import SnapshotProgress, Status, range_fraction
from ..core.schema import TableName, TableSchema
from ..core.throttle import PROBE_ROWS, ChunkSizer, size_text
from ..dialects.base import ChunkRead, Dialect
from ..storage.layout import schema_path
from . import snapshot as steps
from .snapshot_state import SourceProgress

log = logging.getLogger(__name__)

RUNNING, PAUSED, STOPPED, DONE, FAILED = (
    Status.RUNNING,
    Status.PAUSED,
    Status.STOPPED,
    Status.DONE,
    Status.FAILED,
)


def _log_chunk(label: str, n: int, frac: float | None, res: ChunkResult, size: int, staged_bytes: int | None,
               took: float, rows_total: int, rate: float, sizer: ChunkSizer) -> None:
    """A range's progress after its chunk ``n``: the chunks to come, the rows, the rate, the next size."""
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
        rate,
        "" if res.exhausted else f"; next chunk {sizer.describe()}",
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


class ChunkLoop:
    """SnapshotController's chunk loop."""

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

        The work item's throttle fixes each chunk's rows (``chunk_size``); None sizes each chunk from the
        ones read before it (:class:`ChunkSizer`: ``self.chunk_sizing``'s duration and bytes
        targets), starting from the last committed chunk of the range on a retry or resume."""
        work = WorkItem.from_dict(work)
        table = TableName.parse(work.table)
        snapshot_id, ri, rng, upper = work.snapshot_id, work.range_index, work.range, work.upper_bound
        delay = work.throttle.delay_seconds
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
            sizer = self._sizer(dialect, work, sidecars, staged, after_key, label)
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
                size = sizer.size
                res, took = self._read_one_chunk(dialect, work, staged, seq, size, after_key, label)
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
                _log_chunk(label, n, frac, res, size, staged_bytes, took, rows_total,
                           rows_run / elapsed if elapsed > 0 else 0.0, sizer)
                if res.exhausted:
                    break
                if delay:
                    time.sleep(delay)
        return results

    def _sizer(self, dialect, work: WorkItem, sidecars: list, staged: TableSchema, after_key, label: str):
        """The range's :class:`ChunkSizer`: fixed by the work item's throttle, or adaptive
        from the last committed chunk's size (a retry or resume goes on with it: the range
        continues after that chunk's key whatever its size), or from a probe of a range's first
        rows when nothing of it is committed."""
        from .schema_changes import chunk_schema

        last = [s["result"]["rows"] for s in sidecars if s["range_index"] == work.range_index][-1:]
        sizer = ChunkSizer(
            self.chunk_sizing,
            fixed=work.throttle.chunk_size,
            start=last[0] if last else None,
            target_bytes_cap=dialect.batch_max_bytes,
        )
        if sizer.adaptive and not last:
            self._probe(dialect, sizer, chunk_schema(dialect, self.data_dir, self.source, staged), work,
                        after_key, label)
        return sizer

    def _read_one_chunk(
        self, dialect, work: WorkItem, staged: TableSchema, seq: int, size: int, after_key, label: str
    ) -> tuple[ChunkResult, float]:
        """One chunk of the range after ``after_key`` between a fresh pair of watermarks, checked
        to have advanced and committed (its sidecar written): (the result, its seconds on the
        controller's clock)."""
        from .schema_changes import chunk_schema

        # each chunk reads the table's columns as they are now: an ADD or DROP COLUMN
        # while the snapshot runs neither fails it nor leaves a column behind (a DROP
        # between this and the SELECT fails the task once; its retry reads on)
        schema = chunk_schema(dialect, self.data_dir, self.source, staged)
        upper = work.upper_bound
        started = self.clock()
        res = steps.snapshot_chunk(
            dialect,
            schema,
            work.range,
            data_dir=self.data_dir,
            snapshot_id=work.snapshot_id,
            seq=seq,
            limit=size,
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
        steps.write_sidecar(res, work.range_index)  # the chunk is committed
        return res, took

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
                    ChunkRead(schema, work.range, after_key, n, path, work.where, work.upper_bound)
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

