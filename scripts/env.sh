# Environment for tests, the demo and benchmarks; sourced by the Makefile recipes.
_CDC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_CDC_ROOT/.venv/bin:$PATH"
export PYSPARK_PYTHON="$_CDC_ROOT/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$_CDC_ROOT/.venv/bin/python"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$_CDC_ROOT/.cdc-local/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$_CDC_ROOT/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__UNIT_TEST_MODE=False
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__LOGGING__LOGGING_LEVEL="${AIRFLOW__LOGGING__LOGGING_LEVEL:-INFO}"
export AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}'
export SPARK_LOCAL_IP=127.0.0.1
export CDC_DATA_DIR="${CDC_DATA_DIR:-$_CDC_ROOT/.cdc-local/data}"
eval "$("$_CDC_ROOT/scripts/services.sh" env)"
export CDC_TEST_PG_URI CDC_TEST_MYSQL_URI CDC_TEST_PG_STANDBY_URI CDC_TEST_MYSQL_REPLICA_URI CDC_TEST_PG18_URI \
  CDC_TEST_PG16_URI CDC_TEST_PG16_STANDBY_URI CDC_TEST_PG17_URI CDC_TEST_PG17_STANDBY_URI
