"""airflow-provider-cdc: DBLog-style watermark snapshots and changelog capture for Airflow + Spark."""

__version__ = "0.1.0"


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
            {"integration-name": "Change Data Capture (DBLog)", "python-modules": ["airflow_provider_cdc.hooks.cdc_source"]}
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
        # Our own connection type: "postgres"/"mysql" belong to the official providers,
        # and CdcSourceHook accepts those connections too (conn type -> dialect).
        "connection-types": [
            {
                "connection-type": "cdc",
                "hook-class-name": "airflow_provider_cdc.hooks.cdc_source.CdcSourceHook",
                "hook-name": "CDC source (PostgreSQL, MySQL, MariaDB)",
            }
        ],
    }
