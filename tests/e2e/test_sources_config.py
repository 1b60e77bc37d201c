"""Many sources from one config: dags/cdc_sources.py builds a snapshot and a changelog DAG for
a PostgreSQL and a MariaDB source of one YAML file; both run through dag.test() while the
environment points at neither (its data location is a decoy that must stay empty), end
with verify (mirror == source), and each commit's Asset events reach Airflow's database
with the table's position and counts.

The scheduler side (a downstream DAG scheduled on mirror Assets runs after them) is in the
deployment tier (tests/deployment/test_scenarios.py).
"""

from __future__ import annotations

import runpy
import time
import uuid
from pathlib import Path

import pytest
import yaml

from airflow_provider_cdc.cli import run as cli_run
from tools import workload as w

from .helpers import Pipeline, asset_events

ROOT = Path(__file__).resolve().parents[2]
ROWS = 1500


class ConfigPipeline(Pipeline):
    """A Pipeline whose DAGs come from the sources config, not from the environment."""

    def __init__(self, uri: str, name: str, data_dir: Path, decoy: Path, monkeypatch) -> None:
        super().__init__(uri, name, data_dir, monkeypatch)
        self.source = f"cfg_{name}"
        for var in ("CDC_SOURCE_CONN_ID", "CDC_TABLES", "CDC_SOURCE"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("CDC_DATA_DIR", str(decoy))  # what the tasks would use without the config

    def dialect(self):
        """The test's own dialect: the capture scope is the config's, not in the environment."""
        from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook

        return CdcSourceHook(self.conn_id, tables=[self.table.id], all_tables=False).get_dialect(source=self.source)

    def entry(self) -> dict:
        return {"conn_id": self.conn_id, "tables": [self.table.id], "data_dir": self.data_dir,
                "changelog_schedule": None, "throttle": {"chunk_size": 200, "parallelism": 2}}

    def load_dag(self, dag_id: str):
        """The DAG of this source that dags/cdc_sources.py builds from the config."""
        built = runpy.run_path(str(ROOT / "dags" / "cdc_sources.py"), run_name=f"cfg_{uuid.uuid4().hex[:6]}")
        return next(v for v in built.values() if getattr(v, "dag_id", None) == f"{dag_id}__{self.source}")


@pytest.mark.timeout(900)
def test_two_sources_from_one_config(pg_uri, mysql_uri, unique_name, tmp_path, monkeypatch, capsys):
    decoy = tmp_path / "decoy"
    pipes = [ConfigPipeline(pg_uri, f"{unique_name}p", tmp_path / "pg", decoy, monkeypatch),
             ConfigPipeline(mysql_uri, f"{unique_name}m", tmp_path / "my", decoy, monkeypatch)]
    config = tmp_path / "cdc_sources.yaml"
    config.write_text(yaml.safe_dump({"defaults": {"sinks": ["events", "mirror"]},
                                      "sources": {p.source: p.entry() for p in pipes}}))
    monkeypatch.setenv("CDC_SOURCES_FILE", str(config))
    try:
        for p in pipes:
            w.create_demo_table(p.uri, p.table, ROWS)
            p.capture_now()
        for p in pipes:
            p.run("cdc_snapshot", {"action": "start"})  # tables and chunk size from the config
            assert p.progress().status == "done"
            events = asset_events(p.source, p.table.id)
            merged = [e for e in events if "chunks" in e]
            assert sum(e["chunks"] for e in merged) >= ROWS // 200  # the config's chunk_size, not 10,000
            assert merged and merged[-1]["snapshot_id"] == p.progress().snapshot_id
            assert merged[-1]["chunk_rows"] > 0 and merged[-1]["position"]
            # the commit that finished the snapshot: one more event, the whole table converged
            (done,) = [e for e in events if e.get("snapshot_done")]
            assert done["snapshot_id"] == p.progress().snapshot_id and done["rows"] == ROWS
            assert done["swept_rows"] == 0 and done["converged_at"]
            with w.connect(p.uri) as conn, conn.cursor() as cur:
                cur.execute(f"DELETE FROM {w.quote_table(w._params(p.uri), p.table)} WHERE id <= 10")
                conn.commit()
            p.catch_up()
            p.assert_equal()
            # the CLI finds the source in the config: its connection and data location
            assert cli_run(["verify", "--source", p.source, "--table", p.table.id, "--events"]) == 0
            assert f"data dir {p.data_dir}" in capsys.readouterr().out
            applied = [e for e in asset_events(p.source, p.table.id) if "events" in e]
            assert applied and sum(e["events"] for e in applied) >= 10, applied
            assert applied[-1]["position"] > merged[-1]["position"]
            # the range the apply made visible and the commit time of its newest change
            last = applied[-1]
            assert last["from_position"] is None or last["from_position"] < last["position"]
            assert last["committed_at"] is not None and abs(time.time() - last["committed_at"]) < 3600
        assert not decoy.exists(), "a task used the environment's data location instead of its source's"
    finally:
        for p in pipes:
            p.cleanup()
