"""verify's range digests computed by PostgreSQL (core/row_digest.py, the digest forms): each row's
columns become their digest text in SQL, the row's md5 is cut to 64 bits, and one aggregate
returns a key range's row count and the XOR of its rows' digests. Nothing but two numbers per
range leaves the server. The dialect's ``digests``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core import temporal
from ...core.schema import Column, TableSchema
from ..base import DIGEST_NULL, DIGEST_SIZED
from ..digests import Digests
from .chunks import PgChunkReader
from .server import PgServer


def _plain_text(col: Column) -> bool:
    """text and varchar: their cast to text is their output. Other string types are digested as
    their output function renders them (the canonical value): char(n)'s cast to text drops the
    blank padding, inet's adds the /32 or /128 its output leaves out."""
    st = col.source_type.lower()
    return st in ("text", "character varying") or st.startswith("character varying(")


def digest_text_sql(col: Column, ident: str) -> str | None:
    """The SQL of ``col``'s digest text (NULL when the value is), None when its type has none."""
    t = col.type
    if t in ("int16", "int32", "int64", "uuid", "json") or t.startswith("decimal"):
        return f"{ident}::text"
    if t == "string":
        return (
            f"{ident}::text"
            if _plain_text(col)
            else f"CASE WHEN {ident} IS NOT NULL THEN concat({ident}) END"
        )
    if t == "bool":
        return f"CASE WHEN {ident} THEN 't' WHEN NOT {ident} THEN 'f' END"
    if t == "float64":
        return f"(('x' || encode(float8send({ident}), 'hex'))::bit(64)::bigint)::text"
    if t == "float32":
        return f"(('x' || encode(float4send({ident}), 'hex'))::bit(32)::integer)::text"
    if t == "binary":
        return f"encode({ident}, 'hex')"
    if t == "time":  # the canonical text: six fraction digits
        return (
            f"CASE WHEN position('.' IN {ident}::text) > 0 THEN rpad({ident}::text, 15, '0') "
            f"ELSE {ident}::text || '.000000' END"
        )
    if t == "date":
        return (
            f"CASE WHEN {ident} = 'infinity' THEN '{temporal.INF_DATE}' WHEN {ident} = '-infinity' "
            f"THEN '{temporal.NINF_DATE}' ELSE ({ident} - DATE '1970-01-01')::text END"
        )
    if t in ("timestamp", "timestamptz"):  # extract(epoch) is numeric (exact) from PostgreSQL 14
        return (
            f"CASE WHEN {ident} = 'infinity' THEN '{temporal.INF_TS}' WHEN {ident} = '-infinity' "
            f"THEN '{temporal.NINF_TS}' ELSE (extract(epoch FROM {ident}) * 1000000)::bigint::text END"
        )
    return None  # arrays


class PgDigest(Digests):
    """Range digests: the dialect's ``digests`` (dialects/digests.py)."""

    def __init__(self, dialect: Any, server: PgServer, chunks: PgChunkReader) -> None:
        super().__init__(dialect)
        self.server = server
        self.chunks = chunks  # its standby rules: a digest session reads where chunks are read

    def digest_problems(self, schema: TableSchema) -> list[str]:
        out = [
            f"column {c.name!r} ({c.source_type or c.type}): no digest form for {c.type}"
            for c in schema.columns
            if digest_text_sql(c, self.server.quote_ident(c.name)) is None
        ]
        encoding = self.server.query("SELECT current_setting('server_encoding')")[0][0]
        if encoding != "UTF8":  # md5() hashes the server's bytes; the mirror's text is UTF-8
            out.append(f"the database's encoding is {encoding}, not UTF8")
        return out

    def _digest_parts(self, schema: TableSchema) -> tuple[str, str]:
        """(the select list of the columns' digest texts t0, t1..., the SQL of the row's 64-bit digest
        over them)."""
        q = self.server.quote_ident
        texts, pieces = [], []
        for i, col in enumerate(schema.columns):
            alias = q(f"t{i}")
            texts.append(f"{digest_text_sql(col, q(col.name))} AS {alias}")
            value = (
                f"octet_length({alias})::text || ':' || {alias}"
                if col.type in DIGEST_SIZED
                else f"{alias} || ','"
            )
            pieces.append(f"CASE WHEN {alias} IS NULL THEN '{DIGEST_NULL}' ELSE {value} END")
        return ", ".join(texts), f"('x' || left(md5({' || '.join(pieces)}), 16))::bit(64)::bigint"

    def range_digest_query(
        self, schema: TableSchema, *, after_key: Sequence | None, upto_key: Sequence | None
    ) -> tuple[str, list[Any]]:
        texts, digest = self._digest_parts(schema)
        where, params = self.digest_where(schema, after_key, upto_key)
        # OFFSET 0 keeps the texts in the subquery: each is computed once, not once per use
        sql = (
            f"SELECT count(*), bit_xor({digest}) "  # noqa: S608
            f"FROM (SELECT {texts} FROM {self.server.quote_table(schema.table)}{where} OFFSET 0) AS "
            f"{self.server.quote_ident('r')}"
        )
        return sql, params

    def row_digests_query(
        self, schema: TableSchema, *, after_key: Sequence | None, limit: int
    ) -> tuple[str, list[Any]]:
        q = self.server.quote_ident
        texts, digest = self._digest_parts(schema)
        where, params = self.digest_where(schema, after_key, None)
        keys = ", ".join(f"{q(k)} AS {q(f'k{i}')}" for i, k in enumerate(schema.primary_key))
        aliases = ", ".join(q(f"k{i}") for i in range(len(schema.primary_key)))
        pk = ", ".join(q(k) for k in schema.primary_key)
        sql = (
            f"SELECT {aliases}, {digest} FROM (SELECT {keys}, {texts} FROM "  # noqa: S608
            f"{self.server.quote_table(schema.table)}"
            f"{where} ORDER BY {pk} LIMIT %s) AS {q('r')} ORDER BY {aliases}"
        )
        return sql, [*params, int(limit)]

    def digest_session(self) -> Any:
        """Autocommit, on the server chunks are read from (a hot standby named by chunk_conn_id
        waits until it has replayed what the mirror has: read_no_older_than)."""
        conn = self.server.new_connection(self.server.read_params)
        conn.autocommit = True
        if self.server.chunks_on_standby:
            self.chunks.replayed_before_snapshot(conn)
        return conn
