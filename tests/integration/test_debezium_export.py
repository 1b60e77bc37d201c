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
import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.export.debezium import DEBEZIUM_VERSION, DebeziumOptions, export_table
from airflow_provider_cdc.pipeline.capture import stage_changelog

from .event_log_helpers import write_event_log
from .helpers import (
    MY_COLUMNS,
    PG_COLUMNS,
    _my_conn,
    assert_conforms,
)

pytestmark = pytest.mark.integration


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
