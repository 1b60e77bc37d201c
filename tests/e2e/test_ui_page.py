"""The CDC page in Airflow's UI (airflow_provider_cdc/ui), in a real ``airflow api-server`` with
the plugin, driven by headless Chromium (Debian's ``chromium`` through its ``chromedriver``;
nothing is downloaded). The api-server shares this test process's Airflow metadata database, so
the page shows what the real tasks write: a snapshot running under dag.test(), photographed
from inside its third chunk, the capture lag and its chart, a verify started from the page.

Users of Airflow's simple auth manager: ``admin``, ``user`` (may trigger DAGs) and ``viewer``
(may only read). Screenshots of each state go to ``.cdc-local/artifacts/ui/`` (CDC_UI_ARTIFACTS)
and the README shows them (docs/ui/).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from airflow_provider_cdc import airflow_variables

from .helpers import ApiServer, Browser, _text, run_sql

pytestmark = pytest.mark.timeout(900)

@pytest.fixture
def ui(pipeline, tmp_path):
    """A real api-server with the plugin (on this process's metadata database and environment,
    the pipeline's source included) and a browser."""
    server = ApiServer(tmp_path)
    browser = None
    try:
        browser = Browser(server)
        yield server, browser
    finally:
        if browser is not None:
            browser.close()
        server.stop()


def _flash(driver) -> str:
    """The message the page shows after an action (the form's POST redirects back to it)."""
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, 60).until(ec.presence_of_element_located(("css selector", "p.flash"))).text


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_the_page_shows_a_running_snapshot_and_the_lag_and_its_actions_work_for_a_user(pipeline, ui):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    p = pipeline
    server, browser = ui
    for _ in range(3):  # lag readings for the chart: capture runs
        p.run("cdc_changelog")
    seen: dict = {}

    def photograph_while_running():  # inside the chunk task, between its 3rd chunk and its commit
        browser.login("user")
        d = browser.open_page(p.source)
        seen["running"] = _text(d)
        seen["progressbar"] = d.find_element("css selector", f"tr[data-table='{p.table.id}'] [role=progressbar]"
                                             ).get_attribute("aria-valuenow")
        seen["buttons"] = [b.text for b in d.find_elements("css selector", f"tr[data-table='{p.table.id}'] button")]
        browser.shot("running-snapshot")

    p.on_chunk(3, photograph_while_running)
    p.snapshot()
    text = seen["running"]
    assert f"Source {p.source}" in text and p.table.id in text
    # the 3rd chunk is read, its commit record not written yet: two chunks committed
    assert "RUNNING" in text and "chunks 2" in text and "rows 400 of ~" in text and "rows/s" in text, text
    assert "0 rows merged" in text  # read by the running chunk task, merged by the round after it
    assert "time left" in text and "key ranges done 0/2" in text
    assert 0 < int(seen["progressbar"]) < 100
    assert seen["buttons"] == ["pause", "stop", "verify"]
    assert "Capture lag:" in text and "Log held by: replication slot" in text
    # PostgreSQL's default max_slot_wal_keep_size = -1 is warned about (test_retention_warning.py)
    from .helpers import unbounded_server

    assert ("Log retention: UNBOUNDED (warning): nothing bounds the WAL" if unbounded_server(p.uri)
            else "Log retention: ok") in " ".join(text.split()), text

    # done: the lag chart (an SVG with its figures in text) and a verify started from the page
    d = browser.open_page(p.source)
    assert d.find_element("css selector", "svg[role=img]").get_attribute("aria-label").startswith("capture lag in seconds")
    assert "DONE" in _text(d)
    _register("cdc_verify")  # the verify DAG in this Airflow's database (a dag-processor would put it there)
    before = {r.run_id for r in _runs("cdc_verify")}
    d.find_element("css selector", f"tr[data-table='{p.table.id}'] button[aria-label^='verify']").click()
    assert (msg := _flash(d)) == (f"verify of {p.table.id}: a run of the source's verify DAG is queued or running; "
                                  "its result appears here"), msg
    # the page reloads itself (no script) to the source's page without the action's message
    reload = d.find_element("css selector", "meta[http-equiv=refresh]").get_attribute("content")
    assert reload == f"60; url=./?source={quote(p.source, safe='')}", reload
    # the click queued a run of the source's verify DAG (nothing runs in the api-server); this tier
    # has no scheduler, so its one task runs here, in that very run (its conf), through Airflow's CLI
    [run] = [r for r in _runs("cdc_verify") if r.run_id not in before]
    assert (run.conf, run.triggering_user_name, str(run.state)) == ({"table": p.table.id}, "user", "queued")
    _run_task("cdc_verify", "verify", run.run_id)
    _delete_runs([run.run_id])
    assert airflow_variables.load_verifies(p.source).get((p.source, p.table.id)) is not None
    d = browser.open_page(p.source)
    assert "OK" in _text(d) and "3,000 rows checked, 0 mismatched" in _text(d), _text(d)
    browser.shot("verified")

    # an action the page triggers is the snapshot DAG's own run, with that action's conf
    before = {r.run_id for r in _runs("cdc_snapshot")}
    status, body, _ = server.request("POST", "/cdc/action", user="user",
                                     data=f"source={p.source}&table={p.table.id}&action=stop".encode(),
                                     headers={"Content-Type": "application/x-www-form-urlencoded",
                                              "Accept": "application/json", "Origin": server.base})
    assert status == 200, body
    new = [r for r in _runs("cdc_snapshot") if r.run_id not in before]
    try:
        assert [(r.conf, r.triggering_user_name) for r in new] == [({"action": "stop", "tables": [p.table.id]}, "user")]
    finally:
        with create_session() as session:
            session.query(DagRun).filter(DagRun.run_id.in_([r.run_id for r in new])).delete(synchronize_session=False)


def _register(dag_id: str) -> None:
    """Put a DAG of dags/ into this Airflow's metadata database, as the dag-processor would
    (dag.test() of the other DAGs does it for those)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)
    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": False})
        assert session.query(DagModel).filter(DagModel.dag_id == dag_id).count() == 1, f"{dag_id} not registered"


def _run_task(dag_id: str, task_id: str, run_id: str) -> None:
    """``airflow tasks test DAG TASK RUN_ID``: the task of an existing run, with that run's conf."""
    airflow = shutil.which("airflow") or str(Path(sys.executable).with_name("airflow"))
    r = subprocess.run([airflow, "tasks", "test", dag_id, task_id, run_id], env=dict(os.environ), capture_output=True,
                       text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def _delete_runs(run_ids: list[str]) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagRun).filter(DagRun.run_id.in_(run_ids)).delete(synchronize_session=False)


def _runs(dag_id: str):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        runs = session.query(DagRun).filter(DagRun.dag_id == dag_id).all()
        session.expunge_all()
        return runs


@pytest.mark.parametrize("pipeline", ["mysql"], indirect=True)
def test_a_viewer_reads_the_page_but_every_action_is_refused_and_no_session_is_sent_to_login(pipeline, ui):
    p = pipeline
    server, browser = ui
    p.run("cdc_changelog")
    p.on_chunk(2, lambda: airflow_variables.request(p.source, p.table.id, "pause", p.data_dir))
    p.snapshot()
    assert p.progress().status == "paused"
    browser.login("viewer")
    d = browser.open_page(p.source)
    row = d.find_element("css selector", f"tr[data-table='{p.table.id}']")
    assert "PAUSED" in row.text and "read only" in row.text and row.find_elements("css selector", "button") == []
    browser.shot("viewer-paused")
    form = f"source={p.source}&table={p.table.id}&action=resume".encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Origin": server.base}
    status, body, _ = server.request("POST", "/cdc/action", user="viewer", data=form, headers=headers)
    assert status == 403 and b"needs the right to trigger DAG cdc_snapshot" in body, body
    # a user who may trigger, but from another site's form: refused too
    status, body, _ = server.request("POST", "/cdc/action", user="user", data=form,
                                     headers={**headers, "Origin": "http://evil.example"})
    assert status == 403, body
    # no session: a browser goes to Airflow's login, a script gets 401; the JSON view needs one too
    status, _, h = server.request("GET", "/cdc/", user=None, headers={"Accept": "text/html"})
    assert status in (302, 307) and "/auth/login" in h.get("location", h.get("Location", ""))
    assert server.request("GET", "/cdc/api/status", user=None)[0] == 401
    status, body, _ = server.request("GET", f"/cdc/api/status?source={p.source}", user="viewer")
    doc = json.loads(body)
    assert status == 200 and doc["can_act"] == {p.source: False}
    [src] = [s for s in doc["sources"] if s["source"] == p.source]
    assert [t["snapshot"]["status"] for t in src["tables"] if t["table"] == p.table.id] == ["paused"]


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_the_page_acts_only_on_known_sources_verifies_as_one_dag_run_and_survives_bad_variables(pipeline, ui):
    """Issue 46. A source only a Variable names cannot be acted on (its verify once ran with a
    connection taken from the Variable); two verify clicks queue one run of the source's own
    cdc_verify DAG (each click used to start a process in the api-server); a malformed Variable
    is marked where it is and the page still answers (one such value made it 500 for everyone);
    the page may be framed by Airflow's UI only; without Origin only a bearer token may act (any
    Authorization header did); ``?msg=`` text is not shown (any text could be)."""
    from airflow.models.variable import Variable

    from airflow_provider_cdc.core.progress import SnapshotProgress
    from airflow_provider_cdc.core.ranges import ChunkRange

    p = pipeline
    server, browser = ui
    _register("cdc_verify")
    ghost = f"ghost_{p.source}"  # a valid name no sources config nor environment names
    ghost_progress = SnapshotProgress.start(ghost, "snap-1", {p.table.id: [ChunkRange()]}, now=1000.0)
    airflow_variables.publish(ghost, p.table.id, ghost_progress)
    broken = {airflow_variables.variable_key(p.source, "public.broken"): "[1, 2]",  # not a progress
              airflow_variables.verify_key(p.source, p.table.id): json.dumps(
                  {"source": p.source, "table": p.table.id, "ok": True, "rows_checked": "lots"}),  # a wrong type
              airflow_variables.lag_key(p.source): json.dumps({"source": p.source, "bytes": "many", "at": 1.0})}
    for key, value in broken.items():
        Variable.set(key, value)
    form = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json", "Origin": server.base}
    new: list[str] = []
    try:
        # the page answers, marks each bad value where it is, and shows the rest
        status, body, headers = server.request("GET", f"/cdc/?source={p.source}&msg=Call+0800+now", user="user",
                                               headers={"Accept": "text/html"})
        html = body.decode()
        assert status == 200, html
        assert html.count("data-testid='malformed'") == 3, html  # the progress, the verify, the lag
        assert "MALFORMED" in html and "rows_checked" in html and "bytes" in html
        assert "Call 0800 now" not in html  # ?msg= is gone: a link cannot put text into Airflow's UI
        assert {k.lower(): v for k, v in headers.items()}.get("content-security-policy") == "frame-ancestors 'self'"
        status, body, _ = server.request("GET", "/cdc/api/status", user="user")
        assert status == 200
        [g] = [s for s in json.loads(body)["sources"] if s["source"] == ghost]
        assert g["known"] is False and "named only by Variables" in g["unknown"] and g["snapshot_dag"] is None

        # a source only a Variable names: no action, whatever the user's rights
        for action in ("verify", "stop"):
            status, body, _ = server.request("POST", "/cdc/action", user="admin", headers=form,
                                             data=f"source={ghost}&table={p.table.id}&action={action}".encode())
            assert status == 403 and b"not named by the sources config or the environment" in body, body
        assert [r for r in _runs("cdc_verify") if r.conf.get("table") == p.table.id] == []

        # two clicks, one verify: a run of the source's own verify DAG, not a process of the api-server
        before = {r.run_id for r in _runs("cdc_verify")}
        answers = []
        for _ in range(2):
            status, body, _ = server.request("POST", "/cdc/action", user="user", headers=form,
                                             data=f"source={p.source}&table={p.table.id}&action=verify".encode())
            assert status == 200, body
            answers.append(json.loads(body))
        new = [r.run_id for r in _runs("cdc_verify") if r.run_id not in before]
        assert len(new) == 1 and [a["run_id"] for a in answers] == new * 2 and answers[0]["dag_id"] == "cdc_verify"
        assert "already queued or running" in answers[1]["message"]
        [run] = [r for r in _runs("cdc_verify") if r.run_id == new[0]]
        assert (run.conf, run.triggering_user_name) == ({"table": p.table.id}, "user")

        # no Origin: a browser's cookie alone, even beside another kind of Authorization header, is refused
        cookie = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": f"_token={server.token('user')}"}
        data = f"source={p.source}&table={p.table.id}&action=verify".encode()
        for extra in ({}, {"Authorization": "Basic dXNlcjp4"}):
            status, body, _ = server.request("POST", "/cdc/action", user=None, headers={**cookie, **extra}, data=data)
            assert status == 403 and b"must come from the CDC page" in body, (extra, body)
        # a table outside the scope (a Variable names it): shown refused, never acted on
        airflow_variables.publish(p.source, "public.outside", SnapshotProgress.start(
            p.source, "snap-2", {"public.outside": [ChunkRange()]}, now=1000.0))
        status, body, _ = server.request("POST", "/cdc/action", user="user", headers=form,
                                         data=f"source={p.source}&table=public.outside&action=verify".encode())
        assert status == 403 and b"is not captured by source" in body, body
    finally:
        _delete_runs(new)
        for key in [*broken, airflow_variables.variable_key(ghost, p.table.id),
                    airflow_variables.variable_key(p.source, "public.outside")]:
            Variable.delete(key)


@pytest.mark.parametrize("pipeline", ["pg"], indirect=True)
def test_a_failing_capture_and_an_open_gap_lead_status_the_page_and_the_metric(pipeline, ui, gauges, capsys):
    """Issue 58: with its slot dropped, cdc_changelog failed every minute while status and the page
    said "0 s behind the log". Now the failure, with its message, leads ``status`` (which exits
    1), ``status --json``, the page (this browser) and the metric ``cdc.capture.failing``; an open
    failover gap is shown beside it. The page is photographed for the docs
    (docs/screenshots/failing-source.png)."""
    from airflow_provider_cdc import cli
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.source_server import write_gaps

    p = pipeline
    server, browser = ui
    p.run("cdc_changelog")  # a good reading first: the failure is said before it
    with p.dialect() as d:
        d.drop_slot()  # what an administrator (or a failover without the slot) does
    p.run("cdc_changelog", expect="failed")
    assert ("cdc.capture.failing", 1, {"source": p.source}) in gauges.gauges
    # the gap a resync records after a promotion the slot did not follow (test_failover makes a real one)
    write_gaps(changelog_dir(p.data_dir, p.source), [{
        "state": "open", "from": "0/3000028", "to": "0/3A01F10", "tables": [p.table.id], "verified": {},
        "reason": "the source was promoted and its slot did not follow"}])

    # a snapshot run that fails before it plans (a table outside the scope): no progress can say it
    p.run("cdc_snapshot", {"action": "start", "tables": [f"{p.table.schema}.not_in_scope"]}, expect="failed")

    capsys.readouterr()
    assert cli.run(["status", "--source", p.source]) == 1
    out = capsys.readouterr().out
    assert "CAPTURE FAILING since" in out and "does not exist" in out and "gap (open)" in out, out
    assert "SNAPSHOT RUN FAILED" in out and "not_in_scope" in out, out
    assert out.index("CAPTURE FAILING") < out.index("gap (open)") and "NOT HEALTHY (exit 1)" in out
    assert cli.run(["status", "--source", p.source, "--json"]) == 1
    [doc] = json.loads(capsys.readouterr().out)
    assert "does not exist" in doc["source_lag"]["failing"]["error"] and doc["source_gaps"][0]["state"] == "open"
    assert doc["source_failed_run"]["task_id"] == "plan" and "not_in_scope" in doc["source_failed_run"]["error"]

    browser.login("user")
    d = browser.open_page(p.source)
    text = _text(d)
    assert "Capture FAILING" in text and "does not exist" in text and "Open gap" in text, text
    assert "Snapshot run FAILED" in text and "not_in_scope" in text, text
    assert text.index("Capture FAILING") < text.index("Capture lag:") < text.index("Open gap")
    shot = browser.shot("failing-source")
    assert shot.stat().st_size > 10_000
    browser.open_page()  # the index line of every source says it too
    assert "CAPTURE FAILING" in _text(browser.driver) and "1 OPEN GAP(S)" in _text(browser.driver)
    # after the resync the message advises, the next snapshot run that plans ends the record
    # WAL written past the staged end: a transactional message commits, and the commit flushes it. A
    # non-transactional one may sit in the WAL buffers until the WAL writer's next pass, past resync's
    # look at pg_current_wal_lsn() (seen in CI, with two test sessions loading the machine)
    run_sql(p, ["SELECT pg_logical_emit_message(true, 'cdc-test', 'x')"])
    code = cli.run(["resync", "--conn-id", p.conn_id, "--source", p.source, "--data-dir", p.data_dir])
    assert code == 0, capsys.readouterr()
    p.run("cdc_snapshot", {"action": "start", "tables": [p.table.id], "chunk_size": 5000})
    assert airflow_variables.load_run_failures(p.source) == {}
