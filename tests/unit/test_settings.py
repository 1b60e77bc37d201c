"""settings.py: every CDC_* variable parsed in one place, errors that name the variable, a
data location that does not depend on the working directory, and operators that read the
settings when they run, not when the DAG file is parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_cdc import settings
from airflow_provider_cdc.core.errors import ConfigurationError


def test_defaults_put_the_data_under_airflow_home_whatever_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = settings.load({"AIRFLOW_HOME": "/srv/airflow"})
    assert s.data_dir == "/srv/airflow/cdc-data"
    assert (s.conn_id, s.source, s.explicit_source, s.sinks) == ("cdc_source", "cdc_source", None, "events,mirror")
    assert s.changelog_schedule == "* * * * *" and s.snapshot_schedule is None
    assert settings.load({}).data_dir.endswith("/airflow/cdc-data") and str(tmp_path) not in settings.load({}).data_dir


def test_every_variable_is_read():
    s = settings.load({
        "CDC_SOURCE_CONN_ID": "pg", "CDC_DATA_DIR": "s3://b/cdc", "CDC_TABLES": "public.a, public.b",
        "CDC_SINKS": "events, mirror,postgres", "CDC_SPARK_CONN_ID": "spark_cluster",
        "CDC_SPARK_CONF": '{"spark.executor.memory": "4g"}', "CDC_LOCAL_MAX_ROWS": "0",
        "CDC_MAX_PARALLEL_CHUNKS": "8", "CDC_SENSOR_DEFERRABLE": "yes", "CDC_SENSOR_POKE_INTERVAL": "2.5",
        "CDC_SENSOR_TIMEOUT": "600", "CDC_SNAPSHOT_SCHEDULE": "@daily", "CDC_CHANGELOG_SCHEDULE": "none",
        "CDC_CAPTURE_MAX_EVENTS": "1000", "CDC_CAPTURE_SEGMENT_MAX_EVENTS": "0",
    })
    assert (s.conn_id, s.source, s.data_dir, s.tables) == ("pg", "pg", "s3://b/cdc", ("public.a", "public.b"))
    assert (s.sinks, s.spark_conn_id, s.spark_conf) == ("events,mirror,postgres", "spark_cluster",
                                                        {"spark.executor.memory": "4g"})
    assert (s.local_max_rows, s.max_parallel_chunks, s.sensor_deferrable, s.sensor_poke_interval) == (0, 8, True, 2.5)
    assert (s.sensor_timeout, s.snapshot_schedule, s.changelog_schedule) == (600.0, "@daily", None)
    assert (s.capture_max_events, s.capture_segment_max_events) == (1000, 0)
    assert settings.load({"CDC_SOURCE_CONN_ID": "pg", "CDC_SOURCE": "shop"}).source == "shop"


@pytest.mark.parametrize(
    "name, raw",
    [
        ("CDC_SPARK_CONF", "{not json"), ("CDC_SPARK_CONF", "[1]"), ("CDC_LOCAL_MAX_ROWS", "-1"),
        ("CDC_MAX_PARALLEL_CHUNKS", "0"), ("CDC_SENSOR_DEFERRABLE", "maybe"), ("CDC_SENSOR_POKE_INTERVAL", "0"),
        ("CDC_SENSOR_TIMEOUT", "soon"), ("CDC_CAPTURE_MAX_EVENTS", "0"), ("CDC_CAPTURE_SEGMENT_MAX_EVENTS", "x"),
        ("CDC_SINKS", " , "), ("CDC_MIRROR_RETENTION_HOURS", "0.5"), ("CDC_MIRROR_RETENTION_HOURS", "nan"),
        ("CDC_MIRROR_RETENTION_HOURS", "inf"), ("CDC_MIRROR_RETENTION_HOURS", "a week"),
    ],
)
def test_a_bad_value_is_an_error_that_names_the_variable(name, raw):
    with pytest.raises(ConfigurationError, match=name):
        settings.load({name: raw})


def test_operators_read_the_settings_when_they_run_unless_the_dag_gave_a_value(monkeypatch, tmp_path):
    from airflow_provider_cdc.operators.capture import ChangelogCaptureOperator
    from airflow_provider_cdc.operators.snapshot import SnapshotPlanOperator
    from airflow_provider_cdc.operators.spark_jobs import ChangelogApplyOperator
    from airflow_provider_cdc.sensors.high_watermark import HighWatermarkSensor

    monkeypatch.setenv("CDC_DATA_DIR", "/parse/time")
    ops = [SnapshotPlanOperator(task_id="p"), ChangelogCaptureOperator(task_id="c"),
           ChangelogApplyOperator(task_id="a"), HighWatermarkSensor(task_id="s", chunks=[])]
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))  # the worker's environment when the task runs
    monkeypatch.setenv("CDC_SOURCE_CONN_ID", "pg")
    monkeypatch.setenv("CDC_TABLES", "public.t")
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "7")
    assert [op.data_dir for op in ops] == [str(tmp_path)] * 4
    assert ops[0].cdc_conn_id == "pg" and ops[0].hook.source == "pg" and ops[0].default_tables == ("public.t",)
    assert ops[2].source == "pg" and ops[2].local_max_rows == 7 and ops[2].sinks == "events,mirror"
    assert ops[2].job_arguments()[:2] == ["--data-dir", str(tmp_path)]
    given = ChangelogApplyOperator(task_id="g", data_dir="/given", source="src", local_max_rows=3)
    assert (given.data_dir, given.source, given.local_max_rows) == ("/given", "src", 3)


def test_the_dag_files_read_no_setting_the_tasks_can_read_when_they_run(monkeypatch, tmp_path):
    import runpy
    from pathlib import Path

    dags = Path(__file__).resolve().parents[2] / "dags"
    monkeypatch.setenv("CDC_DATA_DIR", "/parse/time")
    snap = runpy.run_path(str(dags / "cdc_snapshot.py"))["dag"]
    log = runpy.run_path(str(dags / "cdc_changelog.py"))["dag"]
    monkeypatch.setenv("CDC_DATA_DIR", str(tmp_path))
    for dag in (snap, log):
        for t in dag.tasks:
            if hasattr(t, "data_dir"):
                assert t.data_dir == str(tmp_path), (dag.dag_id, t.task_id)
    rendered = log.user_defined_macros["cdc_settings"]()
    assert rendered.data_dir == str(tmp_path)


def test_a_data_location_with_percent_is_refused_for_the_delta_mirror():
    """delta-rs reads '%XX' in a path back decoded: the mirror would lose its own files."""
    from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink

    with pytest.raises(ConfigurationError, match="CDC_DATA_DIR '/data/a%20b' contains '%'"):
        settings.load({"CDC_DATA_DIR": "/data/a%20b"})
    assert settings.load({"CDC_DATA_DIR": "/data/a%20b", "CDC_SINKS": "events"}).data_dir == "/data/a%20b"
    with pytest.raises(ConfigurationError, match="contains '%'"):
        MirrorDeltaSink("/data/50%", "src")


def test_object_storage_settings():
    got = settings.load({"CDC_STORAGE_CONN_ID": "lake", "CDC_MIRROR_RETENTION_HOURS": "24"})
    assert (got.storage_conn_id, got.mirror_retention_hours) == ("lake", 24.0)
    assert (settings.load({}).storage_conn_id, settings.load({}).mirror_retention_hours) == (None, 1.0)


def test_airflow_cdc_section_is_read_below_the_environment(monkeypatch):
    """Inside Airflow, [cdc] of airflow.cfg / AIRFLOW__CDC__* gives a setting the CDC_*
    variable does not; the variable wins; a source's overrides win over both."""
    import airflow.configuration  # noqa: F401 - the section is read only where Airflow runs

    from airflow_provider_cdc import settings as s

    for var in ("CDC_LOCAL_MAX_ROWS", "CDC_SINKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AIRFLOW__CDC__LOCAL_MAX_ROWS", "7")
    monkeypatch.setenv("AIRFLOW__CDC__SINKS", "events")
    assert s.airflow_section()["CDC_LOCAL_MAX_ROWS"] == "7"
    assert (s.load().local_max_rows, s.load().sinks) == (7, "events")
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "9")
    assert s.load().local_max_rows == 9
    assert s.load(overrides={"CDC_LOCAL_MAX_ROWS": "3"}).local_max_rows == 3
    monkeypatch.setenv("AIRFLOW__CDC__SENSOR_TIMEOUT", "-1")
    with pytest.raises(ConfigurationError, match="CDC_SENSOR_TIMEOUT"):
        s.load()


def test_every_setting_is_in_the_provider_config_the_readme_and_the_loader():
    from airflow_provider_cdc import get_provider_info
    from airflow_provider_cdc import settings as s

    options = get_provider_info()["config"]["cdc"]["options"]
    assert sorted(options) == sorted(o.key for o in s.OPTIONS)
    # the documentation site's configuration reference (docs/conf.py generates it from OPTIONS)
    import runpy

    reference = runpy.run_path(str(Path(__file__).resolve().parents[2] / "docs" / "conf.py"))["_configuration_reference"]()
    source = Path(s.__file__).read_text()
    for o in s.OPTIONS:
        assert f"`{o.var}`" in reference, f"{o.var} is not in the docs' configuration reference"
        assert " ".join(str(o.description).split()), f"{o.var} has no description for the configuration reference"
        # read by its reader, or composed by load() (which then names it)
        assert o.read is not None or source.count(f'"{o.var}"') >= 2 or o.var.startswith("CDC_CHUNK_"), (
            f"{o.var} is declared but load() never reads it"
        )
        assert options[o.key]["default"] == (o.default and o.default.replace("{", "{{").replace("}", "}}"))
    from airflow.configuration import conf

    assert conf.get("cdc", "spark_conf") == "{}"  # the default as Airflow renders it


def test_staging_retention_hours_default_never_and_bad_values_named():
    from airflow_provider_cdc.core.errors import ConfigurationError
    from airflow_provider_cdc.settings import load

    assert load({}).staging_retention_hours == 72.0
    assert load({"CDC_STAGING_RETENTION_HOURS": "never"}).staging_retention_hours is None
    assert load({"CDC_STAGING_RETENTION_HOURS": "24"}).staging_retention_hours == 24.0
    for bad in ("0.5", "-1", "inf", "soon"):
        with pytest.raises(ConfigurationError, match="CDC_STAGING_RETENTION_HOURS must be a number of hours >= 1"):
            load({"CDC_STAGING_RETENTION_HOURS": bad})


def test_every_setting_is_declared_once_by_its_option():
    """A setting is one Option (variable, default, meaning, how it is read): Settings' fields are
    the options' fields plus the few load composes, the sources config's entry keys are the
    options a source may set, and a default lives in the option alone (load of an empty
    environment gives each option's default)."""
    from dataclasses import fields

    from airflow_provider_cdc import settings, sources_config

    read = [o.field for o in settings.OPTIONS if o.read is not None]
    assert len(read) == len(set(read)), "two options fill one field"
    composed = {"source", "explicit_source", "data_dir", "chunk_sizing"}
    assert {f.name for f in fields(settings.Settings)} == set(read) | composed
    assert sources_config.KEYS == {o.entry: o.var for o in settings.OPTIONS if o.per_source}
    empty = settings.load({"AIRFLOW_HOME": "/tmp/cdc-home"})
    for o in settings.OPTIONS:
        if o.read is not None and o.default is not None:
            assert getattr(empty, o.field) == o.read({o.var: o.default}, o), o.var
