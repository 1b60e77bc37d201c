"""Every task of a round parses its DAG file first: what the DAG files import is paid by every
task. Heavy libraries load in ``execute``, not at parse. The budgets are sets and counts of
modules, and a time relative to Airflow's own import in the same process, never an absolute
time (timings belong in bench/).

Measured (issue 49, a 2-core machine): a DAG file loaded ~650 modules beyond Airflow's, 1.5-3 s;
now under 80 modules and a tenth of Airflow's own import time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted(p.name for p in (ROOT / "dags").glob("cdc_*.py"))
#: loaded only by the tasks that use them (each with its submodules): pyarrow and numpy
#: (~0.3 s), deltalake, the engines; Airflow's Spark operator and hook, whose module imports
#: OpenLineage's Spark utilities and with them the OpenLineage plugin (~1 s)
NOT_AT_PARSE = ("pandas", "numpy", "pyarrow", "deltalake", "pyspark", "duckdb", "polars", "sqlglot",
                "airflow.providers.apache.spark.operators.spark_submit",
                "airflow.providers.apache.spark.hooks.spark_submit",
                "airflow.providers.openlineage.plugins")
#: modules a DAG file may load beyond what ``from airflow.sdk import DAG, task, BaseOperator``
#: loads (the DAG files build with these; ~75 today, ~650 when the Spark operators subclassed
#: SparkSubmitOperator and the hooks imported the dialects)
MODULE_BUDGET = 150
#: a DAG file's parse, in CPU seconds, at most this share of Airflow's own import (~0.1 today;
#: 0.5-0.7 before: 1.5-3 s beyond Airflow's 3-5 s)
TIME_SHARE_BUDGET = 0.35

_PROBE = """
import importlib.util, json, sys, time
t0 = time.process_time()
import airflow
from airflow.sdk import DAG, BaseOperator, BaseSensorOperator, task
t1 = time.process_time()
before = set(sys.modules)
spec = importlib.util.spec_from_file_location("dagfile", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
t2 = time.process_time()
names = json.loads(sys.argv[2])
print(json.dumps({
    "forbidden": sorted(m for m in sys.modules if any(m == n or m.startswith(n + ".") for n in names)),
    "new": sorted(set(sys.modules) - before), "airflow_s": t1 - t0, "dag_s": t2 - t1,
}))
"""


def _parse(dag_file: str, env: dict[str, str] | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT / "dags" / dag_file), json.dumps(NOT_AT_PARSE)],
                         capture_output=True, text=True, timeout=180, cwd=ROOT, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def _sources_env(tmp_path: Path) -> dict[str, str]:
    """The environment with a sources config of two sources (cdc_sources.py reads it at parse)."""
    import os

    cfg = tmp_path / "cdc_sources.yaml"
    cfg.write_text("sources:\n  shop: {conn_id: shop_pg, sinks: 'events,mirror'}\n"
                   "  billing: {conn_id: billing_mdb, sinks: events}\n")
    return {**os.environ, "CDC_SOURCES_FILE": str(cfg)}


@pytest.mark.slow  # tens of seconds (pytest --durations)
@pytest.mark.parametrize("dag_file", DAG_FILES)
def test_parsing_a_dag_file_loads_no_heavy_library_and_stays_in_budget(dag_file, tmp_path):
    got = _parse(dag_file, _sources_env(tmp_path) if dag_file == "cdc_sources.py" else None)
    assert got["forbidden"] == [], f"{dag_file} loads at parse: {got['forbidden']}"
    assert len(got["new"]) <= MODULE_BUDGET, (
        f"{dag_file} loads {len(got['new'])} modules beyond Airflow's (budget {MODULE_BUDGET}): {got['new']}")
    share = got["dag_s"] / max(got["airflow_s"], 1e-3)
    assert share <= TIME_SHARE_BUDGET, (
        f"{dag_file} parses in {got['dag_s']:.2f} CPU s, {share:.0%} of Airflow's own import "
        f"({got['airflow_s']:.2f} s; budget {TIME_SHARE_BUDGET:.0%})")


@pytest.mark.slow
def test_the_log_schedule_s_watcher_adds_no_heavy_import():
    """With CDC_CHANGELOG_SCHEDULE=@log the DAG file builds the source's log Asset and its
    trigger (triggers/log_activity.py): still nothing heavy at parse."""
    import os

    got = _parse("cdc_changelog.py", {**os.environ, "CDC_CHANGELOG_SCHEDULE": "@log"})
    assert got["forbidden"] == [], got["forbidden"]
    assert "airflow_provider_cdc.triggers.log_activity" in got["new"]
    assert len(got["new"]) <= MODULE_BUDGET, got["new"]


@pytest.mark.slow
def test_the_probe_sees_a_heavy_import(tmp_path):
    """The check above can fail: a DAG file that imports a Spark job's module (pyarrow) is caught."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "heavy.py").write_text("from airflow_provider_cdc.pipeline.spark.common import application_path\n")
    out = subprocess.run([sys.executable, "-c", _PROBE, str(dags / "heavy.py"), json.dumps(NOT_AT_PARSE)],
                         capture_output=True, text=True, timeout=180, cwd=ROOT, check=True).stdout
    assert "pyarrow" in json.loads(out.strip().splitlines()[-1])["forbidden"]
