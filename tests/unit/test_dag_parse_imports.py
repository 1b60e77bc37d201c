"""Every task of a round parses its DAG file first: what the DAG files import is paid by every
task. Heavy libraries load in ``execute``, not at parse. The budget is a set of modules, not a
time (timings belong in bench/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
#: loaded only by the tasks that use them: pyarrow.dataset alone brings pandas (~0.5 s)
NOT_AT_PARSE = ("pandas", "pyarrow.dataset", "pyspark", "duckdb", "polars", "sqlglot")

_PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("dagfile", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(m for m in sys.modules if m in json.loads(sys.argv[2]))))
"""


@pytest.mark.slow  # tens of seconds (pytest --durations)
@pytest.mark.parametrize("dag_file", sorted(p.name for p in (ROOT / "dags").glob("cdc_*.py")))
def test_parsing_a_dag_file_loads_no_heavy_library(dag_file):
    out = subprocess.run([sys.executable, "-c", _PROBE, str(ROOT / "dags" / dag_file), json.dumps(NOT_AT_PARSE)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [], f"{dag_file} loads at parse: {out}"
