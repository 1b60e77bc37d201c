"""airflow-provider-cdc: DBLog-style watermark snapshots and changelog capture for Airflow + Spark."""

__version__ = "0.1.0"

DIST_NAME = "airflow-provider-cdc"

#: connection type -> (hook class, hook name) of CdcSourceHook and its subclasses
#: (hooks/cdc_source.py; named here so reading the provider info imports no hook)
_SOURCE_HOOKS = {
    "cdc": ("CdcSourceHook", "CDC source (PostgreSQL, MySQL, MariaDB)"),
    "postgres": ("CdcPostgresSourceHook", "PostgreSQL (CDC source)"),
    "mysql": ("CdcMySqlSourceHook", "MySQL/MariaDB (CDC source)"),
    "mariadb": ("CdcMariaDbSourceHook", "MariaDB (CDC source)"),
}


def types_of_other_providers() -> set[str]:
    """The connection types the other installed providers register (their entry points'
    provider info, as Airflow's ProvidersManager reads it)."""
    import importlib.metadata

    types: set[str] = set()
    for ep in importlib.metadata.entry_points(group="apache_airflow_provider"):
        if ep.dist is not None and ep.dist.name.replace("_", "-").lower() == DIST_NAME:
            continue
        try:
            info = ep.load()()
            types.update(str(t["connection-type"]) for t in info.get("connection-types") or [])
        except Exception:  # noqa: BLE001, S112 - a broken provider registers nothing (Airflow skips it too)
            continue
    return types


def connection_types() -> list[dict[str, str]]:
    """The provider's ``connection-types``: ``cdc`` always; ``postgres``, ``mysql`` and
    ``mariadb`` (so ``airflow connections test`` works for the documented URIs, with the CDC
    checks of CdcSourceHook.test_connection) unless another installed provider registers that
    type. Airflow keeps the first registration of a type, in package-name order, and
    "airflow-provider-cdc" sorts before "apache-airflow-providers-*": registering a type they
    own would take it from them."""
    taken = types_of_other_providers()
    return [
        {
            "connection-type": conn_type,
            "hook-class-name": f"airflow_provider_cdc.hooks.cdc_source.{cls}",
            "hook-name": name,
        }
        for conn_type, (cls, name) in _SOURCE_HOOKS.items()
        if conn_type == "cdc" or conn_type not in taken
    ]


def get_provider_info() -> dict:
    """Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""
    from .settings import provider_config

    return {
        "package-name": "airflow-provider-cdc",
        "name": "Change Data Capture (DBLog)",
        "description": "Watermark-based snapshots and changelog capture for PostgreSQL and MySQL/MariaDB.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "Change Data Capture (DBLog)",
                "external-doc-url": "https://arxiv.org/abs/2010.12597",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Change Data Capture (DBLog)",
                "python-modules": ["airflow_provider_cdc.hooks.cdc_source"],
            }
        ],
        "operators": [
            {
                "integration-name": "Change Data Capture (DBLog)",
                "python-modules": [
                    "airflow_provider_cdc.operators.capture",
                    "airflow_provider_cdc.operators.snapshot",
                    "airflow_provider_cdc.operators.spark_jobs",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "Change Data Capture (DBLog)",
                "python-modules": ["airflow_provider_cdc.sensors.high_watermark"],
            }
        ],
        "triggers": [
            {
                "integration-name": "Change Data Capture (DBLog)",
                "python-modules": ["airflow_provider_cdc.triggers.high_watermark"],
            }
        ],
        # ``airflow cdc status|verify`` (the same commands as the airflow-cdc console script)
        "cli": ["airflow_provider_cdc.cli.get_cli_commands"],
        # the [cdc] section of airflow.cfg: every setting, its default and description
        "config": provider_config(),
        # Our own type "cdc", and the types of the documented URIs (postgres://, mysql://,
        # mariadb://) for `airflow connections test`, each only while no other installed provider
        # (apache-airflow-providers-postgres / -mysql) registers it: that provider's hook keeps it.
        "connection-types": connection_types(),
    }
