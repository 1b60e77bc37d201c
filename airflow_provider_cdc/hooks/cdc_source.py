"""Airflow connection -> CDC dialect.

Credentials come only from the Airflow connection (UI, secrets backend, or an
``AIRFLOW_CONN_<ID>`` environment variable such as
``AIRFLOW_CONN_CDC_SOURCE='postgresql://user:pw@host:5432/db?slot_name=cdc_slot'``).
The connection type picks the dialect; the extra JSON carries CDC settings
(``slot_name``, ``publication_name``, ``server_id``, ``watermark_schema``, ...).

The capture scope (which tables) is not among them: it has one owner, the ``tables``
setting (``CDC_TABLES``, a source's ``tables`` in the sources config), so the DAG author
who picks the tables and the admin who keeps the connection cannot disagree; the hook
hands it to the dialect. A connection extra ``tables`` is refused, saying where it goes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from ..core.errors import ConfigurationError
from ..dialects.registry import all_system_catalogs, get_profile, profiles
from ..settings import FromSettings
from ..settings import load as load_settings
from .cdc_storage import StorageConnectionMixin

if TYPE_CHECKING:  # the dialects import pyarrow: not when a DAG file that names this hook is parsed
    from ..dialects.base import ConnectionParams, Dialect

#: Airflow connection type -> dialect name (each database's profile lists its types: dialects/registry.py)
CONN_TYPE_DIALECTS: dict[str, str] = {t: p.name for p in profiles() for t in p.conn_types}
#: extra keys that are settings of the DAGs, not of the connection: refused with where they go
_SCOPE_KEYS = {
    "tables": "CDC_TABLES (or the 'tables' of the source in the sources config)",
    "all_tables": "CDC_CAPTURE_ALL_TABLES",
    "key_columns": "CDC_KEY_COLUMNS (or the 'key_columns' of the source in the sources config)",
}
#: connection-extra keys that are CDC settings (dialect options), per dialect (its profile's); every
#: other extra key is a driver setting (libpq's sslmode, pymysql's ssl_ca...) kept in
#: ConnectionParams.extra for the dialect's connections
CDC_OPTION_KEYS: dict[str, frozenset[str]] = {p.name: p.cdc_option_keys for p in profiles()}


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

    :param cdc_conn_id: the Airflow connection of the source database.
    :param source: the name of the source's staging folder; default the connection id.
    :param tables: the capture scope (``schema.table`` ids); default CDC_TABLES.
    :param all_tables: capture every table (opt-in); default CDC_CAPTURE_ALL_TABLES.
    :param key_columns: table id -> the key columns of a table without a primary key;
        default CDC_KEY_COLUMNS.
    """

    conn_name_attr = "cdc_conn_id"
    default_conn_name = "cdc_source"
    conn_type = "cdc"
    hook_name = "CDC source (PostgreSQL, MySQL, MariaDB)"

    def __init__(
        self,
        cdc_conn_id: str = default_conn_name,
        *,
        source: str | None = None,
        tables: Sequence[str] | None = None,
        all_tables: bool | None = None,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.cdc_conn_id = cdc_conn_id
        self.source = source or cdc_conn_id
        # the capture scope; None: the settings' when a dialect is made (operators pass the
        # settings of their source, sources config included)
        self.tables = None if tables is None else tuple(tables)
        self.all_tables = all_tables
        self.key_columns = None if key_columns is None else dict(key_columns)

    @classmethod
    def for_settings(
        cls, settings: Any, cdc_conn_id: str | None = None, source: str | None = None
    ) -> CdcSourceHook:
        """The hook of a source as its settings (settings.Settings) describe it, scope included."""
        return cls(
            cdc_conn_id or settings.conn_id,
            source=source or None,
            tables=settings.tables,
            all_tables=settings.capture_all_tables,
            key_columns=settings.key_columns,
        )

    def scope_options(self) -> dict[str, Any]:
        """The dialect options of the capture scope: ``tables``, ``all_tables`` and the
        ``key_columns`` of its tables without a primary key."""
        tables, all_tables, keys = self.tables, self.all_tables, self.key_columns
        if tables is None or all_tables is None or keys is None:
            from .. import settings

            now = settings.load()
            tables = now.tables if tables is None else tables
            all_tables = now.capture_all_tables if all_tables is None else all_tables
            keys = now.key_columns if keys is None else keys
        return {"tables": list(tables) or None, "all_tables": bool(all_tables), "key_columns": dict(keys)}

    @cached_property
    def connection(self):
        return self.get_connection(self.cdc_conn_id)

    @classmethod
    def get_connection(cls, conn_id: str) -> Any:
        """The Airflow connection ``conn_id`` (hooks/connections.py: from the package's CLI also
        one kept in the metadata database)."""
        from .connections import airflow_connection

        return airflow_connection(conn_id)

    def _split_extra(self, conn: Any = None) -> tuple[str, dict[str, Any], dict[str, Any]]:
        conn = conn or self.connection
        extra = dict(conn.extra_dejson or {})
        name = dialect_name_for(conn.conn_type, extra, self.cdc_conn_id)
        keys = CDC_OPTION_KEYS[name]
        for key, setting in _SCOPE_KEYS.items():
            if key in extra:
                raise ConfigurationError(
                    f"connection {self.cdc_conn_id!r} has extra {key!r}, which is not a connection "
                    "setting: the tables "
                    f"a source captures are set in one place, {setting}. Move it there and remove it "
                    "from the "
                    "connection"
                )
        options = {k: v for k, v in extra.items() if k in keys}
        driver = {k: v for k, v in extra.items() if k not in keys and k != "dialect"}
        return name, options, driver

    def connection_params(self, conn_id: str | None = None) -> ConnectionParams:
        """Host, port, credentials and driver settings (of this hook's connection, or of
        ``conn_id``, a standby's); CDC settings are dialect options."""
        from ..dialects.base import ConnectionParams

        conn = self.connection if conn_id is None else self.get_connection(conn_id)
        name, _options, driver = self._split_extra(conn)
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
        kwargs = {**self.dialect_options(), **self.scope_options(), **options}
        chunk_conn_id = kwargs.pop("chunk_conn_id", None)
        if chunk_conn_id:  # chunks read from a hot standby (its own Airflow connection)
            kwargs["read_params"] = self.connection_params(str(chunk_conn_id))
        return dialect_class(params.scheme)(params, source=source or self.source, **kwargs)

    def capture_scope(self):
        """The source's capture scope (core/scope.py, I15), with its server's catalogs and
        watermark table when the connection can be read here (nothing connects); else the
        scope of the settings, which refuses every server's catalogs and the default
        watermark table."""
        from ..core.scope import CaptureScope

        try:
            return self.get_dialect().capture_scope()
        except Exception:  # noqa: BLE001 - no readable connection: the settings' scope, stricter
            opts = self.scope_options()
            return CaptureScope.of(
                self.source, opts["tables"], catalogs=all_system_catalogs(), all_tables=opts["all_tables"]
            )

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's "Test" button and ``airflow connections test <conn_id>``: logs in and checks
        the CDC prerequisites (``wal_level``, binlog format, privileges...). Returns ``(ok,
        message)``; the message names the connection id and, on failure, what to fix (login and
        password, host and port, database, a server setting or grant); on success it warns when
        nothing bounds the WAL a replication slot may hold (PostgreSQL's default
        ``max_slot_wal_keep_size = -1``). It never contains the password.

        Airflow tests connections only when ``[core] test_connection = Enabled``
        (``AIRFLOW__CORE__TEST_CONNECTION=Enabled``); its default, ``Disabled``, refuses every test
        in the CLI, the API and the UI.

        Which hook tests a connection is picked by its type. Type ``cdc`` (extra ``{"dialect":
        "postgres"}`` or ``"mysql"``) is always this hook. The types of the documented URIs,
        ``postgres`` (``postgresql://`` / ``postgres://``), ``mysql`` and ``mariadb``, are tested by
        this hook too when no other installed provider (apache-airflow-providers-postgres or
        -mysql) registers that type; when one does, its own hook tests them (a login only) and
        the CDC checks are run by a ``cdc`` connection or ``airflow cdc`` commands."""
        conn_id = self.cdc_conn_id
        try:
            conn = self.connection
        except Exception as exc:  # noqa: BLE001 - reported, not raised, by contract
            if type(exc).__name__ == "AirflowNotFoundException":
                return False, (
                    f"connection {conn_id!r} is not defined: create it (Admin > Connections, a secrets "
                    f"backend, or AIRFLOW_CONN_{conn_id.upper()})"
                )
            return False, _without(
                f"connection {conn_id!r} could not be read: {type(exc).__name__}: {exc}", None
            )
        password = conn.password or None
        try:
            params = self.connection_params()
        except Exception as exc:  # noqa: BLE001 - a wrong type or extra: its message says what to set
            return False, _without(f"connection {conn_id!r}: {exc}", password)
        where = _where(params)
        try:
            with self.get_dialect() as dialect:
                dialect.check_prerequisites()
                warning = _retention_warning(dialect)
        except Exception as exc:  # noqa: BLE001 - a driver error is reported, not raised, by contract
            from .task_errors import describe_connection_failure

            return False, _without(describe_connection_failure(exc, conn_id, where), password)
        return True, f"connection {conn_id!r} ({where}) is ready for CDC" + (
            f"; WARNING: {warning}" if warning else ""
        )


def _retention_warning(dialect: Dialect) -> str:
    """What a connection test warns about beside success: nothing bounds the WAL a replication
    slot may hold (PostgreSQL's default ``max_slot_wal_keep_size = -1``; "" otherwise)."""
    try:
        limit = dialect.wal_keep_limit_mb()  # None: no slot holds this database's log
        unbounded = limit is not None and limit < 0
    except Exception:  # noqa: BLE001 - a warning that cannot be read is not a failed test
        return ""
    return dialect.unbounded_wal_warning() if unbounded else ""


def _where(params: ConnectionParams) -> str:
    """``PostgreSQL 'user'@host:port/database`` of a connection (no password)."""
    profile = get_profile(params.scheme)
    engine, port = profile.label, params.port or profile.default_port
    user = f"{params.user!r}@" if params.user else ""
    return f"{engine} {user}{params.host}:{port}/{params.database or ''}"


def _without(text: str, password: str | None) -> str:
    """``text`` as shown (row values dropped, through Airflow's masker) and never with ``password``."""
    from ..error_text import safe_error_text

    text = safe_error_text(text)
    return text.replace(password, "***") if password else text


class CdcPostgresSourceHook(CdcSourceHook):
    """:class:`CdcSourceHook` for connection type ``postgres`` (URIs ``postgresql://`` and
    ``postgres://``), registered only when no other installed provider registers that type
    (:func:`airflow_provider_cdc.get_provider_info`), so ``airflow connections test`` works
    for the documented URIs without apache-airflow-providers-postgres."""

    conn_type = "postgres"
    hook_name = "PostgreSQL (CDC source)"


class CdcMySqlSourceHook(CdcSourceHook):
    """:class:`CdcSourceHook` for connection type ``mysql`` (URI ``mysql://``), registered only
    when no other installed provider (apache-airflow-providers-mysql) registers that type."""

    conn_type = "mysql"
    hook_name = "MySQL/MariaDB (CDC source)"


class CdcMariaDbSourceHook(CdcSourceHook):
    """:class:`CdcSourceHook` for connection type ``mariadb`` (URI ``mariadb://``), registered
    only when no other installed provider registers that type."""

    conn_type = "mariadb"
    hook_name = "MariaDB (CDC source)"


class CdcSourceMixin(StorageConnectionMixin):
    """The source parameters of every task of the package, declared once: ``data_dir``,
    ``cdc_conn_id`` and ``source`` (not given, None: the setting read when the task runs,
    CDC_DATA_DIR, CDC_SOURCE_CONN_ID, CDC_SOURCE, with ``cdc_overrides`` on top) and the
    source's :attr:`hook`. Put it before the Airflow base class. A mapped operator's class
    names these keywords in its own ``__init__`` as well: ``partial()`` checks keywords against
    the signatures of BaseOperator subclasses only. Configuration errors of its tasks are not
    retried (:mod:`.task_errors`).

    :param data_dir: the root of staging and outputs (a path or URI); default CDC_DATA_DIR.
    :param cdc_conn_id: the source's Airflow connection; default CDC_SOURCE_CONN_ID.
    :param source: the source's name (its staging folder); default CDC_SOURCE, else the connection id.
    :param cdc_overrides: ``CDC_*`` settings of this source over the environment's (sources config).
    """

    data_dir = FromSettings("data_dir")
    cdc_conn_id = FromSettings("conn_id")
    source = FromSettings("explicit_source")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every operator and sensor of the package fails at once, without retries, on a
        configuration error (a missing scope, an unknown connection, a refused login, a missing
        grant, ``wal_level``...) and says what to fix; transient faults are retried (task_errors.py)."""
        super().__init_subclass__(**kwargs)
        from .task_errors import wrap_task_methods

        wrap_task_methods(cls)

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        cdc_conn_id: str | None = None,
        source: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.data_dir = data_dir
        self.cdc_conn_id = cdc_conn_id
        self.source = source

    @cached_property
    def hook(self) -> CdcSourceHook:
        now = load_settings(overrides=getattr(self, "cdc_overrides", None))
        return CdcSourceHook.for_settings(now, self.cdc_conn_id, self.source)
