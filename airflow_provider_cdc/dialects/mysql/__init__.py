"""MySQL and MariaDB as a source, one module per capability (dialect.py composes them)."""

from .chunks import bounded_batches
from .dialect import MySqlDialect, default_server_id
from .held import XA_DIR
from .log_reader import parse_truncate
from .offsets import OFFSET_FILE, BinlogOffset
from .prerequisites import REQUIRED_SETTINGS, SYSTEM_SCHEMAS, held_privileges, prerequisite_problems
from .server import MARIADB, MYSQL_80, MYSQL_84, Flavour, flavour_for
from .types import logical_type

__all__ = ['BinlogOffset', 'Flavour', 'MARIADB', 'MYSQL_80', 'MYSQL_84', 'MySqlDialect', 'OFFSET_FILE', 'REQUIRED_SETTINGS', 'SYSTEM_SCHEMAS', 'XA_DIR', 'bounded_batches', 'default_server_id', 'flavour_for', 'held_privileges', 'logical_type', 'parse_truncate', 'prerequisite_problems']
