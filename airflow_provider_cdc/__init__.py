"""airflow-provider-cdc: DBLog-style watermark snapshots and changelog capture for Airflow + Spark."""

__version__ = "0.1.0"


def get_provider_info() -> dict:
    """Provider metadata read by Airflow's ProvidersManager (entry point ``apache_airflow_provider``)."""
    return {
        "package-name": "airflow-provider-cdc",
        "name": "Change Data Capture (DBLog)",
        "description": "Watermark-based snapshots and changelog capture for PostgreSQL and MySQL/MariaDB.",
        "versions": [__version__],
    }
