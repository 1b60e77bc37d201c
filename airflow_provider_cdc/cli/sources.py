"""``snapshot`` and ``drop-source``, and the sources the CLI knows."""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

from ..core.errors import CdcError, ConfigurationError
from ..core.schema import TableName
from ..status import list_progress
from .common import (
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_OK,
    _config_source,
    _source_dialect,
    known_sources,
    short_warning,
    unknown_source_error,
)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from .. import airflow_variables, settings

    now = settings.load()
    source = args.source or now.source
    entry = _config_source(source, now)
    if entry is None and source != now.source:  # else the environment's DAG would snapshot another source
        print(
            "error: "
            f"{unknown_source_error(source, known_sources(now)) or f'source {source!r} is not configured'}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    st = entry.settings if entry is not None else now
    data_dir = args.data_dir or st.data_dir
    dag_id = args.snapshot_dag or (f"cdc_snapshot__{entry.name}" if entry is not None else "cdc_snapshot")
    tables = [TableName.parse(t).id for t in args.table]
    if args.action in ("pause", "stop"):  # also a snapshot of a table the scope has dropped since
        for t in tables:
            p = airflow_variables.request(source, t, args.action, data_dir)
            print(
                f"{source}:{t}: snapshot {p.snapshot_id} is {p.status}; its chunk tasks stop before "
                "their next chunk"
            )
        return EXIT_OK
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    from ..pipeline.snapshot_conf import parse_snapshot_conf
    from ..status import source_scope

    try:
        scope = source_scope(st)  # refused here, before a run is triggered, as the run's plan would refuse it
        tables = [scope.check(TableName.parse(t)).id for t in tables]
        conf = _snapshot_conf(args, tables)
        parse_snapshot_conf(conf)  # the plan task's own check: a bad conf never reaches a run
        if args.action == "resume":
            done = [
                t for t in tables if (p := airflow_variables.load(source, t, data_dir)) and p.status == "done"
            ]
            if done:
                raise ConfigurationError(
                    f"the snapshot of {', '.join(done)} is done: nothing to resume (start a new one: "
                    f"airflow-cdc snapshot start --source {source} --table ...)"
                )
        _check_dag_runnable(dag_id)
    except (CdcError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    run = trigger_dag(
        dag_id,
        triggered_by=DagRunTriggeredByType.CLI,
        conf=conf,
        run_id=f"{args.action}__{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}__{uuid.uuid4().hex[:6]}",
    )
    print(
        f"triggered {dag_id} run {run.run_id} with conf {json.dumps(conf)} (airflow-cdc status shows "
        "its progress)"
    )
    return EXIT_OK


def _snapshot_conf(args: argparse.Namespace, tables: list[str]) -> dict:
    """The snapshot DAG's conf for ``snapshot start|resume`` from the command's options (JSON
    where the conf holds JSON); ValueError naming the option when one does not parse."""
    conf: dict[str, Any] = {"action": args.action, "tables": tables}

    def as_json(option: str, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise ValueError(f"{option} must be JSON, got {text!r}") from None

    def bound(text: str) -> list | None:  # one side of --range: a JSON value, else the text itself
        if text == "":
            return None
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        return [value]

    def simple(text: str) -> dict:
        start, sep, end = text.partition(":")
        if not sep or ":" in end:
            raise ValueError(f"--range is START:END (e.g. 5000:6000), got {text!r}")
        rng = {k: v for k, v in (("start", bound(start)), ("end", bound(end))) if v is not None}
        if not rng:
            raise ValueError(f"--range {text!r} names neither a start nor an end")
        return rng

    simple_ranges = getattr(args, "simple_range", None) or []
    if args.action == "start":
        if args.key_range or simple_ranges:
            conf["key_ranges"] = [as_json("--key-range", r) for r in args.key_range or []] + [
                simple(r) for r in simple_ranges
            ]
        if args.keys is not None:
            conf["keys"] = {t: as_json("--keys", args.keys) for t in tables}
        if args.where is not None:
            conf["where"] = args.where
    elif args.key_range or simple_ranges or args.keys is not None or args.where is not None:
        raise ValueError(
            "--range, --key-range, --keys and --where choose what a new snapshot reads: not for "
            f"{args.action}"
        )
    if args.chunk_size is not None:
        conf["chunk_size"] = (
            args.chunk_size if args.chunk_size == "auto" else as_json("--chunk-size", args.chunk_size)
        )
    if args.parallelism is not None:
        conf["parallelism"] = args.parallelism
    if args.delay_seconds is not None:
        conf["delay_seconds"] = args.delay_seconds
    return conf


def _check_dag_runnable(dag_id: str) -> None:
    """Refuse, saying what to do, a trigger that would fail raw (the DAG not parsed yet) or sit
    queued for ever (the DAG paused)."""
    from airflow.models.dag import DagModel

    model = DagModel.get_dagmodel(dag_id)
    if model is None:
        raise ConfigurationError(
            f"Airflow does not know DAG {dag_id!r} yet: its dag-processor has not parsed the DAG files (is "
            "it running, and do its DAG folders hold the package's dags, see the getting-started page? "
            "`airflow dags list` shows the DAGs it knows)"
        )
    if model.is_paused:
        raise ConfigurationError(
            f"DAG {dag_id!r} is paused: a run triggered now would wait queued until it is unpaused. "
            f"Unpause it (airflow dags unpause {dag_id}, or the toggle in the UI), then run this again"
        )


def cmd_drop_source(args: argparse.Namespace) -> int:
    from .. import settings
    from ..pipeline.source_admin import drop_source

    now = settings.load()
    why = unknown_source_error(args.source, known_sources(now))
    if why is not None and not args.conn_id:
        print(f"error: {why} (give --conn-id to drop a source status does not know)", file=sys.stderr)
        return EXIT_ERROR
    running = [
        t for s, t, p in list_progress(args.source) if isinstance(p, dict) and p.get("status") == "running"
    ]
    if running:
        print(
            f"error: source {args.source!r} has running snapshots ({', '.join(running)}): stop them first "
            f"(airflow-cdc snapshot stop --source {args.source} --table ...), then drop the source",
            file=sys.stderr,
        )
        return EXIT_ERROR
    dialect, st = _source_dialect(args.source, now, args.conn_id)
    data_dir = args.data_dir or st.data_dir
    with dialect:
        held = dialect.held_objects(data_dir)  # PostgreSQL: what exists on the server now, and whose
        if not args.yes:
            from ..storage.layout import source_roots

            kept = (
                f"and delete {', '.join(source_roots(data_dir, args.source))}"
                if args.purge_outputs
                else "(the staged changelog and the outputs stay: --purge-outputs deletes them)"
            )
            print(
                f"source {args.source!r} holds: {', '.join(held) or 'nothing'}. Run again with --yes to "
                f"drop them {kept}"
            )
            return EXIT_MISMATCH
        try:
            done = drop_source(dialect, data_dir)
        except CdcError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_ERROR
        watermark = dialect.watermark_table
    for line in done:
        print(f"source {args.source!r}: {line}")
    for line in _retire_source(args.source, now):
        print(f"source {args.source!r}: {line}")
    if args.purge_outputs:
        from .. import storage
        from ..storage.layout import source_roots

        for root in source_roots(data_dir, args.source):
            storage.delete_dir(root)
            print(f"source {args.source!r}: {root} deleted")
        text = "capturing it again starts afresh, with new snapshots"
    else:
        text = (
            f"the staged changelog and outputs of {args.source!r} under {data_dir} are kept for their "
            "readers (--purge-outputs deletes them); capturing it again into that data dir starts with "
            "`airflow-cdc resync` (what was committed meanwhile is in no slot), then verify --repair or new "
            "snapshots"
        )
    if watermark is not None:
        text += (
            f". The watermark table {watermark} stays: other sources of that database may share it; drop it "
            "when none does"
        )
    print(text)
    return EXIT_OK


def _retire_source(source: str, now) -> list[str]:
    """After drop-source: the source's DAGs paused (each later round would fail and advise a
    resync) and its last capture reading forgotten (status would go on warning about the WAL a
    slot that is gone held). What was done, in words."""
    from .. import airflow_variables

    out = []
    entry = _config_source(source, now)
    dags = (
        [f"cdc_changelog__{entry.name}", f"cdc_snapshot__{entry.name}"]
        if entry is not None
        else (["cdc_changelog", "cdc_snapshot"] if source == now.source else [])
    )
    try:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            for dag_id in dags:
                n = session.query(DagModel).filter(DagModel.dag_id == dag_id).update({"is_paused": True})
                if n:
                    out.append(f"DAG {dag_id} paused (unpause it to capture this source again)")
    except Exception as exc:  # noqa: BLE001 - the objects are dropped; say what to do by hand
        out.append(f"its DAGs ({', '.join(dags)}) were not paused ({type(exc).__name__}): pause them by hand")
    try:
        airflow_variables._delete(airflow_variables.lag_key(source))
        out.append("its last capture reading forgotten")
    except Exception:  # noqa: BLE001 - status then shows the old reading until the next capture
        pass
    return out


def _live_holders(sources: list[str], lags: dict, now) -> dict[str, str]:
    """source -> what its server holds for it now (its slot and the WAL held), for the sources with
    no capture lag recorded (e.g. only ever snapshotted: the snapshot created the slot)."""
    from ..pipeline.source_admin import log_holder
    from ..status import known_source

    out = {}
    for s in sources:
        # only a source this deployment names is asked (a name read back from a Variable is no
        # connection, I15)
        if s in lags or known_source(s, now) is None:
            continue
        try:
            dialect, _st = _source_dialect(s, now)
            with dialect:
                reading = log_holder(dialect)
                pub = dialect.publication_name
        except Exception as exc:  # noqa: BLE001 - said on its line, not a failed status
            from ..error_text import safe_error_text

            out[s] = f"its server could not be asked: {safe_error_text(exc)}"
            continue
        if reading is None:
            continue
        out[s] = (
            f"no capture has run, but {reading.holder} (and publication {pub!r}) holds "
            f"{reading.lag_bytes:,} bytes of WAL"
            + (f"; WARNING: {short_warning(reading.unbounded)}" if reading.unbounded else "")
            + f". Run the changelog DAG, or airflow-cdc drop-source --source {s} --yes"
        )
    return out
