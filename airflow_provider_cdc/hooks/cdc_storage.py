"""Object-storage credentials from an Airflow connection (``CDC_STORAGE_CONN_ID``).

storage/ takes S3 settings from the standard AWS environment variables and imports no
Airflow. When the settings name a connection instead, the glue reads it when a task
starts and exports it as those variables in the task's process, so the storage layer,
deltalake and every spark-submit the task starts (they inherit the environment) use it.
The fields follow the Amazon provider's ``aws`` connection: login = access key id,
password = secret access key, extra ``endpoint_url``, ``region_name``,
``aws_session_token``. Nothing of it is written to XCom, a trigger's arguments or a log.
"""

from __future__ import annotations

import os
from typing import Any

from ..core.errors import ConfigurationError

_EXTRA = {"endpoint_url": "AWS_ENDPOINT_URL", "region_name": "AWS_REGION", "aws_session_token": "AWS_SESSION_TOKEN"}


def storage_environment(conn_id: str) -> dict[str, str]:
    """The AWS variables that connection ``conn_id`` stands for."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    env: dict[str, str] = {}
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
    if conn.password:
        env["AWS_SECRET_ACCESS_KEY"] = conn.password
    extra: Any = conn.extra_dejson
    if not isinstance(extra, dict):
        raise ConfigurationError(f"connection {conn_id!r} (CDC_STORAGE_CONN_ID): its extra must be a JSON object")
    for key, var in _EXTRA.items():
        value = extra.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ConfigurationError(
                f"connection {conn_id!r} (CDC_STORAGE_CONN_ID): extra {key!r} must be a non-empty string, got {value!r}"
            )
        env[var] = value.strip()
    return env


def apply_storage_connection(conn_id: str | None = None) -> None:
    """Export the storage connection of the settings (or ``conn_id``) to this process."""
    if conn_id is None:
        from .. import settings

        conn_id = settings.load().storage_conn_id
    if conn_id:
        os.environ.update(storage_environment(conn_id))


class StorageConnectionMixin:
    """For operators and sensors: the storage connection is in place before ``execute``."""

    def pre_execute(self, context: Any) -> Any:
        apply_storage_connection()
        return super().pre_execute(context)  # type: ignore[misc]
