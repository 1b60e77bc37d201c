"""Smoke tests of the real changelogs, independent of our dialects.

They prove what everything else stands on: the private servers really log row changes
(PostgreSQL: wal_level=logical, read through a logical slot; MariaDB: ROW binlog with
full row metadata, read with pymysqlreplication), transactions come out in commit order
(not in the order their statements ran), and a one-row watermark table's UPDATE is
visible in the log with its value — the signal the DBLog snapshot relies on.

The writes are interleaved on three connections: statements of the transactions overlap
and they commit in an order different from the order they began.
"""

from __future__ import annotations

import random
import re
import uuid
from urllib.parse import urlsplit

# Writes of one scenario, per connection: (connection index, action, argument).
# T0 begins first but commits last; T1 (low watermark) commits first; T2 (high
# watermark) begins after T0's first row and commits between T1 and T0.
LW = "lw-" + uuid.uuid4().hex
HW = "hw-" + uuid.uuid4().hex
STEPS = [
    (0, "row", (1, "a")),
    (1, "wm", LW),
    (0, "row", (2, "b")),
    (2, "row", (3, "c")),
    (1, "commit", None),
    (2, "wm", HW),
    (0, "row", (4, "d")),
    (2, "commit", None),
    (0, "commit", None),
]
# What the changelog must show, transaction by transaction, in commit order.
EXPECTED = [
    [("wm", LW)],
    [("row", (3, "c")), ("wm", HW)],
    [("row", (1, "a")), ("row", (2, "b")), ("row", (4, "d"))],
]


def _run_steps(conns, write_row, write_wm, commit):
    for idx, action, arg in STEPS:
        if action == "row":
            write_row(conns[idx], *arg)
        elif action == "wm":
            write_wm(conns[idx], arg)
        else:
            commit(conns[idx])


# --------------------------------------------------------------------------- PostgreSQL

_TD_LINE = re.compile(r"^table (?P<table>\S+): (?P<op>INSERT|UPDATE|DELETE): (?P<cols>.*)$")
_TD_COL = re.compile(r"(\w+)\[[^\]]+\]:('(?:[^']|'')*'|\S+)")


def _td_columns(text: str) -> dict[str, str]:
    out = {}
    for name, value in _TD_COL.findall(text):
        out[name] = value[1:-1].replace("''", "'") if value.startswith("'") else value
    return out


def test_postgres_logical_slot_reads_interleaved_transactions_in_commit_order(pg_uri, unique_name):
    import psycopg2

    table, wm_table, slot = f"smoke_{unique_name}", f"smoke_wm_{unique_name}", f"smoke_{unique_name}"
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    cur = admin.cursor()
    conns = []
    try:
        cur.execute(f'CREATE TABLE "{table}" (id integer PRIMARY KEY, v text NOT NULL)')
        cur.execute(f'CREATE TABLE "{wm_table}" (id integer PRIMARY KEY, value text NOT NULL)')
        cur.execute(f"INSERT INTO \"{wm_table}\" VALUES (1, 'init')")
        # The slot sees only what commits after its creation.
        cur.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
        conns = [psycopg2.connect(pg_uri) for _ in range(3)]

        def write_row(c, key, v):
            c.cursor().execute(f'INSERT INTO "{table}" (id, v) VALUES (%s, %s)', (key, v))

        def write_wm(c, value):
            c.cursor().execute(f'UPDATE "{wm_table}" SET value = %s WHERE id = 1', (value,))

        _run_steps(conns, write_row, write_wm, lambda c: c.commit())

        cur.execute(
            "SELECT lsn::text, xid::text, data FROM pg_logical_slot_get_changes(%s, NULL, NULL, "
            "'include-xids', '1', 'skip-empty-xacts', '1')",
            (slot,),
        )
        changes = cur.fetchall()
    finally:
        for c in conns:
            c.close()
        cur.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )
        cur.execute(f'DROP TABLE IF EXISTS "{table}", "{wm_table}"')
        admin.close()

    # Group into transactions, keeping only our two tables (other tests write to this
    # database at the same time and their changes are in the slot too).
    txns, current, commit_lsns = [], None, []
    for lsn, _xid, data in changes:
        if data.startswith("BEGIN"):
            current = []
        elif data.startswith("COMMIT"):
            if current:
                txns.append(current)
                commit_lsns.append(lsn)
            current = None
        elif data.startswith((f"table public.{table}:", f"table public.{wm_table}:")):
            # (other tests' changes, TRUNCATEs and logical messages are skipped)
            m = _TD_LINE.match(data)
            assert m, f"unexpected test_decoding line: {data!r}"
            cols = _td_columns(m["cols"])
            if m["table"] == f"public.{table}":
                assert m["op"] == "INSERT"
                current.append(("row", (int(cols["id"]), cols["v"])))
            elif m["table"] == f"public.{wm_table}":
                assert m["op"] == "UPDATE"
                current.append(("wm", cols["value"]))
    assert txns == EXPECTED
    # Commit LSNs grow in the order the transactions committed.
    lsn_values = [int(h, 16) << 32 | int(lo, 16) for h, lo in (s.split("/") for s in commit_lsns)]
    assert lsn_values == sorted(lsn_values) and len(set(lsn_values)) == len(lsn_values)


# --------------------------------------------------------------------------- MariaDB


def _mysql_settings(uri: str) -> dict:
    p = urlsplit(uri)
    return {
        "host": p.hostname,
        "port": p.port or 3306,
        "user": p.username or "root",
        "passwd": p.password or "",
    }


def test_mariadb_row_binlog_reads_interleaved_transactions_in_commit_order(mysql_uri, unique_name):
    import pymysql
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import XidEvent
    from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

    settings = _mysql_settings(mysql_uri)
    db = urlsplit(mysql_uri).path.lstrip("/") or "cdc_test"
    table, wm_table = f"smoke_{unique_name}", f"smoke_wm_{unique_name}"
    connect = dict(
        host=settings["host"], port=settings["port"], user=settings["user"], password=settings["passwd"]
    )
    admin = pymysql.connect(database=db, autocommit=True, **connect)
    conns = []
    stream = None
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE TABLE `{table}` (id INT PRIMARY KEY, v VARCHAR(20) NOT NULL) ENGINE=InnoDB")
            cur.execute(
                f"CREATE TABLE `{wm_table}` (id INT PRIMARY KEY, value VARCHAR(64) NOT NULL) ENGINE=InnoDB"
            )
            cur.execute(f"INSERT INTO `{wm_table}` VALUES (1, 'init')")
            cur.execute("SHOW MASTER STATUS")
            log_file, log_pos = cur.fetchone()[:2]
        conns = [pymysql.connect(database=db, autocommit=False, **connect) for _ in range(3)]

        def write_row(c, key, v):
            c.cursor().execute(f"INSERT INTO `{table}` (id, v) VALUES (%s, %s)", (key, v))

        def write_wm(c, value):
            c.cursor().execute(f"UPDATE `{wm_table}` SET value = %s WHERE id = 1", (value,))

        for c in conns:
            c.begin()
        _run_steps(conns, write_row, write_wm, lambda c: c.commit())

        # A server id no other reader of this server uses (the server drops a replica
        # connection when a second one registers with the same id).
        stream = BinLogStreamReader(
            connection_settings=settings,
            server_id=random.randint(100_000, 2**31 - 1),
            blocking=False,
            resume_stream=True,
            log_file=log_file,
            log_pos=log_pos,
            only_events=[WriteRowsEvent, UpdateRowsEvent, XidEvent],
        )
        txns, current, positions = [], [], []
        for event in stream:
            if isinstance(event, XidEvent):
                if current:
                    txns.append(current)
                    positions.append((stream.log_file, stream.log_pos))
                current = []
                continue
            if event.schema != db or event.table not in (table, wm_table):
                continue
            for row in event.rows:
                if event.table == table:
                    assert isinstance(event, WriteRowsEvent)
                    current.append(("row", (row["values"]["id"], row["values"]["v"])))
                else:
                    assert isinstance(event, UpdateRowsEvent)
                    assert row["before_values"]["id"] == 1
                    current.append(("wm", row["after_values"]["value"]))
    finally:
        if stream is not None:
            stream.close()
        for c in conns:
            c.close()
        with admin.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS `{table}`, `{wm_table}`")
        admin.close()

    assert txns == EXPECTED
    # Binlog positions of the commits grow in commit order.
    assert positions == sorted(positions, key=lambda p: (int(p[0].rsplit(".", 1)[1]), p[1]))
