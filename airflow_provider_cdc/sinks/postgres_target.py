"""The 'postgres' sink's target (CDC_POSTGRES_SINK_CONN_ID, CDC_POSTGRES_SINK_SCHEMA): its libpq
parameters resolved in the worker, handed to a spark-submit without the password (a libpq
passfile of mode 0600 in the job's private folder), and read back by the job. The options the
sink registry hands the sink (sinks/registry.py, SinkOptions); no Airflow here: the glue gives
``setting(name)`` and ``connection(conn_id)``."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ..core.errors import ConfigurationError

#: libpq parameters that are secrets: never shipped to executors, never on a command line
SECRET_PARAMETERS = ("password", "sslpassword")


def connection_parameters(conn: str | Mapping[str, object]) -> dict[str, str]:
    """libpq parameters of a URI, a ``key=value`` string or a mapping (empty values left out)."""
    if isinstance(conn, str):
        from psycopg2.extensions import parse_dsn

        try:
            conn = parse_dsn(conn)
        except Exception as exc:  # noqa: BLE001 - psycopg2's ProgrammingError: said without the text
            raise ConfigurationError(
                f"the 'postgres' sink's connection string cannot be parsed ({type(exc).__name__})"
            ) from None
    return {str(k): str(v) for k, v in conn.items() if v is not None and str(v) != ""}


def public_dsn(params: Mapping[str, str]) -> str:
    """``params`` as a libpq ``key=value`` string, refusing secrets: for a command line."""
    secret = sorted(k for k in params if k in SECRET_PARAMETERS)
    if secret:
        raise ConfigurationError(
            f"the 'postgres' sink's connection for the command line carries {', '.join(secret)}: a "
            "command line is "
            "visible to every user of the host (ps). Give the password in a passfile (libpq's passfile "
            "parameter or "
            "PGPASSFILE) or PGPASSWORD; the operators do this for CDC_POSTGRES_SINK_CONN_ID"
        )

    def quoted(v: str) -> str:
        return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{k}={quoted(v)}" for k, v in params.items())


def passfile_line(password: str) -> str:
    """A libpq passfile line for any host, port, database and user: the file is named only by
    this job's one connection (its ``passfile`` parameter), so the wildcards match nothing else."""
    return "*:*:*:*:" + password.replace("\\", "\\\\").replace(":", "\\:") + "\n"


def write_private(path: str, text: str) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def resolve(setting: Callable[[str], object], connection: Callable[[str], dict]) -> dict:
    """The options from the task's settings: ``pg_uri`` (the connection's libpq parameters, the
    password included: for this process only) and ``pg_schema``."""
    conn_id = setting("postgres_sink_conn_id")
    if not conn_id:
        raise ConfigurationError(
            "sink 'postgres' (CDC_SINKS) has no target database: set CDC_POSTGRES_SINK_CONN_ID to the id "
            "of an Airflow connection of type postgres"
        )
    return {"pg_uri": connection(str(conn_id)), "pg_schema": setting("postgres_sink_schema")}


def to_job(options: Mapping[str, object], folder: str) -> list[str]:
    """The job arguments of the options: ``--pg-uri`` without secrets, the password in a passfile
    in ``folder`` (private, removed when the job ends) that its ``passfile`` parameter names."""
    pg = dict(options.get("pg_uri") or {})
    if not pg:
        return []
    if pg.get("sslpassword"):
        raise ConfigurationError(
            "CDC_POSTGRES_SINK_CONN_ID: an sslpassword cannot be handed to a spark-submit without showing "
            "it; use a key file without a passphrase (mode 0600) or run the job in the worker "
            "(CDC_LOCAL_MAX_ROWS)"
        )
    if pg.get("password"):
        pg["passfile"] = write_private(os.path.join(folder, "pgpass"), passfile_line(pg["password"]))
    args = ["--pg-uri", public_dsn({k: v for k, v in pg.items() if k not in SECRET_PARAMETERS})]
    if options.get("pg_schema"):
        args += ["--pg-schema", str(options["pg_schema"])]
    return args


def add_job_arguments(parser) -> None:
    parser.add_argument(
        "--pg-uri",
        default=None,
        help="target PostgreSQL of the 'postgres' sink: a libpq URI or key=value string WITHOUT a "
        "password (refused: a command line is public); libpq reads it from its passfile",
    )
    parser.add_argument(
        "--pg-schema", default=None, help="target schema of the 'postgres' sink (default cdc_{source})"
    )


def from_job(args) -> dict:
    """The options a job was given (a --pg-uri with a password is refused)."""
    if args.pg_uri:
        public_dsn(connection_parameters(args.pg_uri))  # raises on a password
    return {"pg_uri": args.pg_uri, "pg_schema": args.pg_schema}
