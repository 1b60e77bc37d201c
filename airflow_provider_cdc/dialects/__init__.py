"""One package per database. ``get_dialect(params)`` makes a dialect by name (dialects/registry.py)."""

from __future__ import annotations

from .base import ConnectionParams, Dialect
from .registry import get_profile


def dialect_class(name: str) -> type[Dialect]:
    """The dialect class of the database named ``name`` (its registered profile names it)."""
    return get_profile(name).dialect_class()


def get_dialect(params: ConnectionParams, **options) -> Dialect:
    return dialect_class(params.scheme)(params, **options)


__all__ = ["ConnectionParams", "Dialect", "dialect_class", "get_dialect"]
