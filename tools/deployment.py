"""A real Airflow deployment on this machine: its own AIRFLOW_HOME, a fresh metadata database
on a PostgreSQL server, LocalExecutor, and the four components (api-server, scheduler,
dag-processor, triggerer) each in its own process group with its own log file, driven through
the `airflow` CLI and the REST API only.

Used by the deployment test tier (tests/deployment/conftest.py) and by the benchmarks that
measure the pipeline the way it is deployed (``python -m bench large``), where tasks run side
by side as under any scheduler (``airflow dags test`` runs them one after the other).

    with launch(pg_uri, home, dags_folder, env={...}, dags=("cdc_snapshot",)) as dep:
        run_id = dep.trigger("cdc_snapshot", {"action": "start", ...})
        dep.wait_run("cdc_snapshot", run_id)
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
TERMINAL = {"success", "failed"}


class DeploymentError(AssertionError):
    """A deployment component, run or task did not do what was expected (the message holds
    the run's task states, the failed tasks' log tails and the components' log tails)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(lines[-n:])


class Deployment:
    def __init__(self, home: Path, env: dict[str, str], port: int, pg_uri: str, suffix: str) -> None:
        self.home, self.env, self.port, self.pg_uri, self.suffix = home, env, port, pg_uri, suffix
        self.base = f"http://127.0.0.1:{port}"
        self.data_dir = env["CDC_DATA_DIR"]
        self.procs: dict[str, subprocess.Popen] = {}
        self._token: str | None = None
        self.tables: dict[str, str] = {}

    # --- components -----------------------------------------------------------------------
    def start(self, name: str, *args: str) -> None:
        log = open(self.home / f"{name}.log", "w")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            [str(BIN / "airflow"), name, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, cwd=str(ROOT),
        )

    def stop_all(self) -> None:
        for p in self.procs.values():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            try:  # the whole group: workers, task runners, spark-submit JVMs
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def check_alive(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        if dead:
            raise DeploymentError(f"deployment component(s) exited: {dead}\n{self.component_logs()}")

    def component_logs(self, n: int = 30) -> str:
        return "\n".join(f"----- {name}.log (last {n} lines) -----\n{_tail(self.home / f'{name}.log', n)}"
                         for name in COMPONENTS)

    # --- CLI and REST ------------------------------------------------------------------------
    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "airflow"), *args]
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
        if check and proc.returncode != 0:
            raise DeploymentError(f"`{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def cdc(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "airflow-cdc"), *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=str(ROOT))

    def api(self, method: str, path: str, body: dict | None = None, *, ok404: bool = False):
        if self._token is None:
            with urllib.request.urlopen(f"{self.base}/auth/token", timeout=30) as r:
                self._token = json.loads(r.read())["access_token"]
        req = urllib.request.Request(
            f"{self.base}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            if ok404 and exc.code == 404:
                return None
            raise DeploymentError(f"{method} {path} -> HTTP {exc.code}: {exc.read()[:2000]!r}") from exc

    # --- runs ------------------------------------------------------------------------------
    def trigger(self, dag_id: str, conf: dict | None = None, tag: str = "t") -> str:
        run_id = f"{tag}__{uuid.uuid4().hex[:8]}"
        args = ["dags", "trigger", dag_id, "-r", run_id]
        if conf is not None:
            args += ["-c", json.dumps(conf)]
        self.cli(*args)
        return run_id

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def runs(self, dag_id: str) -> list[dict]:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100&order_by=-start_date")["dag_runs"]

    def tis(self, dag_id: str, run_id: str) -> list[dict]:
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]

    def describe(self, dag_id: str, run_id: str) -> str:
        try:
            r = self.run(dag_id, run_id)
            tis = self.tis(dag_id, run_id)
        except Exception as exc:  # noqa: BLE001 - part of a failure message
            return f"{dag_id}/{run_id}: cannot read ({exc})"
        lines = [f"{dag_id} run {run_id}: {r['state']} (start {r.get('start_date')}, end {r.get('end_date')})"]
        for ti in sorted(tis, key=lambda t: (t.get("start_date") or "", t["task_id"], t["map_index"])):
            idx = "" if ti["map_index"] < 0 else f"[{ti['map_index']}]"
            lines.append(f"  {ti['task_id']}{idx}: {ti['state']} try {ti['try_number']}")
        return "\n".join(lines)

    def task_log_tails(self, dag_id: str, run_id: str, states=("failed", "up_for_retry", "up_for_reschedule", "skipped"),
                       n: int = 25) -> str:
        out = []
        try:
            tis = self.tis(dag_id, run_id)
        except Exception:  # noqa: BLE001
            return ""
        for ti in tis:
            if ti["state"] not in states:
                continue
            d = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={ti['task_id']}"
            if ti["map_index"] >= 0:
                d = d / f"map_index={ti['map_index']}"
            for f in sorted(d.glob("attempt=*.log")):
                out.append(f"----- task log {f.relative_to(self.home)} -----\n{_tail(f, n)}")
        return "\n".join(out)

    def failure(self, msg: str, *runs: tuple[str, str]) -> DeploymentError:
        parts = [msg]
        for dag_id, run_id in runs:
            parts.append(self.describe(dag_id, run_id))
            parts.append(self.task_log_tails(dag_id, run_id))
        parts.append(self.component_logs())
        return DeploymentError("\n".join(p for p in parts if p))

    def wait_run(self, dag_id: str, run_id: str, *, timeout: float = 300, expect: str | None = "success") -> dict:
        deadline = time.monotonic() + timeout
        while True:
            r = self.run(dag_id, run_id)
            if r["state"] in TERMINAL:
                break
            if time.monotonic() > deadline:
                raise self.failure(f"{dag_id} run {run_id} still {r['state']} after {timeout:.0f}s", (dag_id, run_id))
            self.check_alive()
            time.sleep(1)
        if expect is not None and r["state"] != expect:
            raise self.failure(f"{dag_id} run {run_id} ended {r['state']}, expected {expect}", (dag_id, run_id))
        return r

    def wait_ti(self, dag_id: str, run_id: str, task_id: str, states: set[str], *, timeout: float = 240,
                also=None) -> dict:
        """Poll until a TI of task_id is in one of states (and ``also(ti)`` holds)."""
        deadline = time.monotonic() + timeout
        while True:
            for ti in self.tis(dag_id, run_id):
                if ti["task_id"] == task_id and ti["state"] in states and (also is None or also(ti)):
                    return ti
            r = self.run(dag_id, run_id)
            if r["state"] in TERMINAL:
                raise self.failure(f"{dag_id} run {run_id} ended {r['state']} before {task_id} was {states}",
                                   (dag_id, run_id))
            if time.monotonic() > deadline:
                raise self.failure(f"{task_id} of {dag_id} run {run_id} not {states} after {timeout:.0f}s",
                                   (dag_id, run_id))
            time.sleep(1)

    def progress(self, table_id: str, source: str = "cdc_source") -> dict | None:
        from airflow_provider_cdc import airflow_variables

        v = self.api("GET", f"/api/v2/variables/{airflow_variables.variable_key(source, table_id)}", ok404=True)
        return None if v is None else json.loads(v["value"])


def _wait_http(url: str, timeout: float, dep: Deployment) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dep.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(1)
    raise DeploymentError(f"{url} did not answer in {timeout:.0f}s\n{dep.component_logs()}")


@contextmanager
def launch(pg_uri: str, home: Path, dags_folder: Path, *, env: Mapping[str, str], dags: Sequence[str] = (),
           parallelism: int = 4) -> Iterator[Deployment]:
    """A deployment whose metadata database is a new database on ``pg_uri``'s server (dropped
    at the end), whose DAG folder is ``dags_folder`` and whose process environment is this
    one's without any AIRFLOW_/CDC_ variable, plus ``env`` (connections, CDC_* settings).
    Yields once the api-server answers and every DAG of ``dags`` is parsed."""
    import psycopg2

    home.mkdir(parents=True, exist_ok=True)
    u = urlsplit(pg_uri)
    suffix = uuid.uuid4().hex[:8]
    db = f"airflow_deploy_{suffix}"
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{db}"')
    port = _free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "CDC_"))}
    full.update({
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{u.username or 'postgres'}"
                                               f"{':' + u.password if u.password else ''}@{u.hostname}:{u.port or 5432}/{db}",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "60",
        "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
        "AIRFLOW__SCHEDULER__PARSING_PROCESSES": "1",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[2]"}',
        "PYSPARK_PYTHON": str(BIN / "python"),
        "PYSPARK_DRIVER_PYTHON": str(BIN / "python"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    })
    full.update(env)
    dep = Deployment(home, full, port, pg_uri, suffix)
    t0 = time.monotonic()
    try:
        dep.cli("db", "migrate", timeout=300)
        print(f"[deployment] db migrate in {time.monotonic() - t0:.0f}s", file=sys.stderr)
        dep.start("api-server", "--port", str(port), "--host", "127.0.0.1", "--workers", "1")
        dep.start("scheduler")
        dep.start("dag-processor")
        dep.start("triggerer")
        _wait_http(f"{dep.base}/api/v2/monitor/health", 120, dep)
        deadline = time.monotonic() + 180
        while not all(dep.api("GET", f"/api/v2/dags/{d}", ok404=True) for d in dags):
            dep.check_alive()
            if time.monotonic() > deadline:
                raise DeploymentError(f"DAGs not parsed after 180s\n"
                                      f"{dep.cli('dags', 'list-import-errors', check=False).stdout}"
                                      f"\n{dep.component_logs()}")
            time.sleep(2)
        print(f"[deployment] up in {time.monotonic() - t0:.0f}s: {home}, api :{port}", file=sys.stderr)
        yield dep
    finally:
        dep.stop_all()
        print(f"[deployment] stopped; logs in {home}", file=sys.stderr)
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        admin.close()
