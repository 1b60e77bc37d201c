"""core/ must import nothing from Airflow, Spark or a database driver, even indirectly.

pyarrow is allowed: Arrow is the data model of the one DBLog window (core/window.py), which
every engine calls on Arrow tables (docs/DESIGN.md, Layout)."""

import subprocess
import sys

FORBIDDEN = ("airflow", "pyspark", "psycopg2", "pymysql", "pymysqlreplication", "deltalake", "MySQLdb", "adbc_driver_postgresql")


def test_core_imports_no_airflow_spark_or_driver():
    code = (
        "import sys, pkgutil, importlib, airflow_provider_cdc.core as c\n"
        "for m in pkgutil.walk_packages(c.__path__, c.__name__ + '.'):\n"
        "    importlib.import_module(m.name)\n"
        f"bad = sorted(n for n in sys.modules if n.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"airflow_provider_cdc.core imported forbidden modules: {out}"
