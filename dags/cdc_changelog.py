"""cdc_changelog: capture the changelog of the source named by the CDC_* environment to
staging, then apply it to the sinks.

The DAG and its documentation (schedules, backfills, settings) are built by
airflow_provider_cdc.dag_builders.changelog_dag; dags/cdc_sources.py builds one per source
of a sources config.
"""

from __future__ import annotations

from airflow_provider_cdc.dag_builders import changelog_dag

dag = changelog_dag("cdc_changelog")
