"""MySQL and MariaDB as a source, one module per capability (dialect.py composes them).

The names below load their module when first used (PEP 562), so that importing the
driver-free ``profile`` module does not import the dialect and its driver."""

from __future__ import annotations

from ..lazy import lazy_exports

#: exported name -> the module that defines it
_EXPORTS = {
    "bounded_batches": ".chunks",
    "MySqlDialect": ".dialect",
    "default_server_id": ".profile",
    "XA_DIR": ".held",
    "parse_truncate": ".binlog_read",
    "OFFSET_FILE": ".offsets",
    "BinlogOffset": ".offsets",
    "MARIADB": ".server",
    "MYSQL_80": ".server",
    "MYSQL_84": ".server",
    "REQUIRED_SETTINGS": ".prerequisites",
    "Flavour": ".server",
    "flavour_for": ".server",
    "held_privileges": ".prerequisites",
    "prerequisite_problems": ".prerequisites",
    "logical_type": ".types",
}


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)

__all__ = sorted(_EXPORTS)
