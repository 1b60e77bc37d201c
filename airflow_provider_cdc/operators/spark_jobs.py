"""SparkSubmitOperators for the package's merge and apply jobs, with an in-process path for small inputs.

A spark-submit has a fixed price (JVM, SparkSession and Python workers: ~20 s and 40-60
CPU seconds on a 2-core machine) that dwarfs a small round: a snapshot of a 1,000-row
table or a changelog batch of a few hundred changes. These operators count their input
first (the round's chunk rows from its round file; the staged changelog rows past the
sinks' markers from Parquet footers) and, when it is at most ``local_max_rows``, run the
same job in the worker with pyarrow (airflow_provider_cdc/local_jobs.py: same window rule,
same sinks, same output files); above it they submit the Spark job as any
SparkSubmitOperator would. ``local_max_rows=0`` always submits; the DAGs read it from
``CDC_LOCAL_MAX_ROWS``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from ..core.errors import ConfigurationError
from ..spark.common import application_path

#: rounds / changelog batches of at most this many rows run in the worker (no spark-submit)
DEFAULT_LOCAL_MAX_ROWS = 100_000


def local_max_rows_from_env(default: int = DEFAULT_LOCAL_MAX_ROWS) -> int:
    raw = os.environ.get("CDC_LOCAL_MAX_ROWS", "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigurationError(f"CDC_LOCAL_MAX_ROWS must be a whole number >= 0 (0: always spark-submit), got {raw!r}")
    return value


class _CdcJobOperator(SparkSubmitOperator):
    job: str = ""
    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "data_dir", "source", "sinks")

    def __init__(
        self,
        *,
        data_dir: str,
        source: str,
        sinks: str = "events,mirror",
        database: str | None = None,
        local_max_rows: int = DEFAULT_LOCAL_MAX_ROWS,
        **kwargs: Any,
    ) -> None:
        if isinstance(local_max_rows, bool) or not isinstance(local_max_rows, int) or local_max_rows < 0:
            raise ConfigurationError(
                f"{type(self).__name__}: local_max_rows must be a whole number >= 0 (0: always spark-submit), "
                f"got {local_max_rows!r}"
            )
        kwargs.setdefault("name", f"cdc-{self.job}")
        super().__init__(application=application_path(self.job), **kwargs)
        self.data_dir, self.source, self.sinks, self.database = data_dir, source, sinks, database
        self.local_max_rows = local_max_rows

    # the job's command-line arguments, from the rendered fields
    def job_arguments(self) -> list[str]:
        args = ["--data-dir", self.data_dir, "--source", self.source, "--sinks", self.sinks]
        return args + (["--database", self.database] if self.database else [])

    def input_rows(self) -> int:
        raise NotImplementedError

    def run_local(self) -> dict:
        raise NotImplementedError

    def execute(self, context: Any) -> dict | None:
        if not getattr(self, "_arguments_set", False):  # once, even if execute runs twice on one object
            self.application_args = [*self.job_arguments(), *(self.application_args or [])]
            self._arguments_set = True
        rows = self.input_rows()
        if rows <= self.local_max_rows:
            self.log.info(
                "%s: %d input rows <= local_max_rows=%d: running the job in this worker (no spark-submit)",
                self.job, rows, self.local_max_rows,
            )
            summary = self.run_local()
            # the line the Spark jobs print too (CDC_MERGE_RESULT / CDC_APPLY_RESULT), for logs and the bench
            self.log.info("CDC_%s_RESULT %s", self.job.upper(), json.dumps(summary))
            return summary
        self.log.info("%s: %d input rows > local_max_rows=%d: spark-submit %s", self.job, rows, self.local_max_rows,
                      self.application)
        return super().execute(context)

    def _sinks(self, *, require_schema: bool):
        from ..spark.common import build_sinks

        return build_sinks(self.sinks, data_dir=self.data_dir, source=self.source, database=self.database,
                           pg_uri=None, pg_schema=None, require_schema=require_schema)


class SnapshotMergeOperator(_CdcJobOperator):
    """DBLog steps 4-5 for a snapshot round: the chunks listed in ``round_file`` (the
    ``round`` task's output) merged with their watermark windows, written to the sinks."""

    job = "merge"
    template_fields: Sequence[str] = (*_CdcJobOperator.template_fields, "round_file")

    def __init__(self, *, round_file: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.round_file = round_file

    def job_arguments(self) -> list[str]:
        return ["--chunks", str(self.round_file), *super().job_arguments()]

    def _chunks(self):
        from ..spark.merge_job import load_chunks

        return load_chunks(str(self.round_file))

    def input_rows(self) -> int:
        return sum(c.rows for c in self._chunks())

    def run_local(self) -> dict:
        from ..local_jobs import merge_round

        sinks = self._sinks(require_schema=True)
        try:
            return merge_round(self._chunks(), data_dir=self.data_dir, source=self.source, sinks=sinks)
        finally:
            for s in sinks:
                s.close()


class ChangelogApplyOperator(_CdcJobOperator):
    """Staged changelog segments past each sink's applied marker -> the sinks."""

    job = "apply"

    def input_rows(self) -> int:
        from ..local_jobs import pending_rows

        return pending_rows(self.data_dir, self.source, [s.strip() for s in self.sinks.split(",") if s.strip()])

    def run_local(self) -> dict:
        from ..local_jobs import apply_changelog

        sinks = self._sinks(require_schema=False)
        try:
            return apply_changelog(self.data_dir, self.source, sinks)
        finally:
            for s in sinks:
                s.close()
