"""The sources config is code, yet what it can do is bounded (issue 31): its Spark settings
are tuning only, its values are never rendered as templates, and two sources that would
share a slot, publication, server_id or staging folder are refused, naming both."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc import settings
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.sources_config import parse_sources

pytestmark = pytest.mark.unit

ENV = {"CDC_DATA_DIR": "/env/data", "CDC_SOURCE_CONN_ID": "env_conn"}


# --- Spark settings: an allowlist ---------------------------------------------------------------
TUNING = {
    "spark.executor.memory": "4g", "spark.executor.cores": 2, "spark.executor.instances": "3",
    "spark.driver.memory": "2g", "spark.driver.maxResultSize": "1g", "spark.sql.shuffle.partitions": 64,
    "spark.dynamicAllocation.enabled": True, "spark.dynamicAllocation.maxExecutors": "10",
    "spark.sql.adaptive.enabled": "true", "spark.sql.session.timeZone": "UTC", "spark.ui.enabled": "false",
}
REFUSED = [
    "spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions", "spark.driver.extraClassPath",
    "spark.executor.extraClassPath", "spark.jars", "spark.jars.packages", "spark.jars.repositories",
    "spark.submit.pyFiles", "spark.submit.deployMode", "spark.yarn.keytab", "spark.yarn.principal",
    "spark.kubernetes.authenticate.driver.oauthToken", "spark.kubernetes.driver.podTemplateFile",
    "spark.executorEnv.AWS_SECRET_ACCESS_KEY", "spark.pyspark.python", "spark.pyspark.driver.python",
    "spark.sql.extensions", "spark.sql.catalog.x", "spark.sql.warehouse.dir", "spark.hadoop.fs.s3a.secret.key",
    "spark.driver.extraLibraryPath", "spark.plugins", "spark.files", "spark.archives",
]


def test_spark_tuning_is_accepted_from_the_config_and_the_environment():
    (entry,) = parse_sources({"sources": {"shop": {"spark_conf": TUNING}}}, env=ENV)
    assert entry.settings.spark_conf == TUNING
    import json

    assert settings.load({"CDC_SPARK_CONF": json.dumps(TUNING)}).spark_conf == TUNING


@pytest.mark.parametrize("key", REFUSED)
def test_a_spark_setting_that_is_not_tuning_is_refused_naming_it(key):
    with pytest.raises(ConfigurationError) as err:
        parse_sources({"sources": {"shop": {"spark_conf": {"spark.executor.memory": "4g", key: "x"}}}}, "cfg.yaml",
                      env=ENV)
    msg = str(err.value)
    assert msg.startswith("cfg.yaml, source 'shop', key 'spark_conf'") and repr(key) in msg
    assert "spark-defaults.conf" in msg and "CDC_SPARK_CONN_ID" in msg  # where to set it instead


def test_the_environment_spark_conf_is_checked_too():
    with pytest.raises(ConfigurationError, match=r"CDC_SPARK_CONF: .*'spark\.driver\.extraJavaOptions'"):
        settings.load({"CDC_SPARK_CONF": '{"spark.driver.extraJavaOptions": "-javaagent:/tmp/a.jar"}'})
    with pytest.raises(ConfigurationError, match="spark.executor.memory"):
        settings.load({"CDC_SPARK_CONF": '{"spark.executor.memory": {"nested": 1}}'})


@pytest.mark.parametrize(("key", "value"), [
    ("spark.io.compression.codec", "org.apache.spark.io.ZStdCompressionCodec"),  # a codec class Spark loads
    ("spark.io.compression.codec", "com.evil.Codec"),
    ("spark.sql.adaptive.customCostEvaluatorClass", "com.evil.Evaluator"),  # a key that takes a class
    ("spark.sql.adaptive.coalescePartitions.enabled", "com.evil.Anything"),  # any value that is a class name
    ("spark.sql.parquet.compression.codec", "org.apache.parquet.Codec"),
])
def test_no_spark_setting_takes_a_class_name(key, value):
    """Issue 46: the allowlist let ``spark.io.compression.codec`` and
    ``spark.sql.adaptive.customCostEvaluatorClass`` name classes for Spark to load."""
    with pytest.raises(ConfigurationError, match=repr(key).replace(".", r"\.")):
        parse_sources({"sources": {"shop": {"spark_conf": {key: value}}}}, "cfg.yaml", env=ENV)
    with pytest.raises(ConfigurationError):
        settings.load({"CDC_SPARK_CONF": json.dumps({key: value})})


def test_codecs_are_taken_by_their_short_names():
    conf = {"spark.io.compression.codec": "zstd", "spark.sql.parquet.compression.codec": "snappy",
            "spark.sql.adaptive.advisoryPartitionSizeInBytes": "64m", "spark.memory.fraction": "0.6"}
    assert settings.load({"CDC_SPARK_CONF": json.dumps(conf)}).spark_conf == conf


# --- no templates ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("entry", "key"),
    [
        ({"data_dir": "/lake/{{ var.value.secret }}"}, "data_dir"),
        ({"tables": ["public.orders", "{{ conn.x.password }}"]}, "tables"),
        ({"conn_id": "{{ var.value.conn }}"}, "conn_id"),
        ({"storage_conn_id": "{% if 1 %}x{% endif %}"}, "storage_conn_id"),
        ({"spark_conf": {"spark.executor.memory": "{{ conn.x.password }}"}}, "spark_conf"),
        ({"sinks": "events,{# c #}mirror"}, "sinks"),
        ({"throttle": {"chunk_size": "{{ 1 }}"}}, "throttle"),
    ],
)
def test_a_template_in_the_config_is_refused_naming_the_source_and_key(entry, key):
    with pytest.raises(ConfigurationError) as err:
        parse_sources({"sources": {"shop": entry}}, "cfg.yaml", env=ENV)
    msg = str(err.value)
    assert msg.startswith(f"cfg.yaml, source 'shop', key {key!r}") and "template" in msg


def test_a_template_in_the_defaults_is_refused_too():
    with pytest.raises(ConfigurationError, match=r"source 'shop', key 'data_dir'.*template"):
        parse_sources({"defaults": {"data_dir": "/{{ ds }}"}, "sources": {"shop": {}}}, "cfg.yaml", env=ENV)


def test_the_operators_would_render_a_config_value():
    """Why: a source's value reaches the operators' template fields (read through
    FromSettings when the DAG gives none) and Airflow renders it."""
    from airflow_provider_cdc.operators.capture import ChangelogCaptureOperator

    op = ChangelogCaptureOperator(task_id="capture", cdc_overrides={"CDC_DATA_DIR": "/lake/{{ 6 * 7 }}"})
    assert "data_dir" in op.template_fields and op.data_dir == "/lake/{{ 6 * 7 }}"
    assert op.render_template(op.data_dir, {}) == "/lake/42"


def test_the_dag_builders_refuse_templated_overrides():
    from airflow_provider_cdc.dag_builders import changelog_dag, snapshot_dag

    for build in (snapshot_dag, changelog_dag):
        with pytest.raises(ConfigurationError, match=r"CDC_DATA_DIR of the DAG's source: holds Jinja"):
            build("x", {"CDC_SOURCE": "x", "CDC_DATA_DIR": "/lake/{{ conn.x.password }}"})


# --- names two sources would share --------------------------------------------------------------
def _connections(table):
    return lambda conn_id: table.get(conn_id)


PG = ("postgres", "db1:5432/app")


def test_two_sources_on_one_slot_are_refused_naming_both():
    conns = _connections({"c1": (*PG, {"slot_name": "cdc_shared"}), "c2": (*PG, {"slot_name": "cdc_shared"})})
    doc = {"sources": {"orders": {"conn_id": "c1"}, "billing": {"conn_id": "c2"}}}
    with pytest.raises(ConfigurationError) as err:
        parse_sources(doc, "cfg.yaml", env=ENV, connections=conns)
    msg = str(err.value)
    assert "'orders'" in msg and "'billing'" in msg and "replication slot 'cdc_shared'" in msg and "slot_name" in msg


def test_one_connection_with_a_slot_name_for_two_sources_is_refused():
    conns = _connections({"c": (*PG, {"slot_name": "cdc_one"})})
    with pytest.raises(ConfigurationError, match="'a' and 'b' would share the replication slot 'cdc_one'"):
        parse_sources({"sources": {"a": {"conn_id": "c"}, "b": {"conn_id": "c"}}}, env=ENV, connections=conns)


def test_an_explicit_slot_equal_to_another_sources_default_is_refused():
    conns = _connections({"c1": (*PG, {}), "c2": (*PG, {"slot_name": "cdc_orders"})})
    with pytest.raises(ConfigurationError, match="'orders' and 'other'"):
        parse_sources({"sources": {"orders": {"conn_id": "c1"}, "other": {"conn_id": "c2"}}}, env=ENV,
                      connections=conns)


def test_default_names_never_collide_and_other_servers_may_reuse_a_slot_name():
    conns = _connections({"c": (*PG, {}), "d": ("postgres", "db2:5432/app", {"slot_name": "cdc_x"}),
                          "e": ("postgres", "db3:5432/app", {"slot_name": "cdc_x"})})
    doc = {"sources": {"orders-eu": {"conn_id": "c"}, "orders_eu": {"conn_id": "c"},
                       "d": {"conn_id": "d"}, "e": {"conn_id": "e"}}}
    assert [e.name for e in parse_sources(doc, env=ENV, connections=conns)] == ["orders-eu", "orders_eu", "d", "e"]


def test_two_mysql_sources_with_one_server_id_are_refused():
    my = ("mysql", "m1:3306/")
    conns = _connections({"c1": (*my, {"server_id": 4242}), "c2": (*my, {"server_id": "4242"})})
    with pytest.raises(ConfigurationError, match=r"'a' and 'b' would share the server_id 4242 .*'server_id'"):
        parse_sources({"sources": {"a": {"conn_id": "c1"}, "b": {"conn_id": "c2"}}}, env=ENV, connections=conns)


def test_an_unreadable_connection_checks_only_derived_names():
    doc = {"sources": {"a": {"conn_id": "c"}, "b": {"conn_id": "c"}}}
    assert len(parse_sources(doc, env=ENV, connections=lambda conn_id: None)) == 2
