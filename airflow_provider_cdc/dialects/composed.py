"""A dialect made of collaborators (docs/DESIGN.md, "The dialects"): the contract's methods
that every such dialect answers by handing them to the same collaborator, written once. Each
database's class holds only what differs (its constructor builds the collaborators, its
capture, its doctor). A new database made the same way subclasses :class:`ComposedDialect`;
one made otherwise subclasses ``base.Dialect`` and answers these itself."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..core.position import Position
from ..core.schema import TableName, TableSchema
from .base import Dialect, LogBatch, LogRead, LogRetention


class ComposedDialect(Dialect):
    """``base.Dialect`` over the collaborators its subclass's constructor sets: ``server``
    (connections, queries), ``prerequisites``, ``catalog`` (tables and keys),
    ``watermark_rows``, ``chunks`` (reads), ``offsets`` (positions and the log kept for them),
    ``log`` (the log's reader); and ``digests`` (verify's SQL), which callers use as it is."""

    server: Any
    prerequisites: Any
    catalog: Any
    watermark_rows: Any
    chunks: Any
    offsets: Any
    log: Any

    # the server
    def _query(self, sql: str, params: Sequence[Any] | None = None) -> list[tuple]:
        return self.server.query(sql, params)

    def close(self) -> None:
        self.server.close()

    # prerequisites
    def check_prerequisites(self) -> None:
        self.prerequisites.check()

    def check_readable(self, table: TableName) -> None:
        self.prerequisites.check_readable(table)

    # catalog
    def describe_table(self, table: TableName, *, keyed: bool = True) -> TableSchema:
        return self.catalog.describe_table(table, keyed=keyed)

    def scope_problems(self, tables: Sequence[TableName]) -> list[str]:
        return self.catalog.scope_problems(tables)

    # watermarks
    def ensure_watermark_table(self) -> None:
        self.watermark_rows.ensure()

    def write_watermark(self, watermark_id: str) -> None:
        self.watermark_rows.write(watermark_id)

    # chunks
    def stream_query(self, sql: str, params: Sequence[Any], **options: Any) -> Iterator[list[tuple]]:
        """See ``Dialect.stream_query``; ``options`` are the chunk reader's (``batch_size``, and
        ``max_bytes`` and ``snapshot`` where the database's reader takes them)."""
        return self.chunks.stream_query(sql, params, **options)

    def replica_lag(self) -> tuple[int, float] | None:
        return self.chunks.replica_lag()

    def row_to_canonical(self, schema: TableSchema, row: tuple) -> dict[str, Any]:
        return self.chunks.row_to_canonical(schema, row)

    def to_db_value(self, schema: TableSchema, column: str, value: Any) -> Any:
        return self.chunks.to_db_value(schema, column, value)

    def max_key(self, schema: TableSchema, where: str | None = None) -> tuple | None:
        return self.chunks.max_key(schema, self.render_filter(where, schema) if where else None)

    def sample_keys(self, schema: TableSchema, count: int) -> list[tuple]:
        return self.chunks.sample_keys(schema, count)

    # offsets
    def current_position(self) -> Position:
        return self.offsets.current_position()

    def offset_position(self, offset: str) -> Position:
        return self.offsets.offset_position(offset)

    def commit_offset(self, offset: str, data_dir: str) -> None:
        self.offsets.commit_offset(offset, data_dir)

    def log_retention(self, offset: str) -> LogRetention | None:
        return self.offsets.log_retention(offset)

    def log_bytes_between(self, start: Position, end: Position) -> int:
        return self.offsets.log_bytes_between(start, end)

    # the log
    def read_log(self, request: LogRead) -> LogBatch:
        """See the database's log reader (``dialects/<db>/log_reader.py``: read_log)."""
        return self.log.read_log(request)
