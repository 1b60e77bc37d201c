"""The event log exported as Debezium JSON, compared with the documents Debezium's connectors
publish for the same changes (Kafka Connect JsonConverter, schemas enabled, Debezium 3.x
defaults). Every expected schema node and value below is written by hand from Debezium's
source (its connectors' type mapping, io.debezium.time/data and the JsonConverter rules), not
produced by our code; the changes are captured from the real databases.

One table per database holds every type the dialect supports; a row is inserted with edge
values, updated, deleted, and a row of NULLs inserted. Checked: the records and tombstones in
order, the key document, every column's schema node and value, the envelope's and the source
block's fields (transaction id, LSN, server id, GTID, thread, binlog file and position read
from the servers themselves)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg2
import pymysql
import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.export.debezium import DEBEZIUM_VERSION, DebeziumOptions, export_table
from airflow_provider_cdc.pipeline.capture import stage_changelog

from .event_log_helpers import write_event_log

pytestmark = pytest.mark.integration


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


def _records(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def _check_envelope_schema(value: dict, prefix: str, connector: str) -> None:
    schema = value["schema"]
    assert schema["name"] == f"{prefix}.Envelope" and schema["version"] == 2 and schema["optional"] is False
    assert [f["field"] for f in schema["fields"]] == ["before", "after", "source", "transaction", "op", "ts_ms",
                                                      "ts_us", "ts_ns"]
    before, after, source, transaction = schema["fields"][:4]
    assert before["name"] == after["name"] == f"{prefix}.Value" and before["optional"] is True
    assert source["name"] == f"io.debezium.connector.{connector}.Source" and source["version"] == 1
    assert transaction == {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "id"},
                                                        {"type": "int64", "optional": False, "field": "total_order"},
                                                        {"type": "int64", "optional": False,
                                                         "field": "data_collection_order"}],
                           "optional": True, "name": "event.block", "version": 1, "field": "transaction"}
    assert schema["fields"][4:] == [{"type": "string", "optional": False, "field": "op"},
                                    {"type": "int64", "optional": True, "field": "ts_ms"},
                                    {"type": "int64", "optional": True, "field": "ts_us"},
                                    {"type": "int64", "optional": True, "field": "ts_ns"}]
    common = ["version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "ts_us", "ts_ns"]
    tail = (["schema", "table", "txId", "lsn", "xmin", "origin", "origin_lsn"] if connector == "postgresql"
            else ["table", "server_id", "gtid", "file", "pos", "row", "thread", "query"])
    assert [f["field"] for f in source["fields"]] == common + tail
    assert source["fields"][4] == {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                                   "parameters": {"allowed": "true,first,first_in_data_collection,"
                                                             "last_in_data_collection,last,false,incremental"},
                                   "default": "false", "field": "snapshot"}


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


def _export_and_check(d, t: TableName, data: str, database: str, connector: str, columns: list) -> tuple:
    """Stage the captured changes (insert, update, delete of row 1; insert of a row of NULLs),
    write the event log, export it, and check what both databases share: the records in order
    with the tombstone, the key, the envelope, and every column's schema node and value of the
    insert. Returns the value documents (created, updated, deleted, nulls)."""
    stage_changelog(d, data)
    assert write_event_log(data, d.source, t, database) == 4
    out = f"{data}/export/dbz.jsonl"
    assert export_table(data, d.source, t, out, DebeziumOptions("srv")) == 5
    assert _event_log_connectors(data, d.source, t) == {connector}
    recs = _records(out)
    for r in recs:
        assert_conforms(r["key"])
        assert_conforms(r["value"])
    prefix = f"srv.{t.schema}.{t.name}"

    key1 = {"schema": {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}],
                       "optional": False, "name": f"{prefix}.Key"}, "payload": {"id": 1}}
    assert [r["key"] for r in recs] == [key1, key1, key1, key1, key1 | {"payload": {"id": 2}}]
    assert [r["value"] and r["value"]["payload"]["op"] for r in recs] == ["c", "u", "d", None, "c"]  # a tombstone
    created, updated, deleted, _, nulls = (r["value"] for r in recs)
    for v in (created, updated, deleted, nulls):
        _check_envelope_schema(v, prefix, connector)
    value_fields = created["schema"]["fields"][1]["fields"]
    assert value_fields == [{"type": "int32", "optional": False, "field": "id"}] + [c[3] for c in columns]
    after = created["payload"]["after"]
    assert list(after) == ["id"] + [c[0] for c in columns]  # every field, in column order
    for col, sql_type, _, _, expected in columns:
        assert after[col] == expected, f"{col} ({sql_type})"
    return created, updated, deleted, nulls


@pytest.fixture
def pg_table(pg_uri, tmp_path):
    u = uuid.uuid4().hex[:10]
    conn = psycopg2.connect(pg_uri)
    conn.autocommit = True
    cur = conn.cursor()
    enum, domain = f"mood_{u}", f"posint_{u}"
    cur.execute(f"CREATE TYPE {enum} AS ENUM ('happy', 'sad')")
    cur.execute(f"CREATE DOMAIN {domain} AS integer CHECK (VALUE > 0)")
    t = TableName("public", f"dbz_{u}")
    cols = ", ".join(f'"{c}" {ty.replace("{enum}", enum).replace("{domain}", domain)}' for c, ty, *_ in PG_COLUMNS)
    cur.execute(f'CREATE TABLE public."{t.name}" ("id" integer PRIMARY KEY, {cols})')
    d = get_dialect(ConnectionParams.from_uri(pg_uri), source=f"dbz{u}", tables=[t], watermark_table=f"wm_{u}")
    try:
        yield d, cur, t, str(tmp_path / "data")
    finally:
        d.drop_slot()
        d.drop_publication()
        d.close()
        cur.execute(f'DROP TABLE IF EXISTS public."{t.name}", cdc."wm_{u}"')
        cur.execute(f"DROP TYPE IF EXISTS {enum}")
        cur.execute(f"DROP DOMAIN IF EXISTS {domain}")
        conn.close()


def test_postgres_changes_export_as_debezium_publishes_them(pg_table):
    d, cur, t, data = pg_table
    d.ensure_watermark_table()
    d.load_offset(data)
    values = ", ".join(lit for _, _, lit, _, _ in PG_COLUMNS)
    cur.execute("BEGIN")
    cur.execute(f'INSERT INTO public."{t.name}" VALUES (1, {values})')
    cur.execute("SELECT txid_current()")
    insert_tx = cur.fetchone()[0]
    cur.execute("COMMIT")
    cur.execute(f'UPDATE public."{t.name}" SET "t" = %s WHERE "id" = 1', ("changed",))
    cur.execute(f'DELETE FROM public."{t.name}" WHERE "id" = 1')
    cur.execute(f'INSERT INTO public."{t.name}" ("id") VALUES (2)')
    cur.execute("SELECT current_database()")
    database = cur.fetchone()[0]
    created, updated, deleted, nulls = _export_and_check(d, t, data, database, "postgresql", PG_COLUMNS)
    assert created["payload"]["before"] is None and created["payload"]["transaction"] is None
    # REPLICA IDENTITY DEFAULT: an update has no before-image; a delete's holds the key, the rest null
    assert updated["payload"]["before"] is None and updated["payload"]["after"]["t"] == "changed"
    assert deleted["payload"]["after"] is None
    assert deleted["payload"]["before"] == {"id": 1} | {c[0]: None for c in PG_COLUMNS}
    assert nulls["payload"]["after"] == {"id": 2} | {c[0]: None for c in PG_COLUMNS}

    src = created["payload"]["source"]
    assert {k: src[k] for k in ("version", "connector", "name", "snapshot", "db", "schema", "table", "txId", "xmin",
                                "origin", "origin_lsn")} == {
        "version": DEBEZIUM_VERSION, "connector": "postgresql", "name": "srv", "snapshot": "false", "db": database,
        "schema": "public", "table": t.name, "txId": insert_tx, "xmin": None, "origin": None, "origin_lsn": None}
    assert src["ts_us"] == src["ts_ms"] * 1000 and src["ts_ns"] == src["ts_ms"] * 1_000_000 and src["ts_ms"] > 0
    # lsn: the change's own WAL position, before its commit; sequence: [the commit before, lsn] as text
    commits = [Position.decode(p).major for p in _positions(data, d.source, t)]
    assert src["lsn"] < commits[0]
    last_commit, lsn = json.loads(src["sequence"])
    assert lsn == str(src["lsn"]) and (last_commit is None or int(last_commit) < src["lsn"])
    later = updated["payload"]["source"]
    assert later["txId"] == insert_tx + 1 and int(json.loads(later["sequence"])[0]) == commits[0]
    assert created["payload"]["ts_ms"] == src["ts_ms"]  # commit time (Debezium's: its own clock)


def _event_log_connectors(data: str, source: str, t: TableName) -> set:
    import pyarrow.parquet as pq

    from airflow_provider_cdc.sinks.event_log import table_dir

    return {r["connector"] for f in Path(table_dir(data, source, t)).glob("*.parquet")
            for r in pq.read_table(f)["source"].to_pylist()}


def _event_log_sources(data: str, source: str, t: TableName) -> list[dict]:
    import pyarrow.parquet as pq

    from airflow_provider_cdc.sinks.event_log import table_dir

    rows = [r for f in Path(table_dir(data, source, t)).glob("*.parquet") for r in pq.read_table(f)["source"].to_pylist()]
    return sorted(rows, key=lambda r: r["position"])


def _positions(data: str, source: str, t: TableName) -> list[str]:
    from airflow_provider_cdc.sinks.event_log import read_events

    return sorted(read_events(data, source, t)["position"].to_pylist())


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
    from urllib.parse import urlsplit

    u = urlsplit(uri)
    return pymysql.connect(host=u.hostname, port=u.port or 3306, user=u.username or "root", password=u.password or "",
                           database=u.path.lstrip("/"), autocommit=True, init_command="SET time_zone = '+00:00'")


@pytest.fixture
def my_table(mysql_uri, tmp_path):
    u = uuid.uuid4().hex[:10]
    conn = _my_conn(mysql_uri)
    cur = conn.cursor()
    cur.execute("SELECT DATABASE()")
    db = cur.fetchone()[0]
    t = TableName(db, f"dbz_{u}")
    cols = ", ".join(f"`{c}` {ty}" for c, ty, *_ in MY_COLUMNS)
    cur.execute(f"CREATE TABLE `{t.name}` (`id` INT PRIMARY KEY, {cols})")
    d = get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"dbz{u}", tables=[t], watermark_table=f"wm_{u}")
    try:
        yield d, cur, t, str(tmp_path / "data")
    finally:
        d.close()
        cur.execute(f"DROP TABLE IF EXISTS `{t.name}`")
        cur.execute(f"DROP TABLE IF EXISTS cdc.`wm_{u}`")
        conn.close()


def test_mariadb_changes_export_as_debezium_publishes_them(my_table):
    d, cur, t, data = my_table
    d.ensure_watermark_table()
    d.load_offset(data)
    cur.execute("SET SESSION sql_mode = ''")  # a zero date is a value to capture, not an error
    cur.execute("SHOW MASTER STATUS")
    binlog_file = cur.fetchone()[0]
    cur.execute("SELECT @@server_id")
    server_id = cur.fetchone()[0]
    values = ", ".join(lit for _, _, lit, _, _ in MY_COLUMNS)
    cur.execute("BEGIN")
    cur.execute(f"INSERT INTO `{t.name}` VALUES (1, {values})")
    cur.execute("COMMIT")
    cur.execute("SELECT @@last_gtid")
    gtid = cur.fetchone()[0]
    cur.execute(f"UPDATE `{t.name}` SET `tx` = 'changed' WHERE `id` = 1")
    cur.execute(f"DELETE FROM `{t.name}` WHERE `id` = 1")
    cur.execute(f"INSERT INTO `{t.name}` (`id`) VALUES (2)")
    created, updated, deleted, nulls = _export_and_check(d, t, data, t.schema, "mariadb", MY_COLUMNS)
    after = created["payload"]["after"]
    # binlog_row_image FULL: the update's and the delete's before-images are whole rows
    assert updated["payload"]["before"] == after and updated["payload"]["after"] == after | {"tx": "changed"}
    assert deleted["payload"]["before"] == after | {"tx": "changed"} and deleted["payload"]["after"] is None
    assert nulls["payload"]["after"] == {"id": 2} | {c[0]: None for c in MY_COLUMNS}

    src = created["payload"]["source"]
    pos = Position.decode(_positions(data, d.source, t)[0])
    logged = _event_log_sources(data, d.source, t)[0]  # the event log's own source block
    assert (logged["file"], logged["pos"], logged["row"], logged["tx"]) == (binlog_file, pos.minor, 0, gtid)
    assert src == {
        "version": DEBEZIUM_VERSION, "connector": "mariadb", "name": "srv", "ts_ms": src["ts_ms"], "snapshot": "false",
        "db": t.schema, "sequence": None, "ts_us": src["ts_ms"] * 1000, "ts_ns": src["ts_ms"] * 1_000_000,
        "table": t.name, "server_id": server_id, "gtid": gtid, "file": binlog_file, "pos": pos.minor, "row": 0,
        "thread": None, "query": None,  # MariaDB starts a transaction with its GTID event: no BEGIN names a thread
    }
    assert src["ts_ms"] % 1000 == 0 and src["ts_ms"] > 0  # the binlog's commit time has whole seconds


def test_export_options_are_checked():
    with pytest.raises(ConfigurationError, match="topic prefix"):
        DebeziumOptions("a b")
    with pytest.raises(ConfigurationError, match="connector"):
        DebeziumOptions("srv", connector="oracle")


def test_cli_exports_snapshot_rows_as_incremental_reads_and_truncates_on_request(tmp_path, capsys, monkeypatch):
    """``airflow cdc export-debezium``: a snapshot row is Debezium's incremental-snapshot read
    (op r, snapshot "incremental", no transaction or LSN); TRUNCATE records and tombstones
    follow Debezium's options; the output is written whole to the location given, readable by
    its owner alone (0600), and an existing file is replaced only with --force. Only tables of
    the capture scope are exported (the one scope check, I15)."""
    import json
    import stat

    import pyarrow as pa

    from airflow_provider_cdc import cli
    from airflow_provider_cdc.core.schema import Column, TableSchema, encode_key, encode_row
    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
    from airflow_provider_cdc.sinks.event_log import EventLogSink
    from airflow_provider_cdc.storage.layout import schema_path

    data = str(tmp_path / "data")
    t = TableName("a'b %s; é", "orders")  # a hostile schema name: sanitised in Debezium's schema names
    schema = TableSchema(t, (Column("id", "int64", "bigint", False), Column("v", "string", "text")), ("id",),
                         {"replica_identity": "default"})
    Path(schema_path(data, "src", t)).parent.mkdir(parents=True)
    Path(schema_path(data, "src", t)).write_text(schema.to_json())

    def ev(pos, op, key, after, batch, **kw):
        return {"position": Position(pos, 0, 0).encode(), "table": t.id, "op": op,
                "key": None if key is None else encode_key([key]), "before": None,
                "after": None if after is None else encode_row(after), "ts_ms": 1000 + pos, "watermark": None,
                "snapshot": op == "r", "batch": batch, **kw}

    def p(i):
        return Position(i, 0, 0).encode()

    c = f"c-{p(20)}-{p(30)}"  # batches are named as the engines name them (position ranges)
    EventLogSink(data, "src", "shop").write(pa.Table.from_pylist([
        ev(10, "r", 1, {"id": 1, "v": "x"}, f"r-{p(10)}-hw", watermark="hw"),
        ev(20, "d", 1, None, c) | {"before": encode_row({"id": 1})},
        ev(30, "t", None, None, c),
        ev(25, "r", 2, {"id": 2, "v": "y"}, f"r-{p(25)}-hw2", watermark="hw2"),  # a chunk inside a changelog batch
    ], schema=EVENT_SCHEMA))
    out = str(tmp_path / "out" / "orders.jsonl")
    args = ["export-debezium", "--data-dir", data, "--source", "src", "--table", t.id, "--out", out]
    monkeypatch.setenv("CDC_TABLES", json.dumps(["s.other"]))  # t outside the scope: refused, nothing written
    assert cli.run(args) == 2
    assert f"table {t} is not captured by source 'src': it is outside the capture scope" in capsys.readouterr().err
    assert not Path(out).exists()
    monkeypatch.setenv("CDC_TABLES", json.dumps(["s.nope", t.id]))
    assert cli.run(args) == 0
    assert "4 Debezium records" in capsys.readouterr().out
    assert stat.S_IMODE(Path(out).stat().st_mode) == 0o600  # row values: its owner's alone
    before = Path(out).read_text()
    assert cli.run([*args, "--truncates"]) == 2  # an existing file is not replaced without --force
    assert "exists already; nothing was written" in capsys.readouterr().err and Path(out).read_text() == before
    for system in ("pg_catalog.pg_authid", "mysql.user"):
        assert cli.run([*args[:-4], "--table", system, "--out", str(tmp_path / "sys.jsonl")]) == 2
        assert f"table {system} is in system schema" in capsys.readouterr().err
    recs = _records(out)
    # position order across files; t skipped; a tombstone after the delete
    assert [r["value"] and r["value"]["payload"]["op"] for r in recs] == ["r", "d", None, "r"]
    assert [r["key"]["payload"]["id"] for r in recs] == [1, 1, 1, 2]
    # read a row at a time, files opened as the merge reaches them: the same records
    assert export_table(data, "src", t, out + ".2", DebeziumOptions("src"), batch_rows=1) == 4
    assert Path(out + ".2").read_text() == Path(out).read_text()
    read = recs[0]["value"]
    assert read["schema"]["name"] == "src.a_b__s___.orders.Envelope"  # each character outside [A-Za-z0-9._-]: "_"
    assert {k: read["payload"]["source"][k] for k in ("snapshot", "txId", "lsn", "sequence", "db", "schema")} == {
        "snapshot": "incremental", "txId": None, "lsn": None, "sequence": None, "db": "shop", "schema": t.schema}
    assert read["payload"]["after"] == {"id": 1, "v": "x"} and read["payload"]["ts_ms"] == 1010

    assert cli.run([*args, "--truncates", "--no-tombstones", "--topic-prefix", "lake", "--force"]) == 0
    recs = _records(out)
    assert [r["value"]["payload"]["op"] for r in recs] == ["r", "d", "r", "t"]
    assert recs[3]["key"] is None and recs[3]["value"]["payload"]["before"] is None
    assert recs[3]["value"]["payload"]["after"] is None and recs[0]["value"]["payload"]["source"]["name"] == "lake"
    assert cli.run([*args, "--topic-prefix", "no spaces", "--force"]) == 2  # a clear error, nothing written
    missing = str(tmp_path / "out" / "missing.jsonl")
    assert cli.run(["export-debezium", "--data-dir", data, "--source", "src", "--table", "s.nope", "--out", missing]) == 2
    assert "no event log for table s.nope" in capsys.readouterr().err and not Path(missing).exists()


def test_zero_dates_in_required_fields_take_distinct_non_null_numbers():
    """A zero date is null in an optional field (Debezium's own behaviour) but a documented
    number in a required one (a key, a NOT NULL column): below any real date, one per date, so
    distinct zero-date keys stay distinct and every record is valid against its schema."""
    from airflow_provider_cdc.core.schema import Column
    from airflow_provider_cdc.export.debezium import ZERO_DATE_DAYS, field_schema, zero_date_days

    zeros = ["0000-00-00", "2024-00-00", "2024-05-00", "0000-01-01", "2024-01-00", "2023-00-31", "9999-12-00"]
    assert len({zero_date_days(z) for z in zeros}) == len(zeros)
    assert all(ZERO_DATE_DAYS <= z < -719_162 for z in map(zero_date_days, zeros))  # 0001-01-01 is day -719,162
    assert sorted(zeros) == sorted(zeros, key=zero_date_days) and ZERO_DATE_DAYS > -(1 << 31)  # ordered; an int32
    _, date = field_schema(Column("d", "date", "date", False), "mariadb")
    _, opt = field_schema(Column("d", "date", "date", True), "mariadb")
    assert date("2024-05-00") == zero_date_days("2024-05-00") and opt("2024-05-00") is None
    assert date("2024-01-15") == 19737  # real dates unchanged
    _, dt6 = field_schema(Column("t", "timestamp", "datetime(6)", False), "mariadb")
    _, dt = field_schema(Column("t", "timestamp", "datetime", False), "mariadb")
    a, b = dt6("2024-00-00T10:00:00.000001"), dt6("2024-00-00T10:00:00.000000")
    assert a == b + 1 and a < -(10 ** 17) and dt("2024-00-00T10:00:00.000000") == b // 1000
    assert dt6("2024-00-00T00:00:00.000000") < dt6("2024-00-00T23:59:59.999999") < dt6("2024-00-01T00:00:00.000000")
    _, ts = field_schema(Column("t", "timestamptz", "timestamp", False), "mariadb")
    assert ts("0000-00-00T00:00:00.000000Z") == "1970-01-01T00:00:00Z"  # no real TIMESTAMP is the epoch itself


def test_mariadb_zero_date_keys_export_as_valid_distinct_value_documents(mysql_uri, tmp_path):
    """Four distinct zero-date primary keys and a real one, exported in the "value" form (one
    value document per line, as Flink's debezium-json reads it): every document is valid against
    its schema, the five keys stay five, source.db is the table's database."""
    u = uuid.uuid4().hex[:10]
    conn = _my_conn(mysql_uri)
    cur = conn.cursor()
    cur.execute("SELECT DATABASE()")
    t = TableName(cur.fetchone()[0], f"dbz_zero_{u}")
    cur.execute(f"CREATE TABLE `{t.name}` (`d` DATE NOT NULL PRIMARY KEY, `dt` DATETIME NOT NULL, `v` INT)")
    d = get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"dbz{u}", tables=[t], watermark_table=f"wm_{u}")
    data = str(tmp_path / "data")
    try:
        d.load_offset(data)
        cur.execute("SET SESSION sql_mode = ''")
        dates = ["0000-00-00", "2024-00-00", "2024-05-00", "0000-01-01", "2024-01-15"]
        cur.executemany(f"INSERT INTO `{t.name}` VALUES (%s, %s, 1)", [(x, f"{x} 10:00:00") for x in dates])
        cur.execute(f"UPDATE `{t.name}` SET `v` = 2 WHERE `d` = '2024-00-00'")
        stage_changelog(d, data)
        assert write_event_log(data, d.source, t, "not-the-database") == 6
        out = f"{data}/export/values.jsonl"
        assert export_table(data, d.source, t, out, DebeziumOptions("srv", form="value")) == 6
        docs = _records(out)
        for doc in docs:
            assert set(doc) == {"schema", "payload"}  # a value document alone, no key wrapper
            assert_conforms(doc)
            assert doc["payload"]["source"]["db"] == t.schema
        keys = [doc["payload"]["after"]["d"] for doc in docs]
        assert len(set(keys[:5])) == 5 and keys[5] == keys[1] and 19737 in keys
    finally:
        d.close()
        cur.execute(f"DROP TABLE IF EXISTS `{t.name}`")
        conn.close()


def test_a_skipped_truncate_is_said_and_the_value_form_has_no_tombstones(tmp_path, capsys, monkeypatch):
    """Without --truncates (Debezium's default) the export says how many TRUNCATEs it left out,
    since a consumer rebuilding the table from it keeps the rows they removed; the value form
    writes one value document per event (a delete has no tombstone); PostgreSQL's source.db is
    the database capture recorded, or --database."""
    import pyarrow as pa

    from airflow_provider_cdc import cli
    from airflow_provider_cdc.core.schema import Column, TableSchema, encode_key, encode_row
    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
    from airflow_provider_cdc.sinks.event_log import EventLogSink
    from airflow_provider_cdc.storage.layout import schema_path

    data = str(tmp_path / "data")
    t = TableName("public", "orders")
    schema = TableSchema(t, (Column("id", "int64", "bigint", False),), ("id",), {"connector": "postgresql"})
    Path(schema_path(data, "src", t)).parent.mkdir(parents=True)
    Path(schema_path(data, "src", t)).write_text(schema.to_json())
    p = [Position(i, 0, 0).encode() for i in range(4)]

    def ev(i, op, key):
        return {"position": p[i], "table": t.id, "op": op, "key": None if key is None else encode_key([key]),
                "before": encode_row({"id": key}) if op == "d" else None,
                "after": encode_row({"id": key}) if op == "c" else None, "ts_ms": 1000, "watermark": None,
                "snapshot": False, "batch": f"c-{p[1]}-{p[3]}"}

    EventLogSink(data, "src", "shop").write(pa.Table.from_pylist(
        [ev(1, "c", 1), ev(2, "d", 1), ev(3, "t", None)], schema=EVENT_SCHEMA))
    out = str(tmp_path / "values.jsonl")
    monkeypatch.setenv("CDC_TABLES", t.id)  # export keeps the capture scope too
    args = ["export-debezium", "--data-dir", data, "--source", "src", "--table", t.id, "--out", out, "--form", "value",
            "--connector", "postgresql"]
    assert cli.run(args) == 0
    err = capsys.readouterr().err
    assert f"1 TRUNCATE(s) of table {t.id} left out (first at position {p[3]})" in err and "--truncates" in err
    docs = _records(out)
    assert [doc["payload"]["op"] for doc in docs] == ["c", "d"]
    assert {doc["payload"]["source"]["db"] for doc in docs} == {"shop"}
    assert cli.run([*args, "--database", "postgres", "--truncates", "--force"]) == 0  # replaces the first export
    assert "left out" not in capsys.readouterr().err
    docs = _records(out)
    assert [doc["payload"]["op"] for doc in docs] == ["c", "d", "t"]
    assert {doc["payload"]["source"]["db"] for doc in docs} == {"postgres"}
    with pytest.raises(ConfigurationError, match="form"):
        DebeziumOptions("srv", form="lines")
