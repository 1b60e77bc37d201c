"""The PostgreSQL catalog: a table's columns, types, primary key and replica identity.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ...core.errors import SourceError, TableNotFoundError
from ...core.schema import Column, TableName, TableSchema
from .types import REPLICA_IDENTITY, SUPPORTED_TYPES, PgType, UnsupportedType, logical_type


class PgCatalog:
    """Describe tables from pg_catalog (types cached per connection)."""

    # --- metadata ---------------------------------------------------------------------
    def _type(self, oid: int) -> PgType:
        t = self._types.get(oid)
        if t is None:
            self._load_types([oid])
            t = self._types.get(oid)
            if t is None:
                raise UnsupportedType(f"oid {oid}")
        return t

    def _load_types(self, oids: Sequence[int]) -> None:
        """Cache pg_type rows for ``oids`` and everything they refer to (elements, base types)."""
        todo = [o for o in set(oids) if o not in self._types]
        while todo:
            rows = self._query(
                "SELECT t.oid, t.typname, n.nspname, t.typtype, t.typelem, t.typbasetype, t.typtypmod, t.typcategory "
                "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = ANY(%s::oid[])",
                (list(todo),),
            )
            for r in rows:
                self._types[r[0]] = PgType(*r)
            todo = [o for r in rows for o in (r[4], r[5]) if o and o not in self._types]

    def _relation(self, table: TableName) -> tuple[int, str] | None:
        rows = self._query(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (table.schema, table.name),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def _primary_key(self, relid: int) -> tuple[str, ...] | None:
        if relid not in self._pk_cache:
            rows = self._query(
                "SELECT a.attname FROM pg_index i "
                "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord",
                (relid,),
            )
            self._pk_cache[relid] = tuple(r[0] for r in rows) or None
        return self._pk_cache[relid]

    def describe_table(self, table: TableName) -> TableSchema:
        rel = self._relation(table)
        if rel is None:
            kind = self._query(
                "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s",
                (table.schema, table.name),
            )
            if kind:
                what = {"v": "a view", "m": "a materialized view", "f": "a foreign table"}.get(
                    kind[0][0], "not a table"
                )
                raise SourceError(
                    f"{table} is {what}; CDC reads tables (a logical slot only decodes table changes): "
                    "give the underlying table"
                )
            raise TableNotFoundError(
                f"table {table} not found in PostgreSQL database {self.params.database!r} "
                f"(schema {table.schema!r}, table {table.name!r}; names are case-sensitive): check the name "
                "and that the user can see it"
            )
        relid, ident = rel
        cols = self._query(
            "SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod) "
            "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attgenerated = '' ORDER BY a.attnum",
            (relid,),
        )
        self._load_types([c[1] for c in cols])
        columns = []
        for name, oid, typmod, notnull, display in cols:
            try:
                lt = logical_type(oid, typmod, self._type)
            except UnsupportedType as exc:
                raise SourceError(
                    f"table {table}: column {name!r} has type {display} ({exc.type_name}), which CDC does not "
                    f"support; supported: {', '.join(SUPPORTED_TYPES)}. Change the column's type or leave the "
                    "table out of CDC"
                ) from None
            columns.append(Column(name, lt, display, not notnull))
        enums = self._enum_labels({c[0]: c[1] for c in cols})
        pk = self._primary_key(relid)
        if not pk:
            raise SourceError(
                f"table {table} has no primary key. DBLog reads chunks in primary-key order and matches "
                f"changelog events by key, so it needs one. Options: add a primary key "
                f"(ALTER TABLE {self.quote_table(table)} ADD PRIMARY KEY (...)), e.g. on an existing unique "
                "NOT NULL column or a new identity column; or leave the table out of CDC"
            )
        extra = {"replica_identity": REPLICA_IDENTITY.get(ident, ident), "connector": "postgresql"}
        if enums:
            extra["enum_labels"] = json.dumps(enums, ensure_ascii=False, sort_keys=True)
        return TableSchema(table, tuple(columns), pk, extra)

    def _enum_labels(self, oids: dict[str, int]) -> dict[str, list[str]]:
        """column -> its enum's labels in sort order, for columns of an enum type, a domain over
        one, or an array of either (Debezium's ``allowed``)."""
        enum_of: dict[str, int] = {}
        for name, oid in oids.items():
            t = self._type(oid)
            for _ in range(8):  # domains over domains, arrays of domains: a few steps at most
                if t.typtype == "d":
                    t = self._type(t.basetype)
                elif t.category == "A" and t.elem:
                    t = self._type(t.elem)
                else:
                    break
            if t.typtype == "e":
                enum_of[name] = t.oid
        if not enum_of:
            return {}
        rows = self._query("SELECT enumtypid, enumlabel FROM pg_enum WHERE enumtypid = ANY(%s::oid[]) "
                           "ORDER BY enumtypid, enumsortorder", (sorted(set(enum_of.values())),))
        labels: dict[int, list[str]] = {}
        for oid, label in rows:
            labels.setdefault(oid, []).append(label)
        return {name: labels.get(oid, []) for name, oid in enum_of.items()}
