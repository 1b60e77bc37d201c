"""The changelog's apply operator: staged changes past the sinks' markers into the sinks
(spark-submit, or in the worker for small inputs: spark_submit.py), and what a round reports."""

from __future__ import annotations

from typing import Any

from ..core.errors import SchemaChangeError
from ..settings import sink_names
from .spark_submit import _CdcJobOperator


def schema_stop_error(stopped: dict[str, str]) -> SchemaChangeError:
    """The error that names the tables whose mirror waits for a re-snapshot, and what to do."""
    return SchemaChangeError(
        "the mirror of "
        + "; ".join(f"table {t} waits for a re-snapshot: {why}" for t, why in sorted(stopped.items()))
        + ". The event log has their changes; the other tables were applied. Snapshot each of these "
        "tables whole (cdc_snapshot with action 'start') to rebuild its mirror with the new schema"
    )


def raise_schema_stops(apply_result: dict | None) -> None:
    """The changelog DAG's ``mirror_schema_stops`` task: fail when the apply left tables waiting."""
    stopped = (apply_result or {}).get("schema_stopped") or {}
    if stopped:
        raise schema_stop_error(stopped)


def emit_freshness(data_dir: str, source: str) -> float | None:
    """``cdc.mirror.freshness_seconds``, tagged with the source: how far behind the source the
    mirror is after an apply (status.freshness: the age of the source state it shows). Returns
    it (None: the mirror has applied nothing yet, or its commit time is unknown)."""
    from ..status import freshness

    f = freshness(data_dir, source)
    age = None if f is None else f["age_s"]
    if age is None:
        return None
    try:
        from airflow.sdk.observability.stats import gauge
    except ImportError:  # an Airflow without the Task SDK's metrics
        return age
    gauge("cdc.mirror.freshness_seconds", age, tags={"source": source})
    return age


class ChangelogApplyOperator(_CdcJobOperator):
    """Staged changelog segments past each sink's applied marker -> the sinks; skipped when
    nothing is staged past them.

    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param sinks: the sinks written, a comma list (``events``, ``mirror``, ``postgres``); default CDC_SINKS.
    :param database: ``source.db`` of the events written; default the database the source's connection
        names, else the source's name.
    :param local_max_rows: inputs of up to this many rows run in this worker, larger ones through
        spark-submit (0: always spark-submit); default CDC_LOCAL_MAX_ROWS.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    :param conn_id: the Spark connection of the spark-submit; default ``spark_default`` (the DAG files
        pass CDC_SPARK_CONN_ID).

    SparkSubmitOperator's arguments (``conf``, ``packages``, ``executor_memory``, ...) are handed to the
    spark-submit as given; the others are BaseOperator's.
    """

    job = "apply"

    def execute(self, context: Any) -> dict | None:
        from airflow.sdk.exceptions import AirflowSkipException

        from ..lineage import available
        from ..pipeline.committed import applied_tables, markers
        from ..sinks.base import staged_past_markers
        from ..sinks.registry import location_sinks, table_stopping

        if not staged_past_markers(self.data_dir, self.source, sink_names(self.sinks)):
            # nothing staged past every sink's marker: no job (a spark-submit is seconds of JVM start)
            raise AirflowSkipException("nothing staged past the sinks' applied markers")

        before = markers(self.data_dir, self.source, self._asset_kinds())
        if available():  # what this apply covers, for its OpenLineage event
            self._lineage_before = markers(self.data_dir, self.source, location_sinks(sink_names(self.sinks)))
        summary = super().execute(context)
        stopped = {}
        stopping = table_stopping(sink_names(self.sinks))
        if stopping:
            from ..sinks.mirror_fencing import schema_stopped_tables

            stopped = schema_stopped_tables(self.data_dir, self.source)
            emit_freshness(self.data_dir, self.source)
        skip = {n: set(stopped) for n in stopping}
        self._emit_assets(
            context, lambda kinds: applied_tables(self.data_dir, self.source, before, skip=skip)
        )
        if stopped:
            # every other table was applied (the markers moved) and its Asset events are emitted:
            # this task succeeds so Airflow records them (it drops the outlet events of a failed
            # task); the DAG's next task, mirror_schema_stops, fails the run naming these tables
            self.log.error("%s", schema_stop_error(stopped))
        # the in-process engine's summary names itself; a spark-submit returns none
        out = dict(summary) if isinstance(summary, dict) else {"engine": "spark"}
        out["schema_stopped"] = stopped
        return out

    def get_openlineage_facets_on_complete(self, task_instance: Any):
        """The tables this apply wrote changes of and the staged changelog in; their event log
        and mirror out."""
        from ..pipeline.committed import applied_tables
        from ..storage.layout import changelog_dir

        before = getattr(self, "_lineage_before", None)
        covered = applied_tables(self.data_dir, self.source, before) if before else {}
        tables = {tid for per in covered.values() for tid in per}
        return self._lineage(tables, changelog_dir(self.data_dir, self.source))

    def input_rows(self) -> int:
        from ..pipeline.arrow_engine import pending_rows

        return pending_rows(self.data_dir, self.source, sink_names(self.sinks))

    def run_local(self) -> dict:
        from ..pipeline.arrow_engine import apply_changelog

        sinks = self._sinks(require_schema=False)
        try:
            return apply_changelog(self.data_dir, self.source, sinks)
        finally:
            for s in sinks:
                s.close()
