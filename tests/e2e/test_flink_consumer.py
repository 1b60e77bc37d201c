"""The consumer tier: Apache Flink (PyFlink, ``debezium-json``) reads ``export-debezium --form
value`` exports of both databases with the settings of docs/outputs.md ("Consuming the Debezium JSON"),
and the table it rebuilds equals the mirror row for row: a snapshot under live writers on the
demo table, and a table of every supported type with inserts, updates and deletes after its
snapshot. Slow (a PyFlink virtualenv of its own, a JVM per read): marked ``consumer``, run by
``make test`` and CI (``make test-consumer`` alone).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.arrow_types import arrow_canonical
from airflow_provider_cdc.core.schema import TableSchema
from airflow_provider_cdc.export.debezium import DebeziumOptions, TableExport, export_table
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import schema_path
from tools import workload as w

from ..integration.helpers import MY_COLUMNS, PG_COLUMNS, assert_conforms
from .helpers import Pipeline

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.consumer, pytest.mark.timeout(1200)]

_FLINK_TYPES = {"int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT", "float": "FLOAT",
                "double": "DOUBLE", "boolean": "BOOLEAN", "string": "STRING", "bytes": "BYTES"}


@pytest.fixture(scope="session")
def flink_python() -> str:
    """The PyFlink interpreter (scripts/flink_env.sh builds its virtualenv on first use)."""
    out = subprocess.run([str(ROOT / "scripts" / "flink_env.sh")], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, f"scripts/flink_env.sh failed: {out.stderr[-3000:]}"
    return out.stdout.strip().splitlines()[-1]


def flink_type(node: dict) -> str:
    """The Flink SQL type of a Debezium schema node, as its raw JSON type (README: Flink's JSON
    format does not decode Kafka Connect's logical types)."""
    if node["type"] == "struct":
        return "ROW<" + ", ".join(f"`{f['field']}` {flink_type(f)}" for f in node["fields"]) + ">"
    if node["type"] == "array":
        return f"ARRAY<{flink_type(node['items'])}>"
    return _FLINK_TYPES[node["type"]]


def flink_columns(export: str) -> tuple[list, list[dict]]:
    """The Flink table's columns for ``export`` (from the envelope's "after" schema) and that
    schema's fields."""
    with open(export) as f:
        fields = json.loads(f.readline())["schema"]["fields"][1]["fields"]
    return [[f["field"], flink_type(f)] for f in fields], fields


def run_flink(flink_python: str, export: str, columns: list, primary_key: list[str]) -> list[dict]:
    """The rows of the table Flink rebuilds from ``export`` (tools/flink_consume.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK", "SPARK", "PYTHONPATH"))}
    proc = subprocess.run(
        [flink_python, str(ROOT / "tools" / "flink_consume.py"), "--export", export, "--columns", json.dumps(columns),
         "--key", json.dumps(primary_key)],
        capture_output=True, text=True, timeout=900, env=env, cwd=str(ROOT),
    )
    assert proc.returncode == 0, f"Flink could not read the export:\n{proc.stderr[-6000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def mirror_as_debezium(p: Pipeline) -> tuple[TableSchema, list[dict]]:
    """The mirror's live rows as the Debezium payload values the export writes for them."""
    schema = TableSchema.from_json(storage.read_text(schema_path(p.data_dir, p.source, p.table)))
    mirror = read_mirror(p.data_dir, p.source, p.table)
    cols = [arrow_canonical(mirror.column(c.name), c.type) for c in schema.columns]
    exp = TableExport(schema, DebeziumOptions("srv"))
    rows = [exp.image(dict(zip(schema.column_names, values, strict=True))) for values in zip(*cols, strict=True)]
    return schema, json.loads(json.dumps(rows))


def same(a, b, node: dict | None) -> bool:
    """Equal, floats to their type's precision (Flink reads a FLOAT as 32 bits)."""
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, str) or isinstance(b, str):  # "NaN" / "Infinity" as Jackson quotes them
            return str(a) == str(b) or (str(a).lower() == "nan" and str(b).lower() == "nan")
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], None) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y, None) for x, y in zip(a, b, strict=True))
    return a == b


def assert_flink_rebuilds_the_mirror(p: Pipeline, flink_python: str, tmp_path: Path) -> int:
    export = str(tmp_path / "export" / f"{p.table.name}.jsonl")
    n = export_table(p.data_dir, p.source, p.table, export, DebeziumOptions("srv", form="value"))
    assert n > 0
    with open(export) as f:
        for line in f:
            assert_conforms(json.loads(line))
    schema, expected = mirror_as_debezium(p)
    columns, fields = flink_columns(export)
    t0 = time.monotonic()
    got = run_flink(flink_python, export, columns, list(schema.primary_key))
    print(f"Flink read {n} records of {p.table} in {time.monotonic() - t0:.1f} s")

    def key(row):
        return json.dumps([row[k] for k in schema.primary_key])

    want = {key(r): r for r in expected}
    have = {key(r): r for r in got}
    assert have.keys() == want.keys(), (sorted(set(have) ^ set(want)))[:10]
    nodes = {f["field"]: f for f in fields}
    diffs = [(k, c, want[k].get(c), have[k].get(c)) for k in want for c in nodes
             if not same(want[k].get(c), have[k].get(c), nodes[c])]
    assert diffs == [], diffs[:10]
    return len(want)


def test_flink_rebuilds_the_mirror_of_a_snapshot_under_writers(pipeline, flink_python, tmp_path):
    p = pipeline
    with w.BackgroundWriter(p.uri, p.table, threads=2, rate=100, seed=41) as writer:
        p.snapshot()
        time.sleep(0.5)
    assert writer.stats().committed > 0
    p.catch_up()
    p.assert_equal()
    assert assert_flink_rebuilds_the_mirror(p, flink_python, tmp_path) == w.count_rows(p.uri, p.table)


@contextmanager
def own_table(request, db: str, unique_name: str, tmp_path: Path, monkeypatch):
    """A Pipeline on a table the test creates (``{qt}`` names it in the test's SQL), its
    connection and cursor (MariaDB: sql_mode '' for zero dates); dropped afterwards with any
    SQL the test added to the returned list."""
    uri = request.getfixturevalue("pg_uri" if db == "pg" else "mysql_uri")
    p = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    conn = w.connect(uri)
    cur = conn.cursor()
    if db != "pg":
        cur.execute("SET SESSION sql_mode = ''")  # zero dates are values
    after: list[str] = []
    try:
        yield p, conn, cur, w.quote_table(w._params(uri), p.table), after
    finally:
        conn.rollback()
        p.cleanup()
        for sql in after:
            cur.execute(sql)
        conn.commit()
        conn.close()


@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_flink_reads_every_supported_type(request, db, unique_name, tmp_path, monkeypatch, flink_python):
    """The export tests' every-type table (tests/integration/test_debezium_export.py), three rows
    snapshotted, then an update, a delete and an insert through the changelog."""
    columns = PG_COLUMNS if db == "pg" else MY_COLUMNS
    with own_table(request, db, unique_name, tmp_path, monkeypatch) as (p, conn, cur, qt, after):
        q = w.quote_ident
        params = w._params(p.uri)
        if db == "pg":
            u = unique_name
            after += [f"DROP TYPE IF EXISTS mood_{u}", f"DROP DOMAIN IF EXISTS posint_{u}"]
            cur.execute(f"CREATE TYPE mood_{u} AS ENUM ('happy', 'sad')")
            cur.execute(f"CREATE DOMAIN posint_{u} AS integer CHECK (VALUE > 0)")
            cols = ", ".join(f'"{c}" {ty.replace("{enum}", f"mood_{u}").replace("{domain}", f"posint_{u}")}'
                             for c, ty, *_ in columns)
        else:
            cols = ", ".join(f"`{c}` {ty}" for c, ty, *_ in columns)
        cur.execute(f"CREATE TABLE {qt} ({q(params, 'id')} INT PRIMARY KEY, {cols})")
        if db == "pg":
            cur.execute(f"ALTER TABLE {qt} REPLICA IDENTITY FULL")  # Flink needs before images (docs/outputs.md)
        values = ", ".join(lit for _, _, lit, *_ in columns)
        for i in (1, 2, 3):
            cur.execute(f"INSERT INTO {qt} VALUES ({i}, {values})")
        conn.commit()
        p.capture_now()
        p.snapshot()
        assert p.progress().status == "done"
        text = next(c for c, ty, *_ in columns if "text" in ty.lower() or "char" in ty.lower())
        cur.execute(f"UPDATE {qt} SET {q(params, text)} = 'changed' WHERE {q(params, 'id')} = 2")
        cur.execute(f"DELETE FROM {qt} WHERE {q(params, 'id')} = 3")
        cur.execute(f"INSERT INTO {qt} ({q(params, 'id')}) VALUES (4)")
        conn.commit()
        p.catch_up()
        p.assert_equal()
        assert assert_flink_rebuilds_the_mirror(p, flink_python, tmp_path) == 3


def test_flink_keeps_distinct_zero_date_keys_distinct(request, unique_name, tmp_path, monkeypatch, flink_python):
    """MariaDB zero dates as a primary key (README: their non-null day numbers): Flink's NOT NULL
    key accepts every record and the five keys stay five, through a snapshot and a changelog."""
    with own_table(request, "mysql", unique_name, tmp_path, monkeypatch) as (p, conn, cur, qt, _after):
        cur.execute(f"CREATE TABLE {qt} (`d` DATE NOT NULL PRIMARY KEY, `at` DATETIME(6) NOT NULL, `v` INT)")
        dates = ["0000-00-00", "2024-00-00", "2024-05-00", "0000-01-01"]
        cur.executemany(f"INSERT INTO {qt} VALUES (%s, %s, 1)", [(d, f"{d} 10:00:00.5") for d in dates])
        conn.commit()
        p.capture_now()
        p.snapshot()
        cur.execute(f"UPDATE {qt} SET `v` = 2, `at` = '2024-00-00 11:00:00' WHERE `d` = '2024-00-00'")
        cur.execute(f"INSERT INTO {qt} VALUES ('2024-01-15', '2024-01-15 00:00:00', 3)")
        conn.commit()
        p.catch_up()
        p.assert_equal()
        assert assert_flink_rebuilds_the_mirror(p, flink_python, tmp_path) == 5
