"""The ``cdc_refresh`` DAG's work (dag_builders.refresh_dag): each table of CDC_REFRESH_TABLES
(or the ones a run's conf names among them) refreshed whole (pipeline/refresh.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def refresh_for_dag(conf: Any, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Refresh the DAG's source's refresh tables, or those of ``conf`` ``{"tables": [...]}``
    (a run's conf narrows the setting, never widens it: each is checked before anything is
    read). One table after another; one that fails does not stop the others, and the task
    fails at the end naming each failed table and why. Returns per table its rows, files and
    version (no row values)."""
    from .. import settings
    from ..core.errors import ConfigurationError
    from ..core.schema import TableName
    from ..hooks.cdc_source import CdcSourceHook
    from ..hooks.cdc_storage import apply_storage_connection
    from ..pipeline.refresh import check_refresh_table, refresh_table

    conf = conf or {}
    if not isinstance(conf, dict) or set(conf) - {"tables"}:
        raise ConfigurationError(
            f'a cdc_refresh run\'s conf is {{}} or {{"tables": ["schema.table", ...]}}, got {conf!r}'
        )
    now = settings.load(overrides=dict(overrides or {}))
    if not now.refresh_tables:
        raise ConfigurationError(
            f"source {now.source!r} refreshes no table: list the tables to refresh whole in "
            "CDC_REFRESH_TABLES (or the sources config's 'refresh_tables')"
        )
    given = conf.get("tables")
    if given is not None and (not isinstance(given, list) or not all(isinstance(t, str) for t in given)):
        raise ConfigurationError(f'a cdc_refresh run\'s "tables" is a list of table names, got {given!r}')
    names = [TableName.parse(t) for t in (given or now.refresh_tables)]
    apply_storage_connection(overrides=overrides)
    results: dict[str, Any] = {}
    failed: list[str] = []
    with CdcSourceHook.for_settings(now, now.conn_id, now.source).get_dialect(source=now.source) as dialect:
        for table in names:  # every name checked before any is read
            check_refresh_table(
                now.source,
                now.refresh_tables,
                table,
                dialect=dialect.name,
                watermark_table=dialect.watermark_table,
            )
        for table in names:
            try:
                res = refresh_table(
                    dialect, now.data_dir, now.source, table, retention_hours=now.mirror_retention_hours
                )
                results[table.id] = {"rows": res.rows, "files": res.files, "version": res.version}
            except Exception as exc:  # noqa: BLE001 - the others still refresh; named at the end
                log.exception("refresh of %s (source %r) failed", table, now.source)
                failed.append(f"{table}: {exc}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(names)} refresh(es) failed: " + "; ".join(failed))
    return results
