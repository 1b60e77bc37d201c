"""OpenLineage through the real OpenLineage provider's listener: ``airflow dags test`` of a
snapshot round and a changelog round, with OpenLineage's file transport, on both databases.
Each COMPLETE event names the right inputs (the source table with its schema facet, staging)
and outputs (staging; the table's event log and mirror with their schema and column lineage
from the source table), by OpenLineage's dataset naming conventions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.sinks.event_log import table_dir
from airflow_provider_cdc.storage.layout import changelog_dir, mirror_dir
from tools import workload as w

from .helpers import SNAPSHOT_CONF

pytestmark = pytest.mark.timeout(900)


def _airflow() -> str:
    return shutil.which("airflow") or str(Path(sys.executable).with_name("airflow"))


def dags_test(dag_id: str, conf: dict | None, events: Path) -> None:
    """``airflow dags test`` with OpenLineage's file transport writing to ``events``."""
    env = dict(os.environ,
               AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(events),
                                                          "append": True}),
               AIRFLOW__OPENLINEAGE__NAMESPACE="cdc-test")
    cmd = [_airflow(), "dags", "test", dag_id] + (["-c", json.dumps(conf)] if conf else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "state=success" in out.replace(" ", ""), out[-4000:]


def completed(events: Path) -> dict[str, dict]:
    """job name -> its last COMPLETE event."""
    out = {}
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("eventType") == "COMPLETE":
            out[ev["job"]["name"]] = ev
    return out


def names(datasets: list[dict]) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in datasets}


def test_a_snapshot_round_and_a_changelog_round_report_their_lineage(pipeline, tmp_path):
    p = pipeline
    events = tmp_path / "ol" / "events.jsonl"
    events.parent.mkdir()
    params = ConnectionParams.from_uri(p.uri)
    scheme = "postgres" if p.scheme == "pg" else "mysql"
    source_ns = f"{scheme}://{params.host}:{params.port}"
    source_name = f"{params.database}.{p.table.schema}.{p.table.name}" if p.scheme == "pg" else p.table.id
    table = (source_ns, source_name)
    with p.dialect() as d:
        columns = [(c.name, c.source_type) for c in d.describe_table(p.table).columns]

    def loc(path: str) -> tuple[str, str]:
        return "file", os.path.abspath(path)

    dags_test("cdc_snapshot", {"action": "start", "tables": [p.table.id], **SNAPSHOT_CONF}, events)
    params_app = w._params(p.uri)
    with w.connect(p.uri) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {w.quote_table(params_app, p.table)} SET {w.quote_ident(params_app, 'amount')} = 7 "
                    f"WHERE {w.quote_ident(params_app, 'id')} <= 10")
        conn.commit()
    dags_test("cdc_changelog", None, events)
    jobs = completed(events)

    def source_input(job: str) -> dict:
        ev = jobs[job]
        hit = [d for d in ev["inputs"] if (d["namespace"], d["name"]) == table]
        assert hit, f"{job}: inputs {names(ev['inputs'])} lack the source table {table}"
        fields = hit[0]["facets"]["schema"]["fields"]
        assert [(f["name"], f["type"]) for f in fields] == columns, job
        return ev

    mirror, event_log = loc(mirror_dir(p.data_dir, p.source, p.table)), loc(table_dir(p.data_dir, p.source, p.table))
    # the snapshot: the source table -> the snapshot's chunks -> the event log and the mirror
    chunks = source_input("cdc_snapshot.read_chunks")
    [out] = chunks["outputs"]
    assert out["namespace"] == "file" and f"/staging/{p.source}/chunks/" in out["name"]
    for job, staging in (("cdc_snapshot.merge", None), ("cdc_changelog.apply", changelog_dir(p.data_dir, p.source))):
        ev = source_input(job)
        if staging is not None:
            assert loc(staging) in names(ev["inputs"]), job
        assert names(ev["outputs"]) == {mirror, event_log}, job
        for out in ev["outputs"]:
            assert [f["name"] for f in out["facets"]["schema"]["fields"]] == [c for c, _ in columns]
            lineage = out["facets"]["columnLineage"]["fields"]
            assert set(lineage) == {c for c, _ in columns}
            for column, spec in lineage.items():
                assert [(i["namespace"], i["name"], i["field"]) for i in spec["inputFields"]] == [(*table, column)]
    # the changelog: the source table -> the staged changelog
    capture = source_input("cdc_changelog.capture")
    assert names(capture["outputs"]) == {loc(changelog_dir(p.data_dir, p.source))}
