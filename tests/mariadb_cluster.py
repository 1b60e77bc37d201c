"""A private MariaDB primary and GTID replica that a test may promote: started on free ports in
a folder of their own (``mariadb-install-db``, then ``mariadbd --no-defaults`` as
scripts/services.sh starts its servers), and removed afterwards. (services.sh's servers are
shared by the whole run and never promoted.)"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def mariadbd() -> str | None:
    return shutil.which("mariadbd") or next(
        (p for p in ("/usr/sbin/mariadbd", "/usr/libexec/mariadbd") if Path(p).exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(ok, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.1)


@dataclass
class Server:
    data: Path
    port: int
    server_id: int
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/cdc_test"

    def start(self, *, replica: bool = False) -> None:
        user = "root" if os.getuid() == 0 else os.environ.get("USER", "")
        if not (self.data / "mysql").exists():
            install = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
            subprocess.run([install, "--no-defaults", f"--datadir={self.data}", f"--user={user}",
                            "--auth-root-authentication-method=normal", "--skip-test-db"],
                           check=True, capture_output=True, text=True, timeout=180)
        args = [mariadbd(), "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
                "--bind-address=127.0.0.1", f"--socket={self.data}/mariadb.sock",
                f"--pid-file={self.data}/mariadbd.pid", f"--log-error={self.data}.err",
                f"--log-bin={self.data}/binlog", "--binlog-format=ROW", "--binlog-row-image=FULL",
                "--binlog-row-metadata=FULL", f"--server-id={self.server_id}", "--log-slave-updates=ON",
                f"--user={user}", "--innodb-flush-log-at-trx-commit=2", "--sync-binlog=0",
                "--innodb-buffer-pool-size=32M", "--skip-name-resolve",
                "--default-time-zone=+00:00", "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_unicode_ci"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        wait(self._up, f"MariaDB on port {self.port} accepts connections (log: {self.data}.err)")

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"mariadbd exited ({self.proc.returncode}): {self.data}.err")
        try:
            self.sql("SELECT 1", database=None)
        except Exception:  # noqa: BLE001 - not up yet
            return False
        return True

    def connect(self, database: str | None = "cdc_test"):
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="", database=database,
                               autocommit=True, connect_timeout=5, charset="utf8mb4")

    def sql(self, query: str, params: tuple = (), *, database: str | None = "cdc_test") -> list[tuple]:
        conn = self.connect(database)
        try:
            with conn.cursor() as cur:
                cur.execute(query, params)
                return list(cur.fetchall())
        finally:
            conn.close()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM): the binlog is complete."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Cluster:
    """A MariaDB primary (server_id 1) and a replica (server_id 2) replicating with
    ``MASTER_USE_GTID=slave_pos`` and ``--log-slave-updates`` (a binlog of its own, numbered
    independently), each with its own data folder and free port."""

    def __init__(self) -> None:
        if mariadbd() is None:
            raise RuntimeError("mariadbd not found: apt-get install mariadb-server")
        self.root = Path(tempfile.mkdtemp(prefix="cdc-failover-mariadb-", dir="/var/tmp"))
        self.primary = Server(self.root / "primary", _free_port(), 1)
        self.replica = Server(self.root / "replica", _free_port(), 2)

    def start(self) -> Cluster:
        self.primary.start()
        # the primary's binlog is a few files further on than the replica's: positions read on the
        # replica once promoted (binlog.000001...) would sort before the primary's without an epoch
        for _ in range(3):
            self.primary.sql("FLUSH BINARY LOGS", database=None)
        self.primary.sql("CREATE DATABASE cdc_test", database=None)
        self.replica.start()
        self.replica.sql(f"CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={self.primary.port}, "
                         "MASTER_USER='root', MASTER_USE_GTID=slave_pos", database=None)
        self.replica.sql("START SLAVE", database=None)
        self.wait_replica()
        return self

    def wait_replica(self, timeout: float = 60) -> None:
        """The replica has applied everything the primary logged so far."""
        pos = self.primary.sql("SELECT @@gtid_binlog_pos", database=None)[0][0]
        got = self.replica.sql("SELECT MASTER_GTID_WAIT(%s, %s)", (pos, timeout), database=None)[0][0]
        assert got == 0, f"the replica did not reach {pos} in {timeout} s"

    def promote(self) -> None:
        """A switchover: the primary stops cleanly, the replica applies what it received and
        becomes a primary (``STOP SLAVE; RESET SLAVE ALL``)."""
        pos = self.primary.sql("SELECT @@gtid_binlog_pos", database=None)[0][0]
        self.primary.stop()
        got = self.replica.sql("SELECT MASTER_GTID_WAIT(%s, 60)", (pos,), database=None)[0][0]
        assert got == 0, f"the replica did not apply up to {pos}"
        self.replica.sql("STOP SLAVE", database=None)
        self.replica.sql("RESET SLAVE ALL", database=None)

    def remove(self) -> None:
        for srv in (self.replica, self.primary):
            if srv.proc is not None and srv.proc.poll() is None:
                srv.proc.kill()
                srv.proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)
