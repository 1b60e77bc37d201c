"""Which errors of a task are the user's configuration (fail at once, without retries, with a
message naming the source, the connection and the fix) and which are transient (retried as
``retries`` say), decided in one place for every operator and sensor of the package
(docs/DESIGN.md, "What operators and consumers see").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..core.errors import CdcError, ConfigurationError, SourceError

#: how a message says it was not retried (the first words of the task's last log line)
NOT_RETRIED = "configuration error, not retried (fix it, then clear the task)"

# --- driver errors ------------------------------------------------------------------------
#: PostgreSQL SQLSTATE classes and codes of transient faults: connection (08), transaction
#: rollback (40: serialization failure, deadlock), insufficient resources (53), operator
#: intervention (57: canceled, shutting down), system error (58), lock not available and
#: object in use (55P03, 55006)
_PG_TRANSIENT_CLASSES = ("08", "40", "53", "57", "58")
_PG_TRANSIENT_CODES = {"55P03", "55006"}
#: PostgreSQL codes of the user's setup: invalid authorization (28), database does not exist
#: (3D000), insufficient privilege (42501), undefined table / schema (42P01, 3F000)
_PG_CONFIG_CLASSES = ("28",)
_PG_CONFIG_CODES = {"3D000", "42501", "42P01", "3F000"}
#: libpq's connect-time texts (a connect error has no SQLSTATE in psycopg2)
_PG_AUTH_TEXT = re.compile(
    r"password authentication failed|authentication failed for user|no password supplied|"
    r"role \"[^\"]*\" does not exist|database \"[^\"]*\" does not exist|"
    r"no pg_hba\.conf entry|is not permitted to log in|permission denied"
)
_PG_TRANSIENT_TEXT = re.compile(
    r"could not connect|connection refused|timeout expired|server closed the connection|"
    r"the database system is (starting up|shutting down|in recovery mode)|"
    r"could not receive data|could not send data|connection to server .* failed: "
    r"(?!FATAL)|too many connections|Connection timed out|No route to host",
    re.I,
)
#: MySQL/MariaDB error codes of the user's setup: access denied (1044, 1045, 1698), unknown
#: database (1049), no grant for a command, table or column (1142, 1143, 1227), missing table (1146)
_MYSQL_CONFIG = {1044, 1045, 1049, 1142, 1143, 1146, 1227, 1698}
_MYSQL_AUTH = {1044, 1045, 1698}
#: transient: can't connect (2003), gone away (2006), lost connection (2013), lock wait
#: timeout (1205), deadlock (1213), too many connections (1040), server shutdown (1053)
_MYSQL_TRANSIENT = {1040, 1053, 1205, 1213, 2002, 2003, 2006, 2013, 2055}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _driver(exc: BaseException) -> str | None:
    """ "postgres" / "mysql" when ``exc`` is an error of that database's driver."""
    mod = type(exc).__module__ or ""
    if mod.startswith("psycopg2"):
        return "postgres"
    if mod.startswith(("pymysql", "MySQLdb")):
        return "mysql"
    return None


def _mysql_code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _driver_kind(exc: BaseException) -> str | None:
    """ "auth", "config" or "transient" for a driver error (None: not one, or undecided)."""
    driver = _driver(exc)
    if driver == "postgres":
        code = getattr(exc, "pgcode", None) or ""
        text = str(exc)
        if code.startswith("28") or (not code and _PG_AUTH_TEXT.search(text) and "FATAL" in text):
            return "auth"
        if code.startswith(_PG_TRANSIENT_CLASSES) or code in _PG_TRANSIENT_CODES:
            return "transient"
        if code.startswith(_PG_CONFIG_CLASSES) or code in _PG_CONFIG_CODES:
            return "config"
        if not code and _PG_AUTH_TEXT.search(text):
            return "auth"
        if type(exc).__name__ in ("OperationalError", "InterfaceError") or _PG_TRANSIENT_TEXT.search(text):
            return "transient"
        return None
    if driver == "mysql":
        code = _mysql_code(exc)
        if code in _MYSQL_AUTH:
            return "auth"
        if code in _MYSQL_CONFIG:
            return "config"
        if code in _MYSQL_TRANSIENT or type(exc).__name__ in ("InterfaceError",):
            return "transient"
        return None
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return "transient"
    return None


def _unknown_connection(exc: BaseException) -> str | None:
    """The conn id of Airflow's "The conn_id `x` isn't defined" (None: not that error)."""
    if type(exc).__name__ != "AirflowNotFoundException":
        return None
    m = re.search(r"conn_id `([^`]*)`", str(exc))
    return m.group(1) if m else None


def _driver_text(exc: BaseException) -> str:
    """A driver error's own words, one line (pymysql: its text without the code tuple)."""
    if _driver(exc) == "mysql" and len(getattr(exc, "args", ())) >= 2:
        return str(exc.args[1])
    return " ".join(str(exc).split())


def connection_help(conn_id: str | None) -> str:
    """Where an Airflow connection is set, said once for every message that names one."""
    if not conn_id:
        return "the source's Airflow connection"
    return (
        f"Airflow connection {conn_id!r} (Admin > Connections, a secrets backend, or the environment "
        "variable "
        f"AIRFLOW_CONN_{conn_id.upper()})"
    )


def describe_user_error(
    exc: BaseException, *, conn_id: str | None = None, source: str | None = None, server: str | None = None
) -> str | None:
    """The message for a user when ``exc`` (or what it was raised from) is a configuration
    error a retry cannot fix: it names the source, the connection and what to check. None when
    the error is transient or not known to be the user's. ``server`` (a connection test: the
    server it tried, as ``PostgreSQL 'user'@host:port/db``) is named in the message, and a
    transient fault is then worded too: a test reports it, it retries nothing."""
    chain = list(_chain(exc))
    if server is None:
        # a transient fault anywhere underneath: retry, even when wrapped (a driver's, or one the
        # package marks retryable: SourceUnreachableError, a server that refused or dropped the
        # connection, worded so by its dialect; SourceBehindError)
        for e in chain:
            if _driver_kind(e) == "transient" or getattr(e, "retryable", False):
                return None
    where = f"source {source!r}: " if source else ""
    for e in chain:
        missing = _unknown_connection(e)
        if missing is not None:
            return (
                f"{where}Airflow connection {missing!r} is not defined: create it (Admin > Connections, a "
                f"secrets backend, or AIRFLOW_CONN_{missing.upper()}"
                "='postgresql://user:password@host:5432/db' "
                "/ "
                "'mysql://user:password@host:3306/db'), or set CDC_SOURCE_CONN_ID (or the source's "
                "'conn_id' in "
                "the sources config) to the connection that exists"
            )
        kind = _driver_kind(e)
        text = _driver_text(e).rstrip(".")
        # the database, not the role ('role "x" does not exist' is a login the server refused)
        no_database = re.search(r'database "[^"]*" does not exist|Unknown database', text) is not None
        if kind == "auth":
            what = "database" if no_database else "login"
            fix = (
                "that the database (the connection's schema field) exists on that server and is "
                "spelled as the "
                "server has it"
                if no_database
                else "the login, password, database (schema field) and host of that connection, and "
                "that the server "
                "lets this user in from here (PostgreSQL: pg_hba.conf; MariaDB/MySQL: the user's host part)"
            )
            return (
                f"{where}{server or 'the database'} refused the {what} of {connection_help(conn_id)}: "
                f"{text}{_stop(text)} Check {fix}"
            )
        if kind == "config" and not isinstance(exc, CdcError):
            fix = (
                "Check that the database (the connection's schema field) exists on that server"
                if no_database
                else "Grant what is missing to the connection's user, or correct the table or database "
                "it names"
            )
            on = f" on {server}" if server else ""
            return f"{where}{text} (connection {conn_id!r}{on}). {fix}"
        if kind == "transient":  # only with a server: a task retries instead
            return (
                f"connection {conn_id!r}: cannot reach {server}: {text}{_stop(text)} Check the host "
                "and port of "
                "the connection, and that the server runs and accepts connections from this host"
            )
    if isinstance(exc, (ConfigurationError, SourceError)):
        return f"{where}{exc}" if source and source not in str(exc) else str(exc)
    return None


def describe_connection_failure(exc: BaseException, conn_id: str, server: str) -> str:
    """What a failed connection test says: :func:`describe_user_error` for ``server``, and for
    an error it does not know, the error itself (a test always says why it failed)."""
    known = describe_user_error(exc, conn_id=conn_id, server=server)
    if known is not None:
        return known if f"{conn_id!r}" in known else f"connection {conn_id!r}: {known}"
    if isinstance(exc, CdcError):  # prerequisites: each problem with the statement or setting that fixes it
        return f"connection {conn_id!r}: {exc}"
    return f"connection {conn_id!r} ({server}): {type(exc).__name__}: {' '.join(str(exc).split())}"


def _stop(text: str) -> str:
    """The end of a driver's sentence before ours (``?`` ends libpq's own question)."""
    return "" if text.endswith(("?", "!")) else "."


def fail_without_retry(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an operator's or sensor's method: a configuration error (:func:`describe_user_error`)
    becomes Airflow's AirflowFailException (one attempt, whatever ``retries`` says) with the
    provider's message; every other error passes unchanged (retried as configured)."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            from airflow.sdk.exceptions import AirflowException, AirflowFailException

            if isinstance(exc, AirflowException) and not _unknown_connection(exc):
                raise  # Airflow's own control flow (skip, defer, fail, reschedule)
            hook = self.__dict__.get("hook")  # the built hook only: building it may be what failed
            conn_id = getattr(hook, "cdc_conn_id", None) or _plain(self, "cdc_conn_id")
            source = getattr(hook, "source", None) or _plain(self, "source") or conn_id
            message = describe_user_error(exc, conn_id=conn_id, source=source)
            if message is None:
                raise
            raise _not_retried(exc, AirflowFailException)(f"{NOT_RETRIED}: {message}") from exc

    wrapper.__cdc_fail_fast__ = True  # type: ignore[attr-defined]
    return wrapper


_NOT_RETRIED_CLASSES: dict[type, type] = {}


def _not_retried(exc: BaseException, fail: type) -> type:
    """AirflowFailException, also a ConfigurationError or SourceError when ``exc`` is one, so code
    that catches the package's errors (a caller of ``execute``, a test) still catches it."""
    for base in (ConfigurationError, SourceError):
        if isinstance(exc, base):
            cls = _NOT_RETRIED_CLASSES.get(base)
            if cls is None:
                cls = _NOT_RETRIED_CLASSES[base] = type(
                    f"NotRetried{base.__name__}", (fail, base), {"__module__": __name__}
                )
            return cls
    return fail


def _plain(task: Any, name: str) -> str | None:
    """The task's ``name`` (a setting read when the task runs) as text; None when it cannot be
    read now (the settings themselves may be what failed)."""
    try:
        value = getattr(task, name, None)
        return str(value) if value else None
    except Exception:  # noqa: BLE001 - a setting that cannot be read now: not named
        return None


#: the methods of an operator or sensor that run the task's work
TASK_METHODS = ("execute", "poke", "execute_complete")


def wrap_task_methods(cls: type) -> None:
    """Wrap the task methods ``cls`` defines itself (its bases' are wrapped already)."""
    for name in TASK_METHODS:
        method = cls.__dict__.get(name)
        if callable(method) and not getattr(method, "__cdc_fail_fast__", False):
            setattr(cls, name, fail_without_retry(method))
