"""Reading an Airflow connection. In a task (or a DAG file's parse, or the triggerer), Airflow's
own lookup answers, through its API server for a connection kept in the metadata database. The
package's CLI (``airflow-cdc``, ``airflow cdc``) runs outside any of those, where that lookup
sees only environment variables and secrets backends: there a connection made in the UI or with
``airflow connections add`` is read from the metadata database, as ``airflow connections get``
does (:func:`read_metadata_database`, switched on by the CLI only, so a DAG file's parse never
loads Airflow's database models).
"""

from __future__ import annotations

import sys
from typing import Any

_FROM_METADATA_DATABASE = False


def read_metadata_database(on: bool = True) -> None:
    """Let :func:`airflow_connection` fall back to the metadata database (the CLI's processes)."""
    global _FROM_METADATA_DATABASE
    _FROM_METADATA_DATABASE = on


def _supervised() -> bool:
    """Whether Airflow's supervisor runs this process (a task, a parse, the triggerer): its
    connections come through the API server."""
    return hasattr(sys.modules.get("airflow.sdk.execution_time.task_runner"), "SUPERVISOR_COMMS")


def airflow_connection(conn_id: str) -> Any:
    """The connection ``conn_id``: Airflow's lookup, then (the CLI, unsupervised) the metadata
    database. Not found anywhere: Airflow's own AirflowNotFoundException."""
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:
        if type(exc).__name__ != "AirflowNotFoundException" or not _FROM_METADATA_DATABASE or _supervised():
            raise
        try:
            from airflow.models.connection import Connection  # the metadata database's
        except ImportError:  # an install without Airflow's core (the task SDK only)
            raise exc from None
        try:
            return Connection.get_connection_from_secrets(conn_id)
        except Exception as again:
            if type(again).__name__ == "AirflowNotFoundException":
                raise exc from None
            raise
