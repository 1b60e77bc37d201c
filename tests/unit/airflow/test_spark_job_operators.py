"""The merge/apply operators' settings and the input count that picks the engine (the
engines themselves run in tests/integration/test_spark_jobs.py and tests/e2e)."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.operators.spark_jobs import (
    ChangelogApplyOperator,
    SnapshotMergeOperator,
    local_max_rows_from_env,
)
from airflow_provider_cdc.pipeline.spark.common import application_path
from airflow_provider_cdc.settings import DEFAULT_LOCAL_MAX_ROWS


def chunk(seq: int, rows: int) -> dict:
    return ChunkResult("s", "public.t", "x", seq, f"l{seq}", f"h{seq}", f"/tmp/c{seq}.parquet", ChunkRange(), None,
                       (rows,) if rows else None, rows, True).to_dict()


def test_merge_operator_counts_the_round_rows_and_builds_the_job_arguments(tmp_path):
    round_file = tmp_path / "round.json"
    round_file.write_text(json.dumps([[chunk(1, 400), chunk(2, 350)], [chunk(3, 0)]]))  # nested as mapped XCom
    op = SnapshotMergeOperator(task_id="merge", round_file=str(round_file), data_dir="/d", source="src",
                               sinks="events,mirror", local_max_rows=750)
    assert op.input_rows() == 750 <= op.local_max_rows  # at the limit: in the worker
    assert op.application == application_path("merge") and op.name == "cdc-merge"
    assert op.job_arguments() == ["--chunks", str(round_file), "--data-dir", "/d", "--source", "src",
                                  "--sinks", "events,mirror"]
    assert "round_file" in op.template_fields and "application_args" in op.template_fields


def test_apply_operator_counts_nothing_pending_on_an_empty_staging(tmp_path):
    op = ChangelogApplyOperator(task_id="apply", data_dir=str(tmp_path), source="src", database="shop")
    assert op.input_rows() == 0 and op.local_max_rows == DEFAULT_LOCAL_MAX_ROWS
    assert op.job_arguments()[-2:] == ["--database", "shop"]


@pytest.mark.parametrize(
    ("master", "operator", "local_max_rows", "snapshot_max_rows", "rows", "engine"),
    [
        ("local[2]", SnapshotMergeOperator, 750, None, 750, "worker"),  # at the threshold, any master
        ("local[2]", SnapshotMergeOperator, 750, None, 5_000_000, "worker"),  # the default bound, local Spark
        ("local[2]", SnapshotMergeOperator, 750, None, 5_000_001, "spark"),  # past it: Spark's two cores
        ("local", SnapshotMergeOperator, 750, "9000000", 9_000_000, "worker"),
        ("spark://10.0.0.5", SnapshotMergeOperator, 750, None, 751, "spark"),  # a cluster: its cores
        ("yarn", SnapshotMergeOperator, 750, None, 751, "spark"),
        ("local[2]", SnapshotMergeOperator, 0, None, 751, "spark"),  # 0: always spark-submit
        ("local[2]", SnapshotMergeOperator, 750, "0", 751, "spark"),  # the bound off: the threshold alone
        ("local[2]", ChangelogApplyOperator, 750, None, 751, "spark"),  # the apply is not bounded by a group
        (None, SnapshotMergeOperator, 750, None, 751, "spark"),  # the connection unreadable: the threshold
    ],
)
def test_the_engine_follows_the_threshold_and_for_a_snapshot_merge_the_spark_master(
    monkeypatch, master, operator, local_max_rows, snapshot_max_rows, rows, engine
):
    """A snapshot merge in the worker holds one group of chunks at a time: under a Spark master of
    this machine it runs there up to CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS rows (a local Spark has no
    core the worker lacks; past that its two cores beat the worker's one); on a cluster, and for
    the apply, the row threshold decides."""
    if snapshot_max_rows is None:
        monkeypatch.delenv("CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS", raising=False)
    else:
        monkeypatch.setenv("CDC_LOCAL_SNAPSHOT_MERGE_MAX_ROWS", snapshot_max_rows)
    if master is None:
        monkeypatch.delenv("AIRFLOW_CONN_SPARK_ENGINE_TEST", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_ENGINE_TEST", json.dumps({"conn_type": "spark", "host": master}))
    kw = {"round_file": "r.json"} if operator is SnapshotMergeOperator else {}
    op = operator(task_id="t", data_dir="/d", source="s", local_max_rows=local_max_rows,
                  conn_id="spark_engine_test", **kw)
    why = op.in_worker(rows)
    assert ("worker" if why is not None else "spark") == engine
    if why is not None and rows > local_max_rows:
        assert "'spark_engine_test'" in why and "local master" in why


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True])
def test_a_bad_local_max_rows_is_a_clear_error(bad):
    with pytest.raises(ConfigurationError, match=r"SnapshotMergeOperator: local_max_rows must be a whole number >= 0"):
        SnapshotMergeOperator(task_id="m", round_file="r.json", data_dir="/d", source="s", local_max_rows=bad)


def test_local_max_rows_from_the_environment(monkeypatch):
    monkeypatch.delenv("CDC_LOCAL_MAX_ROWS", raising=False)
    assert local_max_rows_from_env() == DEFAULT_LOCAL_MAX_ROWS
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "0")
    assert local_max_rows_from_env() == 0  # always spark-submit
    for bad in ("-5", "many", "1e3"):
        monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", bad)
        with pytest.raises(ConfigurationError, match=rf"CDC_LOCAL_MAX_ROWS must be a whole number >= 0.*{bad!r}"):
            local_max_rows_from_env()


@pytest.mark.parametrize("uri", ["postgresql://u:pw@pg.example:5433/lake", "postgres://u:pw@pg.example:5433/lake"])
def test_the_postgres_sink_takes_a_connection_of_postgresql_s_types(monkeypatch, uri):
    """The sink's target is a PostgreSQL: the types its profile lists (dialects/postgres/profile.py)."""
    from airflow_provider_cdc.operators.spark_jobs import postgres_sink_params

    monkeypatch.setenv("AIRFLOW_CONN_CDC_UNIT_SINK", uri)
    params = postgres_sink_params("cdc_unit_sink")
    assert (params["host"], str(params["port"]), params["dbname"]) == ("pg.example", "5433", "lake")


def test_the_postgres_sink_refuses_a_connection_of_another_database(monkeypatch):
    from airflow_provider_cdc.operators.spark_jobs import postgres_sink_params

    monkeypatch.setenv("AIRFLOW_CONN_CDC_UNIT_SINK", "mysql://u:pw@my.example:3306/lake")
    with pytest.raises(ConfigurationError, match="is of type 'mysql'.*needs a connection of type postgres"):
        postgres_sink_params("cdc_unit_sink")


def test_the_operators_take_every_argument_of_airflows_spark_submit_operator():
    """They hold a SparkSubmitOperator (built in execute) instead of subclassing it: its
    templated arguments are their template fields, its others are handed on as given."""
    import inspect

    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_cdc.operators.spark_submit import _SUBMIT_FIELDS, _SUBMIT_OPTIONS, job_application

    params = {p for p in inspect.signature(SparkSubmitOperator.__init__).parameters if p not in ("self", "kwargs")}
    assert set(_SUBMIT_FIELDS) == set(SparkSubmitOperator.template_fields)
    assert set(_SUBMIT_FIELDS) | _SUBMIT_OPTIONS | {"conn_id"} == params
    assert set(_SUBMIT_FIELDS) <= set(SnapshotMergeOperator.template_fields)
    assert all(job_application(job) == application_path(job) for job in ("merge", "apply"))


def test_the_spark_submit_operator_is_built_from_the_rendered_fields(tmp_path):
    op = ChangelogApplyOperator(task_id="apply", data_dir=str(tmp_path), source="s", conn_id="my_spark",
                                conf={"spark.ui.enabled": "false"}, executor_memory="2g", durable=False,
                                env_vars={"A": "1"}, application_args=["--extra"])
    op.conf = {"spark.ui.enabled": "true"}  # as rendering would set it
    submit = op._submit_operator(["--x", "1"])
    assert type(submit).__name__ == "SparkSubmitOperator" and submit.task_id == "apply"
    assert submit._conn_id == "my_spark" and submit.conf == {"spark.ui.enabled": "true"}
    assert submit._executor_memory == "2g" and submit.durable is False and submit.env_vars == {"A": "1"}
    assert submit.application == application_path("apply") and submit.name == "cdc-apply"
    assert submit.application_args == ["--x", "1"] and op.application_args == ["--extra"]
    hook = submit._get_hook()
    assert op._hook is hook and hook.submit.__name__ == "submit_bound_to_task"

