"""The checks every registered database's profile passes (docs/DESIGN.md, "Adding a database"):
run for each registered database by tests/unit/test_profiles.py, and for a fake third database
by tests/unit/test_third_database.py."""

from __future__ import annotations

from airflow_provider_cdc.core.filters import FilterRules
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects.base import Dialect
from airflow_provider_cdc.dialects.profile import DATABASE, SERVER, DatabaseProfile, OwnedObject
from airflow_provider_cdc.dialects.registry import get_profile, profile_for_conn_type, profiles


def check_complete_profile(name: str) -> None:
    """The registered profile ``name`` gives every attribute and rule, consistently."""
    p = get_profile(name)
    assert isinstance(p, DatabaseProfile) and p.name == name
    for attribute in DatabaseProfile.REQUIRED:
        value = getattr(p, attribute, None)
        assert value not in (None, "", (), frozenset()), f"profile {name!r} gives no {attribute!r}"
    assert isinstance(p.default_port, int) and 0 < p.default_port < 65536
    assert all(t == t.lower() for t in p.conn_types) and all(profile_for_conn_type(t) is p for t in p.conn_types)
    assert p.option_keys <= p.cdc_option_keys and "tables" not in p.cdc_option_keys  # the scope is not an option
    assert isinstance(p.filter_rules, FilterRules)
    assert all(len(f) == 3 and isinstance(f[2], bool) for f in p.debezium_source_fields)
    owned = p.owned_objects("orders", {})
    assert owned and all(isinstance(o, OwnedObject) and o.per in (SERVER, DATABASE) for o in owned)
    assert all(o.option in p.option_keys for o in owned), "each owned object is named by one of its options"
    assert p.owned_objects("orders", {}) == owned, "a default owned name is derived from the source, stably"
    assert p.owned_objects("orders", {}) != p.owned_objects("payments", {})
    assert p.lineage_name("db", TableName("s", "t")).endswith("s.t")
    # its catalogs (core/scope.py matches a schema lowercased, a reserved prefix as written)
    assert all(s == s.lower() for s in p.system_schemas), "system schemas are given in lower case"
    assert all(p.is_system_schema(s) and p.is_system_schema(s.upper()) for s in p.system_schemas)
    assert all(p.is_system_schema(f"{prefix}x") for prefix in p.system_schema_prefixes)
    assert not p.is_system_schema("orders"), "an ordinary schema is not the server's"
    cls = p.dialect_class()
    assert issubclass(cls, Dialect) and cls.name == name
    for alias in p.names:
        assert get_profile(alias.upper()) is p


def check_names_belong_to_one_database() -> None:
    """No name, connection type or Debezium connector is shared between registered databases."""
    for attribute in ("names", "conn_types", "debezium_connectors"):
        seen = [v for p in profiles() for v in getattr(p, attribute)]
        assert len(seen) == len(set(seen)), f"{attribute} shared between databases: {seen}"
