#!/usr/bin/env bash
# The PyFlink virtualenv the consumer tests read Debezium exports with (tools/flink_consume.py).
# Its own virtualenv: PyFlink pins py4j, pandas and pyarrow to versions the project's Spark and
# Airflow do not take. Idempotent; prints the interpreter's path. Needs Java 11+ (Spark's).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CDC_LOCAL_DIR:-$ROOT/.cdc-local}/flink-venv"
FLINK_VERSION="${CDC_FLINK_VERSION:-2.3.0}"
# one builder at a time: `make test` starts this script early in the background (scripts/run_tests.py)
# and the consumer tests call it again; the second waits for the first, then finds the venv built
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if ! "$VENV/bin/python" -c "import pyflink, sys; sys.exit(0)" 2>/dev/null \
   || [ "$(cat "$VENV/.flink-version" 2>/dev/null)" != "$FLINK_VERSION" ]; then
  echo "flink_env.sh: installing apache-flink==$FLINK_VERSION into $VENV (first run: ~2 min, ~1 GB)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "apache-flink==$FLINK_VERSION" >&2
  echo "$FLINK_VERSION" > "$VENV/.flink-version"
fi
echo "$VENV/bin/python"
