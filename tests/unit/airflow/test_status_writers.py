"""Every writer of a snapshot's status against every other, with the other's write forced
between this one's read and its write (the interleaving a load-modify-save would lose), on
the real progress store (the register in the data directory). The two-plan-runs case needs
a source: tests/e2e/test_status_writers.py."""

from __future__ import annotations

import shutil

import pytest

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.operators.snapshot import (
    SnapshotCommitOperator,
    SnapshotPlanOperator,
    mark_failed,
    pause_for_dag_pause,
)
from airflow_provider_cdc.pipeline import snapshot_state as authority
from airflow_provider_cdc.pipeline.snapshot import SEQ_STRIDE

from .helpers import T, committed, ctx, progress


@pytest.fixture
def interleave(monkeypatch):
    """``interleave(action)``: the next update of the progress (every writer's goes through
    pipeline.snapshot_state.update) runs ``action()`` once, after
    its read and before its write (the writer under test then conflicts and reads again)."""
    real = authority.update
    pending: list = []

    def update(store, source, table_id, change, **kw):
        def between():
            if pending:
                pending.pop()()  # popped first: the action's own update passes through here too
        return real(store, source, table_id, change, between=between, written=kw.get("written"))

    monkeypatch.setattr(authority, "update", update)
    return pending.append


def stored(tmp_path):
    return airflow_variables.read("src", T.id, str(tmp_path))


def test_a_stop_that_lands_while_a_chunk_task_pauses_for_the_dag_pause_stays(tmp_path, variables, interleave):
    progress(tmp_path)
    interleave(lambda: airflow_variables.request("src", T.id, "stop", str(tmp_path)))
    assert pause_for_dag_pause("src", T.id, "S1", str(tmp_path)) is False
    assert stored(tmp_path).progress.status == "stopped"


def test_a_pause_that_lands_while_a_stop_is_written_is_stopped_over(tmp_path, variables, interleave):
    progress(tmp_path)
    interleave(lambda: pause_for_dag_pause("src", T.id, "S1", str(tmp_path)))
    assert airflow_variables.request("src", T.id, "stop", str(tmp_path)).status == "stopped"
    assert stored(tmp_path).version == 3  # start, the pause, the stop on top of it


def test_a_failure_callback_does_not_undo_a_commit_that_finished_meanwhile(tmp_path, variables, interleave):
    progress(tmp_path)
    a = committed(tmp_path, 0, 0, 49, 50, True)
    b = committed(tmp_path, SEQ_STRIDE, 1, 100, 51, True)
    commit = SnapshotCommitOperator(task_id="commit", chunks=[a.to_dict(), b.to_dict()], data_dir=str(tmp_path),
                                    source="src", cdc_conn_id="unused")
    interleave(lambda: commit.execute({}))
    assert mark_failed("src", [(T.id, "S1")], "task merge failed: late", str(tmp_path)) == []
    got = stored(tmp_path).progress
    assert got.status == "done" and got.error is None and got.rows == 101


def test_a_commit_keeps_a_failure_that_landed_meanwhile_and_still_records_its_chunks(tmp_path, variables,
                                                                                     interleave):
    progress(tmp_path)
    a = committed(tmp_path, 0, 0, 49, 50, True)
    b = committed(tmp_path, SEQ_STRIDE, 1, 100, 51, True)
    interleave(lambda: mark_failed("src", [(T.id, "S1")], "task chunk failed: disk full", str(tmp_path)))
    SnapshotCommitOperator(task_id="commit", chunks=[a.to_dict(), b.to_dict()], data_dir=str(tmp_path),
                           source="src", cdc_conn_id="unused").execute({})
    got = stored(tmp_path).progress
    assert got.status == "failed" and got.error == "task chunk failed: disk full"
    assert got.rows == 101 and got.table(T.id).done  # merged chunks are recorded; resume then finishes it
    assert plan_resume(tmp_path) == [] and stored(tmp_path).progress.status == "done"


def plan_resume(tmp_path):
    return SnapshotPlanOperator(task_id="plan", data_dir=str(tmp_path), cdc_conn_id="unused", source="src",
                                cdc_overrides={"CDC_TABLES": T.id}).execute(ctx({"action": "resume", "tables": [T.id]}))


def test_a_retried_commit_racing_its_first_attempt_records_each_chunk_once(tmp_path, variables, interleave):
    progress(tmp_path)
    a = committed(tmp_path, 0, 0, 9, 10, False)
    b = committed(tmp_path, 1, 0, 19, 10, False, after=9)

    def op():
        return SnapshotCommitOperator(task_id="commit", chunks=[a.to_dict(), b.to_dict()], data_dir=str(tmp_path),
                                      source="src", cdc_conn_id="unused")

    interleave(lambda: op().execute({}))  # the zombie first attempt writes between the retry's read and write
    out = op().execute({})
    got = stored(tmp_path)
    assert out[T.id]["rows"] == 20 and got.progress.rows == 20 and got.progress.chunks == 2
    assert got.progress.status == "running"
    assert got.version == 3  # start, the first attempt, the retry's write on top of it (recording nothing new)


def test_the_variable_is_a_copy_written_after_the_authority(tmp_path, variables):
    p = progress(tmp_path)
    key = airflow_variables.variable_key("src", T.id)
    assert variables.store[key] == p.to_json()
    airflow_variables.request("src", T.id, "pause", str(tmp_path))
    assert '"status":"paused"' in variables.store[key]
    variables.store[key] = variables.store[key].replace('"paused"', '"running"')  # a stale or edited copy
    assert airflow_variables.status("src", T.id, str(tmp_path)) == "paused"  # decisions read the authority
    shutil.rmtree(tmp_path / "control")  # the authority removed (a data dir deleted): the copy is never read back
    assert airflow_variables.load("src", T.id, str(tmp_path)) is None


def test_a_failing_capture_is_recorded_where_status_and_the_page_look_first(variables, monkeypatch, tmp_path, gauges):
    """Issue 58: with the slot dropped or a keyless table in scope, cdc_changelog failed every
    minute while status showed "0 s behind the log". A failed capture now marks the source's lag
    record as failing (since, attempts, the error, never a credential); status and the CDC page
    say so before the last good reading; the next good capture clears it."""
    import json

    import pytest
    from airflow.sdk._shared.secrets_masker import mask_secret

    from airflow_provider_cdc import airflow_variables
    from airflow_provider_cdc.cli import describe_lag
    from airflow_provider_cdc.core.errors import SourceError
    from airflow_provider_cdc.operators import capture as capture_op
    from airflow_provider_cdc.pipeline import capture as capture_pipeline
    from airflow_provider_cdc.ui.page import render

    mask_secret("hunter2")  # as a task registers the password of each connection it reads
    airflow_variables.save_lag("shop", {"bytes": 0, "seconds": 0.0, "holder": "slot 'cdc_shop'", "at": 100.0})

    def refused(*_a, **_k):  # the fault a dropped slot produces, injected
        raise SourceError("replication slot 'cdc_shop' does not exist (password=hunter2)")

    monkeypatch.setattr(capture_pipeline, "run_capture", refused)
    hook = type("Hook", (), {"source": "shop"})()
    for _ in range(2):
        with pytest.raises(SourceError):
            capture_op.capture_changes(hook, str(tmp_path))
    doc = json.loads(variables.store[airflow_variables.lag_key("shop")])
    assert [(s, v, t) for s, v, t in gauges.gauges if s == "cdc.capture.failing"] == [
        ("cdc.capture.failing", 1, {"source": "shop"})] * 2  # the metric an alert rule watches
    assert doc["failing"]["attempts"] == 2 and "does not exist" in doc["failing"]["error"]
    assert "hunter2" not in json.dumps(doc)
    text = describe_lag(doc)
    assert text.startswith("CAPTURE FAILING since") and "2 failed attempt(s)" in text and "last good reading" in text
    html = render([{"source": "shop", "snapshot_dag": "cdc_snapshot", "applied": {}, "lag": doc, "tables": []}],
                  user="u", can_act={})
    assert html.index("capture-failing") < html.index("Capture lag:")
    # status exits non-zero while it fails (it can gate a DAG or a monitor), 0 once it recovers
    import argparse

    from airflow_provider_cdc import cli
    from airflow_provider_cdc.cli import status_cmd

    monkeypatch.setattr(status_cmd, "_data_dir_of", lambda _s: str(tmp_path))
    monkeypatch.setattr(  # the metadata database's listing, of the test's Variables
        airflow_variables,
        "stored_values",
        lambda prefix: [(k, v) for k, v in variables.store.items() if k.startswith(prefix)],
    )
    ask = argparse.Namespace(source=None, caught_up_to=None, live=False, json=False)
    assert cli.cmd_status(ask) == cli.EXIT_MISMATCH
    assert cli.cmd_status(argparse.Namespace(**{**vars(ask), "json": True})) == cli.EXIT_MISMATCH
    airflow_variables.save_lag("shop", {"bytes": 5, "seconds": 1.0, "holder": "slot 'cdc_shop'", "at": 200.0})
    assert "failing" not in json.loads(variables.store[airflow_variables.lag_key("shop")])
    assert cli.cmd_status(ask) == cli.EXIT_OK
