"""The MySQL catalog: a table's columns, types and primary key from information_schema.
"""

from __future__ import annotations

import re

import pymysql
import pymysql.cursors

from ...core.errors import SourceError, TableNotFoundError
from ...core.schema import Column, TableName, TableSchema
from .types import as_text, logical_type


class MyCatalog:
    """Describe tables from information_schema."""

    def describe_table(self, table: TableName) -> TableSchema:
        rows = self._query(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE"
            " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
            " ORDER BY ORDINAL_POSITION",
            (table.schema, table.name),
        )
        if not rows:
            if not self._query(
                "SELECT 1 FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = %s", (table.schema,)
            ):
                raise TableNotFoundError(f"table {table}: database {table.schema!r} does not exist on the source")
            raise TableNotFoundError(
                f"table {table} does not exist in database {table.schema!r} (check the name and case)"
            )
        json_cols = self._json_check_columns(table) if self.flavour.is_mariadb else set()
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
        pk = [
            r[0]
            for r in self._query(
                "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
                " AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX",
                (table.schema, table.name),
            )
        ]
        if not pk:
            raise SourceError(
                f"table {table} has no primary key; DBLog chunks and de-duplicates by primary key: add one "
                f"(ALTER TABLE ... ADD PRIMARY KEY) or exclude the table"
            )
        return TableSchema(table, tuple(cols), tuple(pk), {"flavour": self.flavour.name,
                                                           "connector": "mariadb" if self.flavour.is_mariadb else "mysql"})

    def _json_check_columns(self, table: TableName) -> set[str]:
        """MariaDB's JSON is LONGTEXT plus a ``json_valid(`col`)`` CHECK constraint."""
        try:
            rows = self._query(
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
