"""``airflow-cdc snapshot start|resume`` trigger the snapshot DAG as the UI's trigger button does
(a manual run with the conf), and refuse, before triggering anything, a source nobody configured
or a table outside the source's capture scope."""

from __future__ import annotations

import pytest

from airflow_provider_cdc import cli


@pytest.fixture(scope="module")
def serialized_dags():
    """The DAG folder in the metadata database, as the DAG processor writes it (dag.test does the same)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.utils.session import create_session

    manager = DagBundlesManager()
    with create_session() as session:
        manager.sync_bundles_to_db(session=session)
    for bundle in manager.get_all_dag_bundles():
        if not bundle.is_initialized:
            bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)
    _pause("cdc_snapshot", False)  # new DAGs are paused (Airflow's default): a trigger is refused then


def _pause(dag_id: str, paused: bool) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": paused})


def _runs(dag_id: str, prefix: str):
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return [(r.run_id, r.conf, str(r.run_type), str(r.triggered_by), str(r.state)) for r in
                session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id.like(f"{prefix}__%"))]


def _delete_runs(dag_id: str, run_ids) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(DagRun).filter(DagRun.dag_id == dag_id, DagRun.run_id.in_(list(run_ids))).delete(
            synchronize_session=False)


@pytest.fixture
def scoped(monkeypatch, unique_name, tmp_path):
    source = f"cdc_trig_{unique_name}"
    monkeypatch.setenv("CDC_SOURCE", source)
    monkeypatch.setenv("CDC_TABLES", "public.orders")
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("CDC_SOURCES_FILE", raising=False)
    return source


@pytest.mark.parametrize("action", ["start", "resume"])
def test_snapshot_start_and_resume_trigger_a_manual_run_with_the_conf(action, serialized_dags, scoped, capsys):
    before = {r[0] for r in _runs("cdc_snapshot", action)}
    code = cli.run(["snapshot", action, "--table", "public.orders"])
    out = capsys.readouterr()
    assert code == cli.EXIT_OK, out.err
    new = [r for r in _runs("cdc_snapshot", action) if r[0] not in before]
    try:
        assert len(new) == 1, new
        run_id, conf, run_type, triggered_by, state = new[0]
        assert run_id in out.out
        assert conf == {"action": action, "tables": ["public.orders"]}
        assert run_type.endswith("manual") and triggered_by.lower().endswith("cli") and state.endswith("queued"), new
    finally:
        _delete_runs("cdc_snapshot", [r[0] for r in new])


@pytest.mark.parametrize(("args", "says"), [
    (["--source", "no_such_source", "--table", "public.orders"], "source 'no_such_source' is not known"),
    (["--table", "public.Orders"], "did you mean public.orders?"),
    (["--table", "public.customers"], "outside the capture scope"),
])
def test_snapshot_start_refuses_an_unknown_source_or_a_table_outside_the_scope_before_triggering(
        args, says, serialized_dags, scoped, capsys):
    before = {r[0] for r in _runs("cdc_snapshot", "start")}
    code = cli.run(["snapshot", "start", *args])
    err = capsys.readouterr().err
    triggered = {r[0] for r in _runs("cdc_snapshot", "start")} - before
    _delete_runs("cdc_snapshot", triggered)
    assert code == cli.EXIT_ERROR and says in err, err
    assert not triggered


def test_snapshot_start_takes_what_a_conf_takes_and_refuses_what_would_hang_or_fail_raw(
        serialized_dags, scoped, capsys):
    """Issue 58: the options of a run's conf (key ranges, keys, a filter, chunk size, parallelism)
    from the command line, checked as the plan checks them; a DAG Airflow has not parsed, a paused
    DAG (the run would sit queued for ever) and a resume of a finished snapshot are refused,
    saying what to do, before anything is triggered."""
    before = {r[0] for r in _runs("cdc_snapshot", "start")}
    code = cli.run(["snapshot", "start", "--table", "public.orders", "--key-range", '{"start": [1], "end": [100]}',
                    "--chunk-size", "500", "--parallelism", "2", "--where", "amount > 1"])
    out = capsys.readouterr()
    new = [r for r in _runs("cdc_snapshot", "start") if r[0] not in before]
    _delete_runs("cdc_snapshot", [r[0] for r in new])
    assert code == cli.EXIT_OK, out.err
    assert [r[1] for r in new] == [{"action": "start", "tables": ["public.orders"], "chunk_size": 500, "parallelism": 2,
                                    "key_ranges": [{"start": [1], "end": [100]}], "where": "amount > 1"}]
    # the issue's own command: a range of a one-column key, as START:END
    code = cli.run(["snapshot", "start", "--table", "public.orders", "--range", "5000:6000", "--range", "9000:",
                    "--chunk-size", "500", "--parallel", "3"])
    out = capsys.readouterr()
    new = [r for r in _runs("cdc_snapshot", "start") if r[0] not in before]
    _delete_runs("cdc_snapshot", [r[0] for r in new])
    assert code == cli.EXIT_OK, out.err
    assert [r[1] for r in new] == [{"action": "start", "tables": ["public.orders"], "chunk_size": 500, "parallelism": 3,
                                    "key_ranges": [{"start": [5000], "end": [6000]}, {"start": [9000]}]}]
    for args, says in [
        (["--key-range", "1-100"], "--key-range must be JSON"),
        (["--range", "5000-6000"], "--range is START:END"),
        (["--parallelism", "0"], "parallelism"),
        (["--snapshot-dag", "cdc_snapshot_no_such_dag"], "does not know DAG 'cdc_snapshot_no_such_dag' yet"),
    ]:
        code = cli.run(["snapshot", "start", "--table", "public.orders", *args])
        assert code == cli.EXIT_ERROR and says in capsys.readouterr().err, args
    _pause("cdc_snapshot", True)
    try:
        code = cli.run(["snapshot", "start", "--table", "public.orders", "--range", "5000:6000", "--chunk-size", "500"])
        err = capsys.readouterr().err
        assert code == cli.EXIT_ERROR and "is paused" in err and "airflow dags unpause cdc_snapshot" in err, err
    finally:
        _pause("cdc_snapshot", False)
    assert {r[0] for r in _runs("cdc_snapshot", "start")} == before


def test_the_command_prints_its_own_lines_only(serialized_dags, scoped, tmp_path):
    """Issue 58: Airflow's own INFO lines ("creating dag run") cluttered the CLI's output; a
    command prints what it did, and Airflow's warnings and errors only."""
    import os
    import subprocess
    import sys

    before = {r[0] for r in _runs("cdc_snapshot", "start")}
    out = subprocess.run([sys.executable, "-m", "airflow_provider_cdc.cli", "snapshot", "start", "--table",
                          "public.orders"], capture_output=True, text=True, env=dict(os.environ), timeout=300,
                         cwd=str(tmp_path))  # (not the checkout: its egg-info would list the plugin twice)
    new = [r[0] for r in _runs("cdc_snapshot", "start") if r[0] not in before]
    _delete_runs("cdc_snapshot", new)
    assert out.returncode == 0, out.stderr
    assert len(new) == 1 and f"triggered cdc_snapshot run {new[0]}" in out.stdout, out.stdout
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
