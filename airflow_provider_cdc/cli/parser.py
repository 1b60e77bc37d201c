"""The command line's arguments, defined once: both ``airflow-cdc`` and ``airflow cdc`` read them."""

from __future__ import annotations

import argparse

from ..dialects.registry import debezium_connectors


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="airflow-cdc", description="DBLog CDC for Airflow: snapshot status and verification"
    )
    sub = p.add_subparsers(dest="command", required=True)

    _add_status(sub)
    _add_verify(sub)
    _add_table_commands(sub)
    _add_admin_commands(sub)
    return p


def _add_status(sub) -> None:
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


def _add_verify(sub) -> None:
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


def _add_table_commands(sub) -> None:
    """resync, export-debezium and mirror-version."""
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
    _add_mirror_version(sub)


def _add_mirror_version(sub) -> None:
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
