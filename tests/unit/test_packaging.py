"""Packaging: Airflow finds the provider through its entry point, and the metadata it
returns passes the schema Airflow's ProvidersManager validates it with."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
from pathlib import Path

import airflow_provider_cdc

DIST = "airflow-provider-cdc"


def test_get_provider_info_shape():
    info = airflow_provider_cdc.get_provider_info()
    assert info["package-name"] == DIST
    assert isinstance(info["name"], str) and info["name"]
    assert isinstance(info["description"], str) and info["description"]
    assert info["versions"] and info["versions"][0] == airflow_provider_cdc.__version__
    json.dumps(info)  # plain JSON data: Airflow caches and prints it


def test_provider_info_passes_airflow_schema():
    import jsonschema

    # Locate the schema without importing airflow (slow, and not needed to read a file).
    spec = importlib.util.find_spec("airflow")
    assert spec and spec.submodule_search_locations, "apache-airflow is not installed"
    schema_path = Path(next(iter(spec.submodule_search_locations))) / "provider_info.schema.json"
    schema = json.loads(schema_path.read_text())
    jsonschema.validate(airflow_provider_cdc.get_provider_info(), schema)


def test_entry_point_registered():
    eps = [
        ep
        for ep in importlib.metadata.entry_points(group="apache_airflow_provider")
        if ep.dist is not None and ep.dist.name == DIST
    ]
    assert [ep.value for ep in eps] == ["airflow_provider_cdc:get_provider_info"]
    assert eps[0].load() is airflow_provider_cdc.get_provider_info


def test_installed_version_matches_package():
    assert importlib.metadata.version(DIST) == airflow_provider_cdc.__version__
