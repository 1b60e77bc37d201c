"""The compiled binlog rows walker (dialects/mysql/rows_walker.py, _rows.c) against the
pure-Python reader (mysql-replication + types.binlog_converter), on the private MariaDB.

The same binlog range is captured twice, ``rows_decoder="python"`` and ``"compiled"``: the
staged segments must be identical (names, typed columns, schema metadata) for a table of every
type the project supports with NULLs and edge values (zero dates, negative and 65-digit
decimals, max and unsigned ints, BIT(64), BLOB/TEXT of every length prefix, ENUM/SET of 2 and
8 bytes, fractional TIME/DATETIME/TIMESTAMP of each precision, FLOAT/DOUBLE extremes, JSON),
key-changing updates, segments cut inside a large transaction, a held (non-transactional)
group, events and tables the walker leaves to the pure-Python reader (a minimal row image, a
latin1 column, a FLOAT key).
"""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pymysql
import pytest

from airflow_provider_cdc.core.event_batch import EventBatch
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, LogRead, get_dialect
from airflow_provider_cdc.dialects.mysql import binlog_read, packets, rows_walker
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments, read_log_events

DB = "cdc_test"

pytestmark = pytest.mark.skipif(not rows_walker.available(), reason="the compiled rows walker is not built")

E2 = [f"v{i}" for i in range(300)]  # an ENUM of 300 values: 2-byte indexes
S64 = [f"m{i}" for i in range(64)]  # a SET of 64 members: 8-byte bitmaps
DDL = f"""(
  id INT NOT NULL, k2 VARCHAR(40) NOT NULL,
  ti TINYINT, tu TINYINT UNSIGNED, si SMALLINT, su SMALLINT UNSIGNED, mi MEDIUMINT, mu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
  d1 DECIMAL(1,0), d5 DECIMAL(5,5), d9 DECIMAL(9,4), d14 DECIMAL(14,2), d18 DECIMAL(18,9), d38 DECIMAL(38,10),
  d65 DECIMAL(65,30), f FLOAT, db DOUBLE,
  b1 BIT(1), b9 BIT(9), b63 BIT(63), b64 BIT(64),
  c CHAR(5), c255 CHAR(255), vc VARCHAR(40), vl VARCHAR(2000), tt TINYTEXT, tx TEXT, mt MEDIUMTEXT, lt LONGTEXT,
  bn BINARY(6), vb VARBINARY(300), tb TINYBLOB, bl BLOB, mb MEDIUMBLOB, lb LONGBLOB,
  dt DATE, tm TIME, tm1 TIME(1), tm3 TIME(3), tm6 TIME(6),
  dtm DATETIME, dtm2 DATETIME(2), dtm5 DATETIME(5), dtm6 DATETIME(6),
  ts TIMESTAMP NULL, ts3 TIMESTAMP(3) NULL, ts6 TIMESTAMP(6) NULL, y YEAR,
  e ENUM('x','y','z'), e2 ENUM({", ".join(f"'{v}'" for v in E2)}), s SET('a','b','c'),
  s64 SET({", ".join(f"'{v}'" for v in S64)}), j JSON, n INT NULL,
  PRIMARY KEY (id, k2)) ENGINE=InnoDB"""
COLS = ("id k2 ti tu si su mi mu i iu bi bu d1 d5 d9 d14 d18 d38 d65 f db b1 b9 b63 b64 c c255 vc vl tt tx mt lt "
        "bn vb tb bl mb lb dt tm tm1 tm3 tm6 dtm dtm2 dtm5 dtm6 ts ts3 ts6 y e e2 s s64 j n").split()

MIN = dict(
    id=1, k2="min", ti=-128, tu=0, si=-32768, su=0, mi=-8388608, mu=0, i=-2147483648, iu=0,
    bi=-9223372036854775808, bu=0, d1="-9", d5="-0.99999", d9="-99999.9999", d14="-999999999999.99",
    d18="-999999999.999999999", d38="-" + "9" * 28 + "." + "9" * 10, d65="-" + "9" * 35 + "." + "9" * 30,
    f=-3.4e38, db=-1.7976931348623157e308, b1=0, b9=0, b63=0, b64=0, c="", c255="", vc="", vl="", tt="", tx="",
    mt="", lt="", bn=b"", vb=b"", tb=b"", bl=b"", mb=b"", lb=b"", dt="1000-01-01", tm="-838:59:59",
    tm1="-838:59:58.9", tm3="-00:00:00.001", tm6="-838:59:59.000000", dtm="1000-01-01 00:00:00",
    dtm2="1000-01-01 00:00:00.01", dtm5="1000-01-01 00:00:00.00001", dtm6="1000-01-01 00:00:00.000001",
    ts="1970-01-01 00:00:01", ts3="1970-01-01 00:00:01.001", ts6="1970-01-01 00:00:01.000001", y=1901, e="x",
    e2="v0", s="", s64="", j="{}", n=-1,
)
MAX = dict(
    id=2, k2="max 😀", ti=127, tu=255, si=32767, su=65535, mi=8388607, mu=16777215, i=2147483647, iu=4294967295,
    bi=9223372036854775807, bu=18446744073709551615, d1="9", d5="0.99999", d9="99999.9999", d14="999999999999.99",
    d18="999999999.999999999", d38="9" * 28 + "." + "9" * 10, d65="9" * 35 + "." + "9" * 30,
    f=3.4e38, db=1.7976931348623157e308, b1=1, b9=511, b63=2**63 - 1, b64=2**64 - 1, c="ab  ", c255="é" * 255,
    vc="héllo 😀 ''\"\\\x01\t\n", vl="😀" * 2000, tt="t" * 255, tx="x" * 65535, mt="m" * 70_000, lt="l😀" * 50_000,
    bn=b"\x01\x02", vb=bytes(range(256)) + b"\0" * 44, tb=b"\xff" * 255, bl=bytes(range(256)) * 256,
    mb=b"\x00\x01" * 35_000, lb=b"\xfe" * 200_000, dt="9999-12-31", tm="838:59:59", tm1="838:59:59.9",
    tm3="12:34:56.789", tm6="838:59:59.999999", dtm="9999-12-31 23:59:59", dtm2="9999-12-31 23:59:59.99",
    dtm5="9999-12-31 23:59:59.99999", dtm6="9999-12-31 23:59:59.999999", ts="2038-01-19 03:14:07",
    ts3="2038-01-19 03:14:07.999", ts6="2038-01-19 03:14:07.999999", y=2155, e="z", e2="v299", s="a,c",
    s64=",".join(S64), j='{"k": [1, 2.50, "é"], "n": null}', n=2**31 - 1,
)
EDGE = dict(  # zero and partial dates (sql_mode ''), fractions below a second, small floats, zero decimals
    id=3, k2="zero", ti=0, tu=1, si=-1, su=1, mi=-1, mu=1, i=-1, iu=1, bi=-1, bu=2**63, d1="0", d5="0.00001",
    d9="-0.0001", d14="0.00", d18="-0.000000001", d38="0.0000000001", d65="-0." + "0" * 29 + "1", f=1.17549435e-38,
    db=5e-324, b1=1, b9=256, b63=2**62, b64=2**63, c="x", c255="y", vc="z", vl="w", tt="\x00", tx="😀", mt="é",
    lt="\\", bn=b"\0" * 6, vb=b"\0", tb=b"\0", bl=b"\0", mb=b"\0", lb=b"\0", dt="0000-00-00", tm="-00:00:01",
    tm1="-00:00:01.5", tm3="-00:00:01.250", tm6="-00:00:00.000001", dtm="0000-00-00 00:00:00",
    dtm2="2020-05-00 10:11:12.25", dtm5="2020-00-00 00:00:00.5", dtm6="2024-02-29 23:59:59.5",
    ts="0000-00-00 00:00:00", ts3="2024-06-01 12:00:00.5", ts6="1970-01-01 00:00:00.5", y=0, e="y", e2="v255",
    s="a,b,c", s64="m0,m63", j="[1, 2]", n=0,
)
NULLS = dict(id=4, k2="nulls", **{c: None for c in COLS[2:]})
QUOTED = dict(MIN, id=5, k2='k"\\\x01\n\t😀', d38="12.5", n=5)  # a key JSON must escape


def _connect(mysql_uri: str, **kw) -> pymysql.connections.Connection:
    p = ConnectionParams.from_uri(mysql_uri)
    return pymysql.connect(host=p.host, port=p.port or 3306, user=p.user or "root", password=p.password or "",
                           charset="utf8mb4", autocommit=True,
                           init_command="SET sql_mode = '', time_zone = '+00:00'", **kw)


def _insert(cur, table: str, rows: list[dict]) -> None:
    ph = ", ".join(["%s"] * len(COLS))
    cur.executemany(f"INSERT INTO {table} ({', '.join(COLS)}) VALUES ({ph})", [[r[c] for c in COLS] for r in rows])


def _bulk(n: int, start: int) -> list[dict]:
    out = []
    for k in range(start, start + n):
        base = (MIN, MAX, EDGE, NULLS)[k % 4]
        r = dict(base, id=k, k2=f"bulk-{k}")
        if k % 4 != 3:
            r.update(i=k * 7919 % 1_000_003 - 500_000, vc=f"row {k} 😀", d14=f"{k}.{k % 100:02d}",
                     bl=bytes([k % 256]) * (k % 300))
        if k % 4 == 1:  # keep the bulk rows small: the large values are tested by MAX itself
            r.update(mt="m", lt="l", tx="x", bl=b"b", mb=b"m", lb=b"l", vl="v")
        out.append(r)
    return out


def _capture(mysql_uri: str, source: str, wm: str, tables: list[str], start: str, data: Path, decoder: str):
    d = get_dialect(ConnectionParams.from_uri(mysql_uri), source=source, watermark_schema="cdc", watermark_table=wm,
                    tables=[TableName(DB, t) for t in tables], rows_decoder=decoder)
    try:
        d.commit_offset(start, str(data))
        res = stage_changelog(d, str(data), segment_max_events=300)
        segments = list_segments(changelog_dir(str(data), source))
        return d, res, segments
    finally:
        d.close()


def test_compiled_walker_stages_exactly_what_the_pure_python_reader_stages(mysql_uri, unique_name, tmp_path,
                                                                           monkeypatch):
    t, aria, latin, fkey = (f"rw_{unique_name}", f"rw_aria_{unique_name}", f"rw_latin_{unique_name}",
                            f"rw_fkey_{unique_name}")
    other = f"rw_other_{unique_name}"  # not captured
    q = f"`{DB}`.`{t}`"
    with closing(_connect(mysql_uri)) as conn:
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {q} {DDL}")
        cur.execute(f"CREATE TABLE `{DB}`.`{aria}` (id INT PRIMARY KEY, d DECIMAL(10,3), s VARCHAR(20), "
                    "dt DATETIME(3)) ENGINE=Aria")
        cur.execute(f"CREATE TABLE `{DB}`.`{latin}` (id INT PRIMARY KEY, s VARCHAR(20) CHARACTER SET latin1, "
                    "u VARCHAR(20)) ENGINE=InnoDB")
        cur.execute(f"CREATE TABLE `{DB}`.`{fkey}` (k DOUBLE PRIMARY KEY, v INT) ENGINE=InnoDB")
        tables = [t, aria, latin, fkey]
        probe = get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"rw_{unique_name}", watermark_schema="cdc",
                            watermark_table=f"wm_{unique_name}", tables=[TableName(DB, x) for x in tables])
        try:
            probe.ensure_watermark_table()
            start = probe.binlog_end().to_json()

            # one multi-row INSERT, then updates (one changing the key), bulk rows in one large
            # transaction (cut into segments inside it), deletes
            _insert(cur, q, [MIN, MAX, EDGE, NULLS, QUOTED])
            cur.execute(f"UPDATE {q} SET vc = CONCAT(IFNULL(vc, ''), 'u'), n = IFNULL(n, 0) + 1")
            cur.execute(f"UPDATE {q} SET k2 = CONCAT(k2, '-moved'), f = -0.0 WHERE id = 2")
            cur.execute("BEGIN")
            _insert(cur, q, _bulk(3000, 100))
            cur.execute(f"UPDATE {q} SET bu = bu DIV 3, d65 = -d65 WHERE id >= 100 AND id < 700")
            cur.execute("COMMIT")
            cur.execute(f"DELETE FROM {q} WHERE id >= 2000 AND id < 2300")
            # a new binlog file mid-range (the table ids mapped before it are forgotten), and
            # single-row transactions of a captured and of an uncaptured table after it
            cur.execute("FLUSH BINARY LOGS")
            cur.execute(f"CREATE TABLE `{DB}`.`{other}` (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
            for k in range(5):
                cur.execute(f"INSERT INTO `{DB}`.`{other}` VALUES ({k}, {k})")
                cur.execute(f"UPDATE {q} SET n = IFNULL(n, 0) + {k} WHERE id = 3")
            # a minimal row image: the DELETE logs only the key (the walker leaves it to the reference)
            cur.execute("SET SESSION binlog_row_image = 'MINIMAL'")
            cur.execute(f"DELETE FROM {q} WHERE id = 1")
            cur.execute("SET SESSION binlog_row_image = 'FULL'")
            # a held group (Aria is not transactional), a latin1 column, a FLOAT key
            cur.execute(f"INSERT INTO `{DB}`.`{aria}` VALUES (1, -1.5, 'a', '2024-01-01 00:00:00.5'), "
                        "(2, NULL, NULL, '0000-00-00 00:00:00')")
            cur.execute(f"UPDATE `{DB}`.`{aria}` SET id = 3 WHERE id = 1")
            cur.execute(f"INSERT INTO `{DB}`.`{latin}` VALUES (1, 'caf\u00e9', 'caf\u00e9 😀')")
            cur.execute(f"INSERT INTO `{DB}`.`{fkey}` VALUES (1.5, 1), (-0.25, 2)")
            probe.write_watermark(f"wm-{unique_name}")  # a watermark event among the runs
            cur.execute(f"INSERT INTO {q} (id, k2, n) VALUES (9999, 'after watermark', 1)")

            src = f"rw_{unique_name}"
            wm = f"wm_{unique_name}"
            _, ref, ref_segs = _capture(mysql_uri, src, wm, tables, start, tmp_path / "python", "python")
            # the read loop takes common events from their packets (packets.py): count them
            fast = [0]
            real_fast_rows = binlog_read._BinlogRead.fast_rows

            def counted(self, *args):
                fast[0] += 1
                return real_fast_rows(self, *args)

            monkeypatch.setattr(binlog_read._BinlogRead, "fast_rows", counted)
            _, got, got_segs = _capture(mysql_uri, src, wm, tables, start, tmp_path / "compiled", "compiled")
            monkeypatch.setattr(binlog_read._BinlogRead, "fast_rows", real_fast_rows)
            assert fast[0] >= 10
            # the same range with every event built by mysql-replication (RawStream off)
            monkeypatch.setattr(packets.RawStream, "of", classmethod(lambda cls, stream: None))
            _, lib, lib_segs = _capture(mysql_uri, src, wm, tables, start, tmp_path / "library", "compiled")
            monkeypatch.undo()
            # a rows event the walker refuses (fault injected: every other one) is read the pure-Python way
            calls = [0]
            real = rows_walker._rows

            def refuse_every_other(*args):
                calls[0] += 1
                if calls[0] % 2:
                    raise ValueError("injected")
                return real.decode(*args)

            monkeypatch.setattr(rows_walker, "_rows", SimpleNamespace(decode=refuse_every_other))
            _, mixed, mixed_segs = _capture(mysql_uri, src, wm, tables, start, tmp_path / "mixed", "compiled")
            monkeypatch.setattr(rows_walker, "_rows", real)
            assert calls[0] > 10 and mixed.events == ref.events

            assert ref.events == got.events == lib.events > 3000
            # each capture's end is a group end whose GTID position is the server's there (the four
            # ends may differ: other tests write to the same server between the captures)
            for res in (ref, got, lib, mixed):
                o = json.loads(res.end_offset)
                cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (o["file"], o["pos"]))
                assert o["gtid"] == cur.fetchone()[0], res.end_offset
            assert [Path(p).name for *_, p in ref_segs] == [Path(p).name for *_, p in got_segs]
            assert len(ref_segs) >= 5  # cut inside the large transaction
            for (*_, rp), (*_, gp), (*_, mp), (*_, lp) in zip(ref_segs, got_segs, mixed_segs, lib_segs, strict=True):
                a = pq.read_table(rp)
                for b in (pq.read_table(gp), pq.read_table(mp), pq.read_table(lp)):
                    assert a.schema.equals(b.schema, check_metadata=True), Path(rp).name
                    for name in a.column_names:
                        assert a[name].equals(b[name]), (Path(rp).name, name)
            ref_events = list(read_log_events(str(changelog_dir(str(tmp_path / "python"), src))))
            got_events = list(read_log_events(str(changelog_dir(str(tmp_path / "compiled"), src))))
            assert got_events == ref_events

            # the values themselves (the reference could be wrong the same way): a few edges
            changes = [e for e in got_events if isinstance(e, ChangeEvent)]
            assert len(changes) == len(got_events) - 1  # and the watermark
            after = {(e.table, e.key): e.after for e in changes if e.op in ("c", "u")}
            mx = after[(f"{DB}.{t}", '[2,"max 😀-moved"]')]
            assert mx["bu"] == 18446744073709551615 and mx["b64"] == 18446744073709551615 and mx["b9"] == 511
            assert mx["d65"] == "9" * 35 + "." + "9" * 30 and mx["d38"] == "9" * 28 + "." + "9" * 10
            assert mx["tm6"] == "838:59:59.999999" and mx["ts6"] == "2038-01-19T03:14:07.999999Z"
            assert mx["e2"] == "v299" and mx["s64"] == ",".join(S64) and len(mx["lt"]) == 100_000
            edge = after[(f"{DB}.{t}", '[3,"zero"]')]
            assert edge["dt"] == "0000-00-00" and edge["dtm5"] == "2020-00-00T00:00:00.500000"
            assert edge["ts"] == "0000-00-00T00:00:00.000000Z" and edge["ts6"] == "1970-01-01T00:00:00.500000Z"
            assert edge["tm3"] == "-00:00:01.250000" and edge["tm6"] == "-00:00:00.000001" and edge["y"] == 0
            assert edge["d65"] == "-0." + "0" * 29 + "1" and edge["d9"] == "-0.0001" and edge["db"] == 5e-324
            assert (f"{DB}.{t}", '[5,"k\\"\\\\\\u0001\\n\\t😀"]') in after
            ops = [e.op for e in changes if e.table == f"{DB}.{t}" and e.key.startswith("[2,")]
            assert ops == ["c", "u", "d", "c"]  # the key change: a delete of the old key, a create of the new
            minimal = [e for e in changes if e.op == "d" and e.key == '[1,"min"]']
            assert len(minimal) == 1 and minimal[0].before == {"id": 1, "k2": "min"}

            # the compiled run did decode them: typed image parts straight from the walker
            d = get_dialect(ConnectionParams.from_uri(mysql_uri), source=src, watermark_schema="cdc",
                            watermark_table=wm, tables=[TableName(DB, x) for x in tables], rows_decoder="compiled")
            try:
                batch = d.read_log(LogRead(start))
                assert isinstance(batch.events, EventBatch)
                typed = {p.table for p in batch.events.parts if p.typed}
                assert typed == {f"{DB}.{t}"}  # Aria's held rows, latin1 and the FLOAT key: canonical dicts
                # canonical dicts: the held (Aria) rows, latin1, the FLOAT key and the minimal-image delete
                loose = {p.table: len(p.rows) for p in batch.events.parts if not p.typed}
                assert loose == {f"{DB}.{aria}": 4, f"{DB}.{latin}": 1, f"{DB}.{fkey}": 2, f"{DB}.{t}": 1}
            finally:
                d.close()
        finally:
            for x in [*tables, other]:
                cur.execute(f"DROP TABLE IF EXISTS `{DB}`.`{x}`")
            probe._query(f"DROP TABLE IF EXISTS {probe.quote_table(probe.watermark_table)}")
            probe.close()


def test_compiled_decoder_selected_by_the_connection_extra(mysql_uri, unique_name, monkeypatch):
    from airflow_provider_cdc.core.errors import ConfigurationError
    from airflow_provider_cdc.hooks.cdc_source import CdcSourceHook

    assert rows_walker.decoder_mode(None) == "compiled"
    assert rows_walker.decoder_mode("python") == "python"
    assert rows_walker.decoder_mode("compiled") == "compiled"
    with pytest.raises(ConfigurationError, match="'auto', 'compiled' or 'python'"):
        rows_walker.decoder_mode("fast")
    # the choice is one source's connection extra (never a process-wide environment variable)
    conn_id = f"cdc_walker_{unique_name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", f"{mysql_uri}?rows_decoder=python")
    with CdcSourceHook(conn_id, tables=[]).get_dialect() as d:
        assert d.options.get("rows_decoder") == "python"
    # a machine where the extension was not built (fault injected): auto reads the Python way,
    # compiled says what to install
    monkeypatch.setattr(rows_walker, "_rows", None)
    assert rows_walker.decoder_mode(None) == "python"
    with pytest.raises(ConfigurationError, match="python3-dev"):
        rows_walker.decoder_mode("compiled")
