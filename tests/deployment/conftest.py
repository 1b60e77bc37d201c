"""A real Airflow deployment for the deployment tier, started once for the tier
(tools/deployment.py: its own AIRFLOW_HOME under .cdc-local/, a fresh metadata database on the
project's PostgreSQL server, LocalExecutor, and the four components each in its own process
group with its own log file), with the scenarios' tables, a sources config of two more sources
and the example consumer DAG. Tests drive it through the `airflow` CLI and the REST API only;
see docs/deployment.md.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from urllib.parse import urlsplit

import psycopg2
import pytest

from tools.deployment import ROOT, DeploymentError, launch

CONN_ID = "cdc_source"
# rounds above this many rows go through spark-submit; the "spark" tables are bigger than it
LOCAL_MAX_ROWS = 25_000
LOCAL_ROWS, SPARK_ROWS = 12_000, 30_000
SCENARIO_TABLES = {"stop": SPARK_ROWS, "pause": LOCAL_ROWS, "killchunk": LOCAL_ROWS, "termchunk": LOCAL_ROWS,
                   "killmerge": SPARK_ROWS, "clear": LOCAL_ROWS, "backfill": 4_000, "sensor": 4_000,
                   "range": LOCAL_ROWS}
# cdc_changelog needs a schedule for `airflow backfill create`: monthly, so the scheduler
# itself never starts one during the session (catchup=False: only the latest interval, once).
CHANGELOG_SCHEDULE = "0 0 1 * *"
#: rows of each table of the two sources of the sources config
CONFIG_ROWS = 3_000
CONFIG_SOURCES = ("cfg_pg", "cfg_my")
#: a source whose changelog runs only when it writes (CDC_CHANGELOG_SCHEDULE=@log), and a DAG
#: scheduled on its table's mirror Asset; built by a DAG file of the session's folder
LOG_SOURCE = "log_src"
ALL_DAGS = ("cdc_snapshot", "cdc_changelog", "cdc_mirror_consumer", f"cdc_changelog__{LOG_SOURCE}",
            f"{LOG_SOURCE}_consumer",
            *(f"{kind}__{s}" for s in CONFIG_SOURCES for kind in ("cdc_snapshot", "cdc_changelog")))

LOG_DAGS = '''"""The session's @log source (tests/deployment/conftest.py) and a consumer of its mirror."""
import pendulum
from airflow.sdk import DAG, task

from airflow_provider_cdc.assets import mirror_asset
from airflow_provider_cdc.dag_builders import changelog_dag

changelog = changelog_dag("cdc_changelog__{source}", {overrides!r})

with DAG(dag_id="{source}_consumer", schedule=[mirror_asset("{source}", "{table}")],
         start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False, max_active_runs=1):

    @task
    def read(*, triggering_asset_events=None) -> list:
        return [dict(ev.extra or {{}}) for evs in (triggering_asset_events or {{}}).values() for ev in evs]

    read()
'''



#: the harness's error, under the name the scenarios use
ScenarioError = DeploymentError


@pytest.fixture(scope="package")
def deployment(pg_uri, mysql_uri):
    """The tier's deployment, stopped after the tier's last test: its four components poll even
    when idle (12% of a core together), and `make test` runs the integration and unit tiers
    after this one in the same session."""
    from tools.workload import TableName, create_demo_table, default_table, drop_table

    suffix = uuid.uuid4().hex[:8]
    home = ROOT / ".cdc-local" / f"deploy-{suffix}"
    home.mkdir(parents=True)
    u = urlsplit(pg_uri)
    slot = f"cdc_deploy_{suffix}"
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    tables = {name: f"deploy_{suffix}_{name}" for name in SCENARIO_TABLES}
    for name, rows in SCENARIO_TABLES.items():
        create_demo_table(pg_uri, TableName("public", tables[name]), rows)
    # two more sources from a sources config (dags/cdc_sources.py), one per database, and the
    # example consumer DAG scheduled on their mirrors' Assets
    config_tables = {"cfg_pg": (pg_uri, TableName("public", f"deploy_{suffix}_cfg")),
                     "cfg_my": (mysql_uri, default_table(mysql_uri, f"deploy_{suffix}_cfg"))}
    for uri, table in config_tables.values():
        create_demo_table(uri, table, CONFIG_ROWS)
    dags = home / "dags"
    dags.mkdir()
    for f in sorted((ROOT / "dags").glob("*.py")):
        (dags / f.name).symlink_to(f)
    (dags / "cdc_mirror_consumer.py").symlink_to(ROOT / "examples" / "cdc_mirror_consumer.py")
    cfg_slot = f"cdc_deploy_cfg_{suffix}"
    log_slot, log_table, log_marks = f"cdc_deploy_log_{suffix}", f"deploy_{suffix}_log", f"wm_log_{suffix}"
    create_demo_table(pg_uri, TableName("public", log_table), CONFIG_ROWS)
    (dags / "cdc_log_source.py").write_text(LOG_DAGS.format(source=LOG_SOURCE, table=f"public.{log_table}", overrides={
        "CDC_SOURCE_CONN_ID": LOG_SOURCE, "CDC_SOURCE": LOG_SOURCE, "CDC_TABLES": f"public.{log_table}",
        "CDC_CHANGELOG_SCHEDULE": "@log", "CDC_CHANGELOG_POLL_SECONDS": "1"}))
    (dags / "cdc_sources.yaml").write_text(json.dumps({
        "defaults": {"changelog_schedule": None, "data_dir": str(home / "data")},
        "sources": {name: {"conn_id": name, "tables": [table.id]} for name, (_, table) in config_tables.items()},
    }))

    env = {
        f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({
            "conn_type": "postgres", "host": u.hostname, "port": u.port or 5432, "login": u.username or "postgres",
            **({"password": u.password} if u.password else {}), "schema": u.path.lstrip("/"),
            "extra": {"slot_name": slot, "publication_name": slot},
        }),
        "AIRFLOW_CONN_CFG_PG": f"{pg_uri}?slot_name={cfg_slot}&publication_name={cfg_slot}",
        "AIRFLOW_CONN_CFG_MY": mysql_uri,
        f"AIRFLOW_CONN_{LOG_SOURCE.upper()}": f"{pg_uri}?slot_name={log_slot}&publication_name={log_slot}"
                                              f"&watermark_table={log_marks}",
        "CDC_TABLES": json.dumps([f"public.{t}" for t in tables.values()]),
        "CDC_SOURCE_CONN_ID": CONN_ID,
        "CDC_DATA_DIR": str(home / "data"),
        "CDC_CHANGELOG_SCHEDULE": CHANGELOG_SCHEDULE,
        "CDC_LOCAL_MAX_ROWS": str(LOCAL_MAX_ROWS),
        # a snapshot merge of SPARK_ROWS goes through spark-submit under the local master too
        # (the scenarios kill and stop a running JVM): the row threshold alone decides
        "CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS": "0",
        "CDC_SENSOR_POKE_INTERVAL": "3",
        # a scenario holds its table's merge after the epoch claim (sinks/mirror_fencing.py)
        "CDC_TEST_MERGE_HOLD_DIR": str(home / "merge-holds"),
    }
    (home / "merge-holds").mkdir(parents=True, exist_ok=True)
    try:
        with launch(pg_uri, home, dags, env=env, dags=ALL_DAGS) as dep:
            dep.tables = tables
            dep.config_tables = config_tables
            dep.log_table = log_table
            dep.started = time.time()
            # the first changelog run creates the slot and publication: the log is captured from here
            run_id = dep.trigger("cdc_changelog", tag="first")
            dep.wait_run("cdc_changelog", run_id, timeout=240)
            yield dep
    finally:
        for _ in range(30):
            try:
                admin.cursor().execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN (%s, %s, %s)",
                    (slot, cfg_slot, log_slot))
                break
            except psycopg2.Error:
                time.sleep(0.5)
        cur = admin.cursor()
        cur.execute(f'DROP PUBLICATION IF EXISTS "{slot}"')
        cur.execute(f'DROP PUBLICATION IF EXISTS "{cfg_slot}"')
        cur.execute(f'DROP PUBLICATION IF EXISTS "{log_slot}"')
        cur.execute(f'DROP TABLE IF EXISTS public."{log_table}"')
        cur.execute(f'DROP TABLE IF EXISTS cdc."{log_marks}"')
        for uri, table in config_tables.values():
            drop_table(uri, table)
        for t in tables.values():
            cur.execute(f'DROP TABLE IF EXISTS public."{t}"')
        admin.close()
        if os.environ.get("CDC_DEPLOY_KEEP", "") != "1":
            shutil.rmtree(home / "data", ignore_errors=True)
