"""Configuration errors fail a task once, with the provider's message last; transient faults are
still retried (issue 47, hooks/task_errors.py). Real DAGs with their own ``retries`` (the
changelog DAG: 3, the snapshot DAG's chunk tasks: 2), real servers, real Airflow.

The only injected part is *when* a real fault happens: the snapshot's table is dropped between
its plan and its chunk read (dag.test cannot interleave a statement there by itself).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.hooks.task_errors import NOT_RETRIED
from tools import workload as w

from .helpers import Pipeline

ROOT = Path(__file__).resolve().parents[2]


def _airflow() -> str:
    return str(Path(sys.executable).with_name("airflow"))


def _with_password(uri: str, password: str) -> str:
    p = urlsplit(uri)
    netloc = f"{p.username}:{password}@{p.hostname}:{p.port}"
    return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


def _source_env(monkeypatch, conn_id: str, uri: str | None, data_dir: Path, tables: str | None) -> None:
    if uri is None:
        monkeypatch.delenv(f"AIRFLOW_CONN_{conn_id.upper()}", raising=False)
    else:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", uri)
    monkeypatch.setenv("CDC_SOURCE_CONN_ID", conn_id)
    monkeypatch.delenv("CDC_SOURCE", raising=False)
    monkeypatch.setenv("CDC_DATA_DIR", str(data_dir))
    if tables is None:
        monkeypatch.delenv("CDC_TABLES", raising=False)
    else:
        monkeypatch.setenv("CDC_TABLES", tables)
    monkeypatch.delenv("CDC_CAPTURE_ALL_TABLES", raising=False)
    monkeypatch.setenv("CDC_CHANGELOG_SCHEDULE", "none")
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False")


def _tries(dr, task_id: str) -> list[tuple[int, str]]:
    """(try_number, state) of each task instance of ``task_id`` in run ``dr``."""
    return [(ti.try_number, str(getattr(ti.state, "value", ti.state)))
            for ti in dr.get_task_instances() if ti.task_id == task_id]


def test_a_wrong_password_fails_capture_once_and_its_message_ends_the_task_log(mysql_uri, unique_name, tmp_path,
                                                                                monkeypatch):
    """``airflow dags test cdc_changelog`` with a wrong password (MariaDB): one attempt of the
    capture (the DAG gives it 3 retries), and the task's last log line before Airflow's
    post-execute is the provider's message naming the connection and what to check."""
    conn_id = f"cdc_badpw_{unique_name}"
    _source_env(monkeypatch, conn_id, _with_password(mysql_uri, "not-the-password"), tmp_path / "data",
                f"{urlsplit(mysql_uri).path.lstrip('/')}.anything")
    proc = subprocess.run([_airflow(), "dags", "test", "cdc_changelog"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ), cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert out.count("Task failed with exception") == 1, out[-6000:]  # one attempt, not four
    lines = out.splitlines()
    post = max(i for i, line in enumerate(lines) if "::group::Post Execute" in line)
    last = lines[post - 1]
    assert last.startswith("airflow.sdk.exceptions.AirflowFailException: " + NOT_RETRIED), out[-3000:]
    assert f"Airflow connection {conn_id!r}" in last and "Check the login, password" in last, last
    assert "Access denied for user" in last  # the server's own words stay, after the connection id
    assert "not-the-password" not in out


@pytest.mark.parametrize("fault", ["unknown connection", "no scope", "unknown role"])
def test_configuration_errors_fail_capture_once(fault, pg_uri, unique_name, tmp_path, monkeypatch):
    """An unknown connection id, no capture scope and a login the server refuses each fail the
    changelog DAG's capture at its first attempt, naming what to fix."""
    conn_id = f"cdc_cfg_{unique_name}"
    p = urlsplit(pg_uri)
    uri = {"unknown connection": None, "no scope": pg_uri,
           "unknown role": urlunsplit((p.scheme, f"nobody_{unique_name}@{p.hostname}:{p.port}", p.path, "", ""))}[fault]
    _source_env(monkeypatch, conn_id, uri, tmp_path / "data", None if fault == "no scope" else "public.anything")
    dr = _run("cdc_changelog", monkeypatch, expect="failed")
    assert _tries(dr, "capture") == [(1, "failed")]
    message = _failure_of(dr, "capture")
    assert message.startswith(NOT_RETRIED), message
    expected = {"unknown connection": f"Airflow connection {conn_id!r} is not defined",
                "no scope": "has no capture scope: set CDC_TABLES",
                "unknown role": f"refused the login of Airflow connection {conn_id!r}"}[fault]
    assert expected in message, message


@pytest.fixture
def replica_level_pg():
    """A private PostgreSQL 15 with wal_level=replica (no logical decoding), removed afterwards."""
    import os
    import shutil
    import tempfile

    from tests.pg_cluster import Server, _append, _as_pg, _free_port, pg_bin

    bin_dir = pg_bin(15)
    if bin_dir is None:
        pytest.skip("no PostgreSQL 15 server binaries")
    root = Path(tempfile.mkdtemp(prefix="cdc-replica-level-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    if os.getuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = Server(bin_dir, root / "data", _free_port())
    try:
        _as_pg([str(bin_dir / "initdb"), "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--locale=C.UTF-8"])
        _append(server.data / "postgresql.conf", ["listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{root}'",
                                                 "wal_level = replica", "fsync = off"])
        server.start()
        server.sql("CREATE DATABASE cdc_test", database="postgres")
        server.sql("CREATE TABLE t (id int PRIMARY KEY)")
        yield server.uri
    finally:
        try:
            server.ctl("-m", "immediate", "-w", "stop")
        except Exception:  # noqa: BLE001 - not started
            pass
        shutil.rmtree(root, ignore_errors=True)


def test_wal_level_replica_fails_capture_once_saying_what_to_set(replica_level_pg, unique_name, tmp_path, monkeypatch):
    conn_id = f"cdc_wal_{unique_name}"
    _source_env(monkeypatch, conn_id, replica_level_pg, tmp_path / "data", "public.t")
    dr = _run("cdc_changelog", monkeypatch, expect="failed")
    assert _tries(dr, "capture") == [(1, "failed")]
    message = _failure_of(dr, "capture")
    assert message.startswith(NOT_RETRIED) and "wal_level" in message and "logical" in message, message


def test_a_refused_connection_is_still_retried(unique_name, tmp_path, monkeypatch):
    """A server that does not answer (nothing listens on the port) is a transient fault: the
    capture is tried 1 + retries times, as before."""
    conn_id = f"cdc_down_{unique_name}"
    _source_env(monkeypatch, conn_id, "postgresql://postgres@127.0.0.1:1/cdc_test", tmp_path / "data",
                "public.anything")
    dr = _run("cdc_changelog", monkeypatch, expect="failed")
    assert _tries(dr, "capture") == [(4, "failed")]


def test_a_table_dropped_under_a_snapshot_fails_its_chunk_once_and_marks_the_snapshot_failed(
        pg_uri, unique_name, tmp_path, monkeypatch):
    """The snapshot's table disappears between the plan and the chunk read: the chunk task fails
    at its first attempt (not 3) and the DAG's failure callback still marks the snapshot failed
    with the provider's message."""
    from airflow_provider_cdc.pipeline.snapshot_controller import SnapshotController

    pipe = Pipeline(pg_uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(pg_uri, pipe.table, 500)
    pipe.capture_now()
    read_range = SnapshotController.read_range

    def dropped_first(self, work, **kwargs):  # the fault's timing only; the error is the server's
        w.drop_table(pg_uri, pipe.table)
        return read_range(self, work, **kwargs)

    monkeypatch.setattr(SnapshotController, "read_range", dropped_first)
    try:
        dr = _run("cdc_snapshot", monkeypatch, conf={"action": "start", "tables": [pipe.table.id], "chunk_size": 200},
                  expect="failed")
        tries = _tries(dr, "read_chunks")
        assert tries and all(t == (1, "failed") for t in tries), tries
        progress = airflow_variables.load(pipe.source, pipe.table.id, pipe.data_dir)
        assert str(progress.status) == "failed"
        assert NOT_RETRIED in (progress.error or "") and pipe.table.name in progress.error, progress.error
    finally:
        pipe.cleanup()


# --- helpers ---------------------------------------------------------------------------------
def _run(dag_id: str, monkeypatch, *, conf: dict | None = None, expect: str):
    """dag.test() of a freshly parsed DAG file, its retries as the DAG sets them (1 s apart)."""
    import runpy
    import uuid

    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    dag = runpy.run_path(str(ROOT / "dags" / f"{dag_id}.py"), run_name=f"e2e_{dag_id}_{uuid.uuid4().hex[:6]}")["dag"]
    for task in dag.tasks:
        if hasattr(task, "partial_kwargs"):
            task.partial_kwargs["retry_delay"] = timedelta(seconds=1)
        else:
            task.retry_delay = timedelta(seconds=1)
    _FAILURES.clear()
    for task in dag.tasks:  # remember each failure's exception as the task's callback sees it
        _chain_failure_callback(task)
    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id == dag.dag_id).update({"is_paused": False})
    dr = dag.test(run_conf=conf)
    assert dr.state == expect, f"{dag_id} run {dr.run_id} ended {dr.state}, expected {expect}: {_FAILURES}"
    return dr


_FAILURES: dict[str, str] = {}


def _chain_failure_callback(task) -> None:
    kwargs = task.partial_kwargs if hasattr(task, "partial_kwargs") else None
    before = (kwargs or {}).get("on_failure_callback") if kwargs is not None else task.on_failure_callback
    before = before if isinstance(before, list) else [before] if before else []

    def remember(context):
        _FAILURES[context["ti"].task_id] = str(context.get("exception"))

    if kwargs is not None:
        kwargs["on_failure_callback"] = [*before, remember]
    else:
        task.on_failure_callback = [*before, remember]


def _failure_of(dr, task_id: str) -> str:
    return _FAILURES.get(task_id, "")
