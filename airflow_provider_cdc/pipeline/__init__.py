"""Pipelines without Airflow: capture, snapshot chunks, merge and apply (two engines), verify."""
