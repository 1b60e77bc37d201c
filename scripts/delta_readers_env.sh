#!/usr/bin/env bash
# The virtualenvs the consumer tests read Delta mirrors with (tools/delta_read.py): independent
# Delta readers from the package registry, kept out of the project's virtualenv so their pins
# (pyarrow, polars) never meet Spark's or Airflow's.
#   delta-readers-venv: deltalake 1.x (delta-rs), polars 2.x (read_delta goes through deltalake),
#                       duckdb 1.4.4 with its delta extension shipped as a wheel
#                       (duckdb-ext-delta: `INSTALL delta` would download, which cannot work here).
#   delta-old-venv:     deltalake 1.0.2, a reader without the deletionVectors table feature; it
#                       must refuse a mirror rather than show masked rows.
# Idempotent: a changed pin (the marker file differs) reinstalls. Prints the two interpreters'
# paths, the current readers' first, as the last two lines of stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${CDC_LOCAL_DIR:-$ROOT/.cdc-local}"
NEW_VENV="$BASE/delta-readers-venv"
OLD_VENV="$BASE/delta-old-venv"
NEW_PINS=("deltalake>=1.4.2,<2" "polars>=2,<3" "duckdb==1.4.4" "duckdb-ext-delta==1.4.4.20260205" "pyarrow")
OLD_PINS=("deltalake==1.0.2" "pyarrow")

# ensure VENV IMPORTS PIN...: (re)builds VENV unless it imports IMPORTS and its marker matches PINS.
ensure() {
  local venv="$1" imports="$2"; shift 2
  local marker="$*"
  if ! "$venv/bin/python" -c "import $imports" 2>/dev/null \
     || [ "$(cat "$venv/.delta-readers-version" 2>/dev/null)" != "$marker" ]; then
    echo "delta_readers_env.sh: installing $marker into $venv (first run: ~1 min)" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" >&2
    echo "$marker" > "$venv/.delta-readers-version"
  fi
}

mkdir -p "$BASE"
# one builder at a time (see flink_env.sh: `make test` starts this script early in the background)
exec 9>"$BASE/delta-readers.lock"
flock 9
ensure "$NEW_VENV" "deltalake, polars, duckdb, duckdb_ext, pyarrow" "${NEW_PINS[@]}"
ensure "$OLD_VENV" "deltalake, pyarrow" "${OLD_PINS[@]}"
echo "$NEW_VENV/bin/python"
echo "$OLD_VENV/bin/python"
