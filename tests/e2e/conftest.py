"""Shared e2e fixtures."""

from __future__ import annotations

import pytest

from tools import workload as w

from .test_snapshot_invariants import ROWS, Pipeline


@pytest.fixture(params=["pg", "mysql"])
def pipeline(request, unique_name, tmp_path, monkeypatch):
    """One source and one demo table of ROWS rows, on each database; its changelog exists."""
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    p = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    w.create_demo_table(uri, p.table, ROWS)
    p.capture_now()
    yield p
    p.cleanup()  # before monkeypatch's undo: it needs the test's connection
