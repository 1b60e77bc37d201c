"""The PostgreSQL catalog: a table's columns, types, key and replica identity, read from pg_catalog
(types and keys cached per dialect); the dialect's ``catalog``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from ...core.errors import SourceError, TableNotFoundError
from ...core.schema import MULTISET, WHOLE_ROW, WHOLE_TABLE, Column, TableName, TableSchema, multiset_key
from .server import PgServer
from .types import REPLICA_IDENTITY, SUPPORTED_TYPES, PgType, UnsupportedType, logical_type


@dataclass(frozen=True)
class UniqueIndex:
    name: str
    primary: bool
    identity: bool  # the table's REPLICA IDENTITY USING INDEX
    columns: tuple[str, ...]
    nullable: tuple[str, ...]  # those of the columns that allow NULL


class PgCatalog:
    """Describe tables from pg_catalog (types cached per dialect)."""

    def __init__(self, server: PgServer, key_columns: dict[TableName, tuple[str, ...]]) -> None:
        self.server = server
        self.key_columns = key_columns  # CDC_KEY_COLUMNS, by table
        self._types: dict[int, PgType] = {}
        self._key_cache: dict[
            tuple[int, str], tuple[tuple[str, ...] | None, str]
        ] = {}  # (relid, identity) -> table_key

    def pg_type(self, oid: int) -> PgType:
        t = self._types.get(oid)
        if t is None:
            self.load_types([oid])
            t = self._types.get(oid)
            if t is None:
                raise UnsupportedType(f"oid {oid}")
        return t

    def load_types(self, oids: Sequence[int]) -> None:
        """Cache pg_type rows for ``oids`` and everything they refer to (elements, base types)."""
        todo = [o for o in set(oids) if o not in self._types]
        while todo:
            rows = self.server.query(
                "SELECT t.oid, t.typname, n.nspname, t.typtype, t.typelem, t.typbasetype, t.typtypmod, "
                "t.typcategory "
                "FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = ANY(%s::oid[])",
                (list(todo),),
            )
            for r in rows:
                self._types[r[0]] = PgType(*r)
            todo = [o for r in rows for o in (r[4], r[5]) if o and o not in self._types]

    def relation(self, table: TableName) -> tuple[int, str] | None:
        rows = self.server.query(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (table.schema, table.name),
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def _unique_indexes(self, relid: int) -> list[UniqueIndex]:
        """The table's unique indexes a key can be read from (valid, no predicate, no
        expressions), primary key first, then the replica identity's index."""
        rows = self.server.query(
            "SELECT ic.relname, i.indisprimary, i.indisreplident, "
            "ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "      WHERE k.ord <= i.indnkeyatts ORDER BY k.ord), "
            "ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "      WHERE k.ord <= i.indnkeyatts AND NOT a.attnotnull ORDER BY k.ord) "
            "FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid "
            "WHERE i.indrelid = %s AND i.indisunique AND i.indisvalid AND i.indpred IS NULL AND "
            "i.indexprs IS NULL "
            "ORDER BY NOT i.indisprimary, NOT i.indisreplident, ic.relname",
            (relid,),
        )
        return [
            UniqueIndex(name, primary, identity, tuple(cols), tuple(nullable))
            for name, primary, identity, cols, nullable in rows
        ]

    def _whole_row_key(
        self, table: TableName, at: tuple[int, str], has_key: bool
    ) -> tuple[tuple[str, ...] | None, str]:
        key, why = multiset_key(table, has_key=has_key, whole_old_rows=at[1] == "f")
        if key is None and at[1] != "f":
            qt = self.server.quote_table(table)
            why += f". Have the table's owner run: ALTER TABLE {qt} REPLICA IDENTITY FULL"
        return self._key_cache.setdefault(at, (key, why))

    def table_key(self, table: TableName, relid: int, ident: str) -> tuple[tuple[str, ...] | None, str]:
        """The columns that key ``table``'s rows, or None and why not, with the statements that
        would make it capturable: a key the log carries for every UPDATE and DELETE (the primary
        key under REPLICA IDENTITY DEFAULT, the identity's index under USING INDEX, under FULL the
        primary key or the unique NOT NULL columns CDC_KEY_COLUMNS names; ``()``: '*', a multiset).
        Anything else also makes PostgreSQL refuse the application's UPDATE and DELETE."""
        if (hit := self._key_cache.get((relid, ident))) is not None:
            return hit
        idx = self._unique_indexes(relid)
        pk = next((x for x in idx if x.primary), None)
        want = self.key_columns.get(table)
        qt = self.server.quote_table(table)
        if want == WHOLE_ROW:  # a multiset: () is "keyed by the whole row"
            return self._whole_row_key(table, (relid, ident), pk is not None)
        key, why, fixes = self._identity_key(table, qt, ident, idx, pk, want)
        key, why, fixes = self._named_key(table, qt, ident, idx, want, key, why, fixes)
        out = (
            key,
            "" if key else f"{why}. Have the table's owner run: {'; or '.join(fixes)}" if fixes else why,
        )
        self._key_cache[(relid, ident)] = out
        return out

    def _identity_key(
        self,
        table: TableName,
        qt: str,
        ident: str,
        idx: list[UniqueIndex],
        pk: UniqueIndex | None,
        want: tuple[str, ...] | None,
    ) -> tuple[tuple[str, ...] | None, str, list[str]]:
        """The key the table's replica identity ``ident`` makes the log carry, why it may be
        missing and the statements that would give one."""
        usable = [x for x in idx if not x.nullable]
        example = json.dumps({table.id: list(usable[0].columns)}, ensure_ascii=False) if usable else ""
        full = (
            f"ALTER TABLE {qt} REPLICA IDENTITY FULL and name its key in CDC_KEY_COLUMNS (e.g. {example})"
            if usable
            else f"ALTER TABLE {qt} ADD PRIMARY KEY (...) on columns that identify a row"
        )
        fixes = (
            [f"ALTER TABLE {qt} REPLICA IDENTITY USING INDEX {self.server.quote_ident(usable[0].name)}"]
            if usable
            else []
        ) + [full]
        key: tuple[str, ...] | None = None
        if ident == "n":
            why = (
                "has REPLICA IDENTITY NOTHING, so once published PostgreSQL refuses every UPDATE and "
                "DELETE on it"
            )
            fixes = ([f"ALTER TABLE {qt} REPLICA IDENTITY DEFAULT"] if pk else []) + fixes
        elif ident == "d":
            key = pk.columns if pk else None
            why = (
                "has no primary key and REPLICA IDENTITY DEFAULT, so once published PostgreSQL refuses every "
                "UPDATE and DELETE on it"
            )
        elif ident == "i":
            ri = next((x for x in idx if x.identity), None)
            key = ri.columns if ri else None
            why = (
                "has REPLICA IDENTITY USING INDEX, but that index no longer exists (the table "
                "publishes no key)"
            )
        else:  # "f": the log carries whole old rows, any unique NOT NULL key will do
            key = want or (pk.columns if pk else None)
            why = (
                "has REPLICA IDENTITY FULL but no primary key, and CDC_KEY_COLUMNS names none of its unique "
                "indexes: name its key there"
                + (f", e.g. {example}" if usable else " after creating a unique index on NOT NULL columns")
            )
            fixes = []
        return key, why, fixes

    def _named_key(
        self,
        table: TableName,
        qt: str,
        ident: str,
        idx: list[UniqueIndex],
        want: tuple[str, ...] | None,
        key: tuple[str, ...] | None,
        why: str,
        fixes: list[str],
    ) -> tuple[tuple[str, ...] | None, str, list[str]]:
        """``key``, ``why`` and ``fixes`` as they stand once the CDC_KEY_COLUMNS named for the table
        are checked: a unique NOT NULL index on exactly them, and the key the log carries."""
        if key and want and ident == "f":
            match = [x for x in idx if sorted(x.columns) == sorted(want)]
            if not match:
                key, why = (
                    None,
                    (
                        f"has no unique index on exactly the CDC_KEY_COLUMNS {list(want)!r} (without a "
                        "predicate or expressions), so they need not identify a row"
                    ),
                )
                fixes = [f"CREATE UNIQUE INDEX ON {qt} ({', '.join(map(self.server.quote_ident, want))})"]
            elif match[0].nullable:
                key, why = (
                    None,
                    (
                        f"has CDC_KEY_COLUMNS {list(want)!r}, but column(s) {list(match[0].nullable)!r} "
                        "allow NULL, which a unique index does not make unique"
                    ),
                )
                fixes = [
                    f"ALTER TABLE {qt} ALTER COLUMN {self.server.quote_ident(c)} SET NOT NULL"
                    for c in match[0].nullable
                ]
        elif key and want and sorted(want) != sorted(key):
            kind = {"d": "its primary key", "i": "its REPLICA IDENTITY index"}[ident]
            key, why = (
                None,
                (
                    f"has CDC_KEY_COLUMNS {list(want)!r}, but its UPDATEs and DELETEs carry {kind} only, "
                    "so a change of those columns would go unseen"
                ),
            )
            fixes = [
                f"ALTER TABLE {qt} REPLICA IDENTITY FULL (the log then carries whole old rows)",
                f"remove {table} from CDC_KEY_COLUMNS",
            ]
        return key, why, fixes

    def scope_problems(self, tables: Sequence[TableName]) -> list[str]:
        """Why each of ``tables`` cannot be captured (no usable key; on PostgreSQL that is also
        a table the publication would break for its applications). Missing tables are left to
        the checks that name them."""
        problems = []
        for t in tables:
            rel = self.relation(t)
            if rel is not None:
                key, why = self.table_key(t, *rel)
                if key is None:
                    problems.append(f"table {t} {why}")
        return problems

    def describe_table(self, table: TableName, *, keyed: bool = True) -> TableSchema:
        """``keyed`` False: for a whole-table refresh, which needs no key (core/schema.py, WHOLE_TABLE)."""
        rel = self.relation(table)
        if rel is None:
            kind = self.server.query(
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
                f"table {table} not found in PostgreSQL database {self.server.params.database!r} "
                f"(schema {table.schema!r}, table {table.name!r}; names are case-sensitive): check the name "
                "and that the user can see it"
            )
        relid, ident = rel
        cols = self.server.query(
            "SELECT a.attname, a.atttypid, a.atttypmod, a.attnotnull, format_type(a.atttypid, a.atttypmod) "
            "FROM pg_attribute a WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "AND a.attgenerated = '' ORDER BY a.attnum",
            (relid,),
        )
        self.load_types([c[1] for c in cols])
        columns = []
        for name, oid, typmod, notnull, display in cols:
            try:
                lt = logical_type(oid, typmod, self.pg_type)
            except UnsupportedType as exc:
                raise SourceError(
                    f"table {table}: column {name!r} has type {display} ({exc.type_name}), which CDC "
                    "does not "
                    f"support; supported: {', '.join(SUPPORTED_TYPES)}. Change the column's type or "
                    "leave the "
                    "table out of CDC"
                ) from None
            columns.append(Column(name, lt, display, not notnull))
        enums = self._enum_labels({c[0]: c[1] for c in cols})
        extra = {"replica_identity": REPLICA_IDENTITY.get(ident, ident), "connector": "postgresql"}
        if enums:
            extra["enum_labels"] = json.dumps(enums, ensure_ascii=False, sort_keys=True)
        if not keyed:
            return TableSchema(table, tuple(columns), (), {**extra, WHOLE_TABLE: "true"})
        pk, why = self.table_key(table, relid, ident)
        if pk == ():
            return TableSchema(table, tuple(columns), (), {**extra, MULTISET: "true"})
        if not pk:
            raise SourceError(
                f"table {table} {why}. DBLog reads chunks in key order and matches changelog events by "
                "key, so "
                "it needs a key the log carries; or name it in CDC_REFRESH_TABLES instead, which "
                "refreshes it whole without a key (docs: operations, 'Tables without a primary key'); "
                "or leave the table out of CDC"
            )
        return TableSchema(table, tuple(columns), pk, extra)

    def _enum_labels(self, oids: dict[str, int]) -> dict[str, list[str]]:
        """column -> its enum's labels in sort order, for columns of an enum type, a domain over
        one, or an array of either (Debezium's ``allowed``)."""
        enum_of: dict[str, int] = {}
        for name, oid in oids.items():
            t = self.pg_type(oid)
            for _ in range(8):  # domains over domains, arrays of domains: a few steps at most
                if t.typtype == "d":
                    t = self.pg_type(t.basetype)
                elif t.category == "A" and t.elem:
                    t = self.pg_type(t.elem)
                else:
                    break
            if t.typtype == "e":
                enum_of[name] = t.oid
        if not enum_of:
            return {}
        rows = self.server.query(
            "SELECT enumtypid, enumlabel FROM pg_enum WHERE enumtypid = ANY(%s::oid[]) "
            "ORDER BY enumtypid, enumsortorder",
            (sorted(set(enum_of.values())),),
        )
        labels: dict[int, list[str]] = {}
        for oid, label in rows:
            labels.setdefault(oid, []).append(label)
        return {name: labels.get(oid, []) for name, oid in enum_of.items()}
