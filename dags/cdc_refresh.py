"""cdc_refresh: refresh the tables of CDC_REFRESH_TABLES whole (tables without a key included),
for the source named by the CDC_* environment. Built only when that setting names a table.

Built by airflow_provider_cdc.dag_builders.refresh_dag; dags/cdc_sources.py builds one per
source of a sources config that names refresh tables (``cdc_refresh__<source>``).
"""

from __future__ import annotations

from airflow_provider_cdc import settings
from airflow_provider_cdc.dag_builders import refresh_dag

if settings.load().refresh_tables:
    dag = refresh_dag("cdc_refresh")
