"""The databases the package can capture, by name: one line each.

Each names the ``PROFILE`` of a database's package (dialects/<db>/profile.py): driver-free, so
hooks, lineage, the sources config and DAG parsing read it without importing the database's
driver; the profile names its dialect class, imported only when a dialect is made.

Adding a database is a folder ``dialects/<db>/`` (its profile and dialect) and one line here
(docs/DESIGN.md, "Adding a database").
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from ..core.errors import ConfigurationError
from .profile import DatabaseProfile

if TYPE_CHECKING:
    from ..core.scope import SystemCatalogs

#: dialect name -> ``module:attribute`` of its profile
PROFILES: dict[str, str] = {
    "postgres": "airflow_provider_cdc.dialects.postgres.profile:PROFILE",
    "mysql": "airflow_provider_cdc.dialects.mysql.profile:PROFILE",
}


@cache
def profiles() -> tuple[DatabaseProfile, ...]:
    """Every registered database's profile, in registry order."""
    out = []
    for name, target in PROFILES.items():
        module, attr = target.split(":")
        profile = getattr(importlib.import_module(module), attr)
        if profile.name != name:
            raise ConfigurationError(
                f"the profile at {target} is named {profile.name!r}, registered as {name!r}"
            )
        out.append(profile)
    return tuple(out)


def _by(attribute: str) -> dict[str, DatabaseProfile]:
    return {key: p for p in profiles() for key in getattr(p, attribute)}


def known_names() -> list[str]:
    """Every name a dialect is known by (its name and aliases), sorted."""
    return sorted(_by("names"))


def get_profile(name: str) -> DatabaseProfile:
    """The profile of the database named ``name`` (a dialect name or alias, any case)."""
    try:
        return _by("names")[name.lower()]
    except KeyError:
        raise ConfigurationError(f"unknown dialect {name!r}; known: {', '.join(known_names())}") from None


def profile_for_conn_type(conn_type: str | None) -> DatabaseProfile | None:
    """The database of an Airflow connection type (None: not a source database's type)."""
    return _by("conn_types").get((conn_type or "").lower().replace("-", "_"))


def profile_for_debezium(connector: str) -> DatabaseProfile:
    """The database of a Debezium connector name (``postgresql``, ``mysql``, ``mariadb``)."""
    try:
        return _by("debezium_connectors")[connector]
    except KeyError:
        raise ConfigurationError(
            f"unknown Debezium connector {connector!r}; known: {', '.join(debezium_connectors())}"
        ) from None


def debezium_connectors() -> tuple[str, ...]:
    return tuple(c for p in profiles() for c in p.debezium_connectors)


def all_system_catalogs() -> SystemCatalogs:
    """The system catalogs of every registered database: what a capture scope known without its
    dialect (from the settings alone) refuses, so it is never less strict than the server's."""
    from ..core.scope import SystemCatalogs

    out = SystemCatalogs()
    for p in profiles():
        out = out | p.system_catalogs
    return out
