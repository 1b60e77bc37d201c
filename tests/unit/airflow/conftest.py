from __future__ import annotations

import pytest

from airflow_provider_cdc import airflow_variables


@pytest.fixture
def variables(monkeypatch):
    """Airflow Variables as a dict (the unit tier has no API server); records every write."""
    store: dict[str, str] = {}
    writes: list[str] = []
    monkeypatch.setattr(airflow_variables, "_get", lambda key: store.get(key))

    def _set(key, value):
        writes.append(key)
        store[key] = value

    monkeypatch.setattr(airflow_variables, "_set", _set)
    return type("Vars", (), {"store": store, "writes": writes})
