"""A whole-table refresh: the snapshot-only way a table without a key (or any table a user does
not capture) reaches the lake. DBLog needs a key (chunks in key order, windows matched by key);
a refresh needs none: it reads every row in ONE consistent snapshot of the source (PostgreSQL:
physical ``ctid`` ranges inside one REPEATABLE READ transaction; MariaDB/MySQL: one streamed
SELECT in a consistent snapshot), stages it, and publishes it as one new version of a plain
Delta table (sinks/refreshed.py). Nothing is created or changed on the source: no publication,
no replica identity, no watermark row. Design: docs/DESIGN.md, "Tables without a key".
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from .. import storage
from ..core.errors import ConfigurationError
from ..core.schema import TableName
from ..core.scope import close_tables, is_system_schema
from ..dialects import Dialect, TableScan
from ..dialects.registry import all_system_catalogs, get_profile
from ..sinks import refreshed
from ..storage import layout

log = logging.getLogger(__name__)

#: rows per staged file and per data file of a refresh (one ``ctid`` span on PostgreSQL)
DEFAULT_FILE_ROWS = 500_000


@dataclass(frozen=True)
class RefreshResult:
    table: str
    rows: int
    files: int
    version: int  # the Delta version that holds this refresh
    mark: str | None  # the position mark of the snapshot read
    seconds: float
    location: str

    def to_dict(self) -> dict:
        return asdict(self)


def check_refresh_table(
    source: str,
    refresh_tables: Iterable[TableName | str],
    table: TableName,
    *,
    dialect: str | None = None,
    watermark_table: TableName | None = None,
) -> TableName:
    """``table`` when the source refreshes it (CDC_REFRESH_TABLES); else ConfigurationError
    saying why. A run's conf names tables; only the setting decides which may be read.
    ``dialect``: the source's database, whose catalogs are refused (None: every database's)."""
    allowed = frozenset(t if isinstance(t, TableName) else TableName.parse(str(t)) for t in refresh_tables)
    catalogs = get_profile(dialect).system_catalogs if dialect else all_system_catalogs()
    if is_system_schema(table.schema, catalogs):
        raise ConfigurationError(f"table {table} is in system schema {table.schema!r}: never refreshed")
    if watermark_table is not None and table == watermark_table:
        raise ConfigurationError(
            f"table {table} is the watermark table of source {source!r}: never refreshed"
        )
    if table not in allowed:
        close = close_tables(table, allowed)
        hint = f"; did you mean {' or '.join(map(str, close))}?" if close else ""
        raise ConfigurationError(
            f"table {table} is not refreshed by source {source!r}: CDC_REFRESH_TABLES (or the sources "
            f"config's 'refresh_tables') lists {', '.join(sorted(map(str, allowed))) or 'no table'}{hint} "
            "An administrator allows it by adding it to that setting"
        )
    return table


def refresh_table(
    dialect: Dialect,
    data_dir: str,
    source: str,
    table: TableName,
    *,
    retention_hours: float = 1.0,
    file_rows: int = DEFAULT_FILE_ROWS,
    before_publish: Callable[[], None] | None = None,
) -> RefreshResult:
    """Refresh ``table`` whole: claim an epoch (fencing any refresh still running), read it in
    one snapshot into staging, write the table's data files, publish them in one commit,
    vacuum what the retention allows. Readers see the previous version until the commit. A
    failure (or a newer refresh's claim) publishes nothing and leaves no staged file.
    ``before_publish``: tests only, called between writing the files and the commit."""
    started = time.monotonic()
    schema = dialect.describe_table(table, keyed=False)
    uri = layout.refreshed_dir(data_dir, source, table)
    want = refreshed.table_schema(schema)  # column checks before anything is written
    epoch = refreshed.claim(uri, want, retention_hours)
    staging = layout.refresh_staging_dir(data_dir, source, table, uuid.uuid4().hex)
    last_log = [time.monotonic()]

    def progress(rows: int) -> None:
        if time.monotonic() - last_log[0] >= 10:
            last_log[0] = time.monotonic()
            log.info("refresh of %s (source %r): %d rows read", table, source, rows)

    adds: list[dict] = []
    try:
        read = dialect.read_whole_table(
            TableScan(schema, lambda i: storage.join(staging, f"part-{i:06d}.parquet"),
                      max(1, file_rows), progress)
        )
        adds = refreshed.write_files(uri, schema, [p for p, _n in read.files])
        if before_publish is not None:
            before_publish()
        version = refreshed.publish(
            uri,
            epoch,
            adds,
            want,
            {
                refreshed.ROWS_PROPERTY: str(read.rows),
                refreshed.MARK_PROPERTY: read.mark or "",
                refreshed.AT_PROPERTY: dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            },
        )
    except BaseException:
        refreshed.discard(uri, adds)  # (publish discards its own on failure; a read's end too)
        raise
    finally:
        storage.delete_dir(staging)
    removed = refreshed.vacuum(uri, retention_hours)
    res = RefreshResult(
        table.id, read.rows, len(adds), version, read.mark, round(time.monotonic() - started, 3), uri
    )
    log.info(
        "refresh of %s (source %r): %d rows in %d files published as version %d of %s in %.1f s "
        "(%d replaced files vacuumed)",
        table,
        source,
        res.rows,
        res.files,
        version,
        uri,
        res.seconds,
        removed,
    )
    return res
