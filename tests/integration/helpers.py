"""Helpers shared by integration (and e2e) test modules: least-privilege set-ups, Debezium
schema checks, a paused standby replay, a Spark standalone's ports, failover writers, a
log-retention handle. Test modules import from here, never from each other."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import threading
import time
from contextlib import closing
from pathlib import Path
from urllib.parse import urlsplit

import psycopg2
import pymysql

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect


def _connect(uri: str, *, autocommit: bool):
    import psycopg2

    c = psycopg2.connect(uri)
    c.autocommit = autocommit
    return c


def wait_replayed(standby, primary_uri: str, timeout: float = 120) -> None:
    """Until ``standby`` (a connection) replayed all the primary wrote so far; ``timeout`` beyond
    max_standby_streaming_delay (30 s): the other test session's reads there may hold replay."""
    primary = _connect(primary_uri, autocommit=True)
    try:
        with primary.cursor() as c:
            c.execute("SELECT pg_current_wal_insert_lsn()::text")
            target = c.fetchone()[0]
    finally:
        primary.close()
    deadline = time.monotonic() + timeout
    with standby.cursor() as c:
        while True:
            c.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))
            if c.fetchone()[0]:
                return
            assert time.monotonic() < deadline, f"the standby did not replay up to {target} in {timeout:.0f} s"
            time.sleep(0.01)


@contextlib.contextmanager
def _replay_paused(standby_uri: str, primary_uri: str | None = None):
    """WAL replay paused on the standby for the block (resumed whatever happens). With
    ``primary_uri``: once the standby replayed all the primary wrote so far (a table the test
    just created is there), waited for as long as a recovery conflict may hold replay
    (max_standby_streaming_delay, 30 s) and more: the other test session reads there too."""
    standby = _connect(standby_uri, autocommit=True)
    try:
        if primary_uri is not None:
            wait_replayed(standby, primary_uri)
        standby.cursor().execute("SELECT pg_wal_replay_pause()")
        yield standby
    finally:
        standby.cursor().execute("SELECT pg_wal_replay_resume()")
        standby.close()


# --------------------------------------------------------------------------- PostgreSQL
def pg_setup2_admin(role: str, tables: list[str], wm: str, publication: str) -> list[str]:
    """Set-up 2 on PostgreSQL: what an administrator runs (docs/connections.md "Grants")."""
    return [
        f"CREATE ROLE {role} LOGIN REPLICATION",
        "CREATE SCHEMA IF NOT EXISTS cdc",
        f"CREATE TABLE {wm} (id integer PRIMARY KEY CHECK (id = 1), value text NOT NULL, "
        "updated_at timestamptz NOT NULL DEFAULT now())",
        f"INSERT INTO {wm} (id, value) VALUES (1, '')",
        f"CREATE PUBLICATION {publication} FOR TABLE {', '.join(tables)}, {wm} WITH (publish_via_partition_root = true)",
        f"GRANT USAGE ON SCHEMA public, cdc TO {role}",
        f"GRANT SELECT ON {', '.join(tables)} TO {role}",
        f"GRANT SELECT, UPDATE ON {wm} TO {role}",
    ]


def pg_setup1_admin(role: str, database: str, tables: list[str]) -> list[str]:
    """Set-up 1 on PostgreSQL: the provider creates schema, watermark table and publication.
    PostgreSQL lets only a table's owner publish it, so the role owns the captured tables."""
    return [
        f"CREATE ROLE {role} LOGIN REPLICATION",
        f"GRANT CREATE ON DATABASE {database} TO {role}",
        f"GRANT USAGE ON SCHEMA public TO {role}",
        *(f"ALTER TABLE {t} OWNER TO {role}" for t in tables),
    ]


def pg_run(uri: str, *statements: str) -> list:
    with closing(psycopg2.connect(uri)) as c:
        c.autocommit = True
        cur = c.cursor()
        out = []
        for sql in statements:
            cur.execute(sql)
            out = cur.fetchall() if cur.description else []
        return out


def my_run(conn, *statements: str) -> None:
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)


def my_setup(user: str, table: str, wm: str, *, provider_creates: bool) -> list[str]:
    """docs/connections.md "Grants" on MariaDB: set-up 1 lets the provider create the watermark table in
    its database (`cdc`); in set-up 2 an administrator made it and the user only writes its row."""
    common = [
        f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'",
        f"GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'%'",
        f"GRANT SELECT ON {table} TO '{user}'@'%'",
    ]
    if provider_creates:
        return [*common, f"GRANT CREATE, INSERT, SELECT, UPDATE ON `cdc`.* TO '{user}'@'%'"]
    return [
        "CREATE DATABASE IF NOT EXISTS `cdc`",
        f"CREATE TABLE {wm} (`id` TINYINT UNSIGNED NOT NULL PRIMARY KEY, `value` VARCHAR(64) NOT NULL) ENGINE=InnoDB",
        f"INSERT INTO {wm} (`id`, `value`) VALUES (1, '')",
        *common,
        f"GRANT SELECT, UPDATE ON {wm} TO '{user}'@'%'",
    ]


def node(type_: str, field: str, *, optional: bool = True, name: str | None = None, version: int | None = None,
         parameters: dict | None = None, **extra) -> dict:
    """A JsonConverter schema node in its key order (type, fields/items, optional, name, version,
    doc, parameters, field)."""
    out = {"type": type_, **{k: v for k, v in extra.items() if k in ("fields", "items")}, "optional": optional}
    if name:
        out["name"] = name
    if version is not None:
        out["version"] = version
    if "doc" in extra:
        out["doc"] = extra["doc"]
    if parameters:
        out["parameters"] = parameters
    out["field"] = field
    return out


def decimal(field: str, p: int, s: int) -> dict:
    return node("bytes", field, name="org.apache.kafka.connect.data.Decimal", version=1,
                parameters={"scale": str(s), "connect.decimal.precision": str(p)})


# --- PostgreSQL ---------------------------------------------------------------------------------
# (column, SQL type, SQL literal of row 1, Debezium schema node, Debezium value of row 1)
PG_COLUMNS = [
    ("i2", "smallint", "-32768", node("int16", "i2"), -32768),
    ("i8", "bigint", "9223372036854775807", node("int64", "i8"), 9223372036854775807),
    ("f4", "real", "1.5", node("float", "f4"), 1.5),
    ("f8", "double precision", "0.1", node("double", "f8"), 0.1),
    ("f8n", "double precision", "'NaN'", node("double", "f8n"), "NaN"),
    ("num", "numeric(10,2)", "12.34", decimal("num", 10, 2), "BNI="),  # unscaled 1234 = 04 D2
    ("numneg", "numeric(10,2)", "-12.34", decimal("numneg", 10, 2), "+y4="),  # -1234 = FB 2E
    ("numfree", "numeric", "12.3400",
     node("struct", "numfree", name="io.debezium.data.VariableScaleDecimal", version=1, doc="Variable scaled decimal",
          fields=[{"type": "int32", "optional": False, "field": "scale"},
                  {"type": "bytes", "optional": False, "field": "value"}]),
     {"scale": 2, "value": "BNI="}),  # trailing zeros stripped
    ("b", "boolean", "true", node("boolean", "b"), True),
    ("t", "text", "'héllo \"q\"'", node("string", "t"), 'héllo "q"'),
    ("vc", "varchar(10)", "'abc'", node("string", "vc"), "abc"),
    ("nm", "name", "'pg_name'", node("string", "nm"), "pg_name"),
    ("o", "oid", "4294967295", node("int64", "o"), 4294967295),
    ("dom", "{domain}", "7", node("int32", "dom"), 7),  # a domain: its base type
    ("ch", "char(5)", "'ab'", node("string", "ch"), "ab   "),  # PostgreSQL's blank padding kept
    ("by", "bytea", "'\\xdeadbeef'::bytea", node("bytes", "by"), "3q2+7w=="),
    ("d", "date", "'2024-01-15'", node("int32", "d", name="io.debezium.time.Date", version=1), 19737),
    ("tm", "time", "'13:51:30.123456'", node("int64", "tm", name="io.debezium.time.MicroTime", version=1),
     49890123456),
    ("tm3", "time(3)", "'13:51:30.123'", node("int32", "tm3", name="io.debezium.time.Time", version=1), 49890123),
    ("ts", "timestamp", "'2024-01-15 10:30:00.123456'",
     node("int64", "ts", name="io.debezium.time.MicroTimestamp", version=1), 1705314600123456),
    ("ts3", "timestamp(3)", "'2024-01-15 10:30:00.123'",
     node("int64", "ts3", name="io.debezium.time.Timestamp", version=1), 1705314600123),
    ("tsinf", "timestamp", "'infinity'",
     node("int64", "tsinf", name="io.debezium.time.MicroTimestamp", version=1), 9223372036825200000),
    ("tstz", "timestamptz", "'2024-01-15 10:30:00+00'",
     node("string", "tstz", name="io.debezium.time.ZonedTimestamp", version=1), "2024-01-15T10:30:00.000000Z"),
    ("tstz3", "timestamptz(3)", "'2024-01-15 12:30:00.5+02'",
     node("string", "tstz3", name="io.debezium.time.ZonedTimestamp", version=1), "2024-01-15T10:30:00.500Z"),
    ("tstz0", "timestamptz(0)", "'2024-01-15 10:30:00+00'",
     node("string", "tstz0", name="io.debezium.time.ZonedTimestamp", version=1), "2024-01-15T10:30:00Z"),
    ("ttz", "timetz", "'11:51:30.123789+02'",
     node("string", "ttz", name="io.debezium.time.ZonedTime", version=1), "09:51:30.123789Z"),
    ("iv", "interval", "'1 mon 2 days 03:04:05.5'",
     node("int64", "iv", name="io.debezium.time.MicroDuration", version=1), 2813645500000),  # a month: 30.4375 days
    ("u", "uuid", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", node("string", "u", name="io.debezium.data.Uuid", version=1),
     "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("j", "json", "'{\"a\": 1}'", node("string", "j", name="io.debezium.data.Json", version=1), '{"a": 1}'),
    ("jb", "jsonb", "'{\"a\":1}'", node("string", "jb", name="io.debezium.data.Json", version=1), '{"a": 1}'),
    ("x", "xml", "'<a>1</a>'", node("string", "x", name="io.debezium.data.Xml", version=1), "<a>1</a>"),
    ("ip", "inet", "'192.168.0.1/24'", node("string", "ip"), "192.168.0.1/24"),
    ("mac", "macaddr", "'08:00:2b:01:02:03'", node("string", "mac"), "08:00:2b:01:02:03"),
    ("net", "cidr", "'10.0.0.0/8'", node("string", "net"), "10.0.0.0/8"),
    ("mac8", "macaddr8", "'08:00:2b:01:02:03:04:05'", node("string", "mac8"), "08:00:2b:01:02:03:04:05"),
    ("vb", "varbit(5)", "B'10'",
     node("bytes", "vb", name="io.debezium.data.Bits", version=1, parameters={"length": "5"}), "Ag=="),
    ("bt", "bit(3)", "B'101'", node("bytes", "bt", name="io.debezium.data.Bits", version=1, parameters={"length": "3"}),
     "BQ=="),  # little-endian bytes of 0b101
    ("b1", "bit(1)", "B'1'", node("boolean", "b1"), True),
    ("ai", "integer[]", "'{1,2,NULL}'", node("array", "ai", items={"type": "int32", "optional": True}), [1, 2, None]),
    ("at", "text[]", "ARRAY['a', 'b c']", node("array", "at", items={"type": "string", "optional": True}), ["a", "b c"]),
    ("mood", "{enum}", "'happy'",
     node("string", "mood", name="io.debezium.data.Enum", version=1, parameters={"allowed": "happy,sad"}), "happy"),
    ("n", "text", "NULL", node("string", "n"), None),
]


_JSON_TYPES = {"int8": int, "int16": int, "int32": int, "int64": int, "float": (int, float), "double": (int, float),
               "boolean": bool, "string": str, "bytes": str}


_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def conforms(schema: dict, value, path: str = "") -> list[str]:
    """What Kafka Connect's JsonConverter (and Flink's NOT NULL enforcer) would reject in
    ``value`` under ``schema``: a null in a required field, a value of the wrong JSON type, an
    integer out of its type's range, a struct with other fields than its schema's."""
    where = path or "<root>"
    if value is None:
        return [] if schema.get("optional") else [f"{where}: null in a required field"]
    t = schema["type"]
    if t == "struct":
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} for a struct"]
        names = [f["field"] for f in schema["fields"]]
        bad = [f"{where}: fields {sorted(value)} != schema's {sorted(names)}"] if sorted(value) != sorted(names) else []
        return bad + [e for f in schema["fields"] for e in conforms(f, value.get(f["field"]), f"{path}.{f['field']}")]
    if t == "array":
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__} for an array"]
        return [e for i, v in enumerate(value) for e in conforms(schema["items"], v, f"{path}[{i}]")]
    if t in ("float", "double") and value in ("NaN", "Infinity", "-Infinity"):
        return []  # Jackson's quoted non-numeric numbers, as JsonConverter writes them
    if not isinstance(value, _JSON_TYPES[t]) or (t != "boolean" and isinstance(value, bool)):
        return [f"{where}: {value!r} is not a {t}"]
    if t in _INT_BITS and not -(1 << (_INT_BITS[t] - 1)) <= value < 1 << (_INT_BITS[t] - 1):
        return [f"{where}: {value} out of range for {t}"]
    return []


def assert_conforms(doc: dict | None) -> None:
    """A JsonConverter document (schema and payload) valid against its own schema."""
    if doc is not None:
        errors = conforms(doc["schema"], doc["payload"])
        assert errors == [], errors


# --- MariaDB --------------------------------------------------------------------------------------
MY_COLUMNS = [
    ("ti", "TINYINT", "-128", node("int8", "ti"), -128),
    ("bo", "BOOLEAN", "1", node("int8", "bo"), 1),  # TINYINT(1): int8 unless Debezium saw the DDL while streaming
    ("tu", "TINYINT UNSIGNED", "255", node("int16", "tu"), 255),
    ("si", "SMALLINT", "-32768", node("int16", "si"), -32768),
    ("su", "SMALLINT UNSIGNED", "65535", node("int32", "su"), 65535),
    ("mi", "MEDIUMINT", "-8388608", node("int32", "mi"), -8388608),
    ("i", "INT", "2147483647", node("int32", "i"), 2147483647),
    ("iu", "INT UNSIGNED", "4294967295", node("int64", "iu"), 4294967295),
    ("bi", "BIGINT", "-9223372036854775808", node("int64", "bi"), -9223372036854775808),
    ("bu", "BIGINT UNSIGNED", "18446744073709551615", node("int64", "bu"), -1),  # long mode wraps
    ("f", "FLOAT", "1.5", node("float", "f"), 1.5),
    ("dbl", "DOUBLE", "0.1", node("double", "dbl"), 0.1),
    ("dec", "DECIMAL(10,2)", "12.34", decimal("dec", 10, 2), "BNI="),
    ("c", "CHAR(3)", "'ab'", node("string", "c"), "ab"),
    ("vc", "VARCHAR(10)", "'héllo'", node("string", "vc"), "héllo"),
    ("tx", "TEXT", "'long text'", node("string", "tx"), "long text"),
    ("mt", "MEDIUMTEXT", "'medium'", node("string", "mt"), "medium"),
    ("bn", "BINARY(2)", "x'0102'", node("bytes", "bn"), "AQI="),
    ("bl", "BLOB", "x'00ff'", node("bytes", "bl"), "AP8="),
    ("vb", "VARBINARY(4)", "x'deadbeef'", node("bytes", "vb"), "3q2+7w=="),
    ("d", "DATE", "'2024-01-15'", node("int32", "d", name="io.debezium.time.Date", version=1), 19737),
    ("zd", "DATE", "'0000-00-00'", node("int32", "zd", name="io.debezium.time.Date", version=1), None),  # zero date
    ("tm", "TIME(6)", "'-838:59:59'", node("int64", "tm", name="io.debezium.time.MicroTime", version=1), -3020399000000),
    ("tm0", "TIME", "'838:59:59'", node("int64", "tm0", name="io.debezium.time.MicroTime", version=1), 3020399000000),
    ("dt", "DATETIME", "'2018-06-20 06:37:03'", node("int64", "dt", name="io.debezium.time.Timestamp", version=1),
     1529476623000),
    ("dt3", "DATETIME(3)", "'2024-01-15 10:30:00.123'",
     node("int64", "dt3", name="io.debezium.time.Timestamp", version=1), 1705314600123),
    ("dt6", "DATETIME(6)", "'2024-01-15 10:30:00.123456'",
     node("int64", "dt6", name="io.debezium.time.MicroTimestamp", version=1), 1705314600123456),
    ("ts", "TIMESTAMP NULL", "'2018-06-20 13:37:03'",
     node("string", "ts", name="io.debezium.time.ZonedTimestamp", version=1), "2018-06-20T13:37:03Z"),
    ("ts6", "TIMESTAMP(6) NULL", "'2024-01-15 10:30:00.5'",
     node("string", "ts6", name="io.debezium.time.ZonedTimestamp", version=1), "2024-01-15T10:30:00.500000Z"),
    ("y", "YEAR", "2024", node("int32", "y", name="io.debezium.time.Year", version=1), 2024),
    ("e", "ENUM('small','large')", "'large'",
     node("string", "e", name="io.debezium.data.Enum", version=1, parameters={"allowed": "small,large"}), "large"),
    ("st", "SET('x','y','z')", "'z,x'",
     node("string", "st", name="io.debezium.data.EnumSet", version=1, parameters={"allowed": "x,y,z"}), "x,z"),
    ("b1", "BIT(1)", "b'1'", node("boolean", "b1"), True),
    ("b10", "BIT(10)", "b'1000000001'",
     node("bytes", "b10", name="io.debezium.data.Bits", version=1, parameters={"length": "10"}), "AQI="),  # 513 LE
    ("j", "JSON", "'{\"a\": 1}'", node("string", "j"), '{"a": 1}'),  # MariaDB's JSON is LONGTEXT: a string
    ("n", "TEXT", "NULL", node("string", "n"), None),
]


def _my_conn(uri: str):

    u = urlsplit(uri)
    return pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username or "root", password=u.password or "",
                           database=u.path.lstrip("/"), autocommit=True, init_command="SET time_zone = '+00:00'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[1]} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"{proc.args[1]} did not log {text!r} within {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


ROWS = 400


class Writers:
    """Writers on the current primary throughout; a failover's connection errors are retried
    against whichever server is the primary then, as an application's pool does."""

    def __init__(self, uri: str, threads: int = 2) -> None:
        self.uri = uri
        self.stop = threading.Event()
        self.committed = 0
        self.threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in range(threads)]

    def _run(self, seed: int) -> None:
        import psycopg2

        rnd = random.Random(seed)
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = psycopg2.connect(self.uri, connect_timeout=2)
                with conn.cursor() as cur:
                    k = rnd.randint(1, ROWS + 50)
                    op = rnd.random()
                    if op < 0.6:
                        cur.execute("UPDATE orders SET v = %s, n = n + 1 WHERE id = %s", (f"u{seed}-{rnd.random()}", k))
                    elif op < 0.8:
                        cur.execute("DELETE FROM orders WHERE id = %s", (k,))
                    else:
                        cur.execute("INSERT INTO orders VALUES (%s, %s, %s) ON CONFLICT (id) DO UPDATE SET v = 'ins'",
                                    (k, f"i{seed}", k))
                conn.commit()
                self.committed += 1
                time.sleep(0.002)
            except psycopg2.Error:
                # the primary went away (or a read-only standby answered): reconnect to self.uri
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
        if conn is not None:
            conn.close()

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


class Handle:
    """What run_capture needs of a source (the hook's part), without Airflow."""

    def __init__(self, uri: str, source: str, tables: list[TableName], own_watermark_table: bool = True) -> None:
        self.uri, self.source, self.tables = uri, source, tables
        self.own_watermark_table = own_watermark_table  # False: the default watermark table

    def connection_params(self) -> ConnectionParams:
        return ConnectionParams.from_uri(self.uri)

    def get_dialect(self):
        own = {"watermark_table": f"wm_{self.source}"} if self.own_watermark_table else {}
        return get_dialect(self.connection_params(), source=self.source, tables=self.tables, **own)


def write_mirror_equal_to_source(uri: str, table: TableName, source: str, data_dir: str) -> int:
    """Write ``source``'s mirror of ``table`` equal to the table as it is now (its rows as a
    snapshot's ``r`` events, through the real sink code), for tests of verify; returns the rows."""
    import pyarrow as pa

    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.core.ranges import FULL_RANGE
    from airflow_provider_cdc.core.schema import encode_key, encode_row
    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
    from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
    from airflow_provider_cdc.storage.layout import schema_path

    with get_dialect(ConnectionParams.from_uri(uri), source=source) as dialect:
        schema = dialect.describe_table(table)
        p = Path(schema_path(data_dir, source, table))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(schema.to_json())
        sql, params = dialect.chunk_query(schema, FULL_RANGE, after_key=None, limit=None)
        rows = [dialect.row_to_canonical(schema, raw) for batch in dialect.stream_query(sql, params) for raw in batch]
    n = len(rows)
    events = pa.table(
        {
            "position": [Position(100).encode()] * n,
            "table": [table.id] * n,
            "op": ["r"] * n,
            "key": [encode_key(schema.key_values(r)) for r in rows],
            "before": [None] * n,
            "after": [encode_row(r) for r in rows],
            "ts_ms": [0] * n,
            "watermark": ["hw-test"] * n,
            "origin": [None] * n,
            "snapshot": [True] * n,
            "batch": ["r-test"] * n,
        },
        schema=EVENT_SCHEMA,
    )
    MirrorDeltaSink(data_dir, source, require_schema=True).write(events)
    return n


@contextlib.contextmanager
def standalone_spark(folder: Path, env: dict, workers: list[tuple[int, str]]):
    """A Spark standalone master and ``workers`` ((cores, memory) each) from the pyspark package on
    127.0.0.1; yields the master's URL as its log says it (Spark moves to the next port when the one
    asked for was taken meanwhile). Every daemon is stopped on the way out."""
    import re
    import shutil

    spark_class = shutil.which("spark-class")
    assert spark_class, "spark-class is not on PATH: run `source scripts/env.sh` (pyspark's bin/ from the venv)"
    env = dict(env, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1")
    procs: list[subprocess.Popen] = []
    try:
        log = folder / "master.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(_free_port()), "--webui-port", str(_free_port())],
                stdout=out, stderr=subprocess.STDOUT, env=env))
        _wait_for(log, "I have been elected leader", procs[0])
        found = re.search(r"Starting Spark master at (spark://\S+)", log.read_text(errors="replace"))
        assert found, f"the master's log names no URL:\n{log.read_text(errors='replace')[-3000:]}"
        url = found.group(1)
        for i, (cores, memory) in enumerate(workers):
            log = folder / f"worker{i}.log"
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                     "--webui-port", str(_free_port()), "--cores", str(cores), "--memory", memory,
                     "--work-dir", str(folder / f"work{i}"), url],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
            _wait_for(log, "Successfully registered with master", procs[-1])
        yield url
    finally:
        for p in reversed(procs):
            _stop(p)
