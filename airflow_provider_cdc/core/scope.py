"""The capture scope, and the one check every reader of a source goes through (I15):
:meth:`CaptureScope.check` refuses catalogs, the watermark table and tables outside the scope
with one message, whichever door asked. Also the grammars of names read back from Variables,
XCom and files (:func:`check_source_name`, :func:`check_snapshot_id`) and
:func:`drop_row_values` for error texts. Pure: no Airflow, no driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ConfigurationError
from .schema import TableName

#: the watermark table a source uses unless its connection's extra names another
DEFAULT_WATERMARK_TABLE = TableName("cdc", "watermark")


@dataclass(frozen=True)
class SystemCatalogs:
    """The schemas of a server's own catalogs, as its database's profile gives them
    (dialects/<db>/profile.py: ``system_schemas``, ``system_schema_prefixes``): ``schemas`` by
    name, in any case, and every schema whose name starts with one of ``prefixes`` (PostgreSQL
    reserves ``pg_*``). Core knows no database: a caller passes its server's catalogs, or, where
    the scope is known without a dialect, every registered server's
    (dialects/registry.all_system_catalogs), so such a scope refuses all of them."""

    schemas: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    def __or__(self, other: SystemCatalogs) -> SystemCatalogs:
        prefixes = tuple(dict.fromkeys(self.prefixes + other.prefixes))
        return SystemCatalogs(self.schemas | other.schemas, prefixes)


def is_system_schema(schema: str, catalogs: SystemCatalogs) -> bool:
    """A schema of the server's own catalogs (``catalogs``: its server's, or every server's)."""
    return schema.lower() in catalogs.schemas or schema.startswith(catalogs.prefixes)


def no_scope_error(source: str) -> ConfigurationError:
    """The error of a source without a capture scope: what to set, and why not everything."""
    return ConfigurationError(
        f"source {source!r} has no capture scope: set CDC_TABLES (or the 'tables' of its entry in the "
        "sources config) to the tables it captures, e.g. CDC_TABLES='public.orders,public.customers'. "
        "To capture every table of the database instead, set CDC_CAPTURE_ALL_TABLES=true (the docs' "
        "security page: on PostgreSQL that is a FOR ALL TABLES publication, under which UPDATE and "
        "DELETE fail "
        "on any table without a replica identity)"
    )


@dataclass(frozen=True)
class CaptureScope:
    """What a source may read: ``tables`` (None with ``all_tables``: every table but the
    catalogs and the watermark table). ``catalogs``: the system catalogs refused (the source's
    server's, or every registered server's when its dialect is not known);
    ``watermark_table``: None when not known (the default one is refused then)."""

    source: str
    tables: frozenset[TableName] | None
    catalogs: SystemCatalogs
    all_tables: bool = False
    watermark_table: TableName | None = None

    @classmethod
    def of(
        cls,
        source: str,
        tables: Iterable[TableName | str] | None,
        *,
        catalogs: SystemCatalogs,
        all_tables: bool = False,
        watermark_table: TableName | None = None,
    ) -> CaptureScope:
        given = (
            None
            if tables is None
            else frozenset(t if isinstance(t, TableName) else TableName.parse(str(t)) for t in tables)
        )
        return cls(source, given or None, catalogs, bool(all_tables), watermark_table)

    def require(self) -> None:
        """Refuse when no scope is configured: nothing may be read then."""
        if self.tables is None and not self.all_tables:
            raise no_scope_error(self.source)

    def refusal(self, table: TableName) -> str | None:
        """Why ``table`` may not be read by any entry point (None: it may)."""
        if self.tables is None and not self.all_tables:
            return (
                f"source {self.source!r} has no capture scope: set CDC_TABLES (or the 'tables' of its "
                "entry in "
                "the sources config) to the tables it captures"
            )
        if is_system_schema(table.schema, self.catalogs):
            return (
                f"table {table} is in system schema {table.schema!r}: the server's catalogs are never "
                "read by "
                "CDC (snapshot, verify, repair, export, the CDC page), whatever a conf or setting says"
            )
        if table == (self.watermark_table or DEFAULT_WATERMARK_TABLE):
            return (
                f"table {table} is the watermark table of source {self.source!r}, not data: CDC "
                "never reads it"
            )
        if self.tables is not None and table not in self.tables:
            close = close_tables(table, self.tables)
            if close:  # a typo or the wrong case: not something to add to the scope
                return (
                    f"table {table} is not captured by source {self.source!r}: it is outside the "
                    "capture scope; "
                    f"did you mean {' or '.join(map(str, close))}? Table names match exactly, case included "
                    f"(the scope: {', '.join(sorted(map(str, self.tables)))})"
                )
            return (
                f"table {table} is not captured by source {self.source!r}: it is outside the capture scope "
                "(CDC_TABLES, or the sources config's 'tables': "
                f"{', '.join(sorted(map(str, self.tables)))}), "
                "and snapshot, verify, repair, export and the CDC page read only captured tables. An "
                "administrator allows it by adding it to that setting"
            )
        return None

    def check(self, table: TableName) -> TableName:
        """``table`` when it may be read; else a ConfigurationError with :meth:`refusal`."""
        self.require()
        why = self.refusal(table)
        if why is not None:
            raise ConfigurationError(why)
        return table

    def check_all(self, tables: Iterable[TableName]) -> None:
        self.require()
        for t in tables:
            self.check(t)


def close_tables(table: TableName, candidates: Iterable[TableName]) -> list[TableName]:
    """The tables of ``candidates`` a user probably meant by ``table``: the same name in another
    case, else names one or two typing slips away (a letter left out, added, changed, or two
    swapped; one slip for names under 5 characters), closest first."""
    pool = sorted(candidates, key=str)
    same = [t for t in pool if str(t).lower() == str(table).lower()]
    if same:
        return same
    given = str(table).lower()
    limit = 1 if len(table.name) < 5 else 2
    scored = sorted((d, str(t)) for t in pool if (d := _slips(given, str(t).lower(), limit)) <= limit)
    by_name = {str(t): t for t in pool}
    return [by_name[n] for _d, n in scored[:3]]


def _slips(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance of ``a`` and ``b`` (limit + 1 once it exceeds ``limit``)."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


# --- names read back from Variables, XCom and files ------------------------------------------
#: a source name: the sources config's names and Airflow connection ids (letters, digits,
#: '_', '-', '.'; not starting with '.' or '-'), so it is one harmless path component
SOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}")
#: a snapshot id: what new_snapshot_id() makes (``20261127T091500-1a2b3c4d``), or any short
#: name of the same letters (tests and older versions)
SNAPSHOT_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def check_source_name(name: object, where: str = "a stored value") -> str:
    """``name`` when it is a source name; else a ConfigurationError naming ``where``."""
    if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name) or ".." in name:
        raise ConfigurationError(
            f"{where}: source name {name!r} is not a source name (1-250 letters, digits, '_', '-', '.', not "
            "starting with '.' or '-'); it is not used as a path or a connection. Delete or correct "
            "that value"
        )
    return name


def check_snapshot_id(snapshot_id: object, where: str = "a stored value") -> str:
    """``snapshot_id`` when it is a snapshot id; else a ConfigurationError naming ``where``."""
    if not isinstance(snapshot_id, str) or not SNAPSHOT_ID.fullmatch(snapshot_id) or ".." in snapshot_id:
        raise ConfigurationError(
            f"{where}: snapshot id {snapshot_id!r} is not a snapshot id (1-100 letters, digits, '_', "
            "'-', '.', "
            "not starting with '.' or '-'); it is not used as a path. Delete or correct that value"
        )
    return snapshot_id


# --- error text that is stored or shown ----------------------------------------------------------
_DETAIL = re.compile(r"^\s*(DETAIL|HINT|CONTEXT|WHERE|QUERY|LINE \d+):.*$", re.MULTILINE)
_MYSQL_VALUES = re.compile(
    r"(Duplicate entry |Incorrect \w+ value: |Truncated incorrect \w+ value: )'(?:[^'\\]|\\.|'')*'"
)
ROW_VALUES_DROPPED = "(row values dropped)"
#: PostgreSQL messages whose main line quotes the value that failed (a column's value: an SSN
#: in a text column cast to integer), e.g. ``invalid input syntax for type integer: "ssn-1"``
_PG_QUOTED_VALUE = re.compile(
    r"((?:invalid input syntax for(?: type)? [^:\n]{1,80}|invalid input value for enum [^:\n]{1,120}|"
    r"(?:date/time )?field value out of range|invalid byte sequence for encoding [^:\n]{1,40}|"
    r"malformed (?:array|range|record) literal|invalid (?:hexadecimal|binary) (?:data|digit)[^:\n]{0,40}): )"
    r'"(?:[^"\\]|\\.|"")*"'
)
#: ``value "123456789012" is out of range for type integer``
_PG_VALUE_OUT_OF_RANGE = re.compile(r'\bvalue "(?:[^"\\]|\\.|"")*" (is out of range)')


def drop_row_values(text: str) -> str:
    """A database error's text without the row values it may carry: PostgreSQL's DETAIL
    (``Key (id)=(5) already exists``, ``Failing row contains (...)``), HINT, CONTEXT, WHERE
    and QUERY lines and the value a main line quotes (``invalid input syntax for type integer:
    "..."``), and MySQL's quoted values (``Duplicate entry 'x' for key``)."""
    out = _DETAIL.sub(lambda m: f"{m.group(1)}: {ROW_VALUES_DROPPED}", str(text))
    out = _PG_QUOTED_VALUE.sub(lambda m: f"{m.group(1)}{ROW_VALUES_DROPPED}", out)
    out = _PG_VALUE_OUT_OF_RANGE.sub(lambda m: f"value {ROW_VALUES_DROPPED} {m.group(1)}", out)
    return _MYSQL_VALUES.sub(lambda m: f"{m.group(1)}{ROW_VALUES_DROPPED}", out)
