#!/usr/bin/env bash
# One-time (and cheap when repeated) set-up: virtualenv + package, private databases,
# Airflow home with SQLite metadata. Every `make` target calls it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
VENV="$ROOT/.venv"
# Reinstall only when the dependencies or the build system change (not for lint settings).
STAMP="$VENV/.installed-$({ cat setup.cfg; sed -n '/^\[build-system\]/,/^$/p' pyproject.toml; } | sha1sum | cut -c1-12)"

say() { echo "setup.sh: $*" >&2; }

if ! command -v "$PY" >/dev/null; then
  if [[ $(id -u) -eq 0 ]]; then apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-dev >/dev/null
  else echo "setup.sh: ERROR: python3 not found; install python3 and python3-venv" >&2; exit 1; fi
fi
if [[ ! -x "$VENV/bin/pip" ]]; then  # (a venv made without ensurepip has python but no pip)
  say "creating virtualenv $VENV"
  rm -rf "$VENV"
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
  LOG="$VENV/pip-install.log"
  { "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip \
      && "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev]"; } >"$LOG" 2>&1 \
    || { tail -40 "$LOG" >&2; echo "setup.sh: ERROR: pip install failed (log: $LOG)" >&2; exit 1; }
  "$VENV/bin/python" -c "import airflow_provider_cdc, airflow, pyspark, psycopg2, pymysql, pymysqlreplication, deltalake" \
    || { echo "setup.sh: ERROR: dependencies did not install; see pip output above" >&2; exit 1; }
  rm -f "$VENV"/.installed-*; touch "$STAMP"
fi

# The browser of the UI tests: Debian's chromium and its chromedriver (nothing is downloaded at
# test time). Missing and not root: the browser tests fail naming them.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing Debian's chromium and chromium-driver (the CDC page's browser tests)"
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null \
      || say "WARNING: chromium/chromium-driver did not install: the browser tests will fail"
  else
    say "WARNING: chromium and chromedriver are missing: sudo apt-get install chromium chromium-driver"
  fi
fi

# Databases: when they cannot start, say why loudly and go on (unit tests still run; the
# database tests skip, quoting this log) — except in CI, where they must run.
SERVICES_LOG="${CDC_LOCAL_DIR:-$ROOT/.cdc-local}/services-start.log"
mkdir -p "$(dirname "$SERVICES_LOG")"
if "$ROOT/scripts/services.sh" start 2>"$SERVICES_LOG" >/dev/null; then
  cat "$SERVICES_LOG" >&2; rm -f "$SERVICES_LOG"
else
  cat "$SERVICES_LOG" >&2
  if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    echo "setup.sh: ERROR: the databases did not start (CI: the integration tests must run)" >&2; exit 1
  fi
  printf 'setup.sh: %s\nsetup.sh: WARNING: the private databases did not start (above); tests that need them will be SKIPPED\nsetup.sh: %s\n' \
    "$(printf '!%.0s' {1..70})" "$(printf '!%.0s' {1..70})" >&2
fi

# shellcheck source=scripts/env.sh
source "$ROOT/scripts/env.sh"
# Migrate once per installed dependency set (an upgraded Airflow needs its new schema).
MIGRATED="$AIRFLOW_HOME/.migrated-${STAMP##*-}"
if [[ ! -f "$AIRFLOW_HOME/airflow.db" || ! -f "$MIGRATED" ]]; then
  say "airflow db migrate ($AIRFLOW_HOME)"
  mkdir -p "$AIRFLOW_HOME"
  "$VENV/bin/airflow" db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 \
    || { tail -30 "$AIRFLOW_HOME/migrate.log" >&2; echo "setup.sh: ERROR: airflow db migrate failed" >&2; exit 1; }
  rm -f "$AIRFLOW_HOME"/.migrated-*; touch "$MIGRATED"
fi
