"""A conf table outside the scope that is a typo or the wrong case of a captured one gets "did you
mean" (issue 47), not "add it to that setting", which would send an administrator to widen the
scope for a table that does not exist."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.scope import CaptureScope, SystemCatalogs, close_tables
from airflow_provider_cdc.dialects.registry import get_profile
from airflow_provider_cdc.pipeline.snapshot_conf import check_scope, parse_snapshot_conf

SCOPE = CaptureScope.of("shop", ["public.orders", "public.Customers", "sales.order_items"],
                        catalogs=get_profile("postgres").system_catalogs)


@pytest.mark.parametrize(("given", "meant"), [
    ("public.Orders", "public.orders"),  # case
    ("PUBLIC.ORDERS", "public.orders"),
    ("public.customers", "public.Customers"),
    ("public.ordres", "public.orders"),  # typo
    ("sales.order_item", "sales.order_items"),
])
def test_a_typo_or_the_wrong_case_gets_did_you_mean(given, meant):
    with pytest.raises(ConfigurationError, match=rf"did you mean {meant}\? Table names match exactly, case included"):
        SCOPE.check(TableName.parse(given))
    req = parse_snapshot_conf({"action": "start", "tables": [given]}, None, default_action="start")
    with pytest.raises(ConfigurationError, match=rf"did you mean {meant}\?"):  # the plan's check of a run's conf
        check_scope(req, None, SCOPE)


def test_a_table_with_no_close_name_is_refused_as_before():
    with pytest.raises(ConfigurationError, match="outside the capture scope .*adding it to that setting") as info:
        SCOPE.check(TableName.parse("public.secrets"))
    assert "did you mean" not in str(info.value)
    assert close_tables(TableName.parse("hr.salaries"), SCOPE.tables) == []


def test_a_different_table_with_a_shared_part_is_not_suggested():
    """cli_other_x is not a slip of cli_x: no "did you mean" (the scope's message as before)."""
    scope = CaptureScope.of("s", ["public.cli_22c021e23e"], catalogs=SystemCatalogs())
    assert close_tables(TableName.parse("public.cli_other_22c021e23e"), scope.tables) == []
    assert close_tables(TableName.parse("public.cli_22c021e32e"), scope.tables) == [TableName.parse("public.cli_22c021e23e")]
