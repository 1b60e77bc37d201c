"""The ``cdc_verify`` DAG's work (dag_builders.verify_dag): the CDC page's verify button
triggers a run of the source's own verify DAG instead of starting a process in the api-server
(issue 46). One table per run, of the DAG's own source."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)


def verify_for_dag(conf: Any, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Verify one table of the DAG's source, ``conf`` ``{"table": "schema.table"}``, and record
    the result for the page and ``airflow cdc status``. The source, its connection and data
    location are the DAG's (the sources config's entry or the environment), never the conf's or
    a Variable's; the table passes the one scope check (core/scope.py, I15) before anything is
    read. Returns the counts (no row values: the task's XCom and log stay free of them)."""
    from .. import airflow_variables, settings
    from ..core.errors import ConfigurationError
    from ..core.schema import TableName
    from ..hooks.cdc_source import CdcSourceHook
    from ..hooks.cdc_storage import apply_storage_connection
    from ..pipeline.resync import verified_after_gap
    from ..pipeline.verify import verify_table

    if not isinstance(conf, dict) or set(conf) != {"table"} or not isinstance(conf["table"], str):
        raise ConfigurationError(
            f'a cdc_verify run\'s conf is {{"table": "schema.table"}} and nothing else, got '
            f"{conf!r}: the source is the DAG's own"
        )
    now = settings.load(overrides=dict(overrides or {}))
    apply_storage_connection(overrides=overrides)
    table = TableName.parse(conf["table"])
    with CdcSourceHook.for_settings(now, now.conn_id, now.source).get_dialect(source=now.source) as dialect:
        dialect.check_in_scope([table])  # before anything is read (the dialect connects lazily)
        res = verify_table(dialect, now.data_dir, now.source, table)
        if res.ok:  # a failover's gap is repaired for this table (docs: operations, 'Failover')
            verified_after_gap(dialect, now.data_dir, table.id)
    keep = ("rows_checked", "mismatched", "source_rows", "mirror_rows", "missing", "extra", "different")
    counts = {k: v for k, v in res.to_dict().items() if k in keep}
    airflow_variables.save_verify(
        now.source,
        table.id,
        {
            **counts,
            "repair_conf": res.repair_conf(),
            "ok": res.ok,
            "at": round(time.time(), 3),
            "repair_run": None,
            "event_violations": None,
        },
    )
    log.info("verify of %s (source %r): %s", table.id, now.source, res.summary())
    return {"table": table.id, "ok": res.ok, **counts}
