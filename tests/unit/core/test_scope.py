"""The one scope check (core/scope.py, invariant I15) and the grammars of names read back from
Variables, XCom and files (issue 46). Every door refuses the server's catalogs, the watermark
table and tables outside the scope with the same message; a stored snapshot id or source name
that is not one never becomes a path."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.progress import SnapshotProgress
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.scope import (
    ROW_VALUES_DROPPED,
    CaptureScope,
    SystemCatalogs,
    check_snapshot_id,
    check_source_name,
    drop_row_values,
)
from airflow_provider_cdc.dialects.registry import all_system_catalogs, get_profile

ORDERS = TableName("public", "orders")


def test_the_scope_refuses_catalogs_the_watermark_table_and_tables_outside_it():
    scope = CaptureScope.of("shop", [ORDERS], catalogs=get_profile("postgres").system_catalogs)
    assert scope.check(ORDERS) == ORDERS
    cases = {
        "pg_catalog.pg_authid": "table pg_catalog.pg_authid is in system schema 'pg_catalog'",
        "information_schema.tables": "is in system schema 'information_schema'",
        "pg_toast.x": "is in system schema 'pg_toast'",
        "pg_temp_3.x": "is in system schema 'pg_temp_3'",  # every pg_* schema is the server's
        "cdc.watermark": "table cdc.watermark is the watermark table of source 'shop', not data",
        "public.secrets": "table public.secrets is not captured by source 'shop': it is outside the capture scope",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigurationError, match=message):
            scope.check(TableName.parse(text))
    # capturing every table still refuses the catalogs and the watermark table
    wide = CaptureScope.of("shop", None, all_tables=True, catalogs=get_profile("mysql").system_catalogs,
                           watermark_table=TableName("ops", "wm"))
    assert wide.check(TableName("shop", "anything"))
    for text in ("mysql.user", "performance_schema.threads", "sys.x", "INFORMATION_SCHEMA.tables", "ops.wm"):
        assert wide.refusal(TableName.parse(text)) is not None, text
    with pytest.raises(ConfigurationError, match="has no capture scope: set CDC_TABLES"):
        CaptureScope.of("shop", None, catalogs=SystemCatalogs()).check(ORDERS)


def test_a_scope_known_without_its_dialect_refuses_every_server_s_catalogs():
    """The settings' scope (a run's conf checked before any connection) refuses the catalogs of
    every registered database, PostgreSQL's reserved pg_* schemas included; a server's own
    scope refuses only its own."""
    every = CaptureScope.of("shop", None, all_tables=True, catalogs=all_system_catalogs())
    for text in ("pg_catalog.pg_authid", "pg_temp_3.x", "mysql.user", "PERFORMANCE_SCHEMA.threads", "sys.x"):
        assert "is in system schema" in every.refusal(TableName.parse(text)), text
    assert every.refusal(ORDERS) is None
    mine = CaptureScope.of("shop", None, all_tables=True, catalogs=get_profile("mysql").system_catalogs)
    assert mine.refusal(TableName.parse("pg_temp_3.x")) is None  # not a MySQL catalog
    assert mine.refusal(TableName.parse("sys.x")) is not None


def test_every_door_gives_the_same_message():
    """A run's conf (settings only, before any connection), the dialect (verify, the snapshot's
    start, the page's verify DAG) and export: one check, one text."""
    from airflow_provider_cdc.dialects import get_dialect
    from airflow_provider_cdc.dialects.base import ConnectionParams
    from airflow_provider_cdc.pipeline.snapshot_conf import check_scope, parse_snapshot_conf
    from airflow_provider_cdc.settings import load

    settings = load({"CDC_SOURCE_CONN_ID": "shop", "CDC_TABLES": "public.orders", "CDC_DATA_DIR": "/d"})
    dialect = get_dialect(ConnectionParams("postgres"), source="shop", tables=["public.orders"])
    for text in ("pg_catalog.pg_authid", "public.secrets", "cdc.watermark"):
        t = TableName.parse(text)
        with pytest.raises(ConfigurationError) as by_conf:
            check_scope(parse_snapshot_conf({"tables": [text]}), settings)
        with pytest.raises(ConfigurationError) as by_dialect:
            dialect.check_in_scope([t])  # nothing connects: the dialect opens its session lazily
        assert str(by_conf.value) == str(by_dialect.value) == dialect.capture_scope().refusal(t)


def test_snapshot_ids_and_source_names_from_stored_values_are_checked_before_they_become_paths():
    from airflow_provider_cdc.storage.layout import chunk_path, events_dir, plan_path, staging_dir

    for bad in ("../x", "../../../../x", "..", ".hidden", "a/b", "a\\b", "", "x\x00", None, 7):
        with pytest.raises(ConfigurationError, match="is not a snapshot id"):
            check_snapshot_id(bad, "progress")
        with pytest.raises(ConfigurationError, match="is not a snapshot id"):
            plan_path("/data", "shop", ORDERS, bad)  # type: ignore[arg-type]
    for bad in ("/etc", "..", "../x", "a/b", "", ".x", "-x", None):
        with pytest.raises(ConfigurationError):
            check_source_name(bad)
    for bad in ("/etc", "..", "a/b"):
        with pytest.raises(ConfigurationError, match="cannot be a path component"):
            staging_dir("/data", bad)
        with pytest.raises(ConfigurationError, match="cannot be a path component"):
            events_dir("/data", bad)
    assert check_snapshot_id("20261127T091500-1a2b3c4d") and check_source_name("orders-eu.v2")
    assert chunk_path("/data", "shop", ORDERS, "S1", 1, "hw").startswith("/data/staging/shop/chunks/")


def test_a_progress_read_back_with_a_snapshot_id_that_is_no_id_is_refused():
    p = SnapshotProgress.start("shop", "snap-1", {ORDERS.id: [ChunkRange()]}, now=1.0)
    assert SnapshotProgress.from_json(p.to_json()).snapshot_id == "snap-1"
    for bad in ("../x", "../../../../x", "/etc"):
        with pytest.raises(ConfigurationError, match="is not a snapshot id"):
            SnapshotProgress.from_json(p.to_json().replace('"snap-1"', f'"{bad}"'))


def test_row_values_of_database_errors_are_dropped():
    pg = ('duplicate key value violates unique constraint "t_pkey"\nDETAIL:  Key (id, card)=(5, 4111-1111) already '
          'exists.\n')
    assert drop_row_values(pg) == f'duplicate key value violates unique constraint "t_pkey"\nDETAIL: {ROW_VALUES_DROPPED}\n'
    check = 'new row for relation "t" violates check constraint "c"\nDETAIL:  Failing row contains (1, s3cret).'
    assert "s3cret" not in drop_row_values(check) and 'violates check constraint "c"' in drop_row_values(check)
    my = "(1062, \"Duplicate entry 'alice@example.com' for key 'email'\")"
    assert drop_row_values(my) == f"(1062, \"Duplicate entry {ROW_VALUES_DROPPED} for key 'email'\")"
    assert drop_row_values("plain text, no values") == "plain text, no values"
    # PostgreSQL's main line quotes the failing value (audit, issue 58)
    for msg in ('invalid input syntax for type integer: "ssn-123-45-6789"',
                'invalid input value for enum mood: "ssn-123-45-6789"',
                'date/time field value out of range: "ssn-123-45-6789"',
                'malformed array literal: "ssn-123-45-6789"',
                'invalid input syntax for type json: "ssn-123-45-6789 \\" quoted"',
                'value "123456789" is out of range for type integer'):
        out = drop_row_values(msg)
        assert "ssn" not in out and "123456789" not in out and ROW_VALUES_DROPPED in out, (msg, out)
    assert drop_row_values('relation "public.orders" does not exist') == 'relation "public.orders" does not exist'
    assert drop_row_values('column "ssn" is of type integer') == 'column "ssn" is of type integer'
