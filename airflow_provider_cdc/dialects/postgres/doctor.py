"""``airflow-cdc doctor``'s PostgreSQL checks (Dialect.doctor_findings): the server's
settings, the role's grants, the WAL a slot may hold, and a hot standby chunks are read from.
``d`` is a PostgresDialect (dialect.py calls these). The session is read-only (doctor.py made it
so) and nothing is created."""

from __future__ import annotations

from typing import Any

from ...core.findings import ERROR, OK, WARNING, Finding
from ..base import grant_findings
from .prerequisites import prerequisite_problems


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


def findings(d: Any) -> list[Finding]:
    """Every PostgreSQL finding of ``d``'s source but its tables' (doctor.py checks those)."""
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
        if d.watermark_tables():  # a standby takes no writes
            grants.append(d.standby_watermark_problem)
        pub = d.standby_publication_problem()
        if pub:
            out.append(Finding(ERROR, "publication", pub))
    out += grant_findings(d, f"role {s.user!r}", grants, out)
    out += _pg_retention(d)
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
