"""``python -m bench capture_memory`` at tiny sizes on the real databases: it runs through
(the transaction probes, the large-value capture and chunk) and prints its tables and the
targets with a verdict."""

from __future__ import annotations

import json

import pytest

from bench import bench_capture_memory as b


@pytest.mark.parametrize("kind", ["postgres", "mysql"])
def test_bench_runs_at_tiny_sizes(kind, request, capsys):
    uri = request.getfixturevalue("pg_uri" if kind == "postgres" else "mysql_uri")
    flag = "--pg-uri" if kind == "postgres" else "--mysql-uri"
    # PostgreSQL: watermarks as log messages, so the slot publishes the test's table alone. Under the
    # default, the database's shared watermark table (cdc.watermark) is published too, and a source
    # of a test running beside this one (make test runs two sessions) adds its watermark to the count
    own = ["--capture-option", "watermark_strategy=log"] if kind == "postgres" else []
    rc = b.main(["--dialects", kind, flag, uri, "--rows", "50,300", "--value-mb", "1", "--value-rows", "1", *own])
    out = capsys.readouterr().out
    assert rc == 0, out
    (res,) = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    assert [r["rows"] for r in res["transactions"]] == [50, 300]
    # the UPDATE of N rows is N change events (MariaDB: one per row image pair); the watermark rows
    # that sources of tests running beside this one write to the shared watermark table are not
    assert [r["events"] - r["watermarks"] for r in res["transactions"]] == [50, 300]
    values = res["values"]["capture"]
    assert values["events"] - values["watermarks"] == 1 and res["values"]["chunk"]["rows"] == 1
    assert "## Targets" in out
    assert "300-row peak within 250 MB of the 50-row peak" in out
    assert "1 MB value through the chunk" in out
