"""cdc_snapshot: DBLog watermark snapshot of the source named by the CDC_* environment.

The DAG and its documentation (trigger confs, tasks, settings) are built by
airflow_provider_cdc.dag_builders.snapshot_dag; dags/cdc_sources.py builds one per source of
a sources config.
"""

from __future__ import annotations

from airflow_provider_cdc.dag_builders import snapshot_dag

dag = snapshot_dag("cdc_snapshot")
