"""Every file in dags/ imports cleanly into Airflow 3's DagBag and defines a DAG.

The scheduler parses DAG files constantly; an import error there hides a DAG silently
from the UI, so it must fail the suite instead. Files whose name starts with "_" are
helpers shared by DAG files and need not define a DAG themselves.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

DAGS = Path(__file__).resolve().parents[2] / "dags"


def dag_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if not p.name.startswith("_"))


def dagbag_problems(folder: Path) -> tuple[list[str], dict[str, list[str]]]:
    """Load ``folder`` like the DAG processor does; return (problems, dag ids per file)."""
    from airflow.dag_processing.dagbag import DagBag

    # safe_mode=False: import every .py file, not only those mentioning "dag"/"airflow",
    # so a file that silently stopped being a DAG file is noticed too.
    # (Airflow 3's DagBag no longer mixes in the example DAGs; those come from a bundle.)
    bag = DagBag(dag_folder=str(folder), safe_mode=False)
    problems = [f"import error in {path}:\n{err}" for path, err in sorted(bag.import_errors.items())]
    by_file: dict[str, list[str]] = {}
    for dag_id, dag in bag.dags.items():
        by_file.setdefault(str(Path(dag.fileloc).resolve()), []).append(dag_id)
    by_file = {k: sorted(v) for k, v in by_file.items()}
    for path in dag_files(folder):
        if str(path.resolve()) not in by_file and not any(str(path) in p for p in problems):
            problems.append(f"{path} defines no DAG (helpers must be named _*.py)")
    return problems, by_file


def test_every_dag_file_imports_and_defines_a_dag(monkeypatch):
    # dags/cdc_sources.py builds DAGs from a sources config: the shipped example's
    monkeypatch.setenv("CDC_SOURCES_FILE", str(DAGS.parent / "examples" / "cdc_sources.example.yaml"))
    # dags/cdc_refresh.py builds its DAG only for a source that refreshes tables (CDC_REFRESH_TABLES)
    monkeypatch.setenv("CDC_REFRESH_TABLES", "public.audit_log")
    problems, by_file = dagbag_problems(DAGS)
    assert not problems, "\n\n".join(problems)
    assert sorted(by_file) == sorted(str(p.resolve()) for p in dag_files(DAGS))
    assert by_file[str((DAGS / "cdc_sources.py").resolve())] == [
        "cdc_changelog__billing", "cdc_changelog__shop", "cdc_refresh__billing", "cdc_refresh__shop",
        "cdc_snapshot__billing", "cdc_snapshot__shop", "cdc_verify__billing", "cdc_verify__shop"]


def test_the_example_consumer_is_scheduled_on_every_configured_mirror(monkeypatch, tmp_path):
    monkeypatch.setenv("CDC_SOURCES_FILE", str(DAGS.parent / "examples" / "cdc_sources.example.yaml"))
    (tmp_path / "consumer.py").write_text((DAGS.parent / "examples" / "cdc_mirror_consumer.py").read_text())
    problems, by_file = dagbag_problems(tmp_path)
    assert not problems, problems
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(tmp_path), safe_mode=False).dags["cdc_mirror_consumer"]
    names = sorted(a.name for a in dag.timetable.asset_condition.objects)
    assert names == ["cdc/billing/billing.invoices/mirror", "cdc/shop/public.customers/mirror",
                     "cdc/shop/public.orders/mirror"]


# The checks above must be able to fail: run them on folders with known content.


def test_dagbag_check_reports_an_import_error(tmp_path):
    (tmp_path / "broken_dag.py").write_text("from airflow.sdk import DAG\nimport no_such_module_xyz\n")
    problems, _ = dagbag_problems(tmp_path)
    assert len(problems) == 1
    assert "broken_dag.py" in problems[0] and "no_such_module_xyz" in problems[0]


def test_dagbag_check_reports_a_file_without_dag(tmp_path):
    (tmp_path / "not_a_dag.py").write_text("VALUE = 1\n")
    (tmp_path / "_helper.py").write_text("VALUE = 2\n")
    problems, _ = dagbag_problems(tmp_path)
    assert problems == [f"{tmp_path / 'not_a_dag.py'} defines no DAG (helpers must be named _*.py)"]


@pytest.mark.parametrize("n_dags", [1, 2])
def test_dagbag_check_accepts_a_valid_dag_file(tmp_path, n_dags):
    body = "import pendulum\nfrom airflow.sdk import DAG\n" + "".join(
        textwrap.dedent(
            f"""
            with DAG("ok_{i}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
                pass
            """
        )
        for i in range(n_dags)
    )
    (tmp_path / "ok_dag.py").write_text(body)
    problems, by_file = dagbag_problems(tmp_path)
    assert problems == []
    assert by_file == {str((tmp_path / "ok_dag.py").resolve()): [f"ok_{i}" for i in range(n_dags)]}
