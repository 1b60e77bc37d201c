"""``airflow cdc`` (or ``airflow-cdc``): status, verify, resync, export-debezium, snapshot,
drop-source, doctor and sources from the command line (docs/cli.md).

Registered through the provider's CLI entry (``get_provider_info()["cli"]`` ->
:func:`get_cli_commands`); the arguments are defined once, in :func:`_parser`. Exit codes: 0
done or ready, 1 a finding (a mismatch, an error, not caught up yet), 2 cannot run. A source's
credentials come from its Airflow connection, never from the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from typing import Any

from .core.errors import CdcError, ConfigurationError
from .core.schema import TableName
from .dialects.registry import debezium_connectors

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="airflow-cdc", description="DBLog CDC for Airflow: snapshot status and verification"
    )
    sub = p.add_subparsers(dest="command", required=True)

    st = sub.add_parser(
        "status",
        help="progress of each table's snapshot and each source's capture lag (from the Airflow Variables)",
        description="Progress of each table's snapshot, each source's capture lag, open failover gaps. "
        "Exit 1 when anything is failing (a capture failing, a snapshot failed, a malformed reading, "
        "an open gap), so it can gate a DAG or a monitor; 0 otherwise; 2 on an error.",
    )
    st.add_argument("--source", help="only this source (default: all)")
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.add_argument(
        "--live",
        action="store_true",
        help="also read each source's current log position from its server (its connection) and say "
        "how far the applied changes are behind it",
    )
    st.add_argument(
        "--caught-up-to",
        default=None,
        metavar="POSITION",
        help="with --source: exit 0 when every change committed before POSITION (PostgreSQL: an LSN, "
        "SELECT pg_current_wal_lsn(); MariaDB: file:offset of SHOW MASTER STATUS) is in the event "
        "log and the mirror, 1 when not yet",
    )

    v = sub.add_parser("verify", help="compare the mirror with the source by chunked checksums")
    v.add_argument(
        "--conn-id",
        default=None,
        help="Airflow connection of the source (default $CDC_SOURCE_CONN_ID or cdc_source)",
    )
    v.add_argument("--table", required=True, help="SCHEMA.TABLE (MySQL: DATABASE.TABLE)")
    v.add_argument(
        "--data-dir",
        default=None,
        help="the pipeline's data dir (default $CDC_DATA_DIR, else $AIRFLOW_HOME/cdc-data)",
    )
    v.add_argument(
        "--source",
        help="source name of the staging/output folders (default: the connection id); a source "
        "of the sources config brings its connection, data location and storage",
    )
    v.add_argument("--chunk-rows", type=int, default=10_000, help="rows per checksum chunk (default 10000)")
    v.add_argument("--examples", type=int, default=10, help="mismatched keys to show (default 10)")
    v.add_argument(
        "--events", action="store_true", help="also check the event log is position-monotonic per key"
    )
    v.add_argument("--json", action="store_true", help="machine-readable output")
    v.add_argument(
        "--repair",
        action="store_true",
        help="on a mismatch, trigger a snapshot of only the key ranges that differed (of the whole table "
        "when the mirror has rows the source has not)",
    )
    v.add_argument(
        "--snapshot-dag",
        default=None,
        help="the snapshot DAG --repair triggers (default cdc_snapshot; a source of the sources config: "
        "cdc_snapshot__<source>)",
    )
    r = sub.add_parser(
        "resync",
        help="after a failover capture could not follow (SourceChangedError): record the "
        "gap, start capture anew on the server the source reaches now; then verify "
        "--repair each table",
    )
    r.add_argument(
        "--conn-id", default=None, help="Airflow connection of the source (default $CDC_SOURCE_CONN_ID)"
    )
    r.add_argument(
        "--source",
        help="source name (default: the connection id); a source of the sources config brings "
        "its connection and data location",
    )
    r.add_argument("--data-dir", default=None, help="the pipeline's data dir (default $CDC_DATA_DIR)")
    x = sub.add_parser(
        "export-debezium",
        help="write a table's event log as Debezium JSON records (JSON lines of "
        "key and value documents, JsonConverter with schemas)",
    )
    x.add_argument("--table", required=True, help="SCHEMA.TABLE (MySQL: DATABASE.TABLE)")
    x.add_argument(
        "--out", required=True, help="where to write the JSON lines (a path or a URI of the storage layer)"
    )
    x.add_argument(
        "--topic-prefix",
        default=None,
        help="Debezium's topic.prefix: source.name and the schema names' "
        "first part (default: the source name)",
    )
    x.add_argument(
        "--source",
        help="source name of the output folders (default $CDC_SOURCE or the connection id); "
        "a source of the sources config brings its data location and storage",
    )
    x.add_argument("--data-dir", default=None, help="the pipeline's data dir (default $CDC_DATA_DIR)")
    x.add_argument(
        "--connector",
        choices=list(debezium_connectors()),
        default=None,
        help="the Debezium connector to imitate (default: the database the events came from)",
    )
    x.add_argument(
        "--no-tombstones",
        action="store_true",
        help="no null-value record after each delete (Debezium's tombstones.on.delete=false)",
    )
    x.add_argument(
        "--truncates",
        action="store_true",
        help="also TRUNCATE records (Debezium skips them by default; Flink's debezium-json cannot read them)",
    )
    x.add_argument(
        "--form",
        choices=["keyvalue", "value"],
        default="keyvalue",
        help='keyvalue: {"key", "value"} per line, as Kafka records; value: the value document alone '
        "per line, as Flink's debezium-json and file readers take it (no tombstones)",
    )
    x.add_argument(
        "--database", default=None, help="PostgreSQL: source.db (default: the database capture recorded)"
    )
    x.add_argument(
        "--force", action="store_true", help="replace --out when it exists (default: refuse, write nothing)"
    )
    mv = sub.add_parser(
        "mirror-version",
        help="the mirror's Delta version that equals the source's table at a source position "
        "(time travel: versionAsOf in Spark, duckdb, polars)",
    )
    mv.add_argument("--table", required=True, help="SCHEMA.TABLE (MySQL: DATABASE.TABLE)")
    mv.add_argument(
        "--at",
        required=True,
        help="the source position: a PostgreSQL LSN ('16/B374D848'), a binlog file and offset "
        "('binlog.000042:1234'), or an encoded position (the event log's source.position)",
    )
    mv.add_argument(
        "--source",
        help="source name of the output folders (default $CDC_SOURCE or the connection id); "
        "a source of the sources config brings its data location and storage",
    )
    mv.add_argument("--data-dir", default=None, help="the pipeline's data dir (default $CDC_DATA_DIR)")
    _add_admin_commands(sub)
    return p


def _add_admin_commands(sub) -> None:
    """``snapshot`` and ``drop-source``: what users did by hand (a DAG conf, a Python function)."""
    sn = sub.add_parser(
        "snapshot",
        help="start, pause, resume or stop a snapshot: start and resume trigger the "
        "snapshot DAG with that conf (as the UI's trigger does); pause and stop "
        "change the snapshot's progress, which its running chunk tasks read "
        "before their next chunk",
    )
    sn.add_argument("action", choices=["start", "pause", "resume", "stop"])
    sn.add_argument(
        "--table",
        action="append",
        required=True,
        metavar="SCHEMA.TABLE",
        help="a captured table (repeat for several)",
    )
    sn.add_argument(
        "--source",
        help="source name (default $CDC_SOURCE or the connection id); a source of the "
        "sources config brings its snapshot DAG and data location",
    )
    sn.add_argument(
        "--snapshot-dag",
        default=None,
        help="the snapshot DAG start/resume trigger (default cdc_snapshot; "
        "a source of the sources config: cdc_snapshot__<source>)",
    )
    sn.add_argument("--data-dir", default=None, help="the pipeline's data dir (default $CDC_DATA_DIR)")
    sn.add_argument(
        "--key-range",
        action="append",
        default=None,
        metavar="JSON",
        help='start: a key range to read, {"start": [1], "end": [1000]} (end exclusive; repeat for '
        "several); the conf's key_ranges",
    )
    sn.add_argument(
        "--range",
        action="append",
        default=None,
        dest="simple_range",
        metavar="START:END",
        help="start: a range of a one-column key, e.g. 5000:6000 (END exclusive; either side may be "
        "left out; repeat for several): --key-range for the common case",
    )
    sn.add_argument(
        "--keys", default=None, metavar="JSON", help="start: chosen keys, e.g. [[5], [7]]; the conf's keys"
    )
    sn.add_argument("--where", default=None, help="start: a row filter in the source's SQL; the conf's where")
    sn.add_argument("--chunk-size", default=None, help='start/resume: rows a chunk, or "auto"')
    sn.add_argument(
        "--parallelism", "--parallel", type=int, default=None, help="start/resume: chunk tasks at once"
    )
    sn.add_argument("--delay-seconds", type=float, default=None, help="start/resume: a pause between chunks")
    d = sub.add_parser(
        "drop-source",
        help="drop what a source holds on its server: PostgreSQL its replication slot "
        "and publication (the slot keeps WAL until dropped), MariaDB/MySQL its "
        "stored binlog offset; refused while a capture holds the source's lock "
        "or one of its snapshots runs",
    )
    d.add_argument("--source", required=True, help="the source (a name of `airflow-cdc status`)")
    d.add_argument("--conn-id", default=None, help="its Airflow connection (default: the source's)")
    d.add_argument("--data-dir", default=None, help="its data dir (default: the source's)")
    d.add_argument("--yes", action="store_true", help="drop them; without it, only say what would be dropped")
    d.add_argument(
        "--purge-outputs",
        action="store_true",
        help="also delete the source's staging, outputs (event log, mirror, refreshed tables) and "
        "snapshot registers under its data dir; without it they are kept for their readers",
    )
    _add_doctor_and_sources(sub)


def _add_doctor_and_sources(sub) -> None:
    """``doctor`` (check a source before its first run) and ``sources`` (every source and what
    its server holds for it)."""
    doc = sub.add_parser(
        "doctor",
        help="check a source before its first run and print what to fix, one line per finding (read-only)",
        description="Check a source before its first run and print what to fix, one line per finding "
        "with its "
        "severity (ERROR: the first run would be refused or fail; WARNING: it runs, but something can "
        "hurt later). Checked: the connection reaches the server and logs in (the connection id is "
        "named); the grants the role needs for its watermark strategy (the docs' connections page, "
        "'Grants'); PostgreSQL "
        "wal_level=logical, a free replication slot, the REPLICATION attribute, max_slot_wal_keep_size "
        "(-1: nothing bounds the WAL a slot may hold, a warning), the publication; MariaDB/MySQL "
        "log_bin, binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL, and on a replica "
        "log_slave_updates, GTID replication and watermark_strategy 'log'; each table of the scope "
        "exists and has a primary key or a usable replica identity (the docs' operations page, 'Tables "
        "without a primary "
        "key'); the hot standby chunks are read from (connection extra chunk_conn_id): in recovery, "
        "hot_standby_feedback on, replay not paused. Doctor is read-only: its session cannot write, "
        "and it creates no slot, publication or watermark table. "
        "Which source: --source (a source of the sources config, or the environment's CDC_SOURCE), "
        "--conn-id (an Airflow connection; alone, the sources config's one entry on it, else the "
        "environment's settings on it), or both (a new source name on that connection: its slot and "
        "publication are named after it); neither: the environment's source (CDC_SOURCE_CONN_ID). The "
        "tables checked are the source's scope (CDC_TABLES, or the entry's tables) unless --table names "
        "them. Exit 0 when no finding is an error (warnings allowed), 1 when one is, 2 when doctor "
        "cannot run (e.g. an unknown --source).",
    )
    doc.add_argument(
        "--conn-id",
        default=None,
        help="Airflow connection of the source (default: the source's, else $CDC_SOURCE_CONN_ID or "
        "cdc_source)",
    )
    doc.add_argument(
        "--source",
        default=None,
        help="source name: an entry of the sources config brings its connection, scope and "
        "connection extras; with --conn-id any new name (the slot and publication are named "
        "after it)",
    )
    doc.add_argument(
        "--table",
        action="append",
        default=None,
        metavar="SCHEMA.TABLE",
        help="check this table instead of the source's scope (MySQL: DATABASE.TABLE; repeat for several)",
    )
    doc.add_argument("--verbose", action="store_true", help="also print the checks that passed (OK lines)")
    doc.add_argument(
        "--json",
        action="store_true",
        help="machine-readable output: {source, conn_id, ok, findings: [{severity, check, message}]}",
    )
    so = sub.add_parser(
        "sources",
        help="every source with its replication slot or binlog offset, publication, capture lag and "
        "WAL held, "
        "including sources that only ever ran a snapshot",
        description="List every source this deployment knows: the sources config's, the environment's "
        "(CDC_SOURCE, CDC_SOURCE_CONN_ID), and those only snapshot progress or a capture lag in "
        "Airflow Variables name (e.g. a source that only ever ran a snapshot, whose slot still holds "
        "WAL). Per source: its connection; PostgreSQL its replication slot, whether it exists and the "
        "WAL it holds (and a warning when max_slot_wal_keep_size = -1 leaves that unbounded), its "
        "publication; MariaDB/MySQL its stored binlog offset and the binlog written past it; the "
        "capture lag last recorded; its snapshots. The servers of the sources this deployment names "
        "are asked, read-only; a source only a Variable names is listed but never connected to. "
        "airflow-cdc drop-source removes what a source holds.",
    )
    so.add_argument("--json", action="store_true", help="machine-readable output: one object per source")
    so.add_argument(
        "--offline",
        action="store_true",
        help="do not connect to the sources' servers: only what the sources config, the settings and "
        "the Variables say",
    )


# --- status -------------------------------------------------------------------------------
# what status shows is read by status.py, which the UI page reads too: one source of truth
from .status import (  # noqa: E402, F401
    binlog_epoch_of,
    binlog_file_of,
    caught_up,
    freshness,
    list_progress,
    native_position,
    parse_position,
    progress_summary,
    snapshot_dag_paused,
)


def describe_progress(summary: dict[str, Any]) -> str:
    parts = [summary["status"]]
    if summary.get("dag_paused"):
        # no task of the run is scheduled while the DAG is paused; a chunk task that was
        # running when it was paused has set the status to paused itself
        parts[0] += " (DAG cdc_snapshot is paused: no task runs until it is unpaused)"
    if "ranges" in summary:
        parts.append(f"ranges done {summary['ranges_done']}/{summary['ranges']}")
        parts.append(
            f"{summary['rows']} rows in {summary['chunks']} chunks ({summary['rows_per_second']:.0f} rows/s)"
        )
        if "rows_read" in summary:  # read by the running chunk tasks, not merged yet
            parts.append(f"{summary['rows_read']} rows in {summary['chunks_read']} chunks read")
        if summary["status"] == "running" and summary.get("fraction") is not None:
            left = summary.get("seconds_left")
            parts.append(f"{summary['fraction']:.0%} read" + ("" if left is None else f", ~{left:,} s left"))
        if summary["status"] != "done" and summary["next_keys"]:
            parts.append(
                "continues after "
                + ", ".join("start" if k is None else json.dumps(k) for k in summary["next_keys"])
            )
    if summary.get("snapshot_id"):
        parts.append(f"snapshot {summary['snapshot_id']}")
    if summary.get("run"):
        parts.append(f"run {summary['run']}")
    if summary.get("updated_at"):
        parts.append(f"updated {summary['updated_at']}")
    if summary.get("error"):
        from .error_text import safe_error_text

        parts.append(f"error: {safe_error_text(summary['error'])}")
    if summary.get("refused"):
        parts.append(f"refused: {summary['refused']}")
    return ", ".join(parts)


def _data_dir_of(source: str) -> str | None:
    """The source's data location (its own in the sources config), for what its chunk tasks
    have read; None when the settings cannot tell."""
    from .status import source_setup

    try:
        return source_setup(source)[1]
    except Exception:  # noqa: BLE001 - status still shows the register's figures
        return None


def short_warning(text: str) -> str:
    """A standing warning as status lines repeat it: its first clause, and where the whole
    of it (what happens, how to fix it) is said once (``airflow-cdc doctor``)."""
    head = str(text).split(": while", 1)[0].split(". ", 1)[0]
    return head if head == str(text) else f"{head} (airflow-cdc doctor says why and how to bound it)"


def describe_failing(failing: dict[str, Any]) -> str:
    """A failing capture, first: since when, how many attempts, the last error."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(failing.get("since") or 0)) + "Z"
    return (
        f"CAPTURE FAILING since {since} ({int(failing.get('attempts') or 0)} failed attempt(s)): "
        f"{failing.get('error') or '?'}"
    )


def describe_lag(lag: dict[str, Any]) -> str:
    failing = lag.get("failing")
    if isinstance(failing, dict):
        good = "; the last good reading: " + describe_lag({k: v for k, v in lag.items() if k != "failing"})
        return describe_failing(failing) + (good if lag.get("at") else "; no capture has succeeded yet")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(lag.get("at") or 0)) + "Z"
    text = (
        f"capture lag {lag.get('bytes', 0):,} bytes, {lag.get('seconds') or 0:,.0f} s behind the log "
        f"({lag.get('holder')}), read {when}"
    )
    replica = lag.get("replica")
    if isinstance(replica, dict):
        from .pipeline.capture import describe_replica_lag

        text += f"; {describe_replica_lag(int(replica.get('bytes') or 0), replica.get('seconds'))}"
    return (
        text
        + (f"; AT RISK: {lag['risk']}" if lag.get("risk") else "")
        + (f"; WARNING: {short_warning(lag['warning'])}" if lag.get("warning") else "")
    )


def describe_caught_up(c: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c.get("staged_at") or 0)) + "Z"
    text = (
        f"caught up to {c['caught_up_to']}: every change committed before it is applied (the staged "
        f"changelog reached {c['staged_through']} at {when})"
    )
    if c.get("server_position"):
        behind = c.get("behind_bytes")
        text += f"; the server is at {c['server_position']}" + (
            ", nothing more to apply"
            if c.get("caught_up")
            else f", {behind:,} bytes further"
            if behind is not None
            else ", further on"
        )
    elif c.get("server_error"):
        text += f"; the server's position could not be read: {c['server_error']}"
    f = c.get("freshness")
    if f and f.get("age_s") is not None:
        as_of = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(f["as_of"])) + "Z"
        text += f"; the mirror is {f['age_s']:,.1f} s behind (it shows the source as of {as_of}" + (
            ", changes pending)" if f.get("pending") else ")"
        )
    return text


def _caught_up_of(source: str, data_dir: str | None, live: bool, now) -> dict[str, Any] | None:
    """status.caught_up of ``source`` and, ``live``, its server's position now (None: unknown)."""
    if data_dir is None:
        return None
    try:
        c = caught_up(data_dir, source)
        if c is not None:
            c["freshness"] = freshness(data_dir, source, caught=c)
    except Exception:  # noqa: BLE001 - staging unreadable: status still shows the rest
        return None
    if c is None or not live:
        return c
    from .core.position import Position

    try:
        conn_id, settings = _source_connection(source, now)
        with open_dialect(conn_id, source, settings) as dialect:
            dialect.bind_data_dir(data_dir)  # MariaDB: the epoch of the server read now
            server = dialect.current_position()
            upto = Position.decode(c["position"])
            behind = dialect.log_bytes_between(upto, server)
        c.update(
            server_position=native_position(server, binlog_file_of(data_dir, source)),
            server_encoded=server.encode(),
            behind_bytes=behind,
            caught_up=upto >= server,
        )
    except Exception as exc:  # noqa: BLE001 - an unreachable source is said on its line, not a failed status
        from .error_text import safe_error_text

        c["server_error"] = f"{type(exc).__name__}: {safe_error_text(exc)}"
    return c


def _source_connection(source: str, now):
    """(connection id, settings) of ``source``: its entry of the sources config, else the
    environment's when it is the environment's source; any other name is refused."""
    entry = _config_source(source, now)
    if entry is not None:
        return entry.settings.conn_id, entry.settings
    if source != now.source:  # a name only a Variable holds never chooses a connection (I15)
        from .core.errors import ConfigurationError

        raise ConfigurationError(
            f"source {source!r} is not named by the sources config or the environment "
            "(CDC_SOURCE, CDC_SOURCE_CONN_ID): its server is not read"
        )
    return now.conn_id, now


def cmd_status(args: argparse.Namespace) -> int:
    from . import settings
    from .airflow_variables import load_lags

    if args.source:  # a typo must not read as "nothing recorded" with exit 0
        why = unknown_source_error(args.source, known_sources())
        if why is not None:
            print(f"error: {why}", file=sys.stderr)
            return EXIT_ERROR
    if args.caught_up_to is not None:
        return _status_caught_up_to(args)
    from .status import _checked_numbers, _table_refusal, known_source, source_scope

    items = list_progress(args.source)
    from .airflow_variables import load_run_failures

    failed_runs = load_run_failures(args.source)
    # read back from Variables: a reading of the wrong type is said as such (I15)
    lags = {
        s: _checked_numbers(lag, ("bytes", "seconds", "at"), "capture lag reading")
        for s, lag in load_lags(args.source).items()
    }
    dag_paused = bool(items) and snapshot_dag_paused()
    summaries, data_dirs, scopes = {}, {}, {}
    for s, t, p in items:
        if s not in data_dirs:
            data_dirs[s] = _data_dir_of(s)
            try:
                known = known_source(s)
            except Exception:  # noqa: BLE001 - a sources config that cannot be read: no scope known here
                known = None
            scopes[s] = source_scope(known) if known is not None else None
        refused = _table_refusal(scopes[s], t) if scopes[s] is not None else None
        summary = progress_summary(t, p, data_dir=None if refused else data_dirs[s])
        if refused:  # the one scope check: shown, nothing of the table read
            summary["refused"] = refused
        summary["dag_paused"] = dag_paused and summary["status"] == "running"
        summaries[(s, t)] = summary
    now = settings.load() if args.live else None
    sources = sorted(
        {s for s, _t, _p in items} | set(lags) | set(failed_runs) | ({args.source} if args.source else set())
    )
    caught = {}
    for s in sources:
        if s not in data_dirs:
            data_dirs[s] = _data_dir_of(s)
        caught[s] = _caught_up_of(s, data_dirs[s], args.live, now)
    # --live: what the server holds for sources no capture has run for (a snapshot's slot)
    holders = {}
    if args.live:  # also the deployment's sources nothing is recorded for yet
        asked = sorted(set(sources) | ({args.source} if args.source else set(known_sources(now))))
        holders = _live_holders(asked, lags, now)
    from .status import open_gaps_of

    gaps = {s: open_gaps_of(s, data_dirs.get(s)) for s in sources}  # read once per source
    unhealthy = _unhealthy(lags, summaries, gaps)
    unhealthy += [f"a snapshot run of {s} failed" for s in failed_runs]
    code = EXIT_MISMATCH if unhealthy else EXIT_OK
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "source": s,
                        "table": t,
                        **summaries[(s, t)],
                        "progress": p,
                        "source_lag": lags.get(s),
                        "source_caught_up": caught.get(s),
                        "source_gaps": gaps.get(s, []),
                        "source_log_holder": holders.get(s),
                        "source_failed_run": failed_runs.get(s),
                    }
                    for s, t, p in items
                ]
                + [  # a source with no snapshot recorded: its capture and gaps still (table null)
                    {
                        "source": s,
                        "table": None,
                        "status": None,
                        "source_lag": lags.get(s),
                        "source_caught_up": caught.get(s),
                        "source_gaps": gaps.get(s, []),
                        "source_log_holder": holders.get(s),
                        "source_failed_run": failed_runs.get(s),
                    }
                    for s in sources
                    if s not in {src for src, _t, _p in items}
                ],
                indent=2,
                sort_keys=True,
            )
        )
        return code
    if not items:
        print("no snapshots recorded" + (f" for source {args.source!r}" if args.source else ""))
    width = max([len(f"{s}:{t}") for s, t, _ in items] + [len(s) for s in [*sources, *holders]] + [1])
    for s, t, _p in items:
        print(f"{f'{s}:{t}':<{width}}  {describe_progress(summaries[(s, t)])}")
    for s, lag in lags.items():
        print(
            f"{s:<{width}}  {'MALFORMED: ' + lag['malformed'] if lag.get('malformed') else describe_lag(lag)}"
        )
    for s, held in holders.items():
        print(f"{s:<{width}}  {held}")
    for s, run in failed_runs.items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(run.get("at") or 0))) + "Z"
        print(
            f"{s:<{width}}  SNAPSHOT RUN FAILED {run.get('run_id')} at {when} before planning: "
            f"{run.get('error')} (fix it, then start the snapshot again)"
        )
    for s in sources:
        if caught[s] is not None:
            print(f"{s:<{width}}  {describe_caught_up(caught[s])}")
    for s in sources:
        for gap in gaps[s]:
            todo = sorted(set(gap.get("tables", [])) - set(gap.get("verified", {})))
            print(
                f"{s:<{width}}  gap ({gap['state']}): changes between {gap.get('from')} and "
                f"{gap.get('to')} may be "
                f"missing (a failover); verify --repair: {', '.join(todo) or 'after the next capture'}"
            )
    if unhealthy:
        print(f"NOT HEALTHY (exit {code}): {'; '.join(unhealthy)}")
    return code


def _unhealthy(lags: dict, summaries: dict, gaps: dict) -> list[str]:
    """What makes ``status`` exit non-zero (so it can gate a DAG or a monitor): a failing
    capture, a failed or malformed snapshot, a malformed reading, an open failover gap."""
    out = [f"capture of {s} failing" for s, lag in lags.items() if isinstance(lag.get("failing"), dict)]
    out += [f"lag reading of {s} malformed" for s, lag in lags.items() if lag.get("malformed")]
    out += [
        f"snapshot of {s}:{t} {sm['status']}"
        for (s, t), sm in summaries.items()
        if sm.get("status") in ("failed", "malformed")
    ]
    out += [f"{len(g)} open gap(s) of {s}" for s, g in gaps.items() if g]
    return out


def _status_caught_up_to(args: argparse.Namespace) -> int:
    """``status --source S --caught-up-to POSITION``: whether every change S committed before
    POSITION is in the event log and the mirror (exit 0) or not yet (1)."""
    from .core.position import Position

    if not args.source:
        print("error: --caught-up-to needs --source (whose log the position is in)", file=sys.stderr)
        return EXIT_ERROR
    data_dir = _data_dir_of(args.source)
    if data_dir is None:
        print(f"error: the data location of source {args.source!r} is not known (settings)", file=sys.stderr)
        return EXIT_ERROR
    binlog = binlog_file_of(data_dir, args.source)
    target = parse_position(args.caught_up_to, binlog, binlog_epoch_of(data_dir, args.source))
    c = caught_up(data_dir, args.source)
    done = c is not None and Position.decode(c["position"]) >= target
    want = native_position(target, binlog)
    if args.json:
        print(
            json.dumps(
                {
                    "source": args.source,
                    "target": want,
                    "target_encoded": target.encode(),
                    **(c or {}),
                    "caught_up": done,
                },
                indent=2,
                sort_keys=True,
            )
        )
    elif c is None:
        print(f"{args.source}: not yet: no capture has recorded how far the changelog is staged")
    elif done:
        print(
            f"{args.source}: caught up: every change committed before {want} is applied "
            f"(caught up to {c['caught_up_to']})"
        )
    else:
        print(
            f"{args.source}: not yet: caught up to {c['caught_up_to']}, before {want}"
            + (
                f" ({c['pending_segments']} staged segment(s) to apply)"
                if c["pending_segments"]
                else " (the changelog is not captured that far yet)"
            )
        )
    return EXIT_OK if done else EXIT_MISMATCH


def open_dialect(conn_id: str, source: str, settings=None):
    """The source dialect from the Airflow connection (CdcSourceHook), with the capture scope
    of ``settings`` (a source of the sources config; None: the environment's)."""
    from .hooks.cdc_source import CdcSourceHook

    if settings is None:
        return CdcSourceHook(conn_id, source=source).get_dialect(source=source)
    return CdcSourceHook.for_settings(settings, conn_id, source).get_dialect(source=source)


def cmd_resync(args: argparse.Namespace) -> int:
    from . import settings
    from .pipeline.resync import resync

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


def cmd_verify(args: argparse.Namespace) -> int:
    from . import settings
    from .pipeline.verify import check_event_log, verify_table

    try:
        now = settings.load()  # the same defaults as the DAGs' tasks
        entry = _config_source(args.source, now) if args.source else _config_source_of_conn(args.conn_id, now)
    except Exception as exc:  # noqa: BLE001 - a ConfigurationError naming the variable or config entry
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if entry is not None:  # a source of the sources config: its connection, data location, storage
        now = entry.settings
        args.snapshot_dag = args.snapshot_dag or f"cdc_snapshot__{entry.name}"
        if now.storage_conn_id:
            from .hooks.cdc_storage import apply_storage_connection

            apply_storage_connection(now.storage_conn_id)
    args.data_dir = args.data_dir or now.data_dir
    args.conn_id = args.conn_id or now.conn_id
    args.source = args.source or now.explicit_source
    if args.chunk_rows < 1:
        print(f"error: --chunk-rows must be >= 1, got {args.chunk_rows}", file=sys.stderr)
        return EXIT_ERROR
    from . import storage

    storage.check_location(args.data_dir, "--data-dir")
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
        pk = dialect.describe_table(table).primary_key if args.events else ()
        if res.ok:  # a failover's gap is repaired for this table (docs: operations, 'Failover')
            from .pipeline.resync import verified_after_gap

            for gap in verified_after_gap(dialect, args.data_dir, table.id):
                print(
                    f"gap {gap['from']} .. {gap['to']} of source {source!r} closed: every captured "
                    "table verified "
                    "equal to the source since",
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
        out["ok"] = not failed
        out["repair_run"] = triggered
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{table.id} (source {source!r}, data dir {args.data_dir}): {res.chunks} chunks compared, "
            f"{res.mismatched_chunks} differed; source {res.source_rows} rows, mirror {res.mirror_rows} rows"
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
    return EXIT_MISMATCH if failed else EXIT_OK


def not_snapshotted(data_dir: str, source: str, table: TableName, snapshot_dag: str) -> str | None:
    """Why verify has nothing to compare ``table`` with (None: its mirror exists): no snapshot (nor
    change) of it reached the mirror yet, said with how to start one."""
    from . import storage
    from .storage.layout import mirror_dir

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
    from . import airflow_variables

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
    from .core.position import parse_position
    from .sinks.mirror_history import version_at
    from .storage.layout import mirror_dir

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
    from . import settings, storage
    from .hooks.cdc_source import CdcSourceHook

    now = settings.load()
    entry = _config_source(args.source, now) if args.source else None
    if entry is not None:
        now = entry.settings
        if now.storage_conn_id:
            from .hooks.cdc_storage import apply_storage_connection

            apply_storage_connection(now.storage_conn_id)
    source = args.source or now.explicit_source or now.conn_id
    data_dir = storage.check_location(args.data_dir or now.data_dir, "--data-dir")
    table = TableName.parse(args.table)
    CdcSourceHook.for_settings(now, None, source).capture_scope().check(table)
    return source, data_dir, table


def cmd_export_debezium(args: argparse.Namespace) -> int:
    from . import storage
    from .export.debezium import DebeziumOptions, export_table

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


def _config_source(name: str, now):
    from .status import config_source

    return config_source(name, now)


def _config_source_of_conn(conn_id: str | None, now):
    """The one source of the sources config whose connection is ``conn_id`` (None: not the
    environment's connection, none or several entries use it): ``--conn-id`` alone then means that
    source, with its scope and data location."""
    if not conn_id or conn_id == now.conn_id:
        return None
    from .sources_config import read_sources, sources_file

    dags_folder = None
    try:
        from airflow.configuration import conf

        dags_folder = conf.get("core", "dags_folder", fallback=None)
    except Exception:  # noqa: BLE001 - outside an Airflow installation: no DAG folder to look in
        pass
    location = sources_file(now, dags_folder)
    if location is None:
        return None
    found = [e for e in read_sources(location) if e.settings.conn_id == conn_id]
    return found[0] if len(found) == 1 else None


def trigger_repair(dag_id: str, source: str, table_id: str, conf: dict, data_dir: str) -> str:
    """Trigger ``dag_id`` with a repair conf; returns the run id. Refused while the table has
    a running, paused or failed snapshot (the plan would refuse the start anyway)."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.utils.types import DagRunTriggeredByType

    from . import airflow_variables
    from .core.errors import StateError

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


def main(argv: list[str] | None = None) -> int:
    """Entry point. As the console command (``argv`` None) it ends with ``os._exit``: delta-rs
    threads can abort the interpreter's teardown (SIGABRT, "terminate called without an active
    exception", delta-io/delta-rs#2184), which would turn a clean verify into exit code 134."""
    code = run(argv)
    if argv is None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


# --- snapshot, drop-source, and the sources status knows ----------------------------------------
def known_sources(now=None) -> list[str]:
    """Every source status can tell of: the sources config's, the environment's, and those with a
    stored snapshot progress or capture lag."""
    from . import settings
    from .airflow_variables import load_lags

    names: set[str] = set()
    try:
        now = now or settings.load()
        names.add(now.source)
        from .sources_config import read_sources, sources_file

        try:
            from airflow.configuration import conf

            dags_folder = conf.get("core", "dags_folder", fallback=None)
        except Exception:  # noqa: BLE001 - outside an Airflow installation
            dags_folder = None
        location = sources_file(now, dags_folder)
        if location is not None:
            names.update(e.name for e in read_sources(location))
    except Exception:  # noqa: BLE001 - settings or a sources config that cannot be read: the stored names
        pass
    names.update(s for s, _t, _p in list_progress(None))
    names.update(load_lags(None))
    return sorted(n for n in names if n and n != "?")


def unknown_source_error(source: str, known: list[str]) -> str | None:
    """Why ``source`` is not one status knows, with the close names (None: it is known)."""
    import difflib

    if source in known:
        return None
    close = difflib.get_close_matches(source, known, n=3, cutoff=0.6) or [
        k for k in known if k.lower() == source.lower()
    ]
    return (
        f"source {source!r} is not known: no sources config entry, setting, snapshot or capture names it"
        + (f"; did you mean {' or '.join(map(repr, close))}?" if close else ".")
        + f" Known sources: {', '.join(known) or 'none yet'}"
    )


def _source_dialect(source: str, now, conn_id: str | None = None):
    cid, st = _source_connection(source, now)
    return open_dialect(conn_id or cid, source, st), st


def cmd_snapshot(args: argparse.Namespace) -> int:
    from . import airflow_variables, settings

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

    from .pipeline.snapshot_conf import parse_snapshot_conf
    from .status import source_scope

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
    from . import settings
    from .pipeline.source_admin import drop_source

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
            from .storage.layout import source_roots

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
        from . import storage
        from .storage.layout import source_roots

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
    from . import airflow_variables

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
    from .pipeline.source_admin import log_holder
    from .status import known_source

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
            from .error_text import safe_error_text

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


# --- doctor and sources -------------------------------------------------------------------------
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
    from . import settings
    from .doctor import ERROR, OK, Finding, check_source, has_errors

    now = settings.load()
    target = _doctor_target(args, now)
    if isinstance(target, str):
        print(f"error: {target}", file=sys.stderr)
        return EXIT_ERROR
    source, conn_id, st = target
    try:
        dialect = open_dialect(conn_id, source, st)
    except Exception as exc:  # noqa: BLE001 - an unknown connection or a bad extra: a finding like any other
        from .doctor import _user_error

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
    from .airflow_variables import load_lags
    from .status import _checked_numbers, known_source

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
    from . import storage
    from .error_text import safe_error_text
    from .pipeline.source_admin import log_holder

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
    from . import settings

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


COMMANDS = {
    "status": cmd_status,
    "verify": cmd_verify,
    "resync": cmd_resync,
    "export-debezium": cmd_export_debezium,
    "mirror-version": cmd_mirror_version,
    "snapshot": cmd_snapshot,
    "drop-source": cmd_drop_source,
    "doctor": cmd_doctor,
    "sources": cmd_sources,
}


def run(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _dispatch(args.command, args)


@contextlib.contextmanager
def _quiet_airflow():
    """While a command runs, Airflow's own INFO lines ("creating dag run", the DagBag's filling)
    are not its output: only Airflow's warnings and errors reach the terminal
    (AIRFLOW__LOGGING__LOGGING_LEVEL=DEBUG still shows everything). The levels are put back
    after the command (a command run in-process, as tests and ``airflow cdc`` do, leaves the
    process's logging as it found it)."""
    import importlib
    import logging

    if os.environ.get("AIRFLOW__LOGGING__LOGGING_LEVEL", "").upper() == "DEBUG":
        yield
        return
    stdlib = logging.getLogger("airflow")
    before = stdlib.level
    stdlib.setLevel(logging.WARNING)
    # Airflow 3's structlog loggers take their level per namespace from a table (the core's and
    # the task SDK's copies); a namespace level the deployment set stays
    added = []
    for module in ("airflow._shared.logging.structlog", "airflow.sdk._shared.logging.structlog"):
        try:
            levels = importlib.import_module(module).PER_LOGGER_LEVELS
            if "airflow" not in levels:
                levels["airflow"] = logging.WARNING
                added.append(levels)
        except Exception:  # noqa: BLE001, S112 - another Airflow: its INFO lines show, nothing else changes
            continue
    try:
        yield
    finally:
        stdlib.setLevel(before)
        for levels in added:
            levels.pop("airflow", None)


def _dispatch(command: str, args: argparse.Namespace) -> int:
    from .hooks.connections import read_metadata_database

    read_metadata_database()  # a command runs outside a task: connections of the UI are in the database
    try:
        with _quiet_airflow():
            return COMMANDS[command](args)
    except Exception as exc:  # noqa: BLE001 - a missing connection or unreachable source: say so, exit 2
        from .hooks.task_errors import describe_user_error

        # an unknown connection id or a refused login: named, with what to check (task_errors.py)
        told = (
            describe_user_error(exc, conn_id=getattr(args, "conn_id", None))
            if not isinstance(exc, CdcError) or exc.__cause__ is not None
            else None
        )
        print(
            f"error: {told or (exc if isinstance(exc, CdcError) else f'{type(exc).__name__}: {exc}')}",
            file=sys.stderr,
        )
        return EXIT_ERROR


# --- ``airflow cdc``: the same commands in Airflow's CLI ----------------------------------------
def get_cli_commands() -> list:
    """The provider's CLI entry: one ``cdc`` group whose commands and arguments are read off
    :func:`_parser`, so both entry points parse alike. Runs at every ``airflow`` start: cheap."""
    from airflow.cli.cli_config import ActionCommand, GroupCommand

    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in subparsers._choices_actions}
    commands = [
        ActionCommand(
            name=name,
            help=helps.get(name, ""),
            func=_airflow_entry(name),
            description=sub.description or helps.get(name),
            args=[_airflow_arg(a) for a in sub._actions if not isinstance(a, argparse._HelpAction)],
        )
        for name, sub in subparsers.choices.items()
    ]
    return [GroupCommand(name="cdc", help=parser.description or "", subcommands=commands)]


def _airflow_arg(action: argparse.Action):
    """An argparse action of :func:`_parser` as Airflow's ``Arg``."""
    from airflow.cli.cli_config import Arg

    positional = not action.option_strings  # e.g. ``snapshot``'s action: its name is its flag, no dest
    kwargs: dict[str, Any] = (
        {"help": action.help} if positional else {"help": action.help, "dest": action.dest}
    )
    if isinstance(action, argparse._StoreTrueAction):
        kwargs["action"] = "store_true"
    else:
        if isinstance(action, argparse._AppendAction):
            kwargs["action"] = "append"
        for k in ("default", "type", "choices", "nargs", "metavar"):
            if getattr(action, k) is not None:
                kwargs[k] = getattr(action, k)
        if action.required and not positional:
            kwargs["required"] = True
    return Arg(tuple(action.option_strings) or (action.dest,), **kwargs)


def _airflow_entry(command: str):
    def entry(args: argparse.Namespace) -> None:
        code = _dispatch(command, args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as main(): delta-rs threads can abort the interpreter's teardown

    return entry


if __name__ == "__main__":
    sys.exit(main())
