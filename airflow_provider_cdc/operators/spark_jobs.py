"""Operators for the package's merge and apply jobs: spark-submit, or in-process for small inputs.

A spark-submit has a fixed price (JVM, SparkSession and Python workers: ~20 s and 40-60
CPU seconds on a 2-core machine) that dwarfs a small round: a snapshot of a 1,000-row
table or a changelog batch of a few hundred changes. These operators count their input
first (the round's chunk rows from its round file; the staged changelog rows past the
sinks' markers from Parquet footers) and, when it is at most ``local_max_rows``, run the
same job in the worker with pyarrow (airflow_provider_cdc/pipeline/arrow_engine.py: same window rule,
same sinks, same output files); above it they submit the Spark job through Airflow's
SparkSubmitOperator. ``local_max_rows=0`` always submits; the DAGs read it from
``CDC_LOCAL_MAX_ROWS``.

They hold a SparkSubmitOperator rather than subclass it: its module imports the OpenLineage
Spark utilities (about a second), and every task of a round parses the DAG file first. The
provider is imported in ``execute``; the operator is built there from this task's rendered
fields (its templated arguments are this operator's template fields, the others are handed
on as given), and it runs as it would on its own: its deployment modes, driver tracking,
resume on retry (``durable``), OpenLineage injection and ``on_kill``.

Credentials (the 'postgres' sink's CDC_POSTGRES_SINK_CONN_ID, the storage's
CDC_STORAGE_CONN_ID) are resolved in the worker when the task runs. In the worker they stay
in its memory; a spark-submit gets them as 0600 files in a private folder (mkdtemp) that is
removed when the job ends: a libpq passfile named by ``--pg-uri``'s ``passfile`` parameter,
and ``--storage-credentials``. Only their paths are on its command line (visible to every
user in ``ps``) and in the task log; nothing goes to the environment or the rendered fields.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from ..core.errors import ConfigurationError, SchemaChangeError
from ..hooks.cdc_storage import StorageConnectionMixin
from ..settings import FromSettings, sink_names


def local_max_rows_from_env() -> int:
    """``CDC_LOCAL_MAX_ROWS``, parsed by settings.py (the one place settings are read)."""
    from ..settings import load

    return load().local_max_rows


#: extras of a postgres connection that are libpq parameters (the others are the Postgres provider's own)
_LIBPQ_EXTRAS = (
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslcrl",
    "sslpassword",
    "application_name",
    "connect_timeout",
    "options",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "target_session_attrs",
    "gssencmode",
    "channel_binding",
    "krbsrvname",
    "require_auth",
    "passfile",
    "service",
)


def postgres_sink_params(conn_id: str) -> dict[str, str]:
    """libpq parameters of the Airflow connection ``conn_id`` (CDC_POSTGRES_SINK_CONN_ID), the
    password included: for this process only (sinks/mirror_postgres.py)."""
    from airflow.sdk import BaseHook

    from ..dialects.registry import get_profile
    from ..sinks.mirror_postgres import connection_parameters

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as exc:  # noqa: BLE001 - AirflowNotFoundException and the like, named
        raise ConfigurationError(
            f"CDC_POSTGRES_SINK_CONN_ID: Airflow connection {conn_id!r} cannot be read ("
            f"{type(exc).__name__}); "
            "create a connection of type postgres (host, port, schema = database, login, password) for the "
            "'postgres' sink's target"
        ) from None
    if not get_profile("postgres").accepts_conn_type(conn.conn_type):  # PostgreSQL's types, as a source's
        raise ConfigurationError(
            f"CDC_POSTGRES_SINK_CONN_ID: connection {conn_id!r} is of type {conn.conn_type!r}; the "
            "'postgres' sink "
            "needs a connection of type postgres"
        )
    extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
    return connection_parameters(
        {
            "host": conn.host,
            "port": conn.port,
            "dbname": conn.schema,
            "user": conn.login,
            "password": conn.password,
            **{k: extra[k] for k in _LIBPQ_EXTRAS if k in extra},
        }
    )


def _write_private(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _passfile_line(password: str) -> str:
    """A libpq passfile line for any host, port, database and user: the file is named only by
    this job's one connection (its ``passfile`` parameter), so the wildcards match nothing else."""
    return "*:*:*:*:" + password.replace("\\", "\\\\").replace(":", "\\:") + "\n"


#: SparkSubmitOperator's templated arguments (its ``template_fields``): fields of these operators
_SUBMIT_FIELDS = (
    "application",
    "conf",
    "files",
    "py_files",
    "jars",
    "driver_class_path",
    "packages",
    "exclude_packages",
    "keytab",
    "principal",
    "proxy_user",
    "name",
    "application_args",
    "env_vars",
    "post_submit_commands",
    "properties_file",
)
#: ... and its other arguments, handed on as given (a test compares both with the provider's signature)
_SUBMIT_OPTIONS = frozenset(
    {
        "archives",
        "java_class",
        "repositories",
        "total_executor_cores",
        "executor_cores",
        "executor_memory",
        "driver_memory",
        "num_executors",
        "status_poll_interval",
        "verbose",
        "spark_binary",
        "yarn_queue",
        "deploy_mode",
        "use_krb5ccache",
        "track_driver_via_k8s_api",
        "yarn_track_via_rm_api",
        "yarn_rm_auth",
        "openlineage_inject_parent_job_info",
        "openlineage_inject_transport_info",
        "reconnect_on_retry",
        "durable",
    }
)


def job_application(job: str) -> str:
    """The job's entry point (``pipeline/spark/common.application_path``, which imports pyarrow:
    a test keeps the two equal)."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1] / "pipeline" / "spark" / f"{job}_job.py")


def _run_nested(operator: BaseOperator, context: Any) -> Any:
    """``operator.execute(context)`` inside this task's execute, as the task runner would run it
    (without Airflow's warning for an operator executed outside the task runner)."""
    try:
        from airflow.sdk.bases.operator import ExecutorSafeguard
    except ImportError:  # another SDK layout: Airflow only logs a warning
        return operator.execute(context)
    token = ExecutorSafeguard.tracker.set(operator)
    try:
        return operator.execute(context)
    finally:
        ExecutorSafeguard.tracker.reset(token)


class _CdcJobOperator(StorageConnectionMixin, BaseOperator):
    job: str = ""
    template_fields: Sequence[str] = (*_SUBMIT_FIELDS, "data_dir", "source", "sinks")
    # not given (None): the settings when the task runs (settings.py)
    data_dir = FromSettings("data_dir")
    source = FromSettings("source")
    sinks = FromSettings("sinks")
    local_max_rows = FromSettings("local_max_rows")

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        source: str | None = None,
        sinks: str | None = None,
        database: str | None = None,
        local_max_rows: int | None = None,
        cdc_overrides: dict[str, str] | None = None,  # one source's settings (StorageConnectionMixin)
        conn_id: str = "spark_default",
        **kwargs: Any,
    ) -> None:
        if local_max_rows is not None and (
            isinstance(local_max_rows, bool) or not isinstance(local_max_rows, int) or local_max_rows < 0
        ):
            raise ConfigurationError(
                f"{type(self).__name__}: local_max_rows must be a whole number >= 0 (0: always "
                "spark-submit), "
                f"got {local_max_rows!r}"
            )
        submit = {f: kwargs.pop(f, None) for f in _SUBMIT_FIELDS}
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in _SUBMIT_OPTIONS}
        super().__init__(cdc_overrides=cdc_overrides, **kwargs)
        submit["application"] = submit["application"] or job_application(self.job)
        submit["name"] = submit["name"] or f"cdc-{self.job}"
        for field, value in submit.items():
            setattr(self, field, value)
        self.conn_id, self.submit_options = conn_id, options
        self.data_dir, self.source, self.sinks, self.database = data_dir, source, sinks, database
        self.local_max_rows = local_max_rows
        self._submit_op: BaseOperator | None = None  # the SparkSubmitOperator of the running execute
        self._hook = None  # ... and its hook, for on_kill

    def _submit_operator(self, application_args: list[str] | None = None) -> BaseOperator:
        """Airflow's SparkSubmitOperator for this task's rendered fields, ``application_args`` in
        place of the field's; its hook bound to this task (``_bind_to_task``) and kept in
        ``self._hook`` once built."""
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

        fields = {f: getattr(self, f) for f in _SUBMIT_FIELDS}
        if application_args is not None:
            fields["application_args"] = application_args
        op = SparkSubmitOperator(
            task_id=self.task_id,
            conn_id=self.conn_id,
            **{k: v for k, v in fields.items() if v is not None},
            **self.submit_options,
        )
        build = op._get_hook

        def get_hook():  # the operator builds its hook in execute, after OpenLineage amended its conf
            self._hook = self._bind_to_task(build())
            return self._hook

        op._get_hook = get_hook
        return op

    def _get_hook(self):
        """The hook a spark-submit of this task's fields runs through (bound to this task)."""
        return self._submit_operator()._get_hook()

    @staticmethod
    def _bind_to_task(hook):
        """Spark's hook, with its spark-submit bound to this task's process: killed with the
        task (kill -9 included), never left writing beside the retry (spark/common.py)."""
        from ..pipeline.spark.common import die_with_parent

        submit, parent = hook.submit, os.getpid()

        def submit_bound_to_task(application: str = "", **kwargs: Any):
            kwargs.setdefault("preexec_fn", lambda: die_with_parent(parent))
            return submit(application, **kwargs)

        hook.submit = submit_bound_to_task
        return hook

    def spark_submit(self, context: Any, application_args: list[str]) -> Any:
        """Run the job with ``application_args`` through Airflow's SparkSubmitOperator."""
        self._submit_op = self._submit_operator(application_args)
        return _run_nested(self._submit_op, context)

    def on_kill(self) -> None:
        """A graceful kill (the task's SIGTERM): the SparkSubmitOperator ends the application
        (SIGKILL of the local spark-submit; the driver, YARN application or driver pod in
        cluster modes), and this returns only once the local spark-submit is gone, so the retry
        that follows never runs beside it. A round merged in this worker ends with the task process."""
        submit, hook = getattr(self, "_submit_op", None), getattr(self, "_hook", None)
        if submit is None or hook is None:
            return  # nothing submitted
        submit.on_kill()
        sp = getattr(hook, "_submit_sp", None)
        if sp is None:
            return
        if sp.poll() is None:
            sp.kill()
        try:
            sp.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.log.warning("spark-submit (pid %s) still runs 60 s after SIGKILL", sp.pid)

    # the job's command-line arguments, from the rendered fields
    def job_arguments(self) -> list[str]:
        args = ["--data-dir", self.data_dir, "--source", self.source, "--sinks", self.sinks]
        database = self.source_database()
        return args + (["--database", database] if database else [])

    def source_database(self) -> str | None:
        """``source.db`` of the events this job writes: the ``database`` argument, else the
        database the source's connection names (Debezium's ``source.db``), else None (the
        source's name)."""
        if self.database:
            return self.database
        from airflow.sdk import BaseHook

        from ..settings import load

        try:
            return BaseHook.get_connection(load(overrides=self.cdc_overrides).conn_id).schema or None
        except Exception:  # noqa: BLE001 - a connection not found here: the source's name, as before
            self.log.info(
                "the source connection is not readable here: events name the source, not its database"
            )
            return None

    def input_rows(self) -> int:
        raise NotImplementedError

    def _lineage(self, tables, staging: str):
        """OpenLineage (lineage.py): the source tables and ``staging`` in, their event log and
        mirror out."""
        from ..core.schema import TableName
        from ..hooks.cdc_source import CdcSourceHook
        from ..lineage import tables_lineage
        from ..settings import load

        params = CdcSourceHook(load(overrides=self.cdc_overrides).conn_id).connection_params()
        return tables_lineage(
            params,
            self.data_dir,
            self.source,
            [TableName.parse(t) for t in tables],
            staging=staging,
            staging_is_output=False,
            sinks=sink_names(self.sinks),
        )

    def run_local(self) -> dict:
        raise NotImplementedError

    def _postgres_target(self) -> tuple[dict[str, str] | None, str | None]:
        """The 'postgres' sink's connection (password included) and target schema, when it is a sink."""
        if "postgres" not in sink_names(self.sinks):
            return None, None
        from ..settings import load

        now = load(overrides=self.cdc_overrides)
        if not now.postgres_sink_conn_id:
            raise ConfigurationError(
                "sink 'postgres' (CDC_SINKS) has no target database: set CDC_POSTGRES_SINK_CONN_ID to "
                "the id of an "
                "Airflow connection of type postgres"
            )
        return postgres_sink_params(now.postgres_sink_conn_id), now.postgres_sink_schema

    @contextmanager
    def _submit_secrets(self) -> Iterator[list[str]]:
        """The job arguments that hand credentials to a spark-submit (module docstring): paths
        of 0600 files in a private folder, removed when the block ends."""
        from .. import storage
        from ..hooks.cdc_storage import storage_settings
        from ..sinks.mirror_postgres import SECRET_PARAMETERS, public_dsn

        pg, pg_schema = self._postgres_target()
        given = storage_settings(overrides=self.cdc_overrides)
        folder = tempfile.mkdtemp(prefix="cdc-submit-")  # mode 0700
        try:
            args: list[str] = []
            if pg is not None:
                if pg.get("sslpassword"):
                    raise ConfigurationError(
                        "CDC_POSTGRES_SINK_CONN_ID: an sslpassword cannot be handed to a spark-submit "
                        "without showing "
                        "it; use a key file without a passphrase (mode 0600) or run the job in the worker "
                        "(CDC_LOCAL_MAX_ROWS)"
                    )
                if pg.get("password"):
                    pg["passfile"] = _write_private(
                        os.path.join(folder, "pgpass"), _passfile_line(pg["password"])
                    )
                args += ["--pg-uri", public_dsn({k: v for k, v in pg.items() if k not in SECRET_PARAMETERS})]
                if pg_schema:
                    args += ["--pg-schema", pg_schema]
            if given:
                args += ["--storage-credentials", storage.write_credentials_file(folder, given)]
            yield args
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def execute(self, context: Any) -> dict | None:
        rows = self.input_rows()
        if rows <= self.local_max_rows:
            self.log.info(
                "%s: %d input rows <= local_max_rows=%d: running the job in this worker (no spark-submit)",
                self.job,
                rows,
                self.local_max_rows,
            )
            summary = self.run_local()
            # the line the Spark jobs print too (CDC_MERGE_RESULT / CDC_APPLY_RESULT), for logs and the bench
            self.log.info("CDC_%s_RESULT %s", self.job.upper(), json.dumps(summary))
            return summary
        self.log.info(
            "%s: %d input rows > local_max_rows=%d: spark-submit %s",
            self.job,
            rows,
            self.local_max_rows,
            self.application,
        )
        # the secrets' arguments go to the spark-submit only, never to this task's (rendered) fields
        with self._submit_secrets() as secret_args:
            return self.spark_submit(
                context, [*self.job_arguments(), *(self.application_args or []), *secret_args]
            )

    def _asset_kinds(self) -> list[str]:
        """The sinks this task emits Asset events for: those with an alias in its outlets."""
        from ..assets import outlet_aliases

        aliases = outlet_aliases(self.outlets)
        return [s for s in sink_names(self.sinks) if s in aliases]

    def _emit_assets(self, context: Any, covered) -> None:
        """An Asset event per table and sink this commit wrote (assets.py); ``covered(kinds)``
        gives kind -> table id -> extra. Never fails the task: the data is committed."""
        from ..assets import emit_table_events

        kinds = self._asset_kinds()
        if not kinds:
            return
        try:
            emit_table_events(context, self.outlets, self.source, covered(kinds))
        except Exception:  # noqa: BLE001 - a lost notification must not fail a committed round
            self.log.exception("could not compute the Asset events of this commit; the data is committed")

    def _sinks(self, *, require_schema: bool, fence_tables=None):
        from ..pipeline.spark.common import build_sinks

        pg, pg_schema = self._postgres_target()  # resolved here, in the worker: the password stays in it
        return build_sinks(
            self.sinks,
            data_dir=self.data_dir,
            source=self.source,
            database=self.source_database(),
            pg_uri=pg,
            pg_schema=pg_schema,
            require_schema=require_schema,
            fence_tables=fence_tables,
        )


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
        spark-submit (0: always spark-submit); default CDC_LOCAL_MAX_ROWS.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    :param conn_id: the Spark connection of the spark-submit; default ``spark_default`` (the DAG files
        pass CDC_SPARK_CONN_ID).

    SparkSubmitOperator's arguments (``conf``, ``packages``, ``executor_memory``, ...) are handed to the
    spark-submit as given; the others are BaseOperator's.
    """

    job = "merge"
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
    high watermark staged, one merge (spark-submit, or in this worker for small inputs) writes
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
        spark-submit (0: always spark-submit); default CDC_LOCAL_MAX_ROWS.
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
                    SnapshotMergeOperator.execute(self, context)  # its --chunks: this batch's round file
                    mwr.check_receipt(self.round_file, ready)  # only what this merge wrote is marked merged
                    self._commit(ready)
                    summary.update(
                        batches=n, chunks=summary["chunks"] + len(ready), rows=summary["rows"] + ready_rows
                    )
                    continue
            time.sleep(float(self.poke_interval))


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
        from ..sinks.registry import location_sinks

        if not staged_past_markers(self.data_dir, self.source, sink_names(self.sinks)):
            # nothing staged past every sink's marker: no job (a spark-submit is seconds of JVM start)
            raise AirflowSkipException("nothing staged past the sinks' applied markers")

        before = markers(self.data_dir, self.source, self._asset_kinds())
        if available():  # what this apply covers, for its OpenLineage event
            self._lineage_before = markers(
                self.data_dir, self.source, location_sinks(sink_names(self.sinks))
            )
        summary = super().execute(context)
        stopped = {}
        if "mirror" in sink_names(self.sinks):
            from ..sinks.mirror_fencing import schema_stopped_tables

            stopped = schema_stopped_tables(self.data_dir, self.source)
            emit_freshness(self.data_dir, self.source)
        self._emit_assets(
            context,
            lambda kinds: applied_tables(self.data_dir, self.source, before, skip={"mirror": set(stopped)}),
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
