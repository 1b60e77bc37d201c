"""Object-storage credentials from an Airflow connection (``CDC_STORAGE_CONN_ID``, fields as the
Amazon provider's ``aws`` connection), resolved where they are used and handed to the storage
layer explicitly: for a task's process, per trigger poll, or a 0600 file for a spark-submit
(docs/security.md). Nothing of it reaches XCom, a trigger's arguments or a log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.errors import ConfigurationError

_EXTRA = {
    "endpoint_url": "AWS_ENDPOINT_URL",
    "region_name": "AWS_REGION",
    "aws_session_token": "AWS_SESSION_TOKEN",
}


def storage_environment(conn_id: str) -> dict[str, str]:
    """The AWS variables that connection ``conn_id`` stands for."""
    from .connections import airflow_connection  # from the CLI also the metadata database

    conn = airflow_connection(conn_id)
    env: dict[str, str] = {}
    if conn.login:
        env["AWS_ACCESS_KEY_ID"] = conn.login
    if conn.password:
        env["AWS_SECRET_ACCESS_KEY"] = conn.password
    extra: Any = conn.extra_dejson
    if not isinstance(extra, dict):
        raise ConfigurationError(
            f"connection {conn_id!r} (CDC_STORAGE_CONN_ID): its extra must be a JSON object"
        )
    for key, var in _EXTRA.items():
        value = extra.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ConfigurationError(
                f"connection {conn_id!r} (CDC_STORAGE_CONN_ID): extra {key!r} must be a non-empty "
                f"string, got {value!r}"
            )
        env[var] = value.strip()
    return env


def storage_settings(
    conn_id: str | None = None, overrides: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The storage settings of connection ``conn_id``, or of the settings' CDC_STORAGE_CONN_ID
    (the environment with ``overrides`` on top); None when no connection is named."""
    if conn_id is None:
        from .. import settings

        conn_id = settings.load(overrides=overrides).storage_conn_id
    return storage_environment(conn_id) if conn_id else None


def apply_storage_connection(conn_id: str | None = None, overrides: Mapping[str, str] | None = None) -> None:
    """The storage connection of the settings (the environment with ``overrides`` on top), or
    ``conn_id``, for the rest of this process: a task process, the CLI. Not in the triggerer
    (storage_settings + storage.scoped_settings there). No connection: the environment's."""
    from .. import storage

    storage.use_settings(storage_settings(conn_id, overrides))


class StorageConnectionMixin:
    """For the package's operators and sensors: ``cdc_overrides`` (the ``CDC_*`` values of
    one source of the sources config, on top of the environment, for every setting the
    task reads) and the storage connection in place before ``execute``. A DAG gives
    ``cdc_overrides`` to each task, or to all of them through ``default_args``.

    :param cdc_overrides: ``CDC_*`` setting name -> value, over the environment's.
    """

    def __init__(self, *, cdc_overrides: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # type: ignore[call-arg]
        if cdc_overrides is not None and (
            not isinstance(cdc_overrides, Mapping)
            or not all(
                isinstance(k, str) and k.startswith("CDC_") and isinstance(v, str)
                for k, v in cdc_overrides.items()
            )
        ):
            raise ConfigurationError(
                f"{type(self).__name__}: cdc_overrides must map CDC_* setting names to strings, got "
                f"{cdc_overrides!r}"
            )
        self.cdc_overrides = dict(cdc_overrides or {})

    def pre_execute(self, context: Any) -> Any:
        apply_storage_connection(overrides=self.cdc_overrides)
        return super().pre_execute(context)  # type: ignore[misc]
