"""``airflow-cdc doctor``'s MariaDB/MySQL checks (Dialect.doctor_findings): the server's binlog
settings, the user's grants, and a server that is itself a replica. ``d`` is a MySqlDialect
(dialect.py calls these). The session is read-only (doctor.py made it so) and nothing is
created."""

from __future__ import annotations

from typing import Any

from ...core.findings import ERROR, OK, WARNING, Finding
from ..base import grant_findings
from .prerequisites import REQUIRED_SETTINGS, ReplicaStatusDenied, prerequisite_problems


def findings(d: Any) -> list[Finding]:
    """Every MariaDB/MySQL finding of ``d``'s source but its tables' (doctor.py checks those)."""
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
    out += grant_findings(d, f"user {d.params.user!r}", d.privilege_problems(grants), out)
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
        out += _mysql_replica(d, status)
    return out


def existing_tables(d: Any, tables: list) -> dict:
    """Which of ``tables`` exist as base tables (one query per call)."""
    schemas = sorted({t.schema for t in tables})
    present = {
        (str(a), str(b))
        for a, b in d._query(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = "  # noqa: S608
            "'BASE TABLE' AND TABLE_SCHEMA IN (" + ", ".join(["%s"] * len(schemas)) + ")",
            schemas,
        )
    }
    return {t: (t.schema, t.name) in present for t in tables}


def _mysql_replica(d: Any, status: dict) -> list[Finding]:
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
    if d.watermark_tables():  # watermark strategy 'table'
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
