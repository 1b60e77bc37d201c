#!/usr/bin/env bash
# One-time (and cheap when repeated) set-up: virtualenv + package, private databases,
# Airflow home with SQLite metadata. Every `make` target calls it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
STAMP="$VENV/.installed-$(cat setup.cfg pyproject.toml | sha1sum | cut -c1-12)"

say() { echo "setup.sh: $*" >&2; }

if ! command -v "$PY" >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-dev >/dev/null
  else echo "setup.sh: ERROR: python3 not found; install python3 and python3-venv" >&2; exit 1; fi
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  say "creating virtualenv $VENV"
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$VENV"; "$PY" -m venv "$VENV"
    else
      echo "setup.sh: ERROR: '$PY -m venv' failed; install python3-venv" >&2; exit 1
    fi
  fi
fi
if [[ ! -f "$STAMP" ]]; then
  say "installing the package and its dependencies into $VENV (first run: ~2 min)"
  "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev]" 2>&1 | grep -v -E "^WARNING: Location|^$" || true
  "$VENV/bin/python" -c "import airflow_provider_cdc, airflow, pyspark, psycopg2, pymysql, pymysqlreplication, deltalake" \
    || { echo "setup.sh: ERROR: dependencies did not install; see pip output above" >&2; exit 1; }
  rm -f "$VENV"/.installed-*; touch "$STAMP"
fi

"$ROOT/scripts/services.sh" start >/dev/null

# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"
if [[ ! -f "$AIRFLOW_HOME/airflow.db" ]]; then
  say "airflow db migrate ($AIRFLOW_HOME)"
  mkdir -p "$AIRFLOW_HOME"
  "$VENV/bin/airflow" db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 \
    || { tail -30 "$AIRFLOW_HOME/migrate.log" >&2; echo "setup.sh: ERROR: airflow db migrate failed" >&2; exit 1; }
fi
