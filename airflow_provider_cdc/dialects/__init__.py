"""One module per database. ``get_dialect(name)`` looks a dialect up by name."""

from __future__ import annotations

from ..core.errors import ConfigurationError
from .base import ConnectionParams, Dialect

_DIALECTS = {
    "postgres": "airflow_provider_cdc.dialects.postgres:PostgresDialect",
    "postgresql": "airflow_provider_cdc.dialects.postgres:PostgresDialect",
    "mysql": "airflow_provider_cdc.dialects.mysql:MySqlDialect",
    "mariadb": "airflow_provider_cdc.dialects.mysql:MySqlDialect",
}


def dialect_class(name: str) -> type[Dialect]:
    try:
        target = _DIALECTS[name.lower()]
    except KeyError:
        raise ConfigurationError(f"unknown dialect {name!r}; known: {', '.join(sorted(_DIALECTS))}") from None
    import importlib

    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def get_dialect(params: ConnectionParams, **options) -> Dialect:
    return dialect_class(params.scheme)(params, **options)


__all__ = ["ConnectionParams", "Dialect", "dialect_class", "get_dialect"]
