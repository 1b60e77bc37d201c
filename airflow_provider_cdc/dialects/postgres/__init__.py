"""PostgreSQL as a source, one module per capability (dialect.py composes them)."""

from .chunks import DEFAULT_COPY_BATCH_ROWS
from .dialect import PostgresDialect
from .log_reader import DEFAULT_CAPTURE_STEP_MESSAGES
from .prerequisites import SLOT_NAME_RE, PgSettings, default_object_name, prerequisite_problems
from .types import (
    SESSION_OPTIONS,
    SUPPORTED_TYPES,
    PgType,
    UnsupportedType,
    decoder,
    logical_type,
    numeric_type,
    parse_array,
)

__all__ = ['DEFAULT_CAPTURE_STEP_MESSAGES', 'DEFAULT_COPY_BATCH_ROWS', 'PgSettings', 'PgType', 'PostgresDialect', 'SESSION_OPTIONS', 'SUPPORTED_TYPES', 'UnsupportedType', 'SLOT_NAME_RE', 'numeric_type', 'decoder', 'default_object_name', 'logical_type', 'parse_array', 'prerequisite_problems']
