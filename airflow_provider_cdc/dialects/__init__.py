"""One package per database. ``get_dialect(params)`` makes a dialect by name (dialects/registry.py).

``ConnectionParams``, ``Dialect`` and the read requests (``ChunkRead``, ``TableScan``,
``LogRead``) load dialects/base.py (and pyarrow) when first used (PEP 562): the driver-free
registry and profiles are read when a DAG file is parsed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .registry import get_profile

if TYPE_CHECKING:
    from .base import ConnectionParams, Dialect
    from .requests import ChunkRead, LogRead, TableScan


def dialect_class(name: str) -> type[Dialect]:
    """The dialect class of the database named ``name`` (its registered profile names it)."""
    return get_profile(name).dialect_class()


def get_dialect(params: ConnectionParams, **options: Any) -> Dialect:
    return dialect_class(params.scheme)(params, **options)


def __getattr__(name: str) -> Any:
    if name in ("ConnectionParams", "Dialect", "ChunkRead", "LogRead", "TableScan"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ChunkRead", "ConnectionParams", "Dialect", "LogRead", "TableScan", "dialect_class", "get_dialect"]
