"""The chunk and whole-table reads every dialect shares (the chunk SQL, the stream of rows to a
staged Parquet file, the key ranks): a mixin of dialects.base.Dialect, whose abstract methods
(stream_query, row_to_canonical, to_db_value, quote_ident...) they run on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..core.arrow_types import string_array
from ..core.planning import chunk_predicates, render_predicates
from ..core.ranges import ChunkRange
from ..core.row_digest import DIGEST_NULL, DIGEST_SIZED  # noqa: F401 - the dialects' SQL builds them
from ..core.schema import TableSchema, encode_key
from ..storage.staged import ChunkWriter
from .requests import ChunkRead, TableScan
from .results import ChunkReadResult, ReadSnapshot, WholeTableRead


class SharedReads:
    """Dialect's shared reads (a mixin: ``self`` is the Dialect)."""

    def key_ranks(self, schema: TableSchema, keys: Sequence[Sequence]) -> list[int]:
        """The dense rank of each key (equal keys share one) in the database's own order of
        the primary key, its types and collations: how key ranges of any key type (text under
        an ICU or case-insensitive collation, dates, decimals) are checked for order and
        overlap. The keys go through a UNION ALL whose first branch is the table's key columns
        (no rows), so the bound values take the columns' types and collations."""
        if not keys:
            return []
        q = self.quote_ident
        pk = ", ".join(q(k) for k in schema.primary_key)
        idx = q("__cdc_i")
        marks = ", ".join([self.placeholder] * len(schema.primary_key))
        branches = [f"SELECT {pk}, -1 AS {idx} FROM {self.quote_table(schema.table)} WHERE 1 = 0"]  # noqa: S608
        branches += [f"SELECT {marks}, {i}" for i in range(len(keys))]
        sql = (
            f"SELECT {idx}, DENSE_RANK() OVER (ORDER BY {pk}) FROM ({' UNION ALL '.join(branches)}) "  # noqa: S608
            f"AS {q('__cdc_k')}"
        )
        params = [
            self.to_db_value(schema, c, v)
            for key in keys
            for c, v in zip(schema.primary_key, key, strict=True)
        ]
        ranks = [0] * len(keys)
        for batch in self.stream_query(sql, params):
            for i, rank in batch:
                ranks[int(i)] = int(rank)
        return ranks

    def _keyset_condition(
        self, schema: TableSchema, rng: ChunkRange, after_key: Sequence | None, upper_bound: Sequence | None
    ) -> tuple[str, list[Any]]:
        """The keyset predicate of a key range (``key > after_key``, inside ``rng``, at most
        ``upper_bound``) in this database's SQL, values bound: the one builder of chunk reads and
        verify's ranges (dialects/digests.py)."""
        preds = chunk_predicates(schema.primary_key, rng, after_key=after_key, upper_bound=upper_bound)
        return render_predicates(
            preds,
            self.quote_ident,
            row_values=self.row_value_keyset,
            placeholder=self.placeholder,
            convert=lambda c, v: self.to_db_value(schema, c, v),
        )

    def chunk_query(
        self,
        schema: TableSchema,
        rng: ChunkRange,
        *,
        after_key: Sequence | None,
        limit: int | None,
        where: str | None = None,
        columns: Sequence[str] | None = None,
        upper_bound: Sequence | None = None,
    ) -> tuple[str, list[Any]]:
        """Keyset SELECT of the next chunk: ``key > after_key``, inside ``rng``, ordered by key.

        ``upper_bound`` (inclusive) is the snapshot's max key when it started: compared by
        the database in its own collation, so rows inserted above it later cannot make a
        snapshot endless (they reach the sinks through the changelog)."""
        pk = [self.quote_ident(k) for k in schema.primary_key]
        cols = ", ".join(self.quote_ident(c) for c in (columns or schema.column_names))
        cond, params = self._keyset_condition(schema, rng, after_key, upper_bound)
        conds: list[str] = [cond] if cond else []
        if where:
            # parsed, allowlisted and rendered with bound literals (core/filters.py): never pasted
            w, wparams = self.render_filter(where, schema)
            conds.append(w)
            params += wparams
        sql = f"SELECT {cols} FROM {self.quote_table(schema.table)}"  # noqa: S608 - identifiers quoted, values bound
        if conds:
            sql += " WHERE " + " AND ".join(conds)
        sql += " ORDER BY " + ", ".join(pk)
        if limit is not None:
            sql += f" LIMIT {self.placeholder}"
            params.append(int(limit))
        return sql, params

    def chunk_query_of(self, request: ChunkRead) -> tuple[str, list]:
        """:meth:`chunk_query` for a chunk read's request."""
        r = request
        return self.chunk_query(
            r.schema, r.rng, after_key=r.after_key, limit=r.limit, where=r.where, upper_bound=r.upper_bound
        )

    def read_chunk(self, request: ChunkRead) -> ChunkReadResult:
        """DBLog step 2: stream the next chunk to a typed Parquet file at ``request.path``
        (storage/staged.py)."""
        schema, path = request.schema, request.path
        sql, params = self.chunk_query_of(request)
        last_key: tuple | None = None
        pk = schema.primary_key
        snapshot: list[ReadSnapshot] = []
        with ChunkWriter(schema, path) as writer:
            bound = {"max_bytes": self.batch_max_bytes} if self.stream_max_bytes else {}
            if self.chunk_reads_snapshot:
                bound["snapshot"] = snapshot
            for batch in self.stream_query(sql, params, batch_size=max(1, self.fetch_batch_rows), **bound):
                keys, afters = [], []
                for raw in batch:
                    row = self.row_to_canonical(schema, raw)
                    kv = tuple(row[k] for k in pk)
                    keys.append(encode_key(kv))
                    afters.append(row)
                    last_key = kv
                # the driver rows (the loop's last one too): the batch's largest part, no longer needed
                del batch, raw
                writer.add(string_array(keys), afters)
        rows = writer.rows
        seen = snapshot[0] if snapshot else ReadSnapshot(None)
        return ChunkReadResult(rows, last_key, seen.mark, seen.visibility)

    def whole_table_query(self, schema: TableSchema) -> str:
        """The SELECT of every row of ``schema``'s table, in no order (identifiers quoted)."""
        cols = ", ".join(self.quote_ident(c) for c in schema.column_names)
        return f"SELECT {cols} FROM {self.quote_table(schema.table)}"  # noqa: S608 - identifiers quoted

    def read_whole_table(self, request: TableScan) -> WholeTableRead:
        """Every row of the request's table read in ONE consistent snapshot, staged as typed
        chunk files (storage/staged.py) of about ``rows_per_file`` rows each at ``path_of(0)``,
        ``path_of(1)``... (:class:`TableScan`): a whole-table refresh (pipeline/refresh.py).
        Generic: one streamed SELECT in a snapshot whose log position is recorded (MariaDB:
        ``START TRANSACTION WITH CONSISTENT SNAPSHOT``), rows decoded batch by batch, so memory
        holds one batch. ``progress``: called with the rows read so far."""
        from contextlib import ExitStack

        schema, path_of, rows_per_file, progress = (
            request.schema, request.path_of, request.rows_per_file, request.progress
        )
        files: list[tuple[str, int]] = []
        snapshot: list[ReadSnapshot] = []
        bound: dict[str, Any] = {"max_bytes": self.batch_max_bytes} if self.stream_max_bytes else {}
        with ExitStack() as stack:
            writer: ChunkWriter | None = None
            for batch in self.stream_query(
                self.whole_table_query(schema),
                [],
                batch_size=max(1, self.fetch_batch_rows),
                snapshot=snapshot,
                **bound,
            ):
                if writer is None:
                    writer = stack.enter_context(ChunkWriter(schema, path_of(len(files))))
                afters = [self.row_to_canonical(schema, raw) for raw in batch]
                del batch
                writer.add(pa.repeat(pa.scalar("[]"), len(afters)), afters)
                del afters
                if writer.rows >= rows_per_file:
                    stack.close()  # the file appears
                    files.append((writer.path, writer.rows))
                    writer = None
                    if progress is not None:
                        progress(sum(n for _p, n in files))
            if writer is not None:
                stack.close()
                files.append((writer.path, writer.rows))
        if not files:  # an empty table: one empty file, so the refresh publishes the columns
            with ChunkWriter(schema, path_of(0)) as w:
                pass
            files.append((w.path, 0))
        return WholeTableRead(tuple(files), snapshot[0].mark if snapshot else None)
