"""The suite's Spark JVMs map Spark's classes from the archive `make test` makes
(tools/spark_jvm.py): a class path that drifts from the archive's (a SPARK_CONF_DIR on the
suite's environment, another pyspark) turns it off silently, and every Spark test costs its
JVM's full start again."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import IN_CI, SPARK_CLASSES
from tools import spark_jvm


def test_a_spark_submit_of_the_suite_loads_sparks_classes_from_the_archive():
    archive = SPARK_CLASSES / spark_jvm.ARCHIVE
    if not archive.exists():
        msg = f"no class archive at {archive}: `make test` makes it (python -m tools.spark_jvm {SPARK_CLASSES})"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    env = dict(os.environ)
    assert env["SPARK_SUBMIT_OPTS"] == spark_jvm.environment(SPARK_CLASSES)["SPARK_SUBMIT_OPTS"]
    env["SPARK_SUBMIT_OPTS"] += " -Xlog:class+load=info"
    proc = subprocess.run(["spark-submit", "--version"], env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # Spark's classes from its jars (a lambda's class is made at run time, never archived)
    spark = [ln for ln in out.splitlines() if "[class,load] org.apache.spark." in ln and "$$Lambda" not in ln]
    shared = [ln for ln in spark if "shared objects file (top)" in ln]
    assert spark, out[-3000:]
    assert len(shared) == len(spark), (
        f"{len(spark) - len(shared)} of {len(spark)} Spark classes were not mapped from {archive}, "
        f"e.g. {next(ln for ln in spark if ln not in shared)}"
    )
