"""``resync``, ``verify``, ``mirror-version`` and ``export-debezium``: commands on a table's outputs."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from ..core.errors import CdcError
from ..core.schema import TableName
from .common import EXIT_ERROR, EXIT_MISMATCH, EXIT_OK, _config_source, _config_source_of_conn, open_dialect


def cmd_resync(args: argparse.Namespace) -> int:
    from .. import settings
    from ..pipeline.resync import resync

    try:
        now = settings.load()
        entry = _config_source(args.source, now) if args.source else None
        if entry is not None:
            now = entry.settings
        data_dir = args.data_dir or now.data_dir
        conn_id = args.conn_id or now.conn_id
        source = args.source or now.explicit_source or conn_id
        with open_dialect(conn_id, source, now) as dialect:
            gap = resync(dialect, data_dir)
            tables = [str(t) for t in sorted(dialect.scope_tables() or ())]
    except CdcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    print(
        f"source {source!r}: resynced. Capture starts anew at {gap['to']}; changes after {gap['from']} "
        "and before "
        "it may be missing (recorded as a gap beside the event log, _gaps.json)."
    )
    print("next: let cdc_changelog run once, then verify and repair each captured table:")
    for t in tables:
        print(f"  airflow-cdc verify --conn-id {conn_id} --source {source} --table {t} --repair")
    return EXIT_OK


def _verify_settings(args: argparse.Namespace):
    """The settings a verify runs with (a source of the sources config brings its own), the
    arguments' defaults filled from them; None after saying why it cannot run."""
    from .. import settings, storage

    try:
        now = settings.load()  # the same defaults as the DAGs' tasks
        entry = _config_source(args.source, now) if args.source else _config_source_of_conn(args.conn_id, now)
    except Exception as exc:  # noqa: BLE001 - a ConfigurationError naming the variable or config entry
        print(f"error: {exc}", file=sys.stderr)
        return None
    if entry is not None:  # a source of the sources config: its connection, data location, storage
        now = entry.settings
        args.snapshot_dag = args.snapshot_dag or f"cdc_snapshot__{entry.name}"
        if now.storage_conn_id:
            from ..hooks.cdc_storage import apply_storage_connection

            apply_storage_connection(now.storage_conn_id)
    args.data_dir = args.data_dir or now.data_dir
    args.conn_id = args.conn_id or now.conn_id
    args.source = args.source or now.explicit_source
    if args.chunk_rows < 1:
        print(f"error: --chunk-rows must be >= 1, got {args.chunk_rows}", file=sys.stderr)
        return None
    storage.check_location(args.data_dir, "--data-dir")
    return now


def _print_verify(args, table: TableName, source: str, res, events, repair, triggered) -> None:
    if args.json:
        out: dict[str, Any] = res.to_dict()
        if events is not None:
            out["events"] = {
                "events": events.events,
                "keys": events.keys,
                "duplicates": events.duplicates,
                "violations": events.violation_count,
                "examples": events.violations,
            }
        out["ok"] = res.ok and (events is None or events.ok)
        out["repair_run"] = triggered
        print(json.dumps(out, indent=2))
        return
    compared = (
        f"{res.rows_checked} distinct rows' copies compared (a multiset)"
        if res.method == "multiset"
        else f"{res.chunks} chunks compared, {res.mismatched_chunks} differed"
    )
    print(
        f"{table.id} (source {source!r}, data dir {args.data_dir}): {compared}; source {res.source_rows} "
        f"rows, mirror {res.mirror_rows} rows"
    )
    if not res.ok:
        print(
            f"  missing from the mirror: {res.missing}, extra in the mirror: {res.extra}, "
            f"different: {res.different}"
        )
        for m in res.examples:
            print(f"  {m.describe()}")
    if events is not None:
        print(events.summary())
        for v in events.violations:
            print(f"  {v}")
    print(res.summary())
    if repair is not None:
        dag = args.snapshot_dag or "cdc_snapshot"
        if triggered:
            print(f"repair: triggered {dag} run {triggered} with conf {json.dumps(repair)}")
        else:
            print(f"to repair: airflow dags trigger {dag} -c '{json.dumps(repair)}' (or verify --repair)")


def cmd_verify(args: argparse.Namespace) -> int:
    from ..pipeline.verify import check_event_log, verify_table

    now = _verify_settings(args)
    if now is None:
        return EXIT_ERROR
    table = TableName.parse(args.table)
    source = args.source or args.conn_id
    with open_dialect(args.conn_id, source, now) as dialect:
        # the one scope check (I15, core/scope.py) before anything is read: the dialect connects
        # only at its first statement, so a refused table reads nothing, not even its columns
        dialect.check_in_scope([table])
        missing = not_snapshotted(args.data_dir, source, table, args.snapshot_dag or "cdc_snapshot")
        if missing is not None:  # not "every row mismatched": there is nothing to compare with yet
            print(f"error: {missing}", file=sys.stderr)
            return EXIT_ERROR
        res = verify_table(
            dialect, args.data_dir, source, table, chunk_rows=args.chunk_rows, examples=args.examples
        )
        schema = dialect.describe_table(table) if args.events else None
        if schema is not None and schema.multiset:  # no key to check its events' states by
            print(f"note: {table} is a multiset (no key): its event log is not checked", file=sys.stderr)
            args.events = False
        pk = schema.primary_key if schema is not None else ()
        if res.ok:  # a failover's gap is repaired for this table (docs: operations, 'Failover')
            from ..pipeline.resync import verified_after_gap

            for gap in verified_after_gap(dialect, args.data_dir, table.id):
                print(
                    f"gap {gap['from']} .. {gap['to']} of source {source!r} closed: every captured "
                    "table verified equal to the source since",
                    file=sys.stderr,
                )
    events = check_event_log(args.data_dir, source, table, primary_key=pk) if args.events else None
    failed = not res.ok or (events is not None and not events.ok)
    repair = res.repair_conf()
    triggered = None
    if repair is not None and args.repair:
        try:
            triggered = trigger_repair(
                args.snapshot_dag or "cdc_snapshot", source, table.id, repair, args.data_dir
            )
        except Exception as exc:  # noqa: BLE001 - a StateError or an Airflow error, said as it is
            print(f"error: cannot trigger the repair snapshot: {exc}", file=sys.stderr)
            return EXIT_ERROR
    _record_verify(source, table.id, res, events, failed, triggered)
    _print_verify(args, table, source, res, events, repair, triggered)
    return EXIT_MISMATCH if failed else EXIT_OK


def not_snapshotted(data_dir: str, source: str, table: TableName, snapshot_dag: str) -> str | None:
    """Why verify has nothing to compare ``table`` with (None: its mirror exists): no snapshot (nor
    change) of it reached the mirror yet, said with how to start one."""
    from .. import storage
    from ..storage.layout import mirror_dir

    where = mirror_dir(data_dir, source, table)
    if storage.exists(where):
        return None
    return (
        f"table {table.id} of source {source!r} is not snapshotted yet: it has no mirror ({where}), so "
        "there is "
        f"nothing to verify. Start its snapshot: airflow-cdc snapshot start --source {source} --table "
        f"{table.id} "
        f"(or trigger {snapshot_dag} with conf {json.dumps({'action': 'start', 'tables': [table.id]})}), and "
        "verify once it is done (airflow-cdc status)"
    )


def _record_verify(source: str, table_id: str, res, events, failed: bool, repair_run: str | None) -> None:
    """The verify's result for the UI page (airflow_variables.save_verify); a metadata database
    that cannot be written is said, not a failed verify."""
    from .. import airflow_variables

    keep = (
        "rows_checked",
        "mismatched",
        "source_rows",
        "mirror_rows",
        "missing",
        "extra",
        "different",
        "repair_conf",
    )
    doc = {k: v for k, v in res.to_dict().items() if k in keep}
    doc.update(
        ok=not failed,
        at=round(time.time(), 3),
        repair_run=repair_run,
        event_violations=None if events is None else events.violation_count,
    )
    try:
        airflow_variables.save_verify(source, table_id, doc)
    except Exception as exc:  # noqa: BLE001 - the verify itself is done; only its record is lost
        print(f"warning: the verify's result was not recorded for the CDC page: {exc}", file=sys.stderr)


def cmd_mirror_version(args: argparse.Namespace) -> int:
    """The mirror version of a table for a source position, and how to read it (exit 0: it
    equals the source there; 1: no version does, or the event log cannot tell)."""
    from ..core.position import parse_position
    from ..sinks.mirror_history import version_at
    from ..storage.layout import mirror_dir

    source, data_dir, table = _table_outputs(args)
    try:
        position = parse_position(args.at, "--at")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    found = version_at(data_dir, source, table, position)
    if found is None:
        print(
            f"{table.id}: no mirror version the Delta log still holds was brought to a position at or before "
            f"{args.at} (a version needs a row written; the log keeps CDC_MIRROR_LOG_RETENTION_HOURS)"
        )
        return EXIT_MISMATCH
    print(found.describe())
    path = mirror_dir(data_dir, source, table)
    print(f"  folder: {path}")
    sql_path = path.replace("'", "''")
    print(f"  Spark:  spark.read.format('delta').option('versionAsOf', {found.version}).load({path!r})")
    print(f"  duckdb: ATTACH '{sql_path}' AS m (TYPE delta, VERSION {found.version})")
    print(f"  polars: pl.read_delta({path!r}, version={found.version})")
    print(f"  Python: read_mirror(data_dir, source, {table.id!r}, as_of={args.at!r})")
    return EXIT_OK if found.exact else EXIT_MISMATCH


def _table_outputs(args: argparse.Namespace) -> tuple[str, str, TableName]:
    """A command on one table's outputs (``--table``, ``--source``, ``--data-dir``): the source
    name, its data location (a source of the sources config brings its own, and its storage
    connection) and the table, which the one scope check (I15) admits: these commands read only
    tables of the source's capture scope."""
    from .. import settings, storage
    from ..hooks.cdc_source import CdcSourceHook

    now = settings.load()
    entry = _config_source(args.source, now) if args.source else None
    if entry is not None:
        now = entry.settings
        if now.storage_conn_id:
            from ..hooks.cdc_storage import apply_storage_connection

            apply_storage_connection(now.storage_conn_id)
    source = args.source or now.explicit_source or now.conn_id
    data_dir = storage.check_location(args.data_dir or now.data_dir, "--data-dir")
    table = TableName.parse(args.table)
    CdcSourceHook.for_settings(now, None, source).capture_scope().check(table)
    return source, data_dir, table


def cmd_export_debezium(args: argparse.Namespace) -> int:
    from .. import storage
    from ..export.debezium import DebeziumOptions, export_table

    storage.check_location(args.out, "--out")
    source, data_dir, table = _table_outputs(args)
    if not args.force and storage.exists(args.out):
        print(
            f"error: --out {args.out} exists already; nothing was written. Give another location, or "
            "--force to "
            "replace it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    opts = DebeziumOptions(
        args.topic_prefix or source,
        connector=args.connector,
        tombstones=not args.no_tombstones,
        truncates=args.truncates,
        form=args.form,
        database=args.database,
    )
    skipped: list[str] = []
    n = export_table(data_dir, source, table, args.out, opts, skipped_truncates=skipped, replace=args.force)
    print(f"{table.id}: {n} Debezium records -> {args.out}")
    if skipped:
        print(
            f"warning: {len(skipped)} TRUNCATE(s) of table {table.id} left out (first at position "
            f"{skipped[0]}), as "
            "Debezium's default skipped.operations=t does: a consumer rebuilding the table from this "
            "export keeps "
            "the rows they removed. Re-snapshot the table and export again, or pass --truncates to a "
            "consumer "
            "that reads op 't' (docs: outputs, \"Consuming the Debezium JSON\")",
            file=sys.stderr,
        )
    return EXIT_OK


def trigger_repair(dag_id: str, source: str, table_id: str, conf: dict, data_dir: str) -> str:
    """Trigger ``dag_id`` with a repair conf; returns the run id. Refused while the table has
    a running, paused or failed snapshot (the plan would refuse the start anyway)."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    from .. import airflow_variables
    from ..core.errors import StateError

    current = airflow_variables.load(source, table_id, data_dir)
    if current is not None and str(current.status) in ("running", "paused", "failed"):
        raise StateError(
            f"table {table_id} has a {current.status} snapshot {current.snapshot_id} on source "
            f"{source!r}: let it finish (or stop it), then verify again"
        )
    run = trigger_dag(
        dag_id,
        triggered_by=DagRunTriggeredByType.CLI,
        conf=conf,
        run_id=f"repair__{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}__{uuid.uuid4().hex[:6]}",
    )
    return run.run_id
