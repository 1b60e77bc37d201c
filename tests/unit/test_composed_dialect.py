"""The delegations both dialects share live once, in dialects/composed.py: they must take what
the contract (dialects/base.Dialect) declares, with the same defaults, and both dialects must get
them from there rather than repeating them (docs/DESIGN.md, "The dialects")."""

from __future__ import annotations

import inspect

import pytest

from airflow_provider_cdc.dialects.base import Dialect
from airflow_provider_cdc.dialects.composed import ComposedDialect
from airflow_provider_cdc.dialects.registry import PROFILES, get_profile

pytestmark = pytest.mark.unit

SHARED = [n for n, f in vars(ComposedDialect).items() if inspect.isfunction(f)]


def _parameters(f) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


@pytest.mark.parametrize("name", [n for n in SHARED if hasattr(Dialect, n)])
def test_a_shared_delegation_takes_what_the_contract_declares(name):
    assert _parameters(getattr(ComposedDialect, name)) == _parameters(getattr(Dialect, name))


@pytest.mark.parametrize("db", sorted(PROFILES))
def test_each_dialect_takes_the_shared_delegations_from_composed(db):
    cls = get_profile(db).dialect_class()
    assert issubclass(cls, ComposedDialect)
    repeated = sorted(n for n in SHARED if n in vars(cls))
    assert repeated == [], f"{cls.__name__} defines again what composed.py shares: {repeated}"
