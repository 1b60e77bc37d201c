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

from ..core.errors import ConfigurationError
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
        self._spark_is_local: bool | None = None  # read once a task (spark_is_local)

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

    def _sink_options(self) -> dict[str, dict]:
        """Each sink's own options (sinks/registry.py, SinkOptions), resolved here in the worker from
        this task's settings: the 'postgres' sink's connection, its password included, stays in it."""
        from ..settings import load
        from ..sinks import registry

        now = load(overrides=self.cdc_overrides)
        return registry.resolve_options(
            sink_names(self.sinks), lambda name: getattr(now, name), postgres_sink_params
        )

    @contextmanager
    def _submit_secrets(self) -> Iterator[list[str]]:
        """The job arguments that hand credentials to a spark-submit (module docstring): paths
        of 0600 files in a private folder, removed when the block ends."""
        from .. import storage
        from ..hooks.cdc_storage import storage_settings
        from ..sinks import registry

        options = self._sink_options()
        given = storage_settings(overrides=self.cdc_overrides)
        folder = tempfile.mkdtemp(prefix="cdc-submit-")  # mode 0700
        try:
            args = registry.job_arguments(options, folder)
            if given:
                args += ["--storage-credentials", storage.write_credentials_file(folder, given)]
            yield args
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    #: inputs of up to this many rows run in the worker under a Spark master of this machine
    #: (``local[...]``), past ``local_max_rows``: a job whose in-worker engine holds a bounded part
    #: of its input at a time (the snapshot merge: a group of chunks) sets it; 0: none
    local_master_max_rows: int = 0

    def spark_is_local(self) -> bool:
        """Whether this task's Spark connection runs Spark on this machine (a ``local[...]``
        master): it has no core the worker lacks, and adds a JVM's start and a shuffle. False
        where the connection cannot be read here (the row threshold decides)."""
        if self._spark_is_local is None:
            from airflow.sdk import BaseHook

            try:
                host = (BaseHook.get_connection(self.conn_id).host or "").strip().lower()
            except Exception:  # noqa: BLE001 - not readable here: decide by the row threshold
                host = ""
            self._spark_is_local = host == "local" or host.startswith("local[")
        return self._spark_is_local

    def in_worker(self, rows: int) -> str | None:
        """Why this job runs in the worker (a log line's reason), or None for a spark-submit:
        at most ``local_max_rows`` input rows, or (``local_max_rows`` > 0) at most
        :attr:`local_master_max_rows` under a local Spark master."""
        if rows <= self.local_max_rows:
            return f"{rows} input rows <= local_max_rows={self.local_max_rows}"
        bound = self.local_master_max_rows
        if self.local_max_rows > 0 and rows <= bound and self.spark_is_local():
            return (
                f"{rows} input rows <= {bound} (CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS) and Spark "
                f"connection {self.conn_id!r} runs on this machine (local master)"
            )
        return None

    def execute(self, context: Any) -> dict | None:
        rows = self.input_rows()
        why = self.in_worker(rows)
        if why is not None:
            self.log.info("%s: %s: running the job in this worker (no spark-submit)", self.job, why)
            summary = self.run_local()
            # the line the Spark jobs print too (CDC_MERGE_RESULT / CDC_APPLY_RESULT), for logs and the bench
            self.log.info("CDC_%s_RESULT %s", self.job.upper(), json.dumps(summary))
            return summary
        bound = self.local_master_max_rows
        self.log.info(
            "%s: %d input rows > local_max_rows=%d%s: spark-submit %s",
            self.job,
            rows,
            self.local_max_rows,
            f" and > CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS={bound}" if bound and rows > bound else "",
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

        return build_sinks(
            self.sinks,
            data_dir=self.data_dir,
            source=self.source,
            database=self.source_database(),
            options=self._sink_options(),  # resolved here, in the worker: a password stays in it
            require_schema=require_schema,
            fence_tables=fence_tables,
        )
