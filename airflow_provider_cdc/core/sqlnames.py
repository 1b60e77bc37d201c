"""The one identifier quoter per SQL dialect (names are data: any character but NUL).

Every statement this package sends goes through its driver's ``%``-parameter formatting
(psycopg2 and pymysql both, even without parameters: callers pass an empty tuple, and COPY
text is built with ``cursor.mogrify``), so a ``%`` inside a quoted identifier is written
``%%`` here and reaches the server as ``%``. A table named ``a'b %s; é`` therefore cannot
turn into a placeholder, and the quotes close only where we close them.
"""

from __future__ import annotations

from .errors import ConfigurationError


def _check(name: str, dialect: str) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"{dialect} identifier {name!r} is empty; every table and column needs a name"
        )
    if "\x00" in name:
        raise ConfigurationError(
            f"{dialect} identifier {name!r} contains a NUL character, which {dialect} cannot name"
        )


def quote_pg(name: str) -> str:
    """``"name"`` with inner ``"`` doubled and ``%`` doubled for the driver's formatting."""
    _check(name, "PostgreSQL")
    return '"' + name.replace('"', '""').replace("%", "%%") + '"'


def quote_delta(name: str) -> str:
    """A column for delta-rs expressions (DataFusion SQL): ``"name"``, inner ``"`` doubled.
    (delta-rs's own ``update_all`` / ``insert_all`` quote with backticks unescaped: a column
    named ````` breaks them, so the mirror names every column itself.)"""
    _check(name, "Delta")
    return '"' + name.replace('"', '""') + '"'


def quote_mysql(name: str) -> str:
    """```name``` with inner backticks doubled and ``%`` doubled for the driver's formatting."""
    _check(name, "MySQL")
    return "`" + name.replace("`", "``").replace("%", "%%") + "`"
