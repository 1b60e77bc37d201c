"""``airflow-cdc doctor``: check a source before its first run and say what to fix, one line per
finding (``error``, ``warning``, ``ok``). The checks are the dialects' own, so doctor says what the
first run would say, all at once; its session is read-only and it creates nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ERROR, WARNING, OK = "error", "warning", "ok"


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning | ok
    check: str  # what was checked: connection, wal_level, grants, table public.t, ...
    message: str  # what is wrong and the fix (ok: what holds)

    def line(self) -> str:
        """One line, whatever the message: a driver's multi-line text is folded."""
        return f"{self.severity.upper():<7} {self.check}: {' '.join(self.message.split())}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == ERROR for f in findings)


def _user_error(exc: BaseException, conn_id: str | None) -> str:
    from .core.errors import SourceUnreachableError
    from .error_text import safe_error_text
    from .hooks.task_errors import describe_user_error

    told = describe_user_error(exc, conn_id=conn_id)
    if told:
        return told
    text = safe_error_text(exc)
    unreached = text.startswith("cannot connect") or "Can't connect" in text
    if isinstance(exc, SourceUnreachableError) or unreached:  # the server is not reached at all
        return (
            f"{text} (connection {conn_id!r}): check that connection's host and port, that the server "
            "runs, and "
            "that it accepts connections from here"
        )
    return f"{type(exc).__name__}: {text} (connection {conn_id!r})"


def check_source(dialect: Any, conn_id: str | None) -> list[Finding]:
    """Every finding for ``dialect``'s source (its connection ``conn_id``, named in what is said).
    Reachability first: a source that cannot be reached or refuses the login is that one error."""
    where = f"connection {conn_id!r}" if conn_id else "the source's connection"
    try:
        _read_only(dialect)
    except Exception as exc:  # noqa: BLE001 - unreachable, refused login, unknown connection: said, not raised
        return [Finding(ERROR, "connection", _user_error(exc, conn_id))]
    p = dialect.params
    server = dialect.name if dialect.name == "postgres" else dialect.flavour.name
    found = [Finding(OK, "connection", f"{where} reaches {server} at {p.host}:{p.port} as {p.user!r}")]
    try:
        if dialect.name == "postgres":
            found += _postgres(dialect, conn_id)
        else:
            found += _mysql(dialect)
    except Exception as exc:  # noqa: BLE001 - a check that could not run is an error of its own, not a traceback
        found.append(Finding(ERROR, "check", f"a check could not run: {_user_error(exc, conn_id)}"))
    return found


def _read_only(dialect: Any) -> None:
    """The session cannot write, whatever a check runs (and the first statement connects)."""
    if dialect.name == "postgres":
        dialect._query("SET default_transaction_read_only = on")
    else:
        dialect._query("SET SESSION TRANSACTION READ ONLY")


# --- the table scope (both databases) -----------------------------------------------------------
def _scope(dialect: Any) -> tuple[list, list[Finding]]:
    from .core.errors import ConfigurationError

    tables = list(dialect.scope_tables() or ())
    try:
        dialect.require_capture_scope()
    except ConfigurationError as exc:
        return tables, [Finding(ERROR, "scope", str(exc))]
    if not tables:  # all_tables
        return tables, [
            Finding(
                WARNING,
                "scope",
                "the scope is every table of the database (capture_all_tables): "
                "tables are not checked one by one; name them (CDC_TABLES, or the "
                "source's tables) to have each checked",
            )
        ]
    return tables, []


def _table_findings(dialect: Any, tables: list, exists: dict) -> list[Finding]:
    """Each table of the scope: it exists, has a key the log carries (a primary key, or what
    the docs' operations page, "Tables without a primary key" says), and its columns are of supported
    types."""
    out = []
    keyless = {}
    present = [t for t in tables if exists.get(t)]
    for problem in dialect.scope_problems(present):
        for t in present:
            if problem.startswith(f"table {t} "):
                keyless[t] = problem
                break
    for t in tables:
        check = f"table {t}"
        if not exists.get(t):
            out.append(
                Finding(
                    ERROR,
                    check,
                    f"table {t} does not exist (or the connection's role cannot see it): "
                    "create it, correct its name in the scope (names are case-sensitive), "
                    "or remove it from the scope",
                )
            )
        elif t in keyless:
            out.append(
                Finding(ERROR, check, keyless[t] + ' (docs: operations, "Tables without a primary key")')
            )
        else:
            try:
                schema = dialect.describe_table(t)
            except Exception as exc:  # noqa: BLE001 - an unsupported type, a grant: its own message
                out.append(Finding(ERROR, check, str(exc)))
            else:
                out.append(Finding(OK, check, f"exists, key ({', '.join(schema.primary_key)})"))
    return out


# --- PostgreSQL --------------------------------------------------------------------------------
def _pg_check_of(problem: str) -> str:
    if problem.startswith("wal_level"):
        return "wal_level"
    if "replication slots" in problem and "may not use" in problem:
        return "grants"
    if "replication_slots" in problem or "replication slots" in problem:
        return "replication slots"
    if problem.startswith("server version"):
        return "version"
    if "publication" in problem:
        return "publication"
    return "settings"


def _postgres(d: Any, conn_id: str | None) -> list[Finding]:
    from .dialects.postgres.prerequisites import prerequisite_problems

    out: list[Finding] = []
    s = d.read_settings()
    problems = prerequisite_problems(s, d.slot_name)
    out += [Finding(ERROR, _pg_check_of(p), p) for p in problems]
    if s.wal_level == "logical":
        out.append(Finding(OK, "wal_level", "logical"))
    if s.slot_exists:
        out.append(Finding(OK, "replication slots", f"slot {d.slot_name!r} exists"))
    elif not any(f.check == "replication slots" for f in out):
        out.append(
            Finding(
                OK,
                "replication slots",
                f"{s.max_replication_slots - s.slots_used} of "
                f"{s.max_replication_slots} free for slot {d.slot_name!r}",
            )
        )
    grants = d.privilege_problems(s)
    if s.in_recovery:
        if d.watermarks.tables():  # a standby takes no writes
            grants.append(d.standby_watermark_problem)
        pub = d.standby_publication_problem()
        if pub:
            out.append(Finding(ERROR, "publication", pub))
    strategy = d.watermark_strategy
    out += [
        Finding(ERROR, "grants", f"role {s.user!r} (watermark strategy {strategy!r}): {p}") for p in grants
    ]
    if not grants and not any(f.check == "grants" for f in out):
        out.append(Finding(OK, "grants", f"role {s.user!r} has what watermark strategy {strategy!r} needs"))
    out += _pg_retention(d)
    tables, found = _scope(d)
    out += found
    if tables:
        exists = {t: d._relation(t) is not None for t in tables}
        out += _table_findings(d, tables, exists)
    if d.read_params is not None:
        out += _pg_chunk_standby(d)
    return out


def _pg_retention(d: Any) -> list[Finding]:
    """max_slot_wal_keep_size -1: nothing bounds the WAL a slot holds (the retention check's
    words when the slot exists); a lost slot is an error."""
    limit = d.wal_keep_limit_mb()
    reading = d.log_retention("")  # None while the slot does not exist
    out = []
    if reading is not None and reading.lost:
        out.append(
            Finding(
                ERROR,
                "replication slots",
                f"{reading.holder} is lost (the server removed WAL it needs): "
                "airflow-cdc resync starts capture anew",
            )
        )
    if limit < 0:
        out.append(Finding(WARNING, "max_slot_wal_keep_size", d.unbounded_wal_warning()))
    else:
        out.append(Finding(OK, "max_slot_wal_keep_size", f"{limit:,} MB"))
    return out


def _pg_chunk_standby(d: Any) -> list[Finding]:
    """Chunks from a hot standby (connection extra chunk_conn_id): it is reachable, a standby,
    with hot_standby_feedback on and its replay running."""
    p = d.read_params
    check = f"chunk standby {p.host}:{p.port or 5432}"
    try:
        conn = d._new_connection(p)
    except Exception as exc:  # noqa: BLE001 - said
        return [Finding(ERROR, check, f"the chunk connection (extra chunk_conn_id) cannot be reached: {exc}")]
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SET default_transaction_read_only = on")
            cur.execute(
                "SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback')::bool, "
                "CASE WHEN pg_is_in_recovery() THEN pg_is_wal_replay_paused() END"
            )
            recovering, feedback, paused = cur.fetchone()
    finally:
        conn.close()
    if not recovering:
        return [
            Finding(
                ERROR,
                check,
                "the chunk connection (extra chunk_conn_id) is not a hot standby (it is not in "
                "recovery): name a standby of the source, or remove chunk_conn_id",
            )
        ]
    out = [Finding(OK, check, "a hot standby")]
    if not feedback:
        out.append(
            Finding(
                WARNING,
                check,
                "hot_standby_feedback is off: the primary's vacuum can cancel a chunk "
                "read on the standby (a recovery conflict). Run on the standby: ALTER "
                "SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf()",
            )
        )
    if paused:
        out.append(
            Finding(
                WARNING,
                check,
                "its WAL replay is paused: chunks wait for it and the snapshot pauses "
                "after max_replica_lag_seconds. Run on the standby: SELECT "
                "pg_wal_replay_resume()",
            )
        )
    return out


# --- MariaDB / MySQL ---------------------------------------------------------------------------
def _mysql(d: Any) -> list[Finding]:
    from .dialects.mysql.prerequisites import REQUIRED_SETTINGS, ReplicaStatusDenied, prerequisite_problems

    out: list[Finding] = []
    flavour = d.flavour
    names = [*REQUIRED_SETTINGS, *(v for v, _, _ in flavour.optional_settings)]
    rows = d._query(
        "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(["%s"] * len(names)) + ")", names
    )
    settings: dict[str, str | None] = {n: None for n in names}
    settings.update({str(name).lower(): value for name, value in rows})
    grants = [r[0] for r in d._query("SHOW GRANTS FOR CURRENT_USER()")]
    account = d._query("SELECT CURRENT_USER()")[0][0]  # user@host, as GRANT names it
    user, _, host = str(account).rpartition("@")
    for p in prerequisite_problems(settings, grants, flavour):
        p = p.replace("<user>", f"'{user}'@'{host}'")
        var = p.split(" ", 1)[0]
        out.append(Finding(ERROR, var if var in settings else "grants", p))
    for var in REQUIRED_SETTINGS:
        if not any(f.check == var for f in out):
            out.append(Finding(OK, var, str(settings.get(var))))
    strategy = d.watermark_strategy
    problems = d.privilege_problems(grants)
    out += [
        Finding(ERROR, "grants", f"user {d.params.user!r} (watermark strategy {strategy!r}): {p}")
        for p in problems
    ]
    if not any(f.check == "grants" for f in out):
        out.append(
            Finding(OK, "grants", f"user {d.params.user!r} has what watermark strategy {strategy!r} needs")
        )
    # a source that is itself a replica: its own binlog must carry what it applies, and capture
    # follows a failover by GTID only
    out += [Finding(ERROR, "replica", p) for p in d.replica_problems()]
    try:
        status = d.slave_status()
    except ReplicaStatusDenied:
        out.append(
            Finding(
                WARNING,
                "replica",
                f"user {d.params.user!r} may not run SHOW SLAVE STATUS, so whether "
                "this server is a replica (and its lag) cannot be checked: GRANT "
                f"SLAVE MONITOR ON *.* TO {d.params.user!r} (MySQL: REPLICATION "
                "CLIENT)",
            )
        )
        status = None
    if status:
        out += _mysql_replica(d, status, strategy)
    tables, found = _scope(d)
    out += found
    if tables:
        present = {
            (str(a), str(b))
            for a, b in d._query(
                "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = "  # noqa: S608
                "'BASE TABLE' AND "
                "TABLE_SCHEMA IN (" + ", ".join(["%s"] * len({t.schema for t in tables})) + ")",
                sorted({t.schema for t in tables}),
            )
        }
        out += _table_findings(d, tables, {t: (t.schema, t.name) in present for t in tables})
    return out


def _mysql_replica(d: Any, status: dict, strategy: str) -> list[Finding]:
    of = f"{status.get('Master_Host')}:{status.get('Master_Port')}"
    check = "replica"
    out = [Finding(OK, check, f"this server is a replica of {of}")]
    if status.get("Slave_IO_Running") != "Yes" or status.get("Slave_SQL_Running") != "Yes":
        why = status.get("Last_IO_Error") or status.get("Last_SQL_Error") or "stopped"
        out.append(
            Finding(
                WARNING,
                check,
                f"replication from {of} is not running ({why}): capture and chunks here see "
                "none of the primary's new changes, and a snapshot pauses after "
                "max_replica_lag_seconds. START SLAVE, or fix the error it names",
            )
        )
    if str(status.get("Using_Gtid", "No")).lower() == "no":
        out.append(
            Finding(
                WARNING,
                check,
                "it replicates by binlog file and position, not GTID: after a failover "
                "capture cannot be followed and needs airflow-cdc resync. CHANGE MASTER "
                'TO MASTER_USE_GTID = slave_pos (docs: operations, "Failover")',
            )
        )
    if strategy == "table":
        out.append(
            Finding(
                WARNING,
                check,
                "watermark_strategy 'table' writes watermark rows on this replica, which "
                "diverges it from its primary: set the connection extra "
                "watermark_strategy to 'log' (docs: connections, \"Chunks from a replica or standby\")",
            )
        )
    return out
