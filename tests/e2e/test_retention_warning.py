"""When nothing bounds the WAL a source's replication slot may hold (PostgreSQL's default
``max_slot_wal_keep_size = -1``), a stopped capture lets WAL fill the server's disk. Issue 47:
the retention check warns in three places, each tested here after a real ``cdc_changelog`` run
(dag.test()) on the real servers: ``airflow cdc status`` (a subprocess, as a user runs it), the
metric ``cdc.capture.retention_unbounded`` tagged with the source (1 / 0), and the CDC page in
Airflow's UI (a real api-server, headless Chromium). MariaDB's binlog is bounded by its expiry,
and a PostgreSQL with a limit set is bounded: no warning there, and the gauge says 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import unbounded_server

AIRFLOW = Path(sys.executable).with_name("airflow")
WARNING = "nothing bounds the WAL replication slot"


def test_status_and_metric_warn_when_nothing_bounds_the_slot_wal(pipeline, gauges):
    p = pipeline
    unbounded = unbounded_server(p.uri)
    if p.scheme == "pg" and not unbounded:
        pytest.skip("this PostgreSQL bounds slot WAL (max_slot_wal_keep_size is set)")
    p.run("cdc_changelog")

    # the metric: one reading per capture, tagged with the source, 1 while unbounded
    mine = [(v, t) for s, v, t in gauges.gauges if s == "cdc.capture.retention_unbounded"]
    assert mine == [(1 if unbounded else 0, {"source": p.source})], gauges.gauges
    assert [v for s, v, t in gauges.gauges if s == "cdc.capture.retention_at_risk"] == [0]

    # status, as a user runs it (the environment names the pipeline's source and connection)
    r = subprocess.run([str(AIRFLOW), "cdc", "status", "--source", p.source], env=dict(os.environ),
                       capture_output=True, text=True, timeout=300, check=False)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 0, out
    if unbounded:
        assert f"WARNING: {WARNING}" in out and "max_slot_wal_keep_size = -1" in out, out
        # said once in full by doctor; status repeats its first clause and points there (issue 58)
        assert "airflow-cdc doctor says why and how to bound it" in out and "can fill its disk" not in out, out
        assert "AT RISK" not in out  # a warning, not a risk: the run did not fail
    else:
        assert "WARNING" not in out and "AT RISK" not in out, out


def test_the_cdc_page_warns_when_nothing_bounds_the_slot_wal(pipeline, tmp_path):
    from selenium.webdriver.common.by import By

    from .helpers import ApiServer, Browser, _text

    p = pipeline
    unbounded = unbounded_server(p.uri)
    if p.scheme == "pg" and not unbounded:
        pytest.skip("this PostgreSQL bounds slot WAL (max_slot_wal_keep_size is set)")
    p.run("cdc_changelog")
    server = ApiServer(tmp_path)
    browser = None
    try:
        browser = Browser(server)
        browser.login("viewer")  # reading is enough to be warned
        d = browser.open_page(p.source)
        text = " ".join(_text(d).split())
        box = d.find_element(By.CSS_SELECTOR, "[data-testid=lag]")
        warned = d.find_elements(By.CSS_SELECTOR, "[data-testid=retention-warning]")
        if unbounded:
            assert len(warned) == 1 and warned[0].get_attribute("role") == "alert"
            said = " ".join(warned[0].text.split())
            assert said.startswith("Log retention: UNBOUNDED (warning): " + WARNING), said
            assert "why, and the fix" in said and "Log retention: ok" not in text  # the rest one click away
            fix = warned[0].find_element(By.TAG_NAME, "details").get_attribute("textContent")
            assert "ALTER SYSTEM SET max_slot_wal_keep_size" in fix and "can fill its disk" in fix, fix
            assert "warn" in box.get_attribute("class").split()
            browser.shot(f"retention-unbounded-{p.scheme}")
        else:
            assert warned == [] and "Log retention: ok" in text and "UNBOUNDED" not in text, text
            assert "warn" not in box.get_attribute("class").split()
        # the index of every source says it beside the source's name
        d = browser.open_page()
        line = " ".join(d.find_element(By.CSS_SELECTOR, f"nav li a[href='./?source={p.source}']")
                        .find_element(By.XPATH, "..").text.split())
        assert line.endswith("LOG RETENTION UNBOUNDED") == unbounded, line
    finally:
        if browser is not None:
            browser.close()
        server.stop()
