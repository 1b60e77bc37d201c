"""hooks/task_errors.py on the errors the real drivers and dialects raise: a refused login, an
unknown database or table and the package's own configuration errors are the user's (named,
not retried); a server that does not answer is transient (retried)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest

from airflow_provider_cdc.core.errors import ConfigurationError, SourceBehindError, SourceError
from airflow_provider_cdc.dialects import dialect_class
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.hooks.task_errors import describe_user_error


def _raised(fn) -> BaseException:
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def _dialect(uri: str):
    p = urlsplit(uri)
    scheme = "postgres" if p.scheme.startswith("postgres") else "mysql"
    params = ConnectionParams(scheme=scheme, host=p.hostname, port=p.port, user=p.username, password=p.password,
                              database=p.path.lstrip("/"))
    return dialect_class(scheme)(params, source="src", tables=["x.y"])


def test_a_refused_login_names_the_connection_and_what_to_check(mysql_uri, pg_uri):
    p = urlsplit(mysql_uri)
    wrong = urlunsplit((p.scheme, f"{p.username}:not-it@{p.hostname}:{p.port}", p.path, "", ""))
    exc = _raised(lambda: _dialect(wrong).current_position())
    text = describe_user_error(exc, conn_id="shop_db", source="shop")
    assert text is not None and "refused the login of Airflow connection 'shop_db'" in text, text
    assert "Access denied for user" in text and "Check the login, password" in text and "not-it" not in text
    q = urlsplit(pg_uri)
    nobody = urlunsplit((q.scheme, f"nobody_at_all@{q.hostname}:{q.port}", q.path, "", ""))
    exc = _raised(lambda: _dialect(nobody).current_position())
    text = describe_user_error(exc, conn_id="pg_db", source="pg")
    assert text is not None and "Airflow connection 'pg_db'" in text and "nobody_at_all" in text, text


def test_a_server_that_does_not_answer_is_transient():
    for uri in ("postgresql://postgres@127.0.0.1:1/db", "mysql://root@127.0.0.1:1/db"):
        exc = _raised(lambda uri=uri: _dialect(uri).current_position())
        assert describe_user_error(exc, conn_id="c", source="s") is None, exc


def test_package_errors_are_the_users_unless_a_transient_fault_is_underneath():
    assert "no capture scope" in describe_user_error(ConfigurationError("source 's' has no capture scope"))
    assert describe_user_error(SourceError("wal_level is replica, set it to logical")) is not None
    try:
        try:
            raise TimeoutError("timed out")
        except TimeoutError as inner:
            raise SourceError("cannot read the slot") from inner
    except SourceError as wrapped:
        assert describe_user_error(wrapped) is None
    assert describe_user_error(RuntimeError("anything else")) is None
    assert describe_user_error(SourceBehindError("the standby is 3 MB behind the snapshot's start")) is None


def test_a_server_that_refuses_or_drops_the_connection_is_unreachable_and_retried(mysql_uri, pg_uri):
    """A closed port and a session the server ends: SourceUnreachableError (the driver's error
    chained), named by host and port without the password, retried by a task, and worded as a
    connection problem by a connection test; a refused login stays the user's to fix."""
    from airflow_provider_cdc.core.errors import SourceUnreachableError
    from airflow_provider_cdc.hooks.task_errors import describe_connection_failure

    from .helpers import _free_port

    port = _free_port()
    for uri in (f"postgresql://postgres:pw-not-shown@127.0.0.1:{port}/db", f"mysql://root:pw-not-shown@127.0.0.1:{port}/db"):
        exc = _raised(lambda uri=uri: _dialect(uri).current_position())
        assert isinstance(exc, SourceUnreachableError) and exc.__cause__ is not None, repr(exc)
        assert f"127.0.0.1:{port}" in str(exc) and "pw-not-shown" not in str(exc), exc
        assert "refused or dropped the connection" in str(exc) and "'Failover'" in str(exc), exc
        assert describe_user_error(exc, conn_id="c", source="s") is None  # retried
        test = describe_connection_failure(exc, "c", f"the server at 127.0.0.1:{port}")
        assert test.startswith(f"connection 'c': cannot reach the server at 127.0.0.1:{port}"), test

    d = _dialect(pg_uri)
    try:
        pid = d.server.conn.get_backend_pid()
        with psycopg2.connect(pg_uri) as admin, admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        exc = _raised(lambda: d.server.query("SELECT 1"))
        assert isinstance(exc, SourceUnreachableError) and describe_user_error(exc, conn_id="c") is None, repr(exc)
        assert d.server.query("SELECT 1") == [(1,)]  # the next attempt reconnects
    finally:
        d.close()

    q = urlsplit(pg_uri)
    nobody = urlunsplit((q.scheme, f"nobody_at_all@{q.hostname}:{q.port}", q.path, "", ""))
    refused = _raised(lambda: _dialect(nobody).current_position())
    assert isinstance(refused, SourceError) and not isinstance(refused, SourceUnreachableError), repr(refused)
