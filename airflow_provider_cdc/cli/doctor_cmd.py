"""``doctor`` and ``sources``: a source checked before its first run, and every source listed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..core.schema import TableName
from ..status import list_progress
from .common import (
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_OK,
    _config_source,
    _config_source_of_conn,
    known_sources,
    open_dialect,
    unknown_source_error,
)


def _doctor_target(args: argparse.Namespace, now):
    """(source, connection id, settings) doctor checks, or an error message. ``--source`` of the
    sources config brings its entry; ``--conn-id`` alone the one entry on that connection, else the
    environment's settings on it; ``--table`` replaces the scope."""
    import dataclasses

    entry = None
    if args.source:
        entry = _config_source(args.source, now)
        if entry is None and args.source != now.source and not args.conn_id:
            why = (
                unknown_source_error(args.source, known_sources(now))
                or f"source {args.source!r} is not known"
            )
            return f"{why} (give --conn-id too to check a new source on that connection)"
    elif args.conn_id:
        entry = _config_source_of_conn(args.conn_id, now)
    st = entry.settings if entry is not None else now
    conn_id = args.conn_id or st.conn_id
    if entry is not None:
        source = entry.name
    elif args.source:
        source = args.source
    else:
        source = conn_id if args.conn_id and args.conn_id != now.conn_id else now.source
    if args.table:
        wanted = {TableName.parse(t).id for t in args.table}
        keys = {k: v for k, v in st.key_columns.items() if k in set(args.table) or k in wanted}
        st = dataclasses.replace(st, tables=tuple(args.table), capture_all_tables=False, key_columns=keys)
    return source, conn_id, st


def cmd_doctor(args: argparse.Namespace) -> int:
    from .. import settings
    from ..doctor import ERROR, OK, Finding, check_source, has_errors

    now = settings.load()
    target = _doctor_target(args, now)
    if isinstance(target, str):
        print(f"error: {target}", file=sys.stderr)
        return EXIT_ERROR
    source, conn_id, st = target
    try:
        dialect = open_dialect(conn_id, source, st)
    except Exception as exc:  # noqa: BLE001 - an unknown connection or a bad extra: a finding like any other
        from ..doctor import _user_error

        findings = [Finding(ERROR, "connection", _user_error(exc, conn_id))]
    else:
        with dialect:
            findings = check_source(dialect, conn_id)
    failed = has_errors(findings)
    if args.json:
        print(
            json.dumps(
                {
                    "source": source,
                    "conn_id": conn_id,
                    "ok": not failed,
                    "findings": [f.to_dict() for f in findings],
                },
                indent=2,
            )
        )
        return EXIT_MISMATCH if failed else EXIT_OK
    order = {ERROR: 0, "warning": 1, OK: 2}
    shown = sorted((f for f in findings if args.verbose or f.severity != OK), key=lambda f: order[f.severity])
    print(f"doctor: source {source!r}, connection {conn_id!r}")
    for f in shown:
        print(f.line())
    errors = sum(f.severity == ERROR for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    if failed:
        print(
            f"source {source!r}: {errors} error(s), {warnings} warning(s): fix the errors above before "
            "the first "
            "run, then run doctor again"
        )
    else:
        print(
            f"source {source!r}: ready for CDC"
            + (f" ({warnings} warning(s) above)" if warnings else ": every check passed")
        )
    return EXIT_MISMATCH if failed else EXIT_OK


def source_rows(now, live: bool = True) -> list[dict[str, Any]]:
    """One row per source :func:`known_sources` names: its connection, snapshots, last capture lag
    and, ``live``, what its server holds for it now (a source only Variables name is never asked)."""
    from ..airflow_variables import load_lags
    from ..status import _checked_numbers, known_source

    progress = list_progress(None)
    lags = load_lags(None)
    rows = []
    for name in known_sources(now):
        try:
            known = known_source(name, now)
        except Exception as exc:  # noqa: BLE001 - a sources config that cannot be read: said on the row
            known, note = None, f"the sources config could not be read: {type(exc).__name__}: {exc}"
        else:
            note = (
                (
                    "named only by Variables (snapshot progress or capture lag): neither the sources "
                    "config nor "
                    "the environment names it, so its server is not asked"
                )
                if known is None
                else None
            )
        lag = lags.get(name)
        lag = (
            None if lag is None else _checked_numbers(lag, ("bytes", "seconds", "at"), "capture lag reading")
        )
        snapshots = {
            t: (p.get("status") if isinstance(p, dict) else "malformed") for s, t, p in progress if s == name
        }
        row: dict[str, Any] = {
            "source": name,
            "known": known is not None,
            "conn_id": known.conn_id if known else None,
            "data_dir": known.data_dir if known else None,
            "database": None,
            "holder": lag.get("holder") if lag else None,
            "holder_exists": None,
            "held_by": None,
            "publication": None,
            "publication_exists": None,
            "held_bytes": None,
            "unbounded": None,
            "lost": None,
            "lag": lag,
            "snapshots": snapshots,
            "snapshot_only": lag is None and bool(snapshots),
            "note": note,
            "server_error": None,
        }
        if known is not None and live:
            _ask_server(row, name, known)
        rows.append(row)
    return rows


def _ask_server(row: dict[str, Any], source: str, st) -> None:
    """``row`` with what ``source``'s server holds now: its slot and publication (PostgreSQL) or
    the binlog past its stored offset (MariaDB/MySQL). Read-only; an error is said on the row."""
    from .. import storage
    from ..error_text import safe_error_text
    from ..pipeline.source_admin import log_holder

    try:
        with open_dialect(st.conn_id, source, st) as dialect:
            row["database"] = dialect.name
            if dialect.slot_name is not None:
                row["holder"] = f"replication slot {dialect.slot_name!r}"
                row["publication"] = dialect.publication_name
                row["publication_exists"] = dialect.publication_exists()
                reading = log_holder(dialect)
            else:
                path = dialect.offset_path(st.data_dir)
                row["holder"] = f"binlog offset {path}"
                reading = None
                if path and storage.exists(path):
                    dialect.bind_data_dir(st.data_dir)
                    reading = dialect.log_retention(storage.read_text(path))
            row["holder_exists"] = reading is not None
            if reading is not None:
                row.update(
                    held_bytes=reading.lag_bytes,
                    unbounded=reading.unbounded or None,
                    lost=reading.lost,
                    held_by=reading.holder,
                )
    except Exception as exc:  # noqa: BLE001 - an unreachable server is said on its row, not a failed listing
        row["server_error"] = f"{type(exc).__name__}: {safe_error_text(exc)}"


def describe_source_row(r: dict[str, Any]) -> str:
    parts = []
    if r["database"]:
        parts.append(f"{r['database']} via connection {r['conn_id']!r}")
    elif r["conn_id"]:
        parts.append(f"connection {r['conn_id']!r}")
    if r["server_error"]:
        parts.append(f"its server could not be asked: {r['server_error']}")
    if r["holder"]:
        text = str(r["holder"])
        if r["holder_exists"] is False:
            text += (
                " (not created yet)" if r["holder"].startswith("replication slot") else " (none stored yet)"
            )
        elif r["held_bytes"] is not None:
            what = "WAL" if r["holder"].startswith("replication slot") else "binlog written since"
            text += (
                f" holds {r['held_bytes']:,} bytes of {what}"
                if what == "WAL"
                else f", {r['held_bytes']:,} bytes of {what}"
            )
            if r["lost"]:
                text += ", LOST (airflow-cdc resync)"
            if r["unbounded"]:
                text += ", WARNING: unbounded (max_slot_wal_keep_size = -1: it can fill the disk)"
        parts.append(text)
    if r["publication"]:
        parts.append(
            f"publication {r['publication']!r}" + ("" if r["publication_exists"] else " (not created yet)")
        )
    lag = r["lag"]
    if lag and lag.get("malformed"):
        parts.append(f"capture lag MALFORMED: {lag['malformed']}")
    elif lag:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(lag.get("at") or 0)) + "Z"
        parts.append(
            f"capture lag {lag.get('bytes') or 0:,} bytes, {lag.get('seconds') or 0:,.0f} s (read {when})"
        )
    elif r["snapshot_only"]:
        parts.append(
            "snapshot only: no capture has run"
            + (
                f" (run the changelog DAG, or airflow-cdc drop-source --source {r['source']} --yes)"
                if r["holder_exists"]
                else ""
            )
        )
    else:
        parts.append("no capture has run")
    if r["snapshots"]:
        parts.append("snapshots: " + ", ".join(f"{t} {st}" for t, st in sorted(r["snapshots"].items())))
    if r["note"]:
        parts.append(r["note"])
    return "; ".join(parts)


def cmd_sources(args: argparse.Namespace) -> int:
    from .. import settings

    rows = source_rows(settings.load(), live=not args.offline)
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return EXIT_OK
    if not rows:
        print("no sources: no sources config entry, setting, snapshot or capture names one")
    width = max([len(r["source"]) for r in rows] + [1])
    for r in rows:
        print(f"{r['source']:<{width}}  {describe_source_row(r)}")
    return EXIT_OK
