"""MySQL/MariaDB dialect against the private MariaDB 10.11 (scripts/services.sh).

Prerequisite checks are tested on values (``prerequisite_problems``) rather than by
flipping globals: other engineers use this server at the same time. Everything else runs
on real tables with unique names; capture is restricted to the test's tables with the
``tables`` option so concurrent tests' writes do not show up here.
"""

from __future__ import annotations

import base64
import json
import re
import time
from contextlib import closing
from pathlib import Path

import pymysql
import pytest

from airflow_provider_cdc.core.errors import ConfigurationError, SourceError, StateError
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import TableName, decode_key
from airflow_provider_cdc.dialects import ChunkRead, ConnectionParams, LogRead, get_dialect
from airflow_provider_cdc.dialects.mysql import (
    MARIADB,
    MYSQL_80,
    MYSQL_84,
    OFFSET_FILE,
    BinlogOffset,
    MySqlDialect,
    default_server_id,
    flavour_for,
    prerequisite_problems,
)
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.storage.staged import read_log_events

DB = "cdc_test"
GOOD = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL", "binlog_row_metadata": "FULL"}


def _admin(mysql_uri, **kw):
    p = ConnectionParams.from_uri(mysql_uri)
    return pymysql.connect(
        host=p.host,
        port=p.port or 3306,
        user=p.user or "root",
        password=p.password or "",
        charset="utf8mb4",
        autocommit=True,
        **kw,
    )


@pytest.fixture
def admin(mysql_uri):
    with closing(_admin(mysql_uri)) as conn:
        yield conn.cursor()


@pytest.fixture
def make_dialect(mysql_uri, unique_name):
    made = []

    def make(*tables: str, **options) -> MySqlDialect:
        d = get_dialect(
            ConnectionParams.from_uri(mysql_uri),
            source=f"mysql_{unique_name}",
            watermark_schema="cdc",
            watermark_table=f"wm_{unique_name}",
            tables=[TableName(DB, t) for t in tables],
            **options,
        )
        made.append(d)
        return d

    yield make
    for d in made:
        try:
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
        finally:
            d.close()


# --------------------------------------------------------------------------- pure checks


def test_prerequisites_pass_on_good_settings_and_all_privileges():
    assert prerequisite_problems(GOOD, ["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`"], MARIADB) == []
    assert (
        prerequisite_problems(GOOD, ["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%`"], MARIADB)
        == []
    )
    assert (
        prerequisite_problems(
            GOOD, ["GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`"], MYSQL_80
        )
        == []
    )


@pytest.mark.parametrize(
    "var, bad",
    [
        ("log_bin", "OFF"),
        ("binlog_format", "MIXED"),
        ("binlog_row_image", "MINIMAL"),
        ("binlog_row_metadata", "NO_LOG"),
    ],
)
def test_each_bad_setting_is_named_with_its_fix(var, bad):
    problems = prerequisite_problems({**GOOD, var: bad}, ["GRANT ALL PRIVILEGES ON *.* TO x"], MARIADB)
    assert len(problems) == 1
    assert var in problems[0] and repr(bad) in problems[0]
    assert ("--log-bin" if var == "log_bin" else "SET GLOBAL") in problems[0]


def test_every_problem_is_listed_at_once_including_privileges():
    settings = {
        "log_bin": "OFF",
        "binlog_format": "STATEMENT",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": None,
    }
    problems = prerequisite_problems(settings, ["GRANT SELECT ON *.* TO `cdc`@`%`"], MYSQL_80)
    assert len(problems) == 4
    assert "not a variable of this server" in problems[2]
    assert "REPLICATION SLAVE" in problems[3] and "REPLICATION CLIENT" in problems[3]
    assert "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*" in problems[3]


def test_privileges_on_one_database_do_not_count():
    problems = prerequisite_problems(GOOD, ["GRANT ALL PRIVILEGES ON `shop`.* TO `cdc`@`%`"], MARIADB)
    assert len(problems) == 1 and "BINLOG MONITOR" in problems[0]
    problems = prerequisite_problems(GOOD, ["GRANT REPLICATION SLAVE ON *.* TO `cdc`@`%`"], MARIADB)
    assert len(problems) == 1 and "REPLICATION SLAVE" not in problems[0].split(":")[0]


def test_compressed_binlog_is_refused_per_flavour():
    assert (
        "log_bin_compress"
        in prerequisite_problems({**GOOD, "log_bin_compress": "ON"}, ["GRANT ALL ON *.* TO x"], MARIADB)[0]
    )
    on = {**GOOD, "binlog_transaction_compression": "ON"}
    assert (
        "binlog_transaction_compression" in prerequisite_problems(on, ["GRANT ALL ON *.* TO x"], MYSQL_80)[0]
    )
    assert prerequisite_problems(GOOD, ["GRANT ALL ON *.* TO x"], MYSQL_84) == []  # absent: older server


def test_flavour_from_version():
    assert flavour_for("10.11.19-MariaDB-0+deb12u1-log") is MARIADB
    assert flavour_for("8.0.36") is MYSQL_80
    assert flavour_for("8.4.3") is MYSQL_84
    assert MYSQL_84.status_sql == "SHOW BINARY LOG STATUS" and MYSQL_80.status_sql == "SHOW MASTER STATUS"
    assert MARIADB.gtid_sql != MYSQL_80.gtid_sql


def test_server_id_default_is_stable_and_option_wins(mysql_uri):
    p = ConnectionParams.from_uri(mysql_uri)
    assert MySqlDialect(p, source="a").server_id == default_server_id("a") != default_server_id("b")
    assert MySqlDialect(p, source="a", server_id=4242).server_id == 4242
    with pytest.raises(ConfigurationError, match="server_id"):
        MySqlDialect(p, source="a", server_id=0)


def test_options_from_a_connection_extra():
    params = ConnectionParams(
        "mysql", "h", 3306, extra={"read_timeout": "30", "ssl_disabled": "true", "foo": "x"}
    )
    d = MySqlDialect(params, tables="db.a, db.b", server_id="77")
    assert d.tables == {TableName("db", "a"), TableName("db", "b")} and d.server_id == 77
    assert d._driver_settings() == {"read_timeout": 30, "ssl_disabled": True}


def test_connections_without_tls_settings_share_one_ssl_context_and_settings_get_their_own(mysql_uri):
    """pymysql builds an SSL context per connection (the system's CA store, ~50 ms of CPU) even
    when the server offers no TLS; connections that set nothing share the one it would build."""
    import ssl

    from airflow_provider_cdc.dialects.mysql.server import MyServer

    server = MyServer(ConnectionParams.from_uri(mysql_uri), "a")
    first, second = server.connect(), server.connect()
    try:
        assert first.ctx is second.ctx and first.ctx.verify_mode == ssl.CERT_NONE
        assert first.ssl and not first._ssl_required  # still "preferred": TLS when offered, else plain
        with first.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
    finally:
        first.close()
        second.close()
    # explicit settings: a context of their own, as pymysql builds it, and TLS required
    from airflow_provider_cdc.dialects.mysql.server import _Connection

    own = _Connection(host="127.0.0.1", ssl_verify_cert=True, defer_connect=True)
    assert own.ctx is not first.ctx and own._ssl_required and own.ctx.verify_mode == ssl.CERT_REQUIRED


def test_quote_ident_doubles_backticks(mysql_uri):
    d = MySqlDialect(ConnectionParams.from_uri(mysql_uri))
    assert d.quote_ident("a`b") == "`a``b`"
    assert d.quote_table(TableName("s`", "t t")) == "`s```.`t t`"
    with pytest.raises(ConfigurationError):
        d.quote_ident("")


def test_composite_keyset_uses_expanded_or_form(mysql_uri):
    from airflow_provider_cdc.core.schema import Column, TableSchema

    d = MySqlDialect(ConnectionParams.from_uri(mysql_uri))
    schema = TableSchema(
        TableName("s", "t"), (Column("a", "int32"), Column("b", "string"), Column("f", "float32")), ("a", "b")
    )
    sql, params = d.chunk_query(schema, ChunkRange(None, (9, "z")), after_key=(1, "x"), limit=5)
    assert sql == (
        "SELECT `a`, `b`, `f` + 0e0 AS `f` FROM `s`.`t` WHERE ((`a` > %s) OR (`a` = %s AND `b` > %s))"
        " AND ((`a` < %s) OR (`a` = %s AND `b` < %s)) ORDER BY `a`, `b` LIMIT %s"
    )
    assert params == [1, 1, "x", 9, 9, "z", 5]


# --------------------------------------------------------------------------- real server


def test_check_prerequisites_passes_here(make_dialect):
    make_dialect().check_prerequisites()


def test_check_prerequisites_names_missing_privileges_of_a_real_user(mysql_uri, admin, unique_name):
    user = f"cdc_np_{unique_name}"
    admin.execute("CREATE USER %s@'%%' IDENTIFIED BY 'pw'", (user,))
    try:
        admin.execute(f"GRANT SELECT ON `{DB}`.* TO %s@'%%'", (user,))
        p = ConnectionParams.from_uri(mysql_uri)
        d = MySqlDialect(ConnectionParams("mysql", p.host, p.port, user, "pw", DB))
        with closing(d), pytest.raises(SourceError) as err:
            d.check_prerequisites()
        assert "REPLICATION SLAVE" in str(err.value) and "BINLOG MONITOR" in str(err.value)
    finally:
        admin.execute("DROP USER %s@'%%'", (user,))


def test_describe_table_types_and_bad_inputs(make_dialect, admin, unique_name):
    t = f"types_{unique_name}"
    d = make_dialect(t)
    admin.execute(
        f"CREATE TABLE `{DB}`.`{t}` (a INT UNSIGNED, b VARCHAR(10), u BIGINT UNSIGNED, i BIGINT, m DECIMAL(12,3),"
        f" f FLOAT, bt BIT(5), ts TIMESTAMP(6) NULL, dtm DATETIME(6), j JSON, e ENUM('x'), bl BLOB, y YEAR,"
        f" PRIMARY KEY (b, a))"
    )
    try:
        s = d.describe_table(TableName(DB, t))
        assert s.primary_key == ("b", "a")
        types = {c.name: c.type for c in s.columns}
        assert types == {
            "a": "int64",
            "b": "string",
            "u": "uint64",
            "i": "int64",
            "m": "decimal(12,3)",
            "f": "float32",
            "bt": "int64",
            "ts": "timestamptz",
            "dtm": "timestamp",
            "j": "json",
            "e": "string",
            "bl": "binary",
            "y": "int16",
        }
        with pytest.raises(SourceError, match="does not exist in database"):
            d.describe_table(TableName(DB, f"missing_{unique_name}"))
        with pytest.raises(SourceError, match="database 'nodb_"):
            d.describe_table(TableName(f"nodb_{unique_name}", "t"))
        admin.execute(f"CREATE TABLE `{DB}`.`{t}_nopk` (a INT)")
        with pytest.raises(SourceError, match="no primary key"):
            d.describe_table(TableName(DB, f"{t}_nopk"))
        admin.execute(f"CREATE TABLE `{DB}`.`{t}_geo` (id INT PRIMARY KEY, g POINT, w LINESTRING)")
        with pytest.raises(SourceError, match=r"'g' \(point\), 'w' \(linestring\)"):
            d.describe_table(TableName(DB, f"{t}_geo"))
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`, `{DB}`.`{t}_nopk`, `{DB}`.`{t}_geo`")


PARITY_DDL = """(
  id BIGINT UNSIGNED NOT NULL, k2 VARCHAR(20) NOT NULL,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
  d DECIMAL(20,4), d0 DECIMAL(10,0), dz DECIMAL(30,10), f FLOAT, db DOUBLE, b1 BIT(1), b BIT(10), b64 BIT(64),
  c CHAR(5), vc VARCHAR(40), tx TEXT, bn BINARY(6), vb VARBINARY(10), bl BLOB,
  dt DATE, tm TIME(6), t0 TIME, dtm DATETIME(6), ts TIMESTAMP(6) NULL, y YEAR,
  e ENUM('x','y','z'), s SET('a','b','c'), j JSON, n INT NULL,
  PRIMARY KEY (id, k2))"""
PARITY_COLS = (
    "id, k2, ti, tu, si, su, mi, mu, i, iu, bi, bu, d, d0, dz, f, db, b1, b, b64, c, vc, tx, bn, vb, bl, dt, tm, t0,"
    " dtm, ts, y, e, s, j, n"
)
PARITY_ROWS = [
    (
        1,
        "min",
        -128,
        0,
        -32768,
        0,
        -8388608,
        0,
        -2147483648,
        0,
        -9223372036854775808,
        0,
        "-9999999999999999.9999",
        "-9999999999",
        "-0.0000000001",
        -3.4e38,
        -1.7976931348623157e308,
        0,
        0,
        0,
        "",
        "",
        "",
        b"",
        b"",
        b"",
        "1000-01-01",
        "-838:59:59.000000",
        "-838:59:59",
        "1000-01-01 00:00:00.000000",
        "1970-01-01 00:00:01",
        1901,
        "x",
        "",
        "{}",
        None,
    ),
    (
        2,
        "max 😀",
        127,
        255,
        32767,
        65535,
        8388607,
        16777215,
        2147483647,
        4294967295,
        9223372036854775807,
        18446744073709551615,
        "9999999999999999.9999",
        "9999999999",
        "12.3400000000",
        1.2345678,
        0.1 + 0.2,
        1,
        1023,
        18446744073709551615,
        "ab  ",
        "héllo 😀 ''\"\\",
        "long 😀 text\n",
        b"\x01\x02",
        b"\x00\xff",
        bytes(range(256)),
        "9999-12-31",
        "838:59:59.999999",
        "838:59:59",
        "9999-12-31 23:59:59.999999",
        "2038-01-19 03:14:07.999999",
        2155,
        "z",
        "a,c",
        '{"k": [1, 2.50, "é"], "n": null}',
        7,
    ),
    (
        3,
        "frac",
        0,
        1,
        0,
        1,
        0,
        1,
        0,
        1,
        0,
        1,
        "0.0000",
        "0",
        "0E-10",
        16777217.0,
        1e-300,
        0,
        5,
        1,
        "x",
        "x",
        "x",
        b"\x00" * 6,
        b"\x00",
        b"\x00",
        "2024-02-29",
        "-00:00:01.250000",
        "-12:34:56",
        "2024-01-02 03:04:05.123456",
        "2024-06-01 12:00:00.5",
        0,
        "y",
        "a,b,c",
        "[1, 2]",
        0,
    ),
    (4, "nulls", *([None] * 34)),
]


def _insert_parity_rows(admin, t, rows):
    ph = ", ".join(["%s"] * len(PARITY_ROWS[0]))
    for r in rows:
        admin.execute(f"INSERT INTO `{DB}`.`{t}` ({PARITY_COLS}) VALUES ({ph})", r)


def test_type_parity_chunk_select_vs_binlog(make_dialect, admin, unique_name, tmp_path):
    """Every type: the chunk SELECT and the binlog give the same canonical row."""
    t = f"parity_{unique_name}"
    admin.execute(f"CREATE TABLE `{DB}`.`{t}` {PARITY_DDL}")
    try:
        d = make_dialect(t)
        d.ensure_watermark_table()
        schema = d.describe_table(TableName(DB, t))
        data = str(tmp_path)
        d.load_offset(data)
        _insert_parity_rows(admin, t, PARITY_ROWS)
        res = stage_changelog(d, data)
        assert res.events == len(PARITY_ROWS)
        logged = {e.key: e.after for e in read_log_events(str(Path(res.segment).parent))}

        chunk = tmp_path / "chunk.parquet"
        out = d.read_chunk(ChunkRead(schema, ChunkRange(), after_key=None, limit=100, path=str(chunk)))
        from airflow_provider_cdc.storage.staged import read_chunk_rows

        selected = dict(read_chunk_rows(str(chunk), schema.table.id))
        assert out.rows == len(PARITY_ROWS)
        assert selected.keys() == logged.keys()
        for key in selected:
            assert selected[key] == logged[key], key

        by_id = {decode_key(k)[0]: v for k, v in selected.items()}
        hi, lo, frac, nul = by_id[2], by_id[1], by_id[3], by_id[4]
        assert hi["bu"] == 18446744073709551615 and hi["b64"] == 18446744073709551615 and hi["b"] == 1023
        assert (
            hi["d"] == "9999999999999999.9999"
            and lo["dz"] == "-0.0000000001"
            and frac["dz"] == "0.0000000000"
        )
        assert hi["f"] == 1.2345678 and frac["f"] == 16777216.0 and hi["db"] == 0.30000000000000004
        assert hi["vc"] == "héllo 😀 ''\"\\" and hi["c"] == "ab" and hi["k2"] == "max 😀"
        assert (
            base64.b64decode(hi["bl"]) == bytes(range(256))
            and base64.b64decode(hi["bn"]) == b"\x01\x02" + b"\0" * 4
        )
        assert (
            hi["tm"] == "838:59:59.999999"
            and lo["tm"] == "-838:59:59.000000"
            and frac["tm"] == "-00:00:01.250000"
        )
        assert frac["t0"] == "-12:34:56.000000"
        assert hi["dtm"] == "9999-12-31T23:59:59.999999" and hi["ts"] == "2038-01-19T03:14:07.999999Z"
        assert hi["y"] == 2155 and frac["y"] == 0 and hi["s"] == "a,c" and lo["s"] == "" and hi["e"] == "z"
        assert json.loads(hi["j"]) == {"k": [1, 2.5, "é"], "n": None}
        assert all(v is None for k, v in nul.items() if k not in ("id", "k2"))
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


def test_timestamp_is_utc_whatever_the_writer_session_zone(make_dialect, mysql_uri, unique_name, tmp_path):
    t = f"tz_{unique_name}"
    with closing(_admin(mysql_uri, init_command="SET time_zone = '+05:30'")) as conn:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE `{DB}`.`{t}` (id INT PRIMARY KEY, ts TIMESTAMP(3) NULL, dtm DATETIME)")
        try:
            d = make_dialect(t)
            d.ensure_watermark_table()
            d.load_offset(str(tmp_path))
            cur.execute(
                f"INSERT INTO `{DB}`.`{t}` VALUES (1, '2024-03-10 05:30:00.250', '2024-03-10 05:30:00')"
            )
            res = stage_changelog(d, str(tmp_path))
            (ev,) = list(read_log_events(str(Path(res.segment).parent)))
            schema = d.describe_table(TableName(DB, t))
            (batch,) = list(d.stream_query(*d.chunk_query(schema, ChunkRange(), after_key=None, limit=10)))
            row = d.row_to_canonical(schema, batch[0])
            assert (
                ev.after
                == row
                == {"id": 1, "ts": "2024-03-10T00:00:00.250000Z", "dtm": "2024-03-10T05:30:00.000000"}
            )
        finally:
            cur.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


def test_zero_and_partial_dates_keep_their_text_both_ways(make_dialect, mysql_uri, unique_name, tmp_path):
    """'0000-00-00', '2020-00-00', '2020-05-00' name no day: both paths (SELECT and binlog)
    keep the server's text, so they stay distinct keys and a change of one is seen (not NULL)."""
    t = f"zero_{unique_name}"
    with closing(_admin(mysql_uri, init_command="SET sql_mode = ''")) as conn:
        cur = conn.cursor()
        cur.execute(
            f"CREATE TABLE `{DB}`.`{t}` (k DATETIME(6) PRIMARY KEY, id INT, d DATE, dtm DATETIME, ts TIMESTAMP NULL)"
        )
        try:
            d = make_dialect(t)
            d.load_offset(str(tmp_path))
            cur.execute(
                f"INSERT INTO `{DB}`.`{t}` VALUES ('0000-00-00 00:00:00', 1, '0000-00-00', '0000-00-00 00:00:00', "
                "'0000-00-00 00:00:00'), ('2020-00-00 00:00:00', 2, '2020-00-00', '2020-05-00 10:11:12', NULL), "
                "('2020-05-00 00:00:00.5', 3, '2020-05-00', NULL, NULL), "
                "('2024-01-01 00:00:00', 4, '2024-01-01', '2024-01-01 00:00:00', '1970-01-01 00:00:01')"
            )
            res = stage_changelog(d, str(tmp_path))
            logged = {e.after["id"]: e.after for e in read_log_events(str(Path(res.segment).parent))}
            keys = {e.after["id"]: e.key for e in read_log_events(str(Path(res.segment).parent))}
            schema = d.describe_table(TableName(DB, t))
            (batch,) = list(d.stream_query(*d.chunk_query(schema, ChunkRange(), after_key=None, limit=10)))
            selected = {r[1]: d.row_to_canonical(schema, r) for r in batch}
            assert selected == logged
            assert logged[1] == {"k": "0000-00-00T00:00:00.000000", "id": 1, "d": "0000-00-00",
                                 "dtm": "0000-00-00T00:00:00.000000", "ts": "0000-00-00T00:00:00.000000Z"}
            assert logged[2]["d"] == "2020-00-00" and logged[2]["dtm"] == "2020-05-00T10:11:12.000000"
            assert logged[3]["k"] == "2020-05-00T00:00:00.500000"
            assert logged[4]["ts"] == "1970-01-01T00:00:01.000000Z"
            assert len(set(keys.values())) == 4  # no two zero-date keys collapse into one
            # a keyset read after a zero-date key goes on from it (the bound is the server's text)
            after = decode_key(keys[1])
            (rest,) = list(d.stream_query(*d.chunk_query(schema, ChunkRange(), after_key=after, limit=10)))
            assert sorted(r[1] for r in rest) == [2, 3, 4]
            # done by subclassing the package's own events: the library stays as it is for others
            from pymysqlreplication import row_event

            assert row_event.RowsEvent._RowsEvent__read_date.__module__ == row_event.__name__
            assert not any(k.startswith("_RowsEvent__") for k in vars(row_event.WriteRowsEvent))
        finally:
            cur.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


def test_capture_transactions_positions_watermarks_and_resume(make_dialect, admin, unique_name, tmp_path):
    t = f"cap_{unique_name}"
    admin.execute(f"CREATE TABLE `{DB}`.`{t}` (id INT PRIMARY KEY, v VARCHAR(10))")
    try:
        d = make_dialect(t)
        d.ensure_watermark_table()
        data = str(tmp_path)
        first = BinlogOffset.from_json(d.load_offset(data))
        assert (tmp_path / "staging" / d.source / "changelog" / OFFSET_FILE).exists()
        admin.execute("BEGIN")
        admin.executemany(f"INSERT INTO `{DB}`.`{t}` VALUES (%s, %s)", [(i, "a") for i in range(5)])
        admin.execute("COMMIT")
        d.write_watermark(f"lw-{unique_name}")
        admin.execute(f"UPDATE `{DB}`.`{t}` SET v = 'b' WHERE id IN (1, 2)")
        admin.execute(f"UPDATE `{DB}`.`{t}` SET id = 10 WHERE id = 3")  # key change
        admin.execute(f"DELETE FROM `{DB}`.`{t}` WHERE id = 4")
        d.write_watermark(f"hw-{unique_name}")
        assert d.current_position() > d.current_position().__class__(first.index, first.pos)

        # max_events cuts only at a transaction boundary: the 5-row transaction comes whole
        batch = d.read_log(LogRead(d.load_offset(data), max_events=2))
        assert len(batch.events) == 5 and BinlogOffset.from_json(batch.end_offset) > first
        assert re.fullmatch(r"\d+-\d+-\d+", json.loads(batch.end_offset)["gtid"])  # MariaDB GTID
        res1 = stage_changelog(d, data, max_events=2)
        res2 = stage_changelog(d, data)
        assert res2.start_offset == res1.end_offset
        assert stage_changelog(d, data).events == 0  # caught up: nothing, offset unchanged

        events = list(read_log_events(str(tmp_path / "staging" / d.source / "changelog")))
        kinds = [
            ("w", e.id) if isinstance(e, WatermarkEvent) else (e.op, decode_key(e.key)[0]) for e in events
        ]
        assert kinds == [
            *[("c", i) for i in range(5)],
            ("w", f"lw-{unique_name}"),
            ("u", 1),
            ("u", 2),
            ("d", 3),
            ("c", 10),
            ("d", 4),
            ("w", f"hw-{unique_name}"),
        ]
        positions = [e.position for e in events]
        assert positions == sorted(positions) and len(set(positions)) == len(positions)
        assert positions[0].major == first.index and positions[0].minor >= first.pos
        # rows of one rows event share the offset and count up the index
        assert [p.index for p in positions[:5]] == [0, 1, 2, 3, 4]
        upd = [e for e in events if isinstance(e, ChangeEvent) and e.op == "u"]
        assert upd[0].before == {"id": 1, "v": "a"} and upd[0].after == {"id": 1, "v": "b"}
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


def test_a_savepoint_is_not_a_transaction_boundary(make_dialect, admin, unique_name, tmp_path):
    """MariaDB logs SAVEPOINT as a query event inside the transaction: max_events must not
    cut there (the offset would land mid-transaction and lose or repeat its rows)."""
    t = f"sp_{unique_name}"
    admin.execute(f"CREATE TABLE `{DB}`.`{t}` (id INT PRIMARY KEY)")
    try:
        d = make_dialect(t)
        data = str(tmp_path)
        d.load_offset(data)
        admin.execute("BEGIN")
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (1)")
        admin.execute("SAVEPOINT s1")
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (2)")
        admin.execute("ROLLBACK TO SAVEPOINT s1")
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (3)")
        admin.execute("COMMIT")
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (4)")
        first = stage_changelog(d, data, max_events=1)
        assert first.events == 2  # the whole first transaction: rows 1 and 3
        second = stage_changelog(d, data)
        assert second.events == 1 and second.start_offset == first.end_offset
        keys = [decode_key(e.key)[0] for e in read_log_events(str(Path(first.segment).parent))]
        assert keys == [1, 3, 4]
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


def test_capture_follows_a_binlog_rotation(make_dialect, admin, unique_name, tmp_path):
    t = f"rot_{unique_name}"
    admin.execute(f"CREATE TABLE `{DB}`.`{t}` (id INT PRIMARY KEY)")
    try:
        d = make_dialect(t)
        data = str(tmp_path)
        start = BinlogOffset.from_json(d.load_offset(data))
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (1)")
        admin.execute("FLUSH BINARY LOGS")
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (2)")
        res = stage_changelog(d, data)
        events = list(read_log_events(str(Path(res.segment).parent)))
        assert [decode_key(e.key)[0] for e in events] == [1, 2]
        assert events[1].position.major > events[0].position.major == start.index
        assert BinlogOffset.from_json(res.end_offset).index > start.index
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


def test_purged_binlog_says_resnapshot(make_dialect, tmp_path):
    d = make_dialect(all_tables=True)
    data = str(tmp_path)
    d.commit_offset(BinlogOffset.of("binlog.000000", 4).to_json(), data)
    with pytest.raises(SourceError, match="(?i)re-snapshot"):
        stage_changelog(d, data)
    # without the SHOW BINARY LOGS pre-check the server itself refuses (error 1236)
    d.log.check_not_purged = lambda start: None
    with pytest.raises(SourceError, match="(?i)re-snapshot") as err:
        stage_changelog(d, data)
    assert "binlog.000000" in str(err.value)
    end = d.binlog_end()
    d.commit_offset(BinlogOffset.of(end.file, end.pos + 10**9).to_json(), data)
    with pytest.raises(StateError, match="past the end"):
        stage_changelog(d, data)


def test_hostile_identifiers_round_trip(mysql_uri, admin, unique_name, tmp_path):
    """Backticks, quotes, spaces, semicolons and comment markers in database, table,
    column and watermark names: quoted everywhere, values bound."""
    db = f"cdc h`o'st;--{unique_name}"
    t = 'ta`b"le; DROP TABLE x; -- /*'
    q = lambda s: "`" + s.replace("`", "``") + "`"  # noqa: E731
    admin.execute(f"CREATE DATABASE {q(db)}")
    try:
        admin.execute(f"CREATE TABLE {q(db)}.{q(t)} ({q('k`ey')} VARCHAR(20) PRIMARY KEY, {q('v a;l')} INT)")
        d = get_dialect(
            ConnectionParams.from_uri(mysql_uri),
            source=f"mysql_h_{unique_name}",
            watermark_schema=db,
            watermark_table="w`m",
            tables=[TableName(db, t)],
        )
        with closing(d):
            d.ensure_watermark_table()
            data = str(tmp_path)
            d.load_offset(data)
            admin.execute(f"INSERT INTO {q(db)}.{q(t)} VALUES (%s, 1), (%s, 2)", ("a'); --", "b`"))
            d.write_watermark("hw'`;--")
            schema = d.describe_table(TableName(db, t))
            assert schema.primary_key == ("k`ey",)
            res = stage_changelog(d, data)
            events = list(read_log_events(str(Path(res.segment).parent)))
            assert [e.id for e in events if isinstance(e, WatermarkEvent)] == ["hw'`;--"]
            assert sorted(e.after["k`ey"] for e in events if isinstance(e, ChangeEvent)) == ["a'); --", "b`"]
            out = d.read_chunk(
                ChunkRead(schema, ChunkRange(), after_key=("a'); --",), limit=10, path=str(tmp_path / "c.parquet"))
            )
            assert out.rows == 1 and out.last_key == ("b`",)
            assert d.max_key(schema) == ("b`",)
            assert d.sample_keys(schema, 1) == [("a'); --",)]
    finally:
        admin.execute(f"DROP DATABASE IF EXISTS {q(db)}")


def test_chunks_are_keyset_pages_with_filter(make_dialect, admin, unique_name, tmp_path):
    t = f"chunk_{unique_name}"
    admin.execute(f"CREATE TABLE `{DB}`.`{t}` (a INT, b VARBINARY(4), v INT, PRIMARY KEY (a, b))")
    try:
        rows = [(a, bytes([b]), a * 10 + b) for a in range(4) for b in range(3)]
        admin.executemany(f"INSERT INTO `{DB}`.`{t}` VALUES (%s, %s, %s)", rows)
        d = make_dialect(t)
        schema = d.describe_table(TableName(DB, t))
        seen, after = [], None
        while True:
            res = d.read_chunk(
                ChunkRead(schema, ChunkRange(), after_key=after, limit=5, path=str(tmp_path / f"{len(seen)}.pq"))
            )
            if not res.rows:
                break
            import pyarrow.parquet as pq

            seen += [decode_key(r["key"]) for r in pq.read_table(tmp_path / f"{len(seen)}.pq").to_pylist()]
            after = res.last_key
        want = [(a, base64.b64encode(b).decode()) for a, b, _ in rows]
        assert seen == want
        res = d.read_chunk(
            ChunkRead(
                schema,
                ChunkRange((1, want[4][1]), (3, want[9][1])),
                after_key=None,
                limit=100,
                path=str(tmp_path / "r.pq"),
                where="`v` % 2 = 0",
            )
        )
        assert res.rows == len([r for r in rows if (1, 1) <= (r[0], r[1][0]) < (3, 0) and r[2] % 2 == 0])
        assert d.max_key(schema) == want[-1] and d.max_key(schema, where="`a` < 2") == want[5]
        sample = d.sample_keys(schema, 3)
        assert sample == sorted(sample) and 1 <= len(sample) <= 3 and set(sample) <= set(want)
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")


# --------------------------------------------------------------------------- shared suite

from tests.integration.dialect_suite import DialectSuite, ParityCase  # noqa: E402


class TestMySqlDialect(DialectSuite):
    """The shared dialect suite on MariaDB 10.11."""
    watermark_strategies = ("table", "log")  # "log" on MariaDB: consistent-snapshot positions

    table_schema = DB
    sql_types = {"int": "INT", "text": "VARCHAR(255)"}

    @pytest.fixture
    def source_uri(self, mysql_uri):
        return mysql_uri

    def make_dialect(self, uri, *, source, tables, watermark_table, **options):
        return get_dialect(
            ConnectionParams.from_uri(uri), source=source, tables=tables, watermark_table=watermark_table, **options
        )

    def connect(self, uri, *, autocommit):
        return _admin_conn(uri, autocommit=autocommit)

    def is_deadlock(self, exc):
        # 1213 deadlock victim, 1205 lock wait timeout: InnoDB rolls the writer back
        return isinstance(exc, pymysql.err.OperationalError) and exc.args[0] in (1213, 1205)

    def drop_session(self, ctx, dialect):
        session = dialect.server.conn.thread_id()
        ctx.execute(f"KILL CONNECTION {int(session)}")
        deadline = time.monotonic() + 10
        while ctx.execute("SELECT 1 FROM information_schema.PROCESSLIST WHERE ID = %s", (session,)):
            assert time.monotonic() < deadline, f"session {session} was not ended"
            time.sleep(0.02)

    def type_parity_cases(self):
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        return [
            ParityCase("ti", "TINYINT", "-128", -128),
            ParityCase("tu", "TINYINT UNSIGNED", "255", 255),
            ParityCase("si", "SMALLINT", "-32768", -32768),
            ParityCase("su", "SMALLINT UNSIGNED", "65535", 65535),
            ParityCase("mi", "MEDIUMINT", "-8388608", -8388608),
            ParityCase("mu", "MEDIUMINT UNSIGNED", "16777215", 16777215),
            ParityCase("i", "INT", "-2147483648", -2147483648),
            ParityCase("iu", "INT UNSIGNED", "4294967295", 4294967295),
            ParityCase("bi", "BIGINT", "-9223372036854775808", -9223372036854775808),
            ParityCase("bu", "BIGINT UNSIGNED", "18446744073709551615", 18446744073709551615),
            ParityCase("dec", "DECIMAL(20,4)", "-12.34", "-12.3400"),
            ParityCase("dec0", "DECIMAL(38,0)", "99999999999999999999999999999999999999", "9" * 38),
            ParityCase("fl", "FLOAT", "1.2345678", 1.2345678),
            ParityCase("dbl", "DOUBLE", "0.1e0 + 0.2e0", 0.30000000000000004),
            ParityCase("bit", "BIT(10)", "b'1000000101'", 517),
            ParityCase("ch", "CHAR(5)", "'ab  '", "ab"),
            ParityCase("vc", "VARCHAR(40)", "'héllo 😀 ''q'''", "héllo 😀 'q'"),
            ParityCase("tx", "TEXT", "'multi\\nline 😀'", "multi\nline 😀"),
            ParityCase("bn", "BINARY(4)", "x'0102'", b64(b"\x01\x02\x00\x00")),
            ParityCase("vb", "VARBINARY(8)", "x'00ff00'", b64(b"\x00\xff\x00")),
            ParityCase("bl", "BLOB", "x'deadbeef00'", b64(b"\xde\xad\xbe\xef\x00")),
            ParityCase("dt", "DATE", "'2024-02-29'", "2024-02-29"),
            ParityCase("tm", "TIME(6)", "'-838:59:59.5'", "-838:59:59.500000"),
            ParityCase("tm2", "TIME(3)", "'100:00:00.125'", "100:00:00.125000"),
            ParityCase("dtm", "DATETIME(6)", "'2024-01-02 03:04:05.123456'", "2024-01-02T03:04:05.123456"),
            ParityCase(
                "ts", "TIMESTAMP(6) NULL", "'2038-01-19 03:14:07.999999'", "2038-01-19T03:14:07.999999Z"
            ),
            ParityCase("yr", "YEAR", "2155", 2155),
            ParityCase("en", "ENUM('x','y','z')", "'y'", "y"),
            ParityCase("st", "SET('a','b','c')", "'c,a'", "a,c"),
            ParityCase("st0", "SET('a','b')", "''", ""),
            ParityCase("js", "JSON", '\'{"k": [1, 2.50, "é"]}\'', '{"k": [1, 2.50, "é"]}'),
        ]


def _admin_conn(uri, *, autocommit):
    p = ConnectionParams.from_uri(uri)
    return pymysql.connect(
        host=p.host,
        port=p.port or 3306,
        user=p.user or "root",
        password=p.password or "",
        charset="utf8mb4",
        autocommit=autocommit,
        init_command="SET time_zone = '+00:00'",
    )


def test_capture_without_table_list_takes_every_user_table_with_a_key(
    mysql_uri, admin, unique_name, tmp_path
):
    """The opt-in ``all_tables``: every table outside the system schemas and the watermark
    database; tables without a primary key are skipped (logged), never half-keyed."""
    t, nopk = f"all_{unique_name}", f"allnopk_{unique_name}"
    admin.execute(f"CREATE TABLE `{DB}`.`{t}` (id INT PRIMARY KEY, g BLOB)")
    admin.execute(f"CREATE TABLE `{DB}`.`{nopk}` (v INT)")
    d = get_dialect(
        ConnectionParams.from_uri(mysql_uri),
        source=f"mysql_all_{unique_name}",
        watermark_table=f"wm_{unique_name}",
        all_tables=True,
    )
    try:
        d.ensure_watermark_table()
        data = str(tmp_path)
        d.load_offset(data)
        admin.execute(f"INSERT INTO `{DB}`.`{t}` VALUES (1, x'ff00')")
        admin.execute(f"INSERT INTO `{DB}`.`{nopk}` VALUES (1)")
        d.write_watermark(f"w-{unique_name}")
        events = d.read_log(LogRead(d.load_offset(data))).events
        tables = {e.table for e in events if isinstance(e, ChangeEvent)}
        assert f"{DB}.{t}" in tables and f"{DB}.{nopk}" not in tables
        assert not any(name.startswith("cdc.") for name in tables)
        assert f"w-{unique_name}" in [e.id for e in events if isinstance(e, WatermarkEvent)]
        (mine,) = [e for e in events if isinstance(e, ChangeEvent) and e.table == f"{DB}.{t}"]
        assert mine.after == {"id": 1, "g": "/wA="}
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`, `{DB}`.`{nopk}`")
        d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
        d.close()


def test_truncate_is_staged_as_an_event_for_captured_tables_only(make_dialect, admin, unique_name, tmp_path):
    """TRUNCATE [TABLE] [db.]t (a statement in the binlog, no row deletes): a 't' event at its
    position for a captured table, whatever the statement's default database; none for others."""
    t, other = f"tr {unique_name}`x", f"tro_{unique_name}"
    qt = "`" + t.replace("`", "``") + "`"
    admin.execute(f"CREATE TABLE `{DB}`.{qt} (id INT PRIMARY KEY)")
    admin.execute(f"CREATE TABLE `{DB}`.`{other}` (id INT PRIMARY KEY)")
    try:
        d = make_dialect(t)
        data = str(tmp_path)
        d.load_offset(data)
        admin.execute(f"INSERT INTO `{DB}`.{qt} VALUES (1), (2)")
        admin.execute(f"TRUNCATE TABLE `{DB}`.{qt}")
        admin.execute(f"TRUNCATE `{DB}`.`{other}`")
        admin.execute(f"INSERT INTO `{DB}`.{qt} VALUES (3)")
        stage_changelog(d, data)
        events = [e for e in read_log_events(str(tmp_path / "staging" / d.source / "changelog"))
                  if isinstance(e, ChangeEvent)]
        assert [(e.table, e.op, e.key) for e in events] == [
            (f"{DB}.{t}", "c", "[1]"), (f"{DB}.{t}", "c", "[2]"), (f"{DB}.{t}", "t", None), (f"{DB}.{t}", "c", "[3]"),
        ]
        assert events[1].position < events[2].position < events[3].position
        d.log.on_truncate = "fail"
        admin.execute(f"TRUNCATE `{DB}`.{qt}")
        with pytest.raises(SourceError, match="TRUNCATE of .* on_truncate='fail'"):
            stage_changelog(d, data)
    finally:
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.{qt}")
        admin.execute(f"DROP TABLE IF EXISTS `{DB}`.`{other}`")


def test_a_source_read_entirely_from_a_replica_snapshots_under_writers_on_the_primary(
        mysql_uri, mysql_replica_uri, unique_name, tmp_path):
    """MariaDB: the source's connection names a replica that logs what it applies
    (log_slave_updates): chunks in consistent snapshots at the replica's binlog positions, capture
    from the replica's binlog, nothing on the primary but the application's writes. The merged
    chunks equal the table on the primary once the replica has caught up."""
    import random
    import threading
    import time

    from airflow_provider_cdc.core.ranges import FULL_RANGE
    from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
    from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.staged import read_chunk_rows, read_log_events

    from .dialect_suite import table_events

    t = TableName(DB, f"rep_{unique_name}")
    primary = _admin_conn(mysql_uri, autocommit=True)
    pc = primary.cursor()
    pc.execute(f"CREATE TABLE `{DB}`.`{t.name}` (id INT PRIMARY KEY, v VARCHAR(40), n INT)")
    pc.executemany(f"INSERT INTO `{DB}`.`{t.name}` VALUES (%s, %s, %s)", [(i, f"v{i}", i) for i in range(1, 401)])
    data = str(tmp_path / "data")
    d = get_dialect(ConnectionParams.from_uri(mysql_replica_uri), source=f"rep_{unique_name}", tables=[t],
                    watermark_strategy="log")
    stop, errors = threading.Event(), []

    def writer(seed: int) -> None:
        rnd = random.Random(seed)
        c = _admin_conn(mysql_uri, autocommit=True)
        try:
            cur = c.cursor()
            while not stop.is_set():
                k = rnd.randint(1, 450)
                if rnd.random() < 0.6:
                    cur.execute(f"UPDATE `{DB}`.`{t.name}` SET v = %s, n = n + 1 WHERE id = %s", (f"u{rnd.random()}", k))
                elif rnd.random() < 0.5:
                    cur.execute(f"DELETE FROM `{DB}`.`{t.name}` WHERE id = %s", (k,))
                else:
                    cur.execute(f"INSERT IGNORE INTO `{DB}`.`{t.name}` VALUES (%s, 'i', 0)", (k,))
                time.sleep(0.001)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            c.close()

    def caught_up() -> None:
        # the replica applied at least what the primary logged so far (MASTER_GTID_WAIT: the
        # other test session writes to the same primary, so the replica's position may pass it)
        pc.execute("SELECT @@gtid_binlog_pos")
        want = pc.fetchone()[0]
        rc = _admin_conn(mysql_replica_uri, autocommit=True)
        try:
            rcur = rc.cursor()
            rcur.execute("SELECT MASTER_GTID_WAIT(%s, 120)", (want,))
            if rcur.fetchone()[0] != 0:  # what the replica was doing names the test that held it up
                rcur.execute("SHOW SLAVE STATUS")
                st = dict(zip([c[0] for c in rcur.description], rcur.fetchone() or (), strict=False))
                pytest.fail(f"the replica did not reach {want} in 120 s: " + ", ".join(
                    f"{k} {st.get(k)!r}" for k in ("Gtid_Slave_Pos", "Seconds_Behind_Master",
                                                   "Slave_SQL_Running_State", "Last_SQL_Error")))
        finally:
            rc.close()

    try:
        caught_up()
        d.load_offset(data)
        threads = [threading.Thread(target=writer, args=(s,)) for s in range(2)]
        for th in threads:
            th.start()
        schema, results, after, seq = d.describe_table(t), [], None, 0
        try:
            while True:
                res = snapshot_chunk(d, schema, FULL_RANGE, data_dir=data, snapshot_id="rep", seq=seq, limit=40,
                                     after_key=after)
                results.append(res)
                seq += 1
                if res.exhausted:
                    break
                after = res.last_key
        finally:
            stop.set()
            for th in threads:
                th.join()
        assert not errors, errors
        caught_up()
        stage_changelog(d, data)
        events = list(read_log_events(changelog_dir(data, d.source)))
        chunks = [WindowChunk.from_result(r, read_chunk_rows(r.path, r.table)) for r in results]
        state = mirror_apply({}, table_events(events, t))
        mirror_apply(state, merge_window(chunks, events))
        pc.execute(f"SELECT id, v, n FROM `{DB}`.`{t.name}` ORDER BY id")
        on_primary = {f"[{i}]": {"id": i, "v": v, "n": n} for i, v, n in pc.fetchall()}
        assert mirror_rows(state, t.id) == on_primary and len(results) > 5
    finally:
        d.close()
        pc.execute(f"DROP TABLE IF EXISTS `{DB}`.`{t.name}`")
        primary.close()


def test_the_replica_lag_of_a_source_on_a_replica_is_read_and_a_stopped_replica_says_so(
        mysql_uri, mysql_replica_uri, unique_name):
    """A MariaDB source that is a replica reports how far it is behind its primary (the capture
    shows it, the snapshot throttles on it); with its SQL thread stopped the lag is infinite (the
    snapshot pauses), and it is finite again once replication runs. On the primary: None."""
    import time

    t = f"lag_{unique_name}"
    primary = _admin_conn(mysql_uri, autocommit=True)
    replica = _admin_conn(mysql_replica_uri, autocommit=True)
    assert get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"lagp_{unique_name}").replica_lag() is None
    d = get_dialect(ConnectionParams.from_uri(mysql_replica_uri), source=f"lag_{unique_name}")
    try:
        behind, seconds = d.replica_lag()
        assert behind >= 0 and 0 <= seconds < float("inf")
        replica.cursor().execute("STOP SLAVE SQL_THREAD")
        try:
            primary.cursor().execute(f"CREATE TABLE `{DB}`.`{t}` (id INT PRIMARY KEY)")
            primary.cursor().execute(f"INSERT INTO `{DB}`.`{t}` VALUES (1), (2)")
            assert d.replica_lag()[1] == float("inf")
        finally:
            replica.cursor().execute("START SLAVE SQL_THREAD")
        for _ in range(600):
            if d.replica_lag()[1] < float("inf"):
                break
            time.sleep(0.05)
        assert d.replica_lag()[1] < float("inf")
    finally:
        d.close()
        primary.cursor().execute(f"DROP TABLE IF EXISTS `{DB}`.`{t}`")
        primary.close()
        replica.close()


def test_a_replica_source_must_log_what_it_applies(mysql_uri, mysql_replica_uri, unique_name):
    """A source that is a replica is captured from its own binlog: with log_slave_updates OFF it
    would hold none of the primary's changes, and the start refuses it, naming the setting and
    the primary. The private replica runs with it ON and passes; OFF needs a restart, so that
    answer is injected into the real check (the rest of the check is the server's)."""
    d = get_dialect(ConnectionParams.from_uri(mysql_replica_uri), source=f"rp_{unique_name}")
    p = get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"rpp_{unique_name}")
    try:
        assert d.replica_problems() == [] and d.replica_of() is not None
        for dialect in (d, p):
            dialect.server.query = _with_log_slave_updates_off(dialect.server.query)
        with pytest.raises(SourceError, match=r"is a replica \(of 127\.0\.0\.1:\d+\) and log_slave_updates is OFF.*"
                                              r"log_slave_updates=ON"):
            d.check_prerequisites()
        assert p.replica_problems() == []  # a primary: nothing to log
    finally:
        d.close()
        p.close()


def _with_log_slave_updates_off(query):
    def answer(sql, params=()):
        rows = query(sql, params)
        if not sql.startswith("SHOW GLOBAL VARIABLES"):
            return rows
        return [(n, "OFF" if n.lower() in ("log_slave_updates", "log_replica_updates") else v) for n, v in rows]

    return answer
