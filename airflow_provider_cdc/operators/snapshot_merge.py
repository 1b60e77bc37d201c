"""The snapshot's merge operators: a round's chunks merged into the sinks, at the end of a round or
while later chunks are read (spark-submit, or in the worker for small rounds: spark_submit.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowException

from ..settings import FromSettings, sink_names
from .spark_submit import _CdcJobOperator


def _write_live_round(round_file: str, chunks) -> str:
    """The round without the chunks of stopped snapshots, next to the round file."""
    from .. import storage
    from ..storage.layout import live_round_path

    path = live_round_path(round_file)
    storage.write_text(path, json.dumps([c.to_dict() for c in chunks]))
    return path


class SnapshotMergeOperator(_CdcJobOperator):
    """DBLog steps 4-5 for a snapshot round: the chunks listed in ``round_file`` (the
    ``round`` task's output) merged with their watermark windows, written to the sinks.

    :param round_file: the file that lists the round's chunks (the ``round`` task's output).
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param sinks: the sinks written, a comma list (``events``, ``mirror``, ``postgres``); default CDC_SINKS.
    :param database: ``source.db`` of the events written; default the database the source's connection
        names, else the source's name.
    :param local_max_rows: inputs of up to this many rows run in this worker, larger ones through
        spark-submit (0: always spark-submit); default CDC_LOCAL_MAX_ROWS. Under a ``local[...]``
        Spark master, merges of up to CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS rows run in this worker too.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    :param conn_id: the Spark connection of the spark-submit; default ``spark_default`` (the DAG files
        pass CDC_SPARK_CONN_ID).

    SparkSubmitOperator's arguments (``conf``, ``packages``, ``executor_memory``, ...) are handed to the
    spark-submit as given; the others are BaseOperator's.
    """

    job = "merge"
    #: pipeline/arrow_engine.merge_round holds a group of chunks at a time (_CdcJobOperator.in_worker)
    local_master_max_rows = FromSettings("local_snapshot_merge_max_rows")
    template_fields: Sequence[str] = (*_CdcJobOperator.template_fields, "round_file")

    def __init__(self, *, round_file: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.round_file = round_file

    def job_arguments(self) -> list[str]:
        return ["--chunks", str(self.round_file), *super().job_arguments()]

    def _dead_snapshots(self, chunks) -> set[tuple[str, str]]:
        """(table, snapshot id) of the round whose snapshot was stopped or replaced: their
        chunks are not merged (a stop means no more output from that snapshot)."""
        from .. import airflow_variables

        dead = set()
        for key in {(c.table, c.snapshot_id) for c in chunks}:
            p = airflow_variables.load(self.source, key[0], self.data_dir)
            if p is None or p.snapshot_id != key[1] or p.status == airflow_variables.STOPPED:
                dead.add(key)
        return dead

    def execute(self, context: Any) -> dict | None:
        from airflow.sdk.exceptions import AirflowSkipException

        from ..core.errors import FencedError
        from ..pipeline.merge_while_reading import not_merged

        chunks = self._chunks()
        left = not_merged(chunks)
        if len(left) < len(chunks):  # the merge_while_reading task merged the others (and committed them)
            self.log.info(
                "merge: %d of %d chunk(s) of this round were merged while reading; %d left",
                len(chunks) - len(left),
                len(chunks),
                len(left),
            )
            if not left:
                return {"engine": "none", "chunks": 0, "merged_while_reading": len(chunks)}
            chunks = left
            self.round_file = _write_live_round(str(self.round_file), chunks)
        dead = self._dead_snapshots(chunks)
        if dead:
            live = [c for c in chunks if (c.table, c.snapshot_id) not in dead]
            self.log.info("merge: not merging the chunks of stopped or replaced snapshot(s) %s", sorted(dead))
            if not live:
                raise AirflowSkipException(
                    f"every snapshot of this round was stopped or replaced: {sorted(dead)}"
                )
            self.round_file = _write_live_round(str(self.round_file), live)
        try:
            summary = super().execute(context)
        except (FencedError, AirflowException) as exc:
            # a stop that landed while merging fences the merge out (sinks/mirror_fencing.py):
            # that is the stop working, not a failure to retry
            merging = self._chunks()
            gone = self._dead_snapshots(merging)
            if gone and gone == {(c.table, c.snapshot_id) for c in merging}:
                raise AirflowSkipException(
                    f"merge fenced out: snapshot(s) {sorted(gone)} stopped meanwhile ({exc})"
                ) from exc
            raise
        from ..pipeline.committed import round_tables  # pyarrow.dataset: not when the DAG file is parsed

        self._emit_assets(
            context, lambda kinds: round_tables(self._chunks(), self.data_dir, self.source, kinds)
        )
        return summary

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """The round's tables and the staged chunks in; their event log and mirror out."""
        from ..storage.layout import staging_dir

        return self._lineage({c.table for c in self._chunks()}, staging_dir(self.data_dir, self.source))

    def _chunks(self):
        from ..pipeline.windows import load_chunks

        return load_chunks(str(self.round_file))

    def input_rows(self) -> int:
        return sum(c.rows for c in self._chunks())

    def run_local(self) -> dict:
        from ..pipeline.arrow_engine import merge_round
        from ..pipeline.merge_while_reading import write_receipt

        chunks = self._chunks()
        sinks = self._sinks(require_schema=True, fence_tables=[(c.table, c.snapshot_id) for c in chunks])
        try:
            summary = merge_round(chunks, data_dir=self.data_dir, source=self.source, sinks=sinks)
        finally:
            for s in sinks:
                s.close()
        write_receipt(str(self.round_file), chunks)  # as the Spark job does, after the sinks committed
        return summary


#: task states of a chunk task that will read again, but is not reading now: it may need a
#: worker slot or a turn this task holds (a pool of one, ``airflow dags test`` running tasks one
#: after another), so they are waited for a bounded time only
_WAITING_STATES = frozenset({"queued", "up_for_retry", "up_for_reschedule", "restarting", "deferred"})
#: how long merge_while_reading waits while no chunk task of the run is running
_WAIT_FOR_READERS_S = 20.0
#: ... and of one that has ended for this run
_DONE_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


class SnapshotMergeWhileReadingOperator(SnapshotMergeOperator):
    """Merges a snapshot run's chunks while its chunk tasks still read them
    (pipeline/merge_while_reading.py): whenever ``min_rows`` committed chunk rows have their
    high watermark staged, one merge (spark-submit, or in this worker: spark_submit.py) writes
    them to the sinks and a commit marks them merged. It ends once no chunk task of the run is
    reading; the round's own merge takes what is left. An optimisation only: a failure here is
    logged and leaves its chunks to the round's merge, which retries as it always did.

    :param work: the plan task's work items (the snapshots and ranges of this run).
    :param min_rows: ready rows that start a merge (``CDC_MERGE_WHILE_READING_ROWS``; 0: never).
    :param reader_task_id: the chunk task whose instances of this run are watched.
    :param cdc_conn_id: the source connection, for the captures that stage high watermarks.
    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param sinks: the sinks written, a comma list (``events``, ``mirror``, ``postgres``); default CDC_SINKS.
    :param database: ``source.db`` of the events written; default the database the source's connection
        names, else the source's name.
    :param local_max_rows: inputs of up to this many rows run in this worker, larger ones through
        spark-submit (0: always spark-submit); default CDC_LOCAL_MAX_ROWS. Under a ``local[...]``
        Spark master, merges of up to CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS rows run in this worker too.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    :param conn_id: the Spark connection of the spark-submit; default ``spark_default`` (the DAG files
        pass CDC_SPARK_CONN_ID).

    SparkSubmitOperator's arguments (``conf``, ``packages``, ``executor_memory``, ...) are handed to the
    spark-submit as given; the others are BaseOperator's.
    """

    template_fields: Sequence[str] = (*SnapshotMergeOperator.template_fields, "work")
    min_rows = FromSettings("merge_while_reading_rows")
    poke_interval = FromSettings("sensor_poke_interval")

    def __init__(
        self,
        *,
        work: Any,
        min_rows: int | None = None,
        reader_task_id: str = "read_chunks",
        cdc_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(round_file="", **kwargs)
        self.work, self.min_rows, self.reader_task_id = work, min_rows, reader_task_id
        self.cdc_conn_id = cdc_conn_id
        self.poke_interval = None

    def _work_items(self) -> list[dict]:
        from ..core.chunk import flatten_chunk_results

        return [w for w in flatten_chunk_results(self.work) if isinstance(w, dict)]

    def _readers(self, context: Any) -> bool | str | None:
        """Whether a chunk task of this run is running: True; none is but one is queued or up
        for retry: "waiting"; none is and none will be soon: False; all are done: "done"; None
        when Airflow cannot say."""
        ti = (context or {}).get("ti")
        get_states = getattr(ti, "get_task_states", None)
        if get_states is None:
            return None
        try:
            states = get_states(dag_id=ti.dag_id, task_ids=[self.reader_task_id], run_ids=[ti.run_id])
        except Exception as exc:  # noqa: BLE001 - not served where the task runs: decide from storage
            self.log.debug("could not read the chunk tasks' states: %s", exc)
            return None
        found = [str(getattr(v, "value", v)).lower() for per in (states or {}).values() for v in per.values()]
        if "running" in found:
            return True
        if any(s in _WAITING_STATES for s in found):
            return "waiting"
        return "done" if found and all(s in _DONE_STATES for s in found) else False

    def _drain(self) -> None:
        """A capture under the source's lock (another capture running: nothing to do)."""
        from ..hooks.cdc_source import CdcSourceHook
        from ..pipeline.capture import run_capture
        from ..settings import load

        now = load(overrides=self.cdc_overrides)
        hook = CdcSourceHook.for_settings(now, self.cdc_conn_id, self.source)
        if run_capture(hook, self.data_dir) is None:
            self.log.info("the changelog of %r is being captured elsewhere; waiting for it", self.source)

    def _commit(self, chunks: list[dict]) -> None:
        from .. import airflow_variables
        from ..pipeline.snapshot_controller import SnapshotController
        from ..settings import load

        now = load(overrides=self.cdc_overrides)

        def no_source():  # a commit never reads the source
            raise RuntimeError("merge_while_reading does not connect to the source")

        SnapshotController(
            source=self.source,
            data_dir=self.data_dir,
            progress=airflow_variables.for_source(self.source, self.data_dir),
            connect=no_source,
            sinks=sink_names(self.sinks),
            compact_budget_rows=now.mirror_compact_budget_rows,
            retention_hours=now.mirror_retention_hours,
        ).commit(chunks, finish=False)

    def execute(self, context: Any) -> dict:
        work = self._work_items()
        summary: dict[str, Any] = {"batches": 0, "chunks": 0, "rows": 0}
        if not work or not self.min_rows:
            self.log.info(
                "nothing to merge while reading (%s)", "no work items" if not work else "min_rows is 0"
            )
            return summary
        try:
            self._merge_while_reading(context, work, summary)
        except Exception:  # noqa: BLE001 - an optimisation: the round's merge takes every chunk left
            self.log.exception("merging while reading stopped; the round's merge takes the chunks left")
        self.log.info("merged while reading: %s", summary)
        return summary

    def _merge_while_reading(self, context: Any, work: list[dict], summary: dict[str, Any]) -> None:
        import time

        from .. import storage
        from ..core.chunk import ChunkResult
        from ..pipeline import merge_while_reading as mwr
        from ..storage.layout import round_path

        run_id = (context or {}).get("run_id") or "run"
        idle_since: float | None = None
        while True:
            readers = self._readers(context)
            if readers is None:
                self.log.info(
                    "Airflow cannot say here whether the chunk tasks still read; the round's merge "
                    "takes every chunk"
                )
                return
            if readers is not True:  # "waiting", False or "done"
                # none running: what is committed is the round's merge's (which finishes the
                # snapshot and announces it). Chunk tasks queued or up for retry are waited for a
                # bounded time (they may need the slot this task holds); ones scheduled with this
                # task may not be queued yet at the first look: a second look, a second later
                now = time.monotonic()
                idle_since = now if idle_since is None else idle_since
                limit = _WAIT_FOR_READERS_S if readers == "waiting" else 1.0
                if readers == "done" or now - idle_since >= limit:
                    return
                time.sleep(1.0)
                continue
            idle_since = None
            unmerged = mwr.committed_unmerged(self.data_dir, self.source, work)
            dead = self._dead_snapshots([ChunkResult.from_dict(c) for c in unmerged])
            unmerged = [c for c in unmerged if (c["table"], c["snapshot_id"]) not in dead]
            if mwr.worth_merging(sum(c["rows"] for c in unmerged), self.min_rows):
                ready, missing = mwr.ready(self.data_dir, self.source, unmerged)
                if missing:
                    self._drain()
                    ready, missing = mwr.ready(self.data_dir, self.source, unmerged)
                ready_rows = sum(c["rows"] for c in ready)
                if mwr.worth_merging(ready_rows, self.min_rows):
                    n = summary["batches"] + 1
                    self.round_file = round_path(self.data_dir, self.source, f"{run_id}~early{n}")
                    storage.write_text(self.round_file, json.dumps(ready))
                    self.log.info(
                        "merging %d chunk(s), %d rows, while chunks are read (batch %d; %d chunk(s) "
                        "wait for their high watermark)",
                        len(ready),
                        ready_rows,
                        n,
                        missing,
                    )
                    super().execute(context)  # the merge task's job; its --chunks: this batch's round file
                    mwr.check_receipt(self.round_file, ready)  # only what this merge wrote is marked merged
                    self._commit(ready)
                    summary.update(
                        batches=n, chunks=summary["chunks"] + len(ready), rows=summary["rows"] + ready_rows
                    )
                    continue
            time.sleep(float(self.poke_interval))
