"""PostgreSQL as a source, one module per capability (dialect.py composes them).

The names below load their module when first used (PEP 562), so that importing the
driver-free ``profile`` module does not import the dialect and its driver."""

from __future__ import annotations

from ..lazy import lazy_exports

#: exported name -> the module that defines it
_EXPORTS = {
    "DEFAULT_COPY_BATCH_ROWS": ".chunks",
    "PostgresDialect": ".dialect",
    "DEFAULT_CAPTURE_STEP_MESSAGES": ".log_reader",
    "SLOT_NAME_RE": ".prerequisites",
    "PgSettings": ".prerequisites",
    "default_object_name": ".prerequisites",
    "prerequisite_problems": ".prerequisites",
    "SESSION_OPTIONS": ".types",
    "SUPPORTED_TYPES": ".types",
    "PgType": ".types",
    "UnsupportedType": ".types",
    "decoder": ".types",
    "logical_type": ".types",
    "numeric_type": ".types",
    "parse_array": ".types",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
