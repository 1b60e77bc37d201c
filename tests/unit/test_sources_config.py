"""The sources config: parsing, the errors it gives, and the DAGs dags/cdc_sources.py builds."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.sources_config import KEYS, parse_sources, read_sources

ROOT = Path(__file__).resolve().parents[2]
ENV = {"CDC_DATA_DIR": "/env/data", "CDC_SOURCE_CONN_ID": "env_conn"}


def test_entries_are_the_defaults_with_each_source_on_top():
    doc = {
        "defaults": {"data_dir": "/lake/cdc", "changelog_schedule": "*/5 * * * *", "local_max_rows": 0},
        "sources": {
            "shop": {"conn_id": "shop_pg", "tables": ["public.orders", "public.a,b"], "throttle": {"chunk_size": 500}},
            "billing": {"conn_id": "billing_mdb", "sinks": ["events"], "changelog_schedule": None,
                        "spark_conf": {"spark.executor.memory": "4g"}, "sensor_deferrable": True},
        },
    }
    shop, billing = parse_sources(doc, env=ENV)
    assert (shop.name, billing.name) == ("shop", "billing")
    assert shop.settings.conn_id == "shop_pg" and shop.settings.source == "shop"
    assert shop.settings.tables == ("public.orders", "public.a,b")  # a JSON list keeps the comma
    assert shop.settings.data_dir == "/lake/cdc" and shop.settings.local_max_rows == 0
    assert shop.settings.changelog_schedule == "*/5 * * * *"
    assert shop.throttle == {"chunk_size": 500}
    assert billing.settings.sinks == "events" and billing.settings.changelog_schedule is None
    assert billing.settings.spark_conf == {"spark.executor.memory": "4g"}
    assert billing.settings.sensor_deferrable is True
    assert billing.overrides["CDC_SOURCE"] == "billing"
    assert set(billing.overrides) <= {"CDC_SOURCE", *KEYS.values()}


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ([], "must be a mapping with a 'sources' key"),
        ({"sources": {}}, "'sources' must be a non-empty mapping"),
        ({"source": {"a": {}}}, "unknown top-level key(s) ['source']"),
        ({"sources": {"a b": {}}}, "source name 'a b'"),
        ({"sources": {"shop": {}, "SHOP": {}}}, "differ only in case"),
        ({"sources": {"shop": {"conn": "x"}}}, "source 'shop': unknown key(s) ['conn']"),
        ({"sources": {"shop": {"local_max_rows": -1}}}, "source 'shop', key 'local_max_rows': CDC_LOCAL_MAX_ROWS"),
        ({"sources": {"shop": {"spark_conf": "4g"}}}, "source 'shop', key 'spark_conf'"),
        ({"sources": {"shop": {"tables": [1]}}}, "source 'shop', key 'tables'"),
        ({"sources": {"shop": {"throttle": {"chunk_size": 0}}}}, "source 'shop', key 'throttle'"),
        ({"defaults": {"data_dir": "ftp://x/y"}, "sources": {"shop": {}}}, "source 'shop', key 'data_dir'"),
        ({"sources": {"shop": "pg"}}, "source 'shop' must be a mapping"),
    ],
)
def test_a_bad_config_names_the_source_and_the_key(doc, expected):
    with pytest.raises(ConfigurationError) as err:
        parse_sources(doc, "cfg.yaml", env=ENV)
    assert expected in str(err.value)
    assert str(err.value).startswith("cfg.yaml")


def test_read_sources_reads_yaml_and_json_and_names_the_file(tmp_path):
    (tmp_path / "a.json").write_text('{"sources": {"shop": {"conn_id": "c"}}}')
    assert read_sources(str(tmp_path / "a.json"), env=ENV)[0].settings.conn_id == "c"
    (tmp_path / "b.yaml").write_text("sources:\n  shop: [unclosed\n")
    with pytest.raises(ConfigurationError, match=r"b\.yaml: not valid YAML or JSON"):
        read_sources(str(tmp_path / "b.yaml"), env=ENV)


def test_cdc_sources_builds_two_dags_per_source_whose_tasks_read_their_source(tmp_path, monkeypatch):
    from airflow.sdk import DAG, AssetAlias

    cfg = tmp_path / "cdc_sources.yaml"
    cfg.write_text(
        "defaults: {data_dir: /lake/cdc}\n"
        "sources:\n"
        "  shop: {conn_id: shop_pg, tables: [public.orders], snapshot_schedule: '@daily', throttle: {parallelism: 3}}\n"
        "  billing: {conn_id: billing_mdb, sinks: events, max_parallel_chunks: 2}\n"
    )
    monkeypatch.setenv("CDC_SOURCES_FILE", str(cfg))
    monkeypatch.setenv("CDC_DATA_DIR", "/env/data")
    monkeypatch.setenv("CDC_LOCAL_MAX_ROWS", "7")  # not in the config: the environment's, at run time
    dags = {d.dag_id: d for d in runpy.run_path(str(ROOT / "dags" / "cdc_sources.py")).values() if isinstance(d, DAG)}
    assert set(dags) == {"cdc_snapshot__shop", "cdc_changelog__shop", "cdc_snapshot__billing", "cdc_changelog__billing",
                         "cdc_verify__shop", "cdc_verify__billing"}
    verify = dags["cdc_verify__shop"]  # the CDC page's verify: a DAG run of the source's own DAG, one at a time
    assert verify.max_active_runs == 1 and verify.get_task("verify").max_active_tis_per_dag == 1
    assert dags["cdc_snapshot__shop"].schedule == "@daily"
    merge = dags["cdc_snapshot__shop"].get_task("merge")
    assert (merge.data_dir, merge.source, merge.sinks, merge.local_max_rows) == ("/lake/cdc", "shop", "events,mirror", 7)
    assert [a.name for a in merge.outlets if isinstance(a, AssetAlias)] == ["cdc/shop/events", "cdc/shop/mirror"]
    plan = dags["cdc_snapshot__shop"].get_task("plan")
    assert (plan.cdc_conn_id, plan.source, plan.default_tables) == ("shop_pg", "shop", ("public.orders",))
    assert plan.conf_defaults == {"parallelism": 3}
    chunks = dags["cdc_snapshot__billing"].get_task("read_chunks")
    assert chunks.partial_kwargs["cdc_overrides"]["CDC_SOURCE_CONN_ID"] == "billing_mdb"
    assert chunks.partial_kwargs["max_active_tis_per_dagrun"] == 2
    apply = dags["cdc_changelog__billing"].get_task("apply")
    assert (apply.data_dir, apply.sinks) == ("/lake/cdc", "events")
    assert [a.name for a in apply.outlets] == ["cdc/billing/events"]
    capture = dags["cdc_changelog__billing"].get_task("capture")
    assert (capture.cdc_conn_id, capture.source) == ("billing_mdb", "billing")


def test_a_bad_config_fails_the_parse_of_the_dag_file(tmp_path, monkeypatch):
    cfg = tmp_path / "cdc_sources.yaml"
    cfg.write_text("sources:\n  shop: {conn_id: c, sensor_timeout: -5}\n")
    monkeypatch.setenv("CDC_SOURCES_FILE", str(cfg))
    with pytest.raises(ConfigurationError, match=r"source 'shop', key 'sensor_timeout'"):
        runpy.run_path(str(ROOT / "dags" / "cdc_sources.py"))


def test_without_a_config_cdc_sources_builds_nothing(monkeypatch):
    from airflow.sdk import DAG

    monkeypatch.delenv("CDC_SOURCES_FILE", raising=False)
    if (ROOT / "dags" / "cdc_sources.yaml").exists():
        pytest.skip("a cdc_sources.yaml sits in dags/")
    assert not [d for d in runpy.run_path(str(ROOT / "dags" / "cdc_sources.py")).values() if isinstance(d, DAG)]


def test_plan_operator_takes_the_config_throttle_under_the_run_conf():
    from airflow_provider_cdc.operators.snapshot import SnapshotPlanOperator

    with pytest.raises(ConfigurationError, match="conf_defaults may hold"):
        SnapshotPlanOperator(task_id="p", conf_defaults={"tables": ["x"]})


def test_asset_names_and_uris_hold_any_table_name():
    from airflow_provider_cdc.assets import event_log_asset, mirror_asset, table_alias

    a = mirror_asset("shop", "public.a'b %s; é/x")
    assert a.name == "cdc/shop/public.a'b %s; é/x/mirror"
    assert a.uri == "x-cdc://shop/public.a%27b%20%25s%3B%20%C3%A9%2Fx/mirror"
    assert event_log_asset("shop", "public.orders").uri == "x-cdc://shop/public.orders/events"
    assert mirror_asset("shop", "public.orders") == mirror_asset("shop", "public.orders")
    assert table_alias("shop", "mirror").name == "cdc/shop/mirror"
    with pytest.raises(ValueError, match="asset kind"):
        table_alias("shop", "postgres")


def test_find_source_looks_in_the_setting_then_the_dag_folder(tmp_path):
    from airflow_provider_cdc.settings import load
    from airflow_provider_cdc.sources_config import find_source, sources_file

    (tmp_path / "cdc_sources.yaml").write_text("sources: {shop: {conn_id: shop_pg}}\n")
    assert sources_file(load(ENV)) is None and find_source("shop", load(ENV)) is None
    assert find_source("shop", load(ENV), str(tmp_path)).settings.conn_id == "shop_pg"
    assert find_source("other", load(ENV), str(tmp_path)) is None
    given = load({**ENV, "CDC_SOURCES_FILE": str(tmp_path / "cdc_sources.yaml")})
    assert sources_file(given, "/nowhere") == str(tmp_path / "cdc_sources.yaml")
    assert find_source("shop", given).settings.source == "shop"


def test_connection_options_name_the_dialect_server_and_cdc_extras(monkeypatch):
    """What read_sources checks for shared slot and server names, read without the dialects
    (cdc_sources.py calls it at parse)."""
    import json

    from airflow_provider_cdc.dag_builders import connection_options

    monkeypatch.setenv("AIRFLOW_CONN_SHOP_PG", json.dumps({
        "conn_type": "postgres", "host": "db1", "schema": "shop", "login": "cdc", "password": "pw",
        "extra": {"slot_name": "shop_slot", "sslmode": "require"}}))
    monkeypatch.setenv("AIRFLOW_CONN_BILLING_MDB", json.dumps({"conn_type": "mysql", "port": 3307}))
    assert connection_options("shop_pg") == ("postgres", "db1:5432/shop", {"slot_name": "shop_slot"})
    assert connection_options("billing_mdb") == ("mysql", "127.0.0.1:3307/", {})
    assert connection_options("no_such_connection") is None
