"""docs/DESIGN.md's "Adding a database", walked with a database the package has never heard of.

A fake third database (``fakedb``: a profile and an in-memory dialect, both in fake_database.py,
no server, its tables Python lists) is registered for each test as the checklist says, one line in
dialects/registry.py's ``PROFILES`` (patched here, undone after), and goes through what the rest
of the package does with a database: the profile checks every registered one passes, a dialect
made from a URI or connection params naming it, the capture scope (its own catalogs refused by
name, the watermark table refused, a captured table accepted), a snapshot's range planning, doctor
and lineage. Nothing outside ``dialects/`` is told about it: what differs is asked of its profile
and its dialect, so a step that fails here is a module that still knows databases by name.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.findings import ERROR, OK, WARNING, Finding
from airflow_provider_cdc.core.plans import Throttle
from airflow_provider_cdc.core.ranges import FULL_RANGE, ChunkRange
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import registry
from airflow_provider_cdc.dialects.base import ConnectionParams

from .fake_database import (
    CODES,
    CODES_SCHEMA,
    NOTES,
    ORDERS,
    ORDERS_SCHEMA,
    FakeDialect,
    fake_dialect,
)
from .profile_checks import check_complete_profile, check_names_belong_to_one_database

pytestmark = pytest.mark.unit


# --- the checklist --------------------------------------------------------------------------------
def test_the_fake_database_is_not_known_until_it_is_registered():
    """The walk below proves something only if the package did not know FakeDB already."""
    with pytest.raises(ConfigurationError, match="unknown dialect 'fakedb'"):
        registry.get_profile("fakedb")
    with pytest.raises(ConfigurationError, match="connection URI scheme 'fakedb' not supported"):
        ConnectionParams.from_uri("fakedb://db.example/shop")


def test_step_2_its_profile_passes_the_checks_every_registered_profile_passes(fakedb):
    assert "fakedb" in registry.PROFILES and registry.profiles()[-1] is fakedb
    check_complete_profile("fakedb")
    check_names_belong_to_one_database()
    assert registry.profile_for_conn_type("Fake-DB") is fakedb
    assert registry.profile_for_debezium("fakedb") is fakedb
    assert fakedb.cdc_option_keys >= {"cursor_name", "watermark_table"}


def test_step_1_a_dialect_is_made_from_a_uri_or_connection_params_naming_it(fakedb):
    from airflow_provider_cdc.dialects import dialect_class, get_dialect

    params = ConnectionParams.from_uri("fake+native://cdc:p%40ss@db.example:7001/shop?tls=on")
    assert (params.scheme, params.host, params.port, params.user, params.password, params.database, params.extra) == (
        "fakedb", "db.example", 7001, "cdc", "p@ss", "shop", {"tls": "on"})
    assert dialect_class("FAKE") is FakeDialect
    d = get_dialect(ConnectionParams("fakedb", database="shop"), source="shop", tables=["orders"])
    assert isinstance(d, FakeDialect) and d.profile is fakedb
    assert d.scope_tables() == (ORDERS,)  # its default schema
    assert d.system_schemas == fakedb.system_schemas  # the profile's, not repeated by the dialect
    with pytest.raises(ConfigurationError, match="connection URI scheme 'oracle' not supported; use one of .*fakedb://"):
        ConnectionParams.from_uri("oracle://db.example/shop")


def test_the_capture_scope_refuses_its_catalogs_and_the_watermark_table(fakedb):
    d = fake_dialect()
    d.check_in_scope([ORDERS])  # captured: accepted
    refused = {
        "fake_catalog.objects": "table fake_catalog.objects is in system schema 'fake_catalog'",
        "FAKE_CATALOG.objects": "is in system schema 'FAKE_CATALOG'",  # a catalog's name in any case
        "fk_temp_1.t": "is in system schema 'fk_temp_1'",  # its reserved prefix
        "cdc.watermark": "table cdc.watermark is the watermark table of source 'shop', not data",
        "app.secrets": "table app.secrets is not captured by source 'shop'",
    }
    for text, message in refused.items():
        with pytest.raises(ConfigurationError, match=message):
            d.check_in_scope([TableName.parse(text)])
    # PostgreSQL's and MySQL's catalogs are not FakeDB's: a table there is refused as outside the
    # scope, not as a catalog (each server's own catalogs, from its own profile)
    for text in ("pg_catalog.pg_class", "mysql.user"):
        assert "not captured" in d.capture_scope().refusal(TableName.parse(text))
    # every table of the database, still never its catalogs nor the watermark table
    wide = fake_dialect(tables=None, all_tables=True, watermark_table="wm")
    assert wide.capture_scope().refusal(TableName("app", "anything")) is None
    for text in ("fake_catalog.objects", "fk_x.y", "information_schema.tables", "cdc.wm"):
        assert wide.capture_scope().refusal(TableName.parse(text)) is not None, text
    # the CDC_TABLES check names its catalogs from the profile
    with pytest.raises(ConfigurationError, match=r"names system table\(s\) fake_catalog.objects; the server's "
                                                 r"catalogs \(fake_catalog, information_schema\) are never captured"):
        fake_dialect(tables=[ORDERS, "fake_catalog.objects"]).require_capture_scope()


def test_a_scope_known_without_its_dialect_refuses_the_new_database_s_catalogs_too(fakedb):
    """A run's conf is checked from the settings before any connection, and a refresh from the
    source's dialect name: both learn FakeDB's catalogs from the registry, not from core."""
    from airflow_provider_cdc.pipeline.refresh import check_refresh_table
    from airflow_provider_cdc.pipeline.snapshot_conf import check_scope, parse_snapshot_conf

    settings = SimpleNamespace(source="shop", tables=[ORDERS], capture_all_tables=False)
    for text in ("fake_catalog.objects", "fk_temp.t", "pg_catalog.pg_class", "mysql.user"):
        with pytest.raises(ConfigurationError, match=f"is in system schema '{text.split('.')[0]}'"):
            check_scope(parse_snapshot_conf({"tables": [text]}), settings)
    check_scope(parse_snapshot_conf({"tables": ["app.orders"]}), settings)
    with pytest.raises(ConfigurationError, match="is in system schema 'fk_temp': never refreshed"):
        check_refresh_table("shop", ["fk_temp.t"], TableName("fk_temp", "t"), dialect="fakedb")
    assert check_refresh_table("shop", ["pg_toast.t"], TableName("pg_toast", "t"), dialect="fakedb")  # not its catalog


def test_a_snapshot_of_its_table_is_planned_in_ranges_over_its_keys(fakedb, tmp_path):
    from airflow_provider_cdc.core.planning import SnapshotRequest
    from airflow_provider_cdc.pipeline.snapshot import plan_table_ranges, plan_tables

    d = fake_dialect()
    request = SnapshotRequest((ORDERS,), throttle=Throttle(parallelism=4))
    plans, multisets = plan_tables(d, [ORDERS], request, ("events", "mirror"), str(tmp_path), "shop")
    assert multisets == [] and [(t, s) for t, s, _r in plans] == [(ORDERS, ORDERS_SCHEMA)]
    ranges = plans[0][2]
    assert len(ranges) == 4 and ranges[0].start is None and ranges[-1].end is None
    assert [r.end for r in ranges[:-1]] == [r.start for r in ranges[1:]], "contiguous, no gap"
    bounds = [r.end[0] for r in ranges[:-1]]
    assert bounds == sorted(bounds) and all(1 < b <= 400 for b in bounds), bounds  # keys of the table
    # the row filter is checked against the table's columns and rendered by FakeDB's own rules
    filtered = SnapshotRequest((ORDERS,), where="amount >= 3")
    assert plan_table_ranges(d, ORDERS_SCHEMA, filtered) == [FULL_RANGE]
    assert d.render_filter("amount >= 3", ORDERS_SCHEMA) == ("([amount] >= %s)", [3])
    with pytest.raises(ConfigurationError, match="secret"):
        plan_table_ranges(d, ORDERS_SCHEMA, SnapshotRequest((ORDERS,), where="secret = 1"))
    # chosen ranges of a text key are checked in the database's own order (its key_ranks), not
    # Python's: [a, M) is a range under FakeDB's collation, and overlaps [b, z)
    given = (ChunkRange(("a",), ("M",)), ChunkRange(("M",), None))
    request = SnapshotRequest((CODES,), ranges={CODES.id: given})
    assert plan_table_ranges(d, CODES_SCHEMA, request) == list(given)
    overlapping = SnapshotRequest((CODES,), ranges={CODES.id: (ChunkRange(("a",), ("M",)), ChunkRange(("b",), ("z",)))})
    with pytest.raises(ConfigurationError, match="overlap"):
        plan_table_ranges(d, CODES_SCHEMA, overlapping)
    # and its keys are split where the database's order puts them
    split = plan_table_ranges(d, CODES_SCHEMA, SnapshotRequest((CODES,), throttle=Throttle(parallelism=2)))
    assert split == [ChunkRange(None, ("M",)), ChunkRange(("M",), None)]


def test_doctor_checks_it_through_the_dialect_contract(fakedb):
    from airflow_provider_cdc.doctor import check_source, has_errors

    found = check_source(fake_dialect(tables=[ORDERS, NOTES, "app.missing"], cursor_name="c1"), "fake_conn")
    by_check = {f.check: f for f in found}
    assert by_check["connection"] == Finding(
        OK, "connection", "connection 'fake_conn' reaches FakeDB 1.0 at db.example:7001 as 'cdc'")
    assert by_check["log retention"].severity == OK  # the dialect's own findings, as it gave them
    assert by_check["cursor"].severity == WARNING and "'c1'" in by_check["cursor"].message
    assert by_check["table app.orders"] == Finding(OK, "table app.orders", "exists, key (id)")
    assert by_check["table app.notes"].severity == ERROR and "has no primary key" in by_check["table app.notes"].message
    assert by_check["table app.missing"].severity == ERROR and "does not exist" in by_check["table app.missing"].message
    assert has_errors(found)
    # the scope's own finding: a catalog named in the scope is an error, named
    scoped = check_source(fake_dialect(tables=["fake_catalog.objects"]), "fake_conn")
    scope = next(f for f in scoped if f.check == "scope")
    assert scope.severity == ERROR and "names system table(s) fake_catalog.objects" in scope.message
    # a server that cannot be reached is that one error
    down = check_source(fake_dialect(down=True), "fake_conn")
    assert len(down) == 1 and down[0].severity == ERROR and down[0].check == "connection"
    assert "cannot connect to FakeDB at db.example:7001" in down[0].message and "'fake_conn'" in down[0].message


def test_lineage_names_its_tables_by_its_profile(fakedb):
    from airflow_provider_cdc.lineage import source_input, source_name, source_namespace

    params = ConnectionParams("fakedb", host="db.example", database="shop")
    assert source_namespace(params) == "fakedb://db.example:7777"  # its default port
    assert source_namespace(ConnectionParams("fake", host="db.example", port=7001)) == "fakedb://db.example:7001"
    assert source_name(params, ORDERS) == "shop.app.orders"
    dataset = source_input(params, ORDERS, ORDERS_SCHEMA)
    assert (dataset.namespace, dataset.name) == ("fakedb://db.example:7777", "shop.app.orders")
    assert [(f.name, f.type) for f in dataset.facets["schema"].fields] == [("id", "BIGINT"), ("amount", "int64")]

