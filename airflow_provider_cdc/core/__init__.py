"""Pure core of airflow-provider-cdc.

Imports nothing from Airflow, Spark or a database driver (tests/unit/core/test_purity.py
proves it). Everything else moves data in and out of these types.
"""
