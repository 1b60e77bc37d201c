"""Helpers shared by the e2e test modules and conftest: the ``Pipeline`` a test drives (one
source, one table, one data directory), its SQL helpers, the CLI's path, the UI page's API
server and browser, the example DAGs' source fixture and the capture-lock holder. Test modules
import from here, never from each other.
"""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import airflow.models
import airflow.models.taskinstance
import airflow.models.trigger
import airflow.models.xcom
import airflow.utils.session
import psycopg2
import psycopg2.extensions
import psycopg2.extras  # noqa: F401 - pre-imported for the lock-holder thread
import pyarrow.parquet  # noqa: F401 - pre-imported for the lock-holder thread
import pytest

import airflow_provider_cdc.dialects.postgres
import airflow_provider_cdc.operators.capture  # noqa: F401 - see above
from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.assets import mirror_asset
from airflow_provider_cdc.dialects import ConnectionParams, dialect_class
from airflow_provider_cdc.dialects.base import Dialect
from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook
from airflow_provider_cdc.pipeline import snapshot as snapshot_mod
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.locks import capture_lock, lock_key
from airflow_provider_cdc.pipeline.verify import check_event_log, verify_table
from airflow_provider_cdc.sinks.base import applied_everywhere
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.staged import staged_watermark_position
from airflow_provider_cdc.triggers.high_watermark import HighWatermarkTrigger
from tools import workload as w

#: the watermark strategies a test of the snapshot's promises runs under (conftest ``strategy``)
BOTH_STRATEGIES = pytest.mark.parametrize("strategy", ["table", "log"])

ROOT = Path(__file__).resolve().parents[2]
ROWS = 3000
CHUNK = 200
SNAPSHOT_CONF = {"chunk_size": CHUNK, "parallelism": 2}


class Pipeline:
    """One source (its own connection id, slot, staging and Variables), one table, one data dir."""

    def __init__(self, uri: str, name: str, data_dir: Path, monkeypatch) -> None:
        self.uri = uri
        self.scheme = "pg" if uri.startswith("postgres") else "mysql"
        self.conn_id = f"cdc_e2e_{name}"
        self.source = self.conn_id
        self.data_dir = str(data_dir)
        self.table = w.default_table(uri, f"e2e_{name}")
        self.tables = [self.table]  # what cleanup drops (subclasses hold several)
        self.mp = monkeypatch
        # only this test's table (the capture scope, CDC_TABLES below): other tests' tables in the
        # same database (unsupported types, TOASTed updates without REPLICA IDENTITY FULL) must
        # not reach this capture
        monkeypatch.setenv(f"AIRFLOW_CONN_{self.conn_id.upper()}", uri)
        monkeypatch.setenv("CDC_SOURCE_CONN_ID", self.conn_id)
        monkeypatch.delenv("CDC_SOURCE", raising=False)
        monkeypatch.setenv("CDC_DATA_DIR", self.data_dir)
        monkeypatch.setenv("CDC_TABLES", self.table.id)
        monkeypatch.setenv("CDC_CHANGELOG_SCHEDULE", "none")
        # a DAG paused in Airflow pauses its snapshot; these runs must not start paused
        monkeypatch.setenv("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False")
        self.dialect_cls = dialect_class("postgres" if self.scheme == "pg" else "mysql")

    def dialect(self):
        return CdcSourceHook(self.conn_id).get_dialect(source=self.source)

    # --- DAG runs ------------------------------------------------------------------------
    def load_dag(self, dag_id: str):
        """The DAG, from a freshly parsed DAG file (it reads this test's environment)."""
        return runpy.run_path(str(ROOT / "dags" / f"{dag_id}.py"), run_name=f"e2e_{dag_id}_{uuid.uuid4().hex[:6]}")["dag"]

    def run(self, dag_id: str, conf: dict | None = None, *, expect: str = "success"):
        """dag.test() of :meth:`load_dag`'s DAG."""
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        dag = self.load_dag(dag_id)
        dag_id = dag.dag_id
        for task in dag.tasks:  # retries stay as the DAG sets them; only the wait between tries shrinks
            if hasattr(task, "partial_kwargs"):
                task.partial_kwargs["retry_delay"] = timedelta(seconds=1)
            else:
                task.retry_delay = timedelta(seconds=1)
        with create_session() as session:
            session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": False})
        dr = dag.test(run_conf=conf)
        assert dr.state == expect, f"{dag_id} run {dr.run_id} ended {dr.state}, expected {expect}"
        return dr

    def snapshot(self, action: str = "start", **conf):
        return self.run("cdc_snapshot", {"action": action, "tables": [self.table.id], **SNAPSHOT_CONF, **conf})

    def capture_now(self) -> None:
        """A first capture outside the DAGs: the slot / binlog offset exists from here on."""
        with self.dialect() as d:
            stage_changelog(d, self.data_dir)

    def catch_up(self, max_runs: int = 4) -> None:
        """Mark the log's end (a watermark row, or its position under watermark strategy "log") and
        run cdc_changelog until the mark is staged and applied to both sinks."""
        with self.dialect() as d:
            marker = d.mark(f"e2e-catchup-{uuid.uuid4()}")
        for _ in range(max_runs):
            self.run("cdc_changelog")
            pos = staged_watermark_position(self.data_dir, self.source, marker)
            if pos is not None and applied_everywhere(self.data_dir, self.source, pos):
                return
        raise AssertionError(f"catch-up watermark {marker} not staged and applied after {max_runs} cdc_changelog runs")

    def progress(self):
        return airflow_variables.load(self.source, self.table.id, self.data_dir)

    def assert_equal(self) -> None:
        """I2 and I1: verify reports 0 mismatches, the event log has no violation."""
        with self.dialect() as d:
            res = verify_table(d, self.data_dir, self.source, self.table, chunk_rows=1000)
            pk = d.describe_table(self.table).primary_key
        assert res.ok, f"{res.summary()}: {[m.describe() for m in res.examples]}"
        assert res.rows_checked == w.count_rows(self.uri, self.table) > 0
        rep = check_event_log(self.data_dir, self.source, self.table, primary_key=pk)
        assert rep.ok, f"{rep.summary()}: {rep.violations}"
        assert rep.events >= res.rows_checked  # every live row came through the log or a chunk

    # --- fault injection -----------------------------------------------------------------
    def on_chunk(self, after_calls: int, action):
        """Run ``action()`` after the ``after_calls``-th chunk (lw -> select -> hw) of this test."""
        real = snapshot_mod.snapshot_chunk
        calls = {"n": 0, "after_keys": []}

        def wrapped(dialect, schema, rng, **kw):
            res = real(dialect, schema, rng, **kw)
            calls["n"] += 1
            calls["after_keys"].append((rng.start, kw.get("after_key"), res.last_key))
            if calls["n"] == after_calls:
                action()
            return res

        self.mp.setattr(snapshot_mod, "snapshot_chunk", wrapped)
        return calls

    def kill_select(self, on_call: int):
        """The ``on_call``-th chunk read of this table dies after its first rows reached the
        chunk file: before the file is complete and before the high watermark. (Patched at the
        Parquet write both dialects' chunk reads share; PostgreSQL reads through COPY.)"""
        import pyarrow.parquet as pq

        real_read = self.dialect_cls.read_chunk
        real_write = pq.ParquetWriter.write_table
        table = self.table
        state = {"n": 0, "killed": 0, "armed": False}

        def read_chunk(dialect, request):
            if request.schema.table == table:
                state["n"] += 1
                state["armed"] = state["n"] == on_call
            try:
                return real_read(dialect, request)
            finally:
                state["armed"] = False

        def write_table(writer, tbl, *args, **kwargs):
            real_write(writer, tbl, *args, **kwargs)
            if state["armed"]:
                state["armed"] = False
                state["killed"] += 1
                raise ConnectionError("injected: chunk read killed in the middle (rows read, file incomplete)")

        self.mp.setattr(self.dialect_cls, "read_chunk", read_chunk)
        self.mp.setattr(pq.ParquetWriter, "write_table", write_table)
        return state

    def kill_capture_before_commit(self):
        """The next capture stages its segment, then dies before committing the offset (I6)."""
        real = self.dialect_cls.commit_offset
        state = {"killed": 0, "commits": 0}

        def commit_offset(dialect, offset, data_dir):
            if state["killed"] == 0:
                state["killed"] += 1
                raise ConnectionError("injected: capture killed after staging, before committing its offset")
            state["commits"] += 1
            return real(dialect, offset, data_dir)

        self.mp.setattr(self.dialect_cls, "commit_offset", commit_offset)
        return state

    def cleanup(self) -> None:
        from airflow.models.variable import Variable

        try:
            with self.dialect() as d:
                for name in ("drop_slot", "drop_publication"):
                    fn = getattr(d, name, None)
                    if callable(fn):
                        fn()
        finally:
            self.drop()
            for t in self.tables:
                Variable.delete(airflow_variables.variable_key(self.source, t.id))
                Variable.delete(airflow_variables.verify_key(self.source, t.id))
            Variable.delete(airflow_variables.lag_key(self.source))
            Variable.delete(airflow_variables.run_failed_key(self.source))

    def drop(self) -> None:
        w.drop_table(self.uri, self.table)


def run_sql(p: Pipeline, statements: list[str], *, one_transaction: bool = True) -> None:
    """Statements on a plain connection (autocommit off), committed together or one by one."""
    conn = w.connect(p.uri)
    try:
        cur = conn.cursor()
        for s in statements:
            cur.execute(s)
            if not one_transaction:
                conn.commit()
        conn.commit()
    finally:
        conn.close()


def qt(p: Pipeline) -> str:
    return w.quote_table(w.ConnectionParams.from_uri(p.uri), p.table)


def asset_events(source: str, table_id: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    name = mirror_asset(source, table_id).name
    with create_session() as session:
        rows = (session.query(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .filter(AssetModel.name == name).order_by(AssetEvent.id).all())
        return [dict(r.extra or {}) for r in rows]


CLI = Path(sys.executable).with_name("airflow-cdc")


def _triggered_conf(dag_id: str, run_id: str) -> dict:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id == run_id).one()
        conf = dict(run.conf or {})
        session.delete(run)  # no scheduler here: the test runs it with dag.test()
    return conf


def _json_out(text: str) -> dict:
    """The JSON document verify --json printed last (dag.test() logs may precede it)."""
    return json.loads(text[text.rindex("\n{\n") + 1:] if not text.startswith("{\n") else text)


def unbounded_server(uri: str) -> bool:
    """True when this PostgreSQL leaves slot WAL unbounded (the default, -1); False for MariaDB."""
    if not uri.startswith("postgres"):
        return False
    conn = w.connect(uri)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'")
            return cur.fetchone()[0] == "-1"
    finally:
        conn.close()


ARTIFACTS = Path(os.environ.get("CDC_UI_ARTIFACTS", ROOT / ".cdc-local" / "artifacts" / "ui"))
PASSWORDS = {"admin": "admin-pw-1", "user": "user-pw-1", "viewer": "viewer-pw-1"}


class ApiServer:
    def __init__(self, tmp: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        pw = tmp / "passwords.json"
        pw.write_text(json.dumps(PASSWORDS))
        env = dict(os.environ)
        env.update({
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,user:user,viewer:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(pw),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(16),
            "AIRFLOW__API__BASE_URL": self.base,
        })
        self.log = tmp / "api-server.log"
        self.proc = subprocess.Popen(
            [shutil.which("airflow") or str(Path(sys.executable).with_name("airflow")), "api-server", "--port",
             str(self.port), "--host", "127.0.0.1", "--workers", "1"],
            env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, f"the api-server exited:\n{self.log.read_text()[-4000:]}"
            try:
                with urllib.request.urlopen(f"{self.base}/api/v2/monitor/health", timeout=5):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                assert time.monotonic() < deadline, f"the api-server did not answer:\n{self.log.read_text()[-4000:]}"
                time.sleep(0.5)

    def token(self, user: str) -> str:
        req = urllib.request.Request(f"{self.base}/auth/token", method="POST",
                                     data=json.dumps({"username": user, "password": PASSWORDS[user]}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())["access_token"]

    def request(self, method: str, path: str, *, user: str | None, data: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes, dict]:
        h = dict(headers or {})
        if user:
            h["Authorization"] = f"Bearer {self.token(user)}"
        req = urllib.request.Request(f"{self.base}{path}", method=method, data=data, headers=h)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=60) as r:
                return r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(), dict(exc.headers)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


class Browser:
    """Headless Debian chromium through its chromedriver, at a laptop's window size."""

    def __init__(self, server: ApiServer) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert chromium and driver, "Debian's chromium and chromium-driver are needed (scripts/setup.sh installs them)"
        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1366,900",
                    "--disable-dev-shm-usage", "--no-first-run", "--disable-background-networking"):
            opts.add_argument(arg)
        self.server = server
        self.driver = webdriver.Chrome(service=Service(driver), options=opts)
        self.driver.set_page_load_timeout(60)

    def login(self, user: str) -> None:
        self.driver.delete_all_cookies()
        self.driver.get(f"{self.server.base}/api/v2/monitor/health")
        self.driver.add_cookie({"name": "_token", "value": self.server.token(user), "path": "/"})

    def open_page(self, source: str | None = None):
        """The page as the UI shows it: Browse -> CDC, in its frame (``source``: that source's
        page, deep-linked)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        self.driver.switch_to.default_content()
        self.driver.get(f"{self.server.base}/plugin/cdc" + ("" if source is None else f"/cdc/?source={source}"))
        WebDriverWait(self.driver, 60).until(ec.frame_to_be_available_and_switch_to_it((By.CSS_SELECTOR,
                                                                                        "iframe[title='CDC']")))
        WebDriverWait(self.driver, 60).until(ec.presence_of_element_located((By.TAG_NAME, "h1")))
        return self.driver

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.driver.switch_to.default_content()
        path = ARTIFACTS / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def close(self) -> None:
        self.driver.quit()


def _text(driver) -> str:
    return driver.find_element("tag name", "body").text


def load_dag(name: str, suffix: str):
    """Import a DAG file as a fresh module (it reads its settings from the environment)."""
    spec = importlib.util.spec_from_file_location(f"{name}_{suffix}", ROOT / "dags" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def source_rows(uri: str, table: str) -> dict:
    with psycopg2.connect(uri) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT id, v, amount::text FROM "{table}"')  # noqa: S608
        return {r[0]: (r[1], r[2]) for r in cur.fetchall()}


def mirror_rows(data_dir: str, source: str, table: str) -> dict:

    rows = read_mirror(data_dir, source, f"public.{table}").to_pylist()
    return {r["id"]: (r["v"], None if r["amount"] is None else f"{r['amount']:.2f}") for r in rows}


TRIGGER_CLASSPATH = f"{HighWatermarkTrigger.__module__}.{HighWatermarkTrigger.__qualname__}"


def deferral_of(source: str) -> tuple[int, dict] | None:
    """The trigger row (id, kwargs) the sensor's deferral created in the metadata database
    for ``source``, if any (the execution API stores one per deferral)."""
    Trigger = airflow.models.trigger.Trigger  # noqa: N806

    with airflow.utils.session.create_session() as session:
        for row in session.query(Trigger).filter(Trigger.classpath == TRIGGER_CLASSPATH).all():
            kwargs = row.kwargs
            if kwargs.get("source") == source:
                return row.id, dict(kwargs)
    return None


def xcom_of(run, task_id: str) -> list:
    """The return values of ``task_id`` in ``run``, one per map index (a plain task has one)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(XComModel)
            .filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id, key="return_value")
            .order_by(XComModel.map_index)
            .all()
        )
        return [XComModel.deserialize_value(row) for row in rows]


class CaptureLockHolder(threading.Thread):
    """Holds the capture lock of the source from its own connection until the sensor has
    deferred; then captures under it (``capture=True``, and keeps it until ``finish``) or
    releases it at once (``capture=False``)."""

    def __init__(self, params: ConnectionParams, dialect: Dialect, data_dir: str, *, capture: bool) -> None:
        super().__init__(daemon=True)
        self.params, self.dialect, self.data_dir, self.capture = params, dialect, data_dir, capture
        self.source = dialect.source
        self.locked = threading.Event()
        self.finish = threading.Event()
        self.acquired: bool | None = None
        self.deferral: tuple[int, dict] | None = None
        self.captured = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with capture_lock(self.params, lock_key(self.dialect, self.data_dir)) as acquired:
                self.acquired = acquired
                self.locked.set()
                if not acquired:
                    return
                while not self.finish.is_set() and self.deferral is None:
                    self.deferral = deferral_of(self.source)
                    if self.deferral is None:
                        time.sleep(0.2)
                if self.deferral is None or not self.capture:
                    return  # releases the lock: the sensor's next poke may drain
                with self.dialect as dialect:  # what run_capture does under the lock
                    self.captured = stage_changelog(dialect, self.data_dir)
                self.finish.wait()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            self.error = exc
        finally:
            self.locked.set()
