"""The MySQL catalog: a table's columns, types and key from information_schema; the dialect's
``catalog``.
"""

from __future__ import annotations

import json
import re

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, TableNotFoundError
from ...core.schema import MULTISET, WHOLE_ROW, WHOLE_TABLE, Column, TableName, TableSchema, multiset_key
from .server import MyServer
from .types import as_text, logical_type


class MyCatalog:
    """Describe tables from information_schema: the dialect's ``catalog``."""

    def __init__(self, server: MyServer, key_columns: dict[TableName, tuple[str, ...]]) -> None:
        self.server = server
        self.key_columns = key_columns  # CDC_KEY_COLUMNS, by table

    def describe_table(self, table: TableName, *, keyed: bool = True) -> TableSchema:
        """``keyed`` False: for a whole-table refresh, which needs no key (core/schema.py, WHOLE_TABLE)."""
        rows = self.server.query(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE"
            " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
            " ORDER BY ORDINAL_POSITION",
            (table.schema, table.name),
        )
        if not rows:
            if not self.server.query(
                "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (table.schema,)
            ):
                raise TableNotFoundError(
                    f"table {table}: database {table.schema!r} does not exist on the source"
                )
            raise TableNotFoundError(
                f"table {table} does not exist in database {table.schema!r} (check the name and case)"
            )
        json_cols = self._json_check_columns(table) if self.server.flavour.is_mariadb else set()
        cols, unsupported = [], []
        for name, data_type, column_type, nullable, precision, scale in rows:
            data_type, column_type = as_text(data_type), as_text(column_type)
            if data_type == "bit":
                precision = int(re.search(r"\((\d+)\)", column_type).group(1)) if "(" in column_type else 1
            lt = "json" if name in json_cols else logical_type(data_type, column_type, precision, scale)
            if lt is None:
                unsupported.append(f"{name!r} ({column_type})")
                continue
            cols.append(Column(name, lt, column_type, nullable == "YES"))
        if unsupported:
            raise SourceError(
                f"table {table}: column(s) of unsupported type: {', '.join(unsupported)}; "
                f"exclude the table or change the column type"
            )
        extra = {
            "flavour": self.server.flavour.name,
            "connector": "mariadb" if self.server.flavour.is_mariadb else "mysql",
        }
        if not keyed:
            return TableSchema(table, tuple(cols), (), {**extra, WHOLE_TABLE: "true"})
        pk, why = self._table_key(table, {c.name: c.nullable for c in cols})
        if pk == ():
            return TableSchema(table, tuple(cols), (), {**extra, MULTISET: "true"})
        if not pk:
            raise SourceError(
                f"table {table} {why}; DBLog chunks and de-duplicates by key: name it in "
                "CDC_REFRESH_TABLES instead, which refreshes it whole without a key (docs: operations, "
                "'Tables without a primary key'), or exclude the table"
            )
        return TableSchema(table, tuple(cols), tuple(pk), extra)

    def _table_key(self, table: TableName, nullable: dict[str, bool]) -> tuple[tuple[str, ...] | None, str]:
        """The columns that key ``table``'s rows: the primary key, or the columns CDC_KEY_COLUMNS
        names, which must be those of a unique index (no prefix) on NOT NULL columns. None and
        why not, with the statements that would make it capturable."""
        indexes: dict[str, list[str | None]] = {}
        prefixed: set[str] = set()
        for name, col, sub_part in self.server.query(
            "SELECT INDEX_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS WHERE "
            "TABLE_SCHEMA = %s "
            "AND TABLE_NAME = %s AND NON_UNIQUE = 0 ORDER BY INDEX_NAME <> 'PRIMARY', INDEX_NAME, "
            "SEQ_IN_INDEX",
            (table.schema, table.name),
        ):
            name = as_text(name)
            indexes.setdefault(name, []).append(None if col is None else as_text(col))
            if sub_part is not None:
                prefixed.add(name)
        usable = {
            n: tuple(c)
            for n, c in indexes.items()
            if n not in prefixed and None not in c and not any(nullable.get(x, True) for x in c)
        }
        want = self.key_columns.get(table)
        qt = self.server.quote_table(table)
        if want == WHOLE_ROW:  # a multiset: () is "keyed by the whole row"
            # (binlog_row_image=FULL, every capture's prerequisite, logs whole old rows)
            return multiset_key(table, has_key="PRIMARY" in indexes, whole_old_rows=True)
        if want:
            if any(sorted(c) == sorted(want) for c in usable.values()):
                return want, ""
            near = [n for n, c in indexes.items() if sorted(x or "" for x in c) == sorted(want)]
            null = [c for c in want if nullable.get(c, True)]
            if near and null:
                return None, (
                    f"has CDC_KEY_COLUMNS {list(want)!r}, but column(s) {null!r} allow NULL, which a unique "
                    f"index does not make unique: ALTER TABLE {qt} MODIFY each as NOT NULL"
                )
            return None, (
                f"has no unique index on exactly the CDC_KEY_COLUMNS {list(want)!r} (whole columns, no "
                "prefix), so they need not identify a row: CREATE UNIQUE INDEX ... ON "
                f"{qt} ({', '.join(map(self.server.quote_ident, want))}), or name another key"
            )
        if "PRIMARY" in usable:
            return usable["PRIMARY"], ""
        example = next(iter(usable.values()), None)
        hint = (
            f"name the columns of a unique index on NOT NULL columns in CDC_KEY_COLUMNS, e.g. "
            f"{json.dumps({table.id: list(example)}, ensure_ascii=False)}"
            if example
            else "or create a unique index on NOT NULL columns and name them in CDC_KEY_COLUMNS"
        )
        return None, f"has no primary key: ALTER TABLE {qt} ADD PRIMARY KEY (...), {hint}"

    def scope_problems(self, tables) -> list[str]:
        problems = []
        for t in tables:
            nullable = {
                as_text(c): n == "YES"
                for c, n in self.server.query(
                    "SELECT COLUMN_NAME, IS_NULLABLE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
                    "AND TABLE_NAME = %s",
                    (t.schema, t.name),
                )
            }
            if nullable:
                key, why = self._table_key(t, nullable)
                if key is None:
                    problems.append(f"table {t} {why}")
        return problems

    def _json_check_columns(self, table: TableName) -> set[str]:
        """MariaDB's JSON is LONGTEXT plus a ``json_valid(`col`)`` CHECK constraint."""
        try:
            rows = self.server.query(
                "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS"
                " WHERE CONSTRAINT_SCHEMA = %s AND TABLE_NAME = %s",
                (table.schema, table.name),
            )
        except pymysql.err.MySQLError:
            return set()
        out = set()
        for (clause,) in rows:
            m = re.fullmatch(r"json_valid\(`((?:[^`]|``)+)`\)", as_text(clause).strip())
            if m:
                out.add(m.group(1).replace("``", "`"))
        return out
