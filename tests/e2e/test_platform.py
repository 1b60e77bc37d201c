"""The platform the provider runs on, as a user meets it: the venv's `airflow` lists the
provider, and `spark-submit --master local[2]` from PATH runs a PySpark job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

VENV_BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    """The venv's own tool: that is what Airflow workers and SparkSubmitOperator run."""
    path = VENV_BIN / name
    assert path.exists(), f"{name} not found in {VENV_BIN}; run `make setup`"
    return str(path)


def test_airflow_providers_list_shows_the_provider():
    assert os.environ.get("AIRFLOW_HOME"), "AIRFLOW_HOME is not set; source scripts/env.sh"
    out = subprocess.run(
        [_tool("airflow"), "providers", "list", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    providers = {p["package_name"]: p for p in json.loads(out.stdout)}
    assert "airflow-provider-cdc" in providers, sorted(providers)
    from airflow_provider_cdc import __version__

    assert providers["airflow-provider-cdc"]["version"] == __version__
    # The Spark provider the DAGs submit jobs with is installed next to ours.
    assert "apache-airflow-providers-apache-spark" in providers


def test_spark_submit_local_runs_a_pyspark_job(tmp_path):
    # SparkSubmitOperator runs a bare `spark-submit`: it must be the venv's one on PATH.
    spark_submit = shutil.which("spark-submit")
    assert spark_submit, "spark-submit is not on PATH; source scripts/env.sh"
    assert Path(spark_submit).resolve().parent in (VENV_BIN.resolve(), VENV_BIN), spark_submit

    out_dir = tmp_path / "out"
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import sys
            from pyspark.sql import SparkSession, functions as F

            spark = SparkSession.builder.appName("cdc-platform-check").getOrCreate()
            n = int(sys.argv[2])
            df = spark.range(n, numPartitions=4).withColumn("parity", F.col("id") % 2)
            agg = df.groupBy("parity").agg(F.count("*").alias("n"), F.sum("id").alias("total"))
            agg.coalesce(1).write.mode("overwrite").json(sys.argv[1])
            print("master=" + spark.sparkContext.master)
            spark.stop()
            """
        )
    )
    n = 10_001
    proc = subprocess.run(
        [
            spark_submit,
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",  # not 200 tasks for a two-group aggregate
            str(job),
            str(out_dir),
            str(n),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "master=local[2]" in proc.stdout
    rows = [
        json.loads(line) for f in sorted(out_dir.glob("part-*.json")) for line in f.read_text().splitlines()
    ]
    by_parity = {r["parity"]: r for r in rows}
    evens, odds = range(0, n, 2), range(1, n, 2)
    assert by_parity == {
        0: {"parity": 0, "n": len(evens), "total": sum(evens)},
        1: {"parity": 1, "n": len(odds), "total": sum(odds)},
    }


def test_airflow_dags_test_runs_a_dag_against_the_project_airflow_home(tmp_path):
    """The Airflow home prepared by the setup (migrated SQLite metadata) runs a DAG with a
    task and an XCom through `airflow dags test`, the way the project's DAGs are run."""
    marker = tmp_path / "ran.txt"
    (tmp_path / "platform_check_dag.py").write_text(
        textwrap.dedent(
            f"""
            import pendulum
            from airflow.sdk import DAG, task

            with DAG("cdc_platform_check", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
                @task
                def produce():
                    return 20

                @task
                def consume(value):
                    open({str(marker)!r}, "w").write(str(value + 22))

                consume(produce())
            """
        )
    )
    env = dict(os.environ, AIRFLOW__CORE__DAGS_FOLDER=str(tmp_path))
    proc = subprocess.run(
        [_tool("airflow"), "dags", "test", "cdc_platform_check"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert marker.read_text() == "42"
