"""Verify's SQL, a dialect's ``digests`` capability (pipeline/verify): the range digests the
source computes and compares against the mirror's, the row digests of keys compared one by one,
the range boundaries in the source's own key order, and the sessions those queries run on.

:class:`Digests` computes none: a dialect without digests keeps it, and verify then compares
rows in Python (never a weaker check). A database that computes them subclasses it with the
SQL of its row digest (dialects/<db>/digest.py) and keeps the shared parts here: the keyset
predicate of a range and its boundary query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.ranges import ChunkRange
from ..core.schema import TableSchema


class Digests:
    """A dialect's digests; this base computes none (module docstring)."""

    def __init__(self, dialect: Any) -> None:  # a base.Dialect (not imported: it imports this)
        self.dialect = dialect  # its keyset reads (chunk_query), quoting and value conversion

    def digest_problems(self, schema: TableSchema) -> list[str]:
        """Why the source cannot compute verify's digests of ``schema`` (a column whose type has
        no digest form here, named with its type; a server setting), one reason each; empty:
        :meth:`range_digest_query` serves the table."""
        return [f"{self.dialect.name} computes no digests"]

    def range_digest_query(
        self, schema: TableSchema, *, after_key: Sequence | None, upto_key: Sequence | None
    ) -> tuple[str, list[Any]]:
        """One aggregate over the rows whose key is after ``after_key`` and at most ``upto_key``
        (None: unbounded), compared by the database: ``(row count, XOR of the rows' digests)``
        (core/row_digest.py)."""
        raise NotImplementedError(f"{type(self.dialect).__name__} computes no digests")

    def row_digests_query(
        self, schema: TableSchema, *, after_key: Sequence | None, limit: int
    ) -> tuple[str, list[Any]]:
        """The next ``limit`` rows after ``after_key`` in key order, each as its key columns and its
        64-bit digest: for keys the mirror cannot order as the database does, compared key by key."""
        raise NotImplementedError(f"{type(self.dialect).__name__} computes no digests")

    def key_boundary_query(
        self, schema: TableSchema, *, after_key: Sequence | None, upto_key: Sequence | None, offset: int
    ) -> tuple[str, list[Any]]:
        """The key ``offset`` keys past the first one after ``after_key`` (not past ``upto_key``),
        in the database's own order: the keyset chunk SELECT of the key columns with an OFFSET, so
        range bounds follow the source's collation, never Python's order."""
        d = self.dialect
        sql, params = d.chunk_query(
            schema,
            ChunkRange(None, None),
            after_key=after_key,
            limit=1,
            columns=schema.primary_key,
            upper_bound=upto_key,
        )
        return f"{sql} OFFSET {d.placeholder}", [*params, int(offset)]

    def digest_where(
        self, schema: TableSchema, after_key: Sequence | None, upto_key: Sequence | None
    ) -> tuple[str, list[Any]]:
        """`` WHERE ..`` (or "") of a digest range, from the one keyset predicate builder."""
        cond, params = self.dialect._keyset_condition(schema, ChunkRange(None, None), after_key, upto_key)
        return (f" WHERE {cond}" if cond else ""), params

    def digest_session(self) -> Any:
        """A connection of its own for verify's range queries (one per worker thread), on the
        server chunks are read from."""
        return self.dialect.open_session()
