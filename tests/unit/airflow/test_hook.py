"""CdcSourceHook: Airflow connection (from AIRFLOW_CONN_* env vars, as Airflow resolves them) -> dialect."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook, dialect_name_for


@pytest.mark.parametrize(
    ("conn_type", "dialect"),
    [
        ("postgres", "postgres"),
        ("postgresql", "postgres"),
        ("mysql", "mysql"),
        ("mariadb", "mysql"),
        ("MySQL", "mysql"),
    ],
)
def test_conn_type_mapping(conn_type, dialect):
    assert dialect_name_for(conn_type) == dialect


def test_unknown_conn_type_lists_known_types():
    with pytest.raises(
        ConfigurationError, match="'http'.*known types: cdc, mariadb, mysql, postgres, postgresql"
    ):
        dialect_name_for("http", conn_id="x")
    with pytest.raises(ConfigurationError, match="extra 'dialect'"):
        dialect_name_for("cdc", {}, conn_id="x")
    assert dialect_name_for("cdc", {"dialect": "mariadb"}) == "mysql"


def test_params_from_a_uri_connection(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_UNIT_PG",
        "postgresql://cdc:s3cr%40t@db.example:5433/shop?slot_name=cdc_slot&watermark_schema=wm&sslmode=require",
    )
    hook = CdcSourceHook("cdc_unit_pg")
    p = hook.connection_params()
    assert (p.scheme, p.host, p.port, p.user, p.password, p.database) == (
        "postgres",
        "db.example",
        5433,
        "cdc",
        "s3cr@t",
        "shop",
    )
    assert p.extra == {"sslmode": "require"}  # CDC settings are dialect options, not driver settings
    assert hook.dialect_options() == {"slot_name": "cdc_slot", "watermark_schema": "wm"}
    assert hook.source == "cdc_unit_pg"
    assert CdcSourceHook("cdc_unit_pg", source="shop").source == "shop"


def test_params_from_a_json_connection_of_our_type(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_CDC_UNIT_MY",
        json.dumps(
            {
                "conn_type": "cdc",
                "host": "127.0.0.1",
                "port": 3306,
                "login": "root",
                "schema": "shop",
                "extra": {"dialect": "mysql", "server_id": 4242, "ssl_ca": "/ca.pem", "read_timeout": 30},
            }
        ),
    )
    hook = CdcSourceHook("cdc_unit_my")
    p = hook.connection_params()
    assert (p.scheme, p.port, p.database, hook.dialect_options()) == (
        "mysql",
        3306,
        "shop",
        {"server_id": 4242},
    )
    assert p.extra == {"ssl_ca": "/ca.pem", "read_timeout": 30}  # pymysql settings


def test_test_connection_reports_instead_of_raising(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CDC_UNIT_BAD", "http://example.com")
    ok, message = CdcSourceHook("cdc_unit_bad").test_connection()
    assert ok is False and "not a CDC source" in message


def test_the_capture_scope_has_one_owner_and_a_connection_extra_tables_is_refused(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CDC_UNIT_SCOPE", "postgresql://cdc@db.example/shop?tables=public.a")
    with pytest.raises(ConfigurationError, match=r"extra 'tables'.*CDC_TABLES.*Move it there"):
        CdcSourceHook("cdc_unit_scope").get_dialect()
    monkeypatch.setenv("AIRFLOW_CONN_CDC_UNIT_SCOPE", "postgresql://cdc@db.example/shop?all_tables=true")
    with pytest.raises(ConfigurationError, match="CDC_CAPTURE_ALL_TABLES"):
        CdcSourceHook("cdc_unit_scope").get_dialect()


def test_the_dialect_gets_the_scope_of_the_settings_or_of_the_operator(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_CDC_UNIT_SCOPE", "postgresql://cdc@db.example/shop")
    monkeypatch.setenv("CDC_TABLES", "public.a,public.b")
    d = CdcSourceHook("cdc_unit_scope").get_dialect()  # no I/O until used
    assert [t.id for t in d.tables] == ["public.a", "public.b"] and not d.all_tables
    d = CdcSourceHook("cdc_unit_scope", tables=["s.x"], all_tables=False).get_dialect()
    assert [t.id for t in d.tables] == ["s.x"]
    monkeypatch.delenv("CDC_TABLES")
    d = CdcSourceHook("cdc_unit_scope").get_dialect()
    assert d.tables is None and not d.all_tables
    with pytest.raises(ConfigurationError, match="has no capture scope: set CDC_TABLES"):
        d.require_capture_scope()  # what capture and every snapshot start call first
    monkeypatch.setenv("CDC_CAPTURE_ALL_TABLES", "true")
    assert CdcSourceHook("cdc_unit_scope").get_dialect().all_tables
    monkeypatch.setenv("CDC_TABLES", "public.a")
    with pytest.raises(ConfigurationError, match="both set"):
        CdcSourceHook("cdc_unit_scope").get_dialect()


def test_a_connection_test_and_a_task_word_a_driver_error_alike():
    """One wording (hooks/task_errors.describe_user_error): the connection test names the server
    it tried and words a fault a task would retry; a task retries that fault instead."""
    from pymysql.err import OperationalError

    from airflow_provider_cdc.hooks.task_errors import describe_connection_failure, describe_user_error

    server = "MySQL/MariaDB 'cdc'@db:3306/shop"
    denied = OperationalError(1045, "Access denied for user 'cdc'@'10.0.0.2' (using password: YES)")
    task = describe_user_error(denied, conn_id="shop")
    test = describe_connection_failure(denied, "shop", server)
    assert task.startswith("the database refused the login of Airflow connection 'shop'"), task
    assert test == task.replace("the database", server, 1), test
    refused = ConnectionRefusedError(111, "Connection refused")
    assert describe_user_error(refused, conn_id="shop") is None  # a task retries it
    assert describe_connection_failure(refused, "shop", server).startswith(f"connection 'shop': cannot reach {server}")
    assert describe_connection_failure(ValueError("odd"), "shop", server) == f"connection 'shop' ({server}): ValueError: odd"
