"""cdc_verify: compare one table's mirror with the source named by the CDC_* environment, as a
DAG run (the CDC page's verify button triggers it; conf ``{"table": "schema.table"}``).

Built by airflow_provider_cdc.dag_builders.verify_dag; dags/cdc_sources.py builds one per
source of a sources config (``cdc_verify__<source>``).
"""

from __future__ import annotations

from airflow_provider_cdc.dag_builders import verify_dag

dag = verify_dag("cdc_verify")
