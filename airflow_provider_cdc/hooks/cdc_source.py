"""Airflow connection -> CDC dialect.

Credentials come only from the Airflow connection (UI, secrets backend, or an
``AIRFLOW_CONN_<ID>`` environment variable such as
``AIRFLOW_CONN_CDC_SOURCE='postgresql://user:pw@host:5432/db?slot_name=cdc_slot'``).
The connection type picks the dialect; the extra JSON carries CDC settings
(``slot_name``, ``publication_name``, ``server_id``, ``watermark_schema``, ...).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from ..core.errors import CdcError, ConfigurationError
from ..core.schema import split_table_list
from ..dialects.base import ConnectionParams, Dialect

#: Airflow connection type -> dialect name (see dialects/__init__.py)
CONN_TYPE_DIALECTS: dict[str, str] = {
    "postgres": "postgres",
    "postgresql": "postgres",
    "mysql": "mysql",
    "mariadb": "mysql",
}
#: connection-extra keys that are CDC settings (dialect options), per dialect; every other
#: extra key is a driver setting (libpq's sslmode, pymysql's ssl_ca...) kept in
#: ConnectionParams.extra for the dialect's connections
_COMMON_OPTIONS = {"tables", "watermark_schema", "watermark_table", "segment_max_events", "fetch_batch_rows"}
CDC_OPTION_KEYS: dict[str, frozenset[str]] = {
    "postgres": frozenset(
        {*_COMMON_OPTIONS, "slot_name", "publication_name", "on_truncate", "read_timeout", "copy_batch_rows"}
    ),
    "mysql": frozenset({*_COMMON_OPTIONS, "server_id", "connect_timeout", "on_truncate"}),
}


def dialect_name_for(conn_type: str | None, extra: dict[str, Any] | None = None, conn_id: str = "?") -> str:
    """Map a connection type to a dialect name; the provider's own type ``cdc`` names the
    dialect in its extra (``{"dialect": "postgres"}``) so it never shadows the official
    postgres/mysql providers' connection types."""
    ct = (conn_type or "").lower().replace("-", "_")
    if ct == CdcSourceHook.conn_type:
        ct = str((extra or {}).get("dialect", "")).lower()
        if ct not in CONN_TYPE_DIALECTS:
            raise ConfigurationError(
                f"connection {conn_id!r} has type 'cdc' but its extra 'dialect' is {ct or 'missing'!r}; "
                f'set extra {{"dialect": ...}} to one of: {", ".join(sorted(CONN_TYPE_DIALECTS))}'
            )
    try:
        return CONN_TYPE_DIALECTS[ct]
    except KeyError:
        raise ConfigurationError(
            f"connection {conn_id!r} has type {conn_type!r}, which is not a CDC source; "
            f"known types: {', '.join(sorted([*CONN_TYPE_DIALECTS, CdcSourceHook.conn_type]))}"
        ) from None


class CdcSourceHook(BaseHook):
    """The source database of a CDC pipeline (PostgreSQL or MySQL/MariaDB).

    Built lazily: nothing connects until :meth:`get_dialect` or :meth:`test_connection`.
    ``source`` names the staging folder of this source; it defaults to the connection id.
    """

    conn_name_attr = "cdc_conn_id"
    default_conn_name = "cdc_source"
    conn_type = "cdc"
    hook_name = "CDC source (PostgreSQL, MySQL, MariaDB)"

    def __init__(
        self, cdc_conn_id: str = default_conn_name, *, source: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.cdc_conn_id = cdc_conn_id
        self.source = source or cdc_conn_id

    @cached_property
    def connection(self):
        return self.get_connection(self.cdc_conn_id)

    def _split_extra(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        conn = self.connection
        extra = dict(conn.extra_dejson or {})
        name = dialect_name_for(conn.conn_type, extra, self.cdc_conn_id)
        keys = CDC_OPTION_KEYS[name]
        options = {k: v for k, v in extra.items() if k in keys}
        if "tables" in options:  # a list, or "s.a,s.b" from a URI query string, or a JSON list
            options["tables"] = split_table_list(options["tables"], f"connection {self.cdc_conn_id!r} extra 'tables'")
        driver = {k: v for k, v in extra.items() if k not in keys and k != "dialect"}
        return name, options, driver

    def connection_params(self) -> ConnectionParams:
        """Host, port, credentials and driver settings; CDC settings are dialect options."""
        conn = self.connection
        name, _options, driver = self._split_extra()
        return ConnectionParams(
            scheme=name,
            host=conn.host or "127.0.0.1",
            port=int(conn.port) if conn.port else None,
            user=conn.login or None,
            password=conn.password or None,
            database=conn.schema or None,
            extra=driver,
        )

    def dialect_options(self) -> dict[str, Any]:
        """CDC settings from the connection extra (slot_name, server_id, watermark_schema...)."""
        return self._split_extra()[1]

    def get_dialect(self, source: str | None = None, **options: Any) -> Dialect:
        """A new dialect for this connection (the caller closes it, e.g. ``with hook.get_dialect() as d``).
        ``options`` override the connection's CDC settings."""
        from ..dialects import dialect_class

        params = self.connection_params()
        kwargs = {**self.dialect_options(), **options}
        return dialect_class(params.scheme)(params, source=source or self.source, **kwargs)

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's "Test" button / ``airflow connections test``: checks the CDC prerequisites
        (wal_level, binlog format, privileges...) and says what is missing."""
        try:
            with self.get_dialect() as dialect:
                dialect.check_prerequisites()
        except CdcError as exc:
            return False, str(exc)
        except Exception as exc:  # noqa: BLE001 - a driver error is reported, not raised, by contract
            return False, f"{type(exc).__name__}: {exc}"
        return True, f"connection {self.cdc_conn_id!r} is ready for CDC"
