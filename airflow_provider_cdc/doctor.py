"""``airflow-cdc doctor``: check a source before its first run and say what to fix, one line per
finding (``error``, ``warning``, ``ok``). The checks are the dialects' own, so doctor says what the
first run would say, all at once; its session is read-only and it creates nothing.
"""

from __future__ import annotations

from typing import Any

from .core.findings import ERROR, OK, WARNING, Finding

__all__ = ["ERROR", "OK", "WARNING", "Finding", "check_source", "has_errors"]


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
        dialect.begin_read_only()  # whatever a check runs; the first statement connects
    except Exception as exc:  # noqa: BLE001 - unreachable, refused login, unknown connection: said, not raised
        return [Finding(ERROR, "connection", _user_error(exc, conn_id))]
    p, server = dialect.params, dialect.server_label()
    found = [Finding(OK, "connection", f"{where} reaches {server} at {p.host}:{p.port} as {p.user!r}")]
    try:
        found += dialect.doctor_findings()
        tables, scope = _scope(dialect)
        found += scope
        if tables:
            found += _table_findings(dialect, tables, dialect.existing_tables(tables))
    except Exception as exc:  # noqa: BLE001 - a check that could not run is an error of its own, not a traceback
        found.append(Finding(ERROR, "check", f"a check could not run: {_user_error(exc, conn_id)}"))
    return found


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
