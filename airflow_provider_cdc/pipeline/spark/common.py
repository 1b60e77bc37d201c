"""Shared parts of the PySpark jobs: the session, reading staged files, writing to sinks,
and the spark-submit command line for Airflow's SparkSubmitOperator.

The jobs take everything from their arguments and from spark-submit (master, memory,
conf): nothing here sets a master, so the same file runs on ``local[2]``, a standalone
cluster, YARN or Kubernetes. The executors write the event log and the mirror's files; the
driver commits (distributed.py).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from ...core.errors import ConfigurationError
from ...sinks.base import EVENT_COLUMNS, EVENT_SCHEMA, Sink

log = logging.getLogger(__name__)

JOBS = ("merge", "apply")
SPARK_DIR = Path(__file__).resolve().parent
PACKAGE_ROOT = SPARK_DIR.parents[2]  # the folder that holds airflow_provider_cdc/


def die_with_parent(parent_pid: int | None = None) -> None:
    """Linux: SIGKILL this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

    A task killed with ``kill -9`` cannot end its spark-submit in ``on_kill``; bound this way
    its JVM (spark-submit execs java in the same process) dies with it, and the jobs bind
    their Python driver to the JVM, so a retry never runs beside a zombie merge. Used as a
    ``preexec_fn`` (pass the parent's pid, read before the fork) and at a job's start.
    Elsewhere, or when the call is refused, a no-op: the merge fence still stops a zombie."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if parent_pid is not None and os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(1)


def application_path(job: str) -> str:
    """Absolute path of a job's entry point, for SparkSubmitOperator(application=...)."""
    if job not in JOBS:
        raise ConfigurationError(f"unknown Spark job {job!r}; known: {', '.join(JOBS)}")
    return str(SPARK_DIR / f"{job}_job.py")


def spark_submit_command(
    job: str,
    args: Sequence[str],
    *,
    master: str = "local[2]",
    conf: dict[str, str] | None = None,
    spark_submit: str = "spark-submit",
    py_files: str | None = None,
) -> list[str]:
    """The command line SparkSubmitOperator would run; tests and the bench run it directly.

    ``py_files`` (a zip of the package, see :func:`package_zip`) is only needed when the
    cluster's Python does not have airflow_provider_cdc installed.
    """
    cmd = [spark_submit, "--master", master]
    for k, v in (conf or {}).items():
        cmd += ["--conf", f"{k}={v}"]
    if py_files:
        cmd += ["--py-files", py_files]
    return [*cmd, application_path(job), *args]


def package_zip(dest: str) -> str:
    """Zip airflow_provider_cdc for ``--py-files`` (clusters without the package installed)."""
    import zipfile

    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in (PACKAGE_ROOT / "airflow_provider_cdc").rglob("*.py"):
            zf.write(f, f.relative_to(PACKAGE_ROOT))
    return dest


#: shuffle partitions per core of the job, at least, when ``spark.sql.shuffle.partitions`` is not set
SHUFFLE_PARTITIONS_PER_CORE = 2
#: ... and one per this many input rows: a partition of 100,000 demo rows is ~20-40 MB in the JVM
SHUFFLE_PARTITION_ROWS = 100_000


def shuffle_partitions_for(cores: int, rows: int | None = None) -> int:
    """Shuffle partitions for a job on ``cores`` cores over about ``rows`` input rows: 2 per
    core, more when the rows need them, so a partition stays ~100,000 rows. Sized by cores
    alone, a 5,000,000-row round on local[2] had 4 partitions of ~250 MB each and ran out
    of the driver's default 1 GB heap; Spark's fixed 200 is safe but costs small rounds
    (500,000 rows: 37.7 s wall with 200, 28.8 s with 8, identical output)."""
    n = max(2, SHUFFLE_PARTITIONS_PER_CORE * max(1, cores))
    if rows:
        n = max(n, -(-rows // SHUFFLE_PARTITION_ROWS))
    return n


def get_session(app_name: str, *, rows: int | None = None):
    """The job's session; ``rows`` (the input size, when known) sizes the shuffle partitions."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(app_name).getOrCreate()
    size_shuffle_partitions(spark, rows)
    return spark


def size_shuffle_partitions(spark, rows: int | None = None) -> int:
    """Unless the user set ``spark.sql.shuffle.partitions`` (spark-submit ``--conf``,
    spark-defaults, ``CDC_SPARK_CONF``), set it by :func:`shuffle_partitions_for` from the
    cores the job has (``defaultParallelism``: n for ``local[n]``, the executors' cores on a
    cluster) and ``rows``. Returns the number in effect."""
    if spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        return int(spark.conf.get("spark.sql.shuffle.partitions"))
    n = shuffle_partitions_for(spark.sparkContext.defaultParallelism, rows)
    spark.conf.set("spark.sql.shuffle.partitions", str(n))
    return n


def configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("CDC_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


CHANGELOG_DDL = (
    "position string, table string, op string, key string, before string, after string, ts_ms long, "
    "watermark string, "
    "origin struct<tx: string, lsn: long, last_commit_lsn: long, server_id: long, thread: long, file: string>"
)


def spark_event_schema() -> str:
    return CHANGELOG_DDL + ", snapshot boolean, batch string"


# --- sinks ------------------------------------------------------------------------------------
def to_event_table(arrow: pa.Table) -> pa.Table:
    return arrow.select(list(EVENT_COLUMNS)).cast(EVENT_SCHEMA)


def build_sinks(
    names: str,
    *,
    data_dir: str,
    source: str,
    database: str | None,
    options: Mapping[str, Mapping[str, object]] | None = None,
    require_schema: bool,
    fence_tables: Iterable | None = None,
) -> list[Sink]:
    """The sinks named in ``names``, made by the sink registry (sinks/registry.py). ``options``:
    sink name -> its own options (registry.resolve_options in the worker, registry.options_from_job
    in a Spark job; the 'postgres' sink's target, sinks/postgres_target.py). A snapshot merge
    passes ``fence_tables`` (the (table id, snapshot id) pairs of its round's chunks, or bare table
    ids): it then claims a merge epoch on each of their mirrors before anything is read (refused
    if a snapshot was stopped), and every sink refuses to write once a newer merge or a stop took
    the table (sinks/mirror_fencing.py)."""
    from ...sinks import registry
    from ...sinks.base import SchemaCache
    from ...sinks.mirror_fencing import MergeFence

    wanted = [n.strip() for n in names.split(",") if n.strip()]
    entries = [registry.entry(n) for n in wanted]  # an unknown name fails before any claim
    fence = None
    if fence_tables is not None and any(e.claims_fence for e in entries):
        schemas = SchemaCache(data_dir, source)
        rounds: dict[str, set[str]] = {}
        for item in fence_tables:  # table ids, or (table id, snapshot id) of the round's chunks
            tid, sid = (item, None) if isinstance(item, str) else item
            rounds.setdefault(tid, set()).update([sid] if sid else [])
        fence = MergeFence(data_dir, source).claim((schemas.require(t) for t in sorted(rounds)), rounds)
    given = options or {}
    return [
        registry.create(
            n,
            registry.SinkContext(
                data_dir,
                source,
                database,
                require_schema=require_schema,
                fence=fence,
                options=given.get(n, {}),
            ),
        )
        for n in wanted
    ]


def add_common_arguments(parser) -> None:
    parser.add_argument("--data-dir", required=True, help="staging/output root (storage/layout.py)")
    parser.add_argument("--source", required=True, help="source name (staging/{source}/...)")
    parser.add_argument(
        "--changelog-dir", default=None, help="staged changelog (default: from --data-dir/--source)"
    )
    parser.add_argument(
        "--database", default=None, help="source.db in the event envelope (default: --source)"
    )
    from ...sinks import registry

    parser.add_argument(
        "--sinks", default="events,mirror", help=f"comma list of: {', '.join(registry.names())}"
    )
    registry.add_job_arguments(
        parser
    )  # each sink's own options (the 'postgres' sink's --pg-uri, --pg-schema)
    parser.add_argument(
        "--storage-credentials",
        default=None,
        help="a 0600 JSON file of storage settings (AWS_*) for this job: its path, never its content, "
        "on the command line (the operators write it from CDC_STORAGE_CONN_ID)",
    )


def apply_job_arguments(args) -> dict[str, dict]:
    """What a job does with its secret-bearing arguments before anything else: adopt the
    storage credentials file (this process only: storage.use_settings, nothing exported;
    the executors on this host read the same file) and read each sink's options (a --pg-uri
    with a password is refused): sink name -> options, for :func:`build_sinks`."""
    from ... import storage
    from ...sinks import registry

    if args.storage_credentials and not os.path.isfile(args.storage_credentials):
        log.warning(
            "storage credentials file %s is not on this host (a driver in cluster deploy mode): this "
            "host's own storage settings and identity are used",
            args.storage_credentials,
        )
    elif args.storage_credentials:
        storage.use_settings(
            storage.read_credentials_file(args.storage_credentials), credentials_file=args.storage_credentials
        )
    return registry.options_from_job([n.strip() for n in args.sinks.split(",") if n.strip()], args)
