"""verify by range digests (pipeline/verify.py ``verify_digests``) against the real databases.

The source computes each key range's (row count, XOR of row digests) in SQL, the mirror the same
digests with duckdb over its typed columns; only ranges that differ are descended into, and
their rows compared as the row-by-row verify compares them. Checked here: every supported type's
digest is equal on both sides when the values are and differs when one value differs; an equal
mirror gives 0 mismatched on PostgreSQL 15, 18 and MariaDB; one changed row of 200,000 is named
exactly, with the report and repair conf of the row-by-row verify; missing and extra rows; the
tables verify must compare row by row (a type without a digest form, text keys in a collation)
still are, and say why; text keys in a collation (row digests matched by key).
"""

from __future__ import annotations

import uuid

import psycopg2
import pyarrow as pa
import pytest

from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import TableName, encode_key, encode_row
from airflow_provider_cdc.core.throttle import Throttle
from airflow_provider_cdc.dialects import get_dialect
from airflow_provider_cdc.dialects.base import ConnectionParams
from airflow_provider_cdc.pipeline.verify import (
    MirrorDigests,
    SourceDigests,
    digest_problems,
    source_chunks,
    verify_table,
)
from airflow_provider_cdc.sinks.mirror_delta import events_to_mirror_rows, upsert
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import mirror_dir

from .helpers import MY_COLUMNS, PG_COLUMNS, _my_conn

pytestmark = pytest.mark.integration

ROWS = 200_000

# a second value of each column's type (row 3), as SQL literals: one value differs per check
PG_OTHER = {
    "i2": "32767", "i8": "-1", "f4": "-0.25", "f8": "1e300", "f8n": "'Infinity'", "num": "-0.01", "numneg": "99.9",
    "numfree": "'NaN'", "b": "false", "t": "'x,y:1'", "vc": "''", "nm": "'n'", "o": "0", "dom": "8",
    "ch": "'abc  '", "by": "'\\x00'::bytea", "d": "'0044-03-15 BC'", "tm": "'00:00:00'", "tm3": "'23:59:59.999'",
    "ts": "'1900-01-01 00:00:00.000001'", "ts3": "'-infinity'", "tsinf": "'2024-01-15 10:30:00'",
    "tstz": "'1970-01-01 00:00:00+00'", "tstz3": "'infinity'", "tstz0": "'2262-04-11 23:47:16+00'",
    "ttz": "'00:00:00+14'", "iv": "'-1 year'", "u": "'00000000-0000-0000-0000-000000000000'", "j": "'[]'",
    "jb": "'{\"b\": [1, 2]}'", "x": "'<b/>'", "ip": "'::1'", "mac": "'ff:ff:ff:ff:ff:ff'", "net": "'::/0'",
    "mac8": "'00:00:00:00:00:00:00:01'", "vb": "B'10101'", "bt": "B'000'", "b1": "B'0'", "mood": "'sad'",
    "n": "'not null'",
}
MY_OTHER = {
    "ti": "127", "bo": "0", "tu": "0", "si": "1", "su": "0", "mi": "8388607", "i": "-2147483648", "iu": "0",
    "bi": "9223372036854775807", "bu": "0", "f": "-2.5", "dbl": "1e300", "dec": "-99999999.99", "c": "''",
    "vc": "'a,b:c'", "tx": "'x'", "mt": "''", "bn": "x'0000'", "bl": "x''", "vb": "x'00'", "d": "'1000-01-01'",
    "zd": "'2020-00-00'", "tm": "'00:00:00.000001'", "tm0": "'-00:00:01'", "dt": "'0000-00-00 00:00:00'",
    "dt3": "'9999-12-31 23:59:59.999'", "dt6": "'1969-12-31 23:59:59.999999'", "ts": "'1970-01-01 00:00:01'",
    "ts6": "'2038-01-19 03:14:07.999999'", "y": "0", "e": "'small'", "st": "''", "b1": "b'0'",
    "b10": "b'0'", "j": "'[]'", "n": "'not null'",
}


def build_mirror(d, schema, data_dir: str, source: str) -> None:
    """The mirror of the source's rows as they are now, written as the sinks write it (typed)."""
    keys, rows = [], []
    for chunk in source_chunks(d, schema, 50_000):
        for k, r in chunk:
            keys.append(k)
            rows.append(encode_row(r))
    if not keys:
        return
    for lo in range(0, len(keys), 100_000):
        part = slice(lo, lo + 100_000)
        n = len(keys[part])
        events = pa.table({"table": [schema.table.id] * n, "op": ["r"] * n, "key": keys[part],
                           "position": [Position(1).encode()] * n, "after": rows[part]})
        upsert(mirror_dir(data_dir, source, schema.table), events_to_mirror_rows(schema, events))


def digests_equal(d, schema, data_dir: str, source: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(source's (count, xor) of the whole table, the mirror's)."""
    src = SourceDigests(d, schema, Throttle(parallelism=1))
    try:
        s = src.digest(None, None)
    finally:
        src.close()
    m = read_mirror(data_dir, source, schema.table, with_meta=True)
    md = MirrorDigests(schema)
    h = md(m)
    md.close()
    x = 0
    for v in h.tolist():
        x ^= v
    return s, (m.num_rows, x)


# --- every type -----------------------------------------------------------------------------------
@pytest.fixture
def pg_every_type(request, tmp_path):
    uri = request.getfixturevalue(request.param)
    u = uuid.uuid4().hex[:10]
    conn = psycopg2.connect(uri)
    conn.autocommit = True
    cur = conn.cursor()
    enum, domain = f"mood_{u}", f"posint_{u}"
    cur.execute(f"CREATE TYPE {enum} AS ENUM ('happy', 'sad')")
    cur.execute(f"CREATE DOMAIN {domain} AS integer CHECK (VALUE > 0)")
    t = TableName("public", f"vd_{u}")
    try:
        cur.execute("SELECT '<a/>'::xml")
        skip = ()
    except psycopg2.errors.FeatureNotSupported:  # a server built without libxml (the embedded PostgreSQL 18)
        skip = ("xml",)
    cols = [(c, ty.replace("{enum}", enum).replace("{domain}", domain), lit) for c, ty, lit, *_ in PG_COLUMNS
            if not ty.endswith("[]") and ty not in skip]  # arrays: no digest form (tested below)
    cur.execute(f'CREATE TABLE public."{t.name}" ("id" integer PRIMARY KEY, '
                + ", ".join(f'"{c}" {ty}' for c, ty, _ in cols) + ")")
    names = ", ".join(f'"{c}"' for c, _, _ in cols)
    cur.execute(f'INSERT INTO public."{t.name}" ("id", {names}) VALUES (1, {", ".join(lit for _, _, lit in cols)})')
    cur.execute(f'INSERT INTO public."{t.name}" ("id") VALUES (2)')
    cur.execute(f'INSERT INTO public."{t.name}" ("id", {names}) VALUES (3, {", ".join(PG_OTHER[c] for c, _, _ in cols)})')
    d = get_dialect(ConnectionParams.from_uri(uri), source=f"vd{u}", tables=[t], watermark_table=f"wm_{u}")
    try:
        yield d, cur, t, cols, str(tmp_path / "data")
    finally:
        d.close()
        cur.execute(f'DROP TABLE IF EXISTS public."{t.name}"')
        cur.execute(f"DROP TYPE IF EXISTS {enum}")
        cur.execute(f"DROP DOMAIN IF EXISTS {domain}")
        conn.close()


def _each_type_digest(d, cur, t, cols, data, qt: str, q) -> None:
    schema = d.describe_table(t)
    assert digest_problems(d, schema) == []
    build_mirror(d, schema, data, d.source)
    s, m = digests_equal(d, schema, data, d.source)
    assert s == m, "equal rows, equal digests"
    res = verify_table(d, data, d.source, t)
    assert res.method == "digests" and res.ok and res.rows_checked == 3, res.to_dict()
    for c, ty, lit in cols:
        # one value of this type differs (row 1 takes row 3's): the source's digest changes, the mirror's not
        cur.execute(f"UPDATE {qt} SET {q(c)} = (SELECT {q(c)} FROM {qt} WHERE {q('id')} = 3) WHERE {q('id')} = 1")  # noqa: S608
        s2, m2 = digests_equal(d, schema, data, d.source)
        assert m2 == m and s2[0] == 3 and s2 != m2, f"{c} ({ty}): a changed value must change the digest"
        res = verify_table(d, data, d.source, t)
        assert res.different == 1 and res.examples[0].key == "[1]" and res.examples[0].columns == (c,), \
            (c, ty, res.to_dict())
        cur.execute(f"UPDATE {qt} SET {q(c)} = {lit} WHERE {q('id')} = 1")  # noqa: S608
        assert digests_equal(d, schema, data, d.source)[0] == s, f"{c} ({ty}): restored, equal again"


@pytest.mark.parametrize("pg_every_type", ["pg_uri", "pg18_uri"], indirect=True)
def test_postgres_every_type_digests_equal_and_each_changed_value_differs(pg_every_type):
    d, cur, t, cols, data = pg_every_type
    _each_type_digest(d, cur, t, cols, data, f'public."{t.name}"', lambda n: f'"{n}"')


@pytest.fixture
def my_every_type(mysql_uri, tmp_path):
    u = uuid.uuid4().hex[:10]
    conn = _my_conn(mysql_uri)
    cur = conn.cursor()
    cur.execute("SELECT DATABASE()")
    t = TableName(cur.fetchone()[0], f"vd_{u}")
    cols = [(c, ty, lit) for c, ty, lit, *_ in MY_COLUMNS if ty not in ("FLOAT", "DOUBLE")]
    cur.execute(f"CREATE TABLE `{t.name}` (`id` INT PRIMARY KEY, " + ", ".join(f"`{c}` {ty}" for c, ty, _ in cols) + ")")
    names = ", ".join(f"`{c}`" for c, _, _ in cols)
    cur.execute("SET SESSION sql_mode = ''")  # zero dates
    cur.execute(f"INSERT INTO `{t.name}` (`id`, {names}) VALUES (1, {', '.join(lit for _, _, lit in cols)})")
    cur.execute(f"INSERT INTO `{t.name}` (`id`) VALUES (2)")
    cur.execute(f"INSERT INTO `{t.name}` (`id`, {names}) VALUES (3, {', '.join(MY_OTHER[c] for c, _, _ in cols)})")
    d = get_dialect(ConnectionParams.from_uri(mysql_uri), source=f"vd{u}", tables=[t], watermark_table=f"wm_{u}")
    try:
        yield d, cur, t, cols, str(tmp_path / "data")
    finally:
        d.close()
        cur.execute(f"DROP TABLE IF EXISTS `{t.name}`")
        conn.close()


def test_mariadb_every_type_digests_equal_and_each_changed_value_differs(my_every_type):
    d, cur, t, cols, data = my_every_type
    _each_type_digest(d, cur, t, cols, data, f"`{t.name}`", lambda n: f"`{n}`")


def test_types_without_a_digest_form_are_compared_row_by_row_and_named(my_every_type, pg_every_type_arrays):
    d, cur, t, _cols, data = my_every_type
    cur.execute(f"ALTER TABLE `{t.name}` ADD COLUMN `fl` FLOAT, ADD COLUMN `db` DOUBLE")
    cur.execute(f"UPDATE `{t.name}` SET `fl` = 1.5, `db` = 0.1")
    schema = d.describe_table(t)
    assert [p.split(":")[0] for p in digest_problems(d, schema)] == ["column 'fl' (float)", "column 'db' (double)"]
    build_mirror(d, schema, data, d.source)
    res = verify_table(d, data, d.source, t)
    assert res.method == "rows" and "'fl'" in res.method_note and res.ok
    cur.execute(f"UPDATE `{t.name}` SET `db` = 0.2 WHERE `id` = 3")
    res = verify_table(d, data, d.source, t)
    assert res.method == "rows" and res.different == 1 and res.examples[0].key == "[3]"
    with pytest.raises(Exception, match="no digest verify"):
        verify_table(d, data, d.source, t, method="digests")
    pd, pt, pdata = pg_every_type_arrays
    pschema = pd.describe_table(pt)
    assert [p.split(":")[0] for p in digest_problems(pd, pschema)] == ["column 'ai' (integer[])", "column 'at' (text[])"]
    build_mirror(pd, pschema, pdata, pd.source)
    res = verify_table(pd, pdata, pd.source, pt)
    assert res.method == "rows" and res.ok


@pytest.fixture
def pg_every_type_arrays(pg_uri, tmp_path):
    u = uuid.uuid4().hex[:10]
    conn = psycopg2.connect(pg_uri)
    conn.autocommit = True
    cur = conn.cursor()
    t = TableName("public", f"va_{u}")
    cols = [(c, ty, lit) for c, ty, lit, *_ in PG_COLUMNS if ty.endswith("[]")]
    cur.execute(f'CREATE TABLE public."{t.name}" ("id" integer PRIMARY KEY, ' + ", ".join(f'"{c}" {ty}' for c, ty, _ in cols) + ")")
    cur.execute(f'INSERT INTO public."{t.name}" VALUES (1, {", ".join(lit for _, _, lit in cols)})')
    d = get_dialect(ConnectionParams.from_uri(pg_uri), source=f"va{u}", tables=[t], watermark_table=f"wm_{u}")
    try:
        yield d, t, str(tmp_path / "data")
    finally:
        d.close()
        cur.execute(f'DROP TABLE IF EXISTS public."{t.name}"')
        conn.close()


def _autocommit(conn):
    if callable(getattr(conn, "autocommit", None)):  # pymysql
        conn.autocommit(True)
    else:
        conn.autocommit = True
    return conn


# --- a larger table -------------------------------------------------------------------------------
@pytest.fixture(params=["pg_uri", "pg18_uri", "mysql_uri"])
def large(request, tmp_path):
    from tools.workload import connect, create_demo_table, drop_table

    uri = request.getfixturevalue(request.param)
    p = ConnectionParams.from_uri(uri)
    u = uuid.uuid4().hex[:8]
    t = TableName("public" if p.scheme == "postgres" else p.database, f"vl_{u}")
    create_demo_table(uri, t, ROWS)
    d = get_dialect(p, source=f"vl{u}", tables=[t], watermark_table=f"wm_{u}")
    conn = _autocommit(connect(p))
    q = (lambda n: f'"{n}"') if p.scheme == "postgres" else (lambda n: f"`{n}`")
    data = str(tmp_path / "data")
    schema = d.describe_table(t)
    build_mirror(d, schema, data, d.source)
    try:
        yield d, conn.cursor(), f"{q(t.schema)}.{q(t.name)}", t, data
    finally:
        d.close()
        conn.close()
        drop_table(uri, t)


def _same_report(a, b) -> None:
    """The digest verify's report is the row-by-row verify's (its repair ranges may be cut
    elsewhere: both cover the keys that differ)."""
    da, db = a.to_dict(), b.to_dict()
    for k in ("rows_checked", "mismatched", "source_rows", "mirror_rows", "missing", "extra", "different", "examples"):
        assert da[k] == db[k], (k, da[k], db[k])
    assert (a.repair_conf() is None) == (b.repair_conf() is None)
    if a.repair_conf() is not None:  # both ranged (cut elsewhere), or both the whole table
        assert ("key_ranges" in a.repair_conf()) == ("key_ranges" in b.repair_conf())


def test_equal_mirror_then_one_changed_row_named_exactly(large):
    d, cur, qt, t, data = large
    res = verify_table(d, data, d.source, t, range_rows=20_000)
    assert res.method == "digests" and res.ok and res.rows_checked == ROWS and res.mirror_rows == ROWS, res.to_dict()
    assert res.digest_ranges == ROWS // 20_000 + 1 and res.chunks == ROWS // 10_000  # nothing descended into

    cur.execute(f"UPDATE {qt} SET note = 'changed behind the capture' WHERE id = 123457")  # noqa: S608
    res = verify_table(d, data, d.source, t, range_rows=20_000, chunk_rows=1000)
    assert res.different == 1 and res.missing == res.extra == 0, res.to_dict()
    (m,) = res.examples
    assert m.key == "[123457]" and m.kind == "different" and m.columns == ("note",)
    assert m.source["note"] == "changed behind the capture"
    (r,) = res.repair_ranges
    assert r.start[0] <= 123457 and r.end is not None and 123457 < r.end[0] and r.end[0] - r.start[0] <= 1000
    assert res.repair_conf()["key_ranges"] == {t.id: [{"start": list(r.start), "end": list(r.end)}]}
    assert res.digest_ranges < 60, "only the range that differs is split"
    _same_report(res, verify_table(d, data, d.source, t, method="rows", chunk_rows=1000))


def test_missing_and_extra_rows_are_found(large):
    d, cur, qt, t, data = large
    cur.execute(f"DELETE FROM {qt} WHERE id IN (1, 77777, {ROWS})")  # noqa: S608 - the mirror still has them: extra
    cur.execute(f"INSERT INTO {qt} SELECT id + {ROWS + 5}, name, amount, updated_at, active, attrs, payload, note "  # noqa: S608
                f"FROM {qt} WHERE id = 5")  # a row the mirror has not: missing, past the mirror's last key
    cur.execute(f"UPDATE {qt} SET amount = amount + 1 WHERE id = 150000")  # noqa: S608
    res = verify_table(d, data, d.source, t, range_rows=30_000, chunk_rows=500)
    assert (res.missing, res.extra, res.different) == (1, 3, 1), res.to_dict()
    assert {m.key for m in res.examples} == {"[1]", "[77777]", f"[{ROWS}]", f"[{ROWS + 10}]", "[150000]"}
    # extra rows too are in the ranges a repair re-reads (it converges inside them), not the table
    ranges = res.repair_conf()["key_ranges"][t.id]
    for k in (1, 77777, ROWS, ROWS + 10, 150000):
        assert any(r["start"][0] <= k and (r["end"] is None or k < r["end"][0]) for r in ranges), (k, ranges)
    assert sum((r["end"] or [ROWS + 11])[0] - r["start"][0] for r in ranges) < ROWS // 50, ranges
    _same_report(res, verify_table(d, data, d.source, t, method="rows", chunk_rows=500))


# --- keys in a collation ------------------------------------------------------------------------
@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_text_keys_that_sort_differently_under_the_collation(db, request, tmp_path):
    """'B' < 'a' in Python (code points); 'a' < 'B' under the collation. Text keys are never put in
    ranges outside the database: their row digests, computed by the source and sent with their
    keys in the source's order, are matched by key; the chunks (the source's keyset order) holding
    a difference are compared row by row, and the report is the row-by-row verify's, repair
    ranges included."""
    uri = request.getfixturevalue("pg_uri" if db == "pg" else "mysql_uri")
    p = ConnectionParams.from_uri(uri)
    u = uuid.uuid4().hex[:8]
    t = TableName("public" if db == "pg" else p.database, f"vk_{u}")
    from tools.workload import connect

    conn = _autocommit(connect(p))
    cur = conn.cursor()
    q = (lambda n: f'"{n}"') if db == "pg" else (lambda n: f"`{n}`")
    qt = f"{q(t.schema)}.{q(t.name)}"
    coll = 'COLLATE "en-x-icu"' if db == "pg" else "COLLATE utf8mb4_unicode_ci"
    cur.execute(f"CREATE TABLE {qt} (k VARCHAR(20) {coll} PRIMARY KEY, v INT)")
    keys = ["a", "B", "c", "D", "e", "F", "Ab", "Z", "z0", "_x", "C1", "d2", "E3"]
    for i, k in enumerate(keys):
        cur.execute(f"INSERT INTO {qt} VALUES (%s, %s)", (k, i))  # noqa: S608
    d = get_dialect(p, source=f"vk{u}", tables=[t], watermark_table=f"wm_{u}")
    try:
        schema = d.describe_table(t)
        data = str(tmp_path / "data")
        build_mirror(d, schema, data, d.source)
        res = verify_table(d, data, d.source, t, chunk_rows=3)
        assert res.ok and res.method == "digests" and res.rows_checked == len(keys), res.to_dict()
        cur.execute(f"UPDATE {qt} SET v = 100 WHERE k = 'D'")  # noqa: S608
        res = verify_table(d, data, d.source, t, chunk_rows=3)
        assert res.method == "digests" and res.different == 1 and res.examples[0].key == encode_key(["D"])
        assert res.examples[0].columns == ("v",), res.to_dict()
        (r,) = res.repair_ranges  # in the database's order: start <= 'D' < end
        ranks = d.key_ranks(schema, [r.start, ("D",), r.end])
        assert ranks[0] <= ranks[1] < ranks[2], (r, ranks)
        rows = verify_table(d, data, d.source, t, chunk_rows=3, method="rows")
        _same_report(res, rows)
        assert res.repair_ranges == rows.repair_ranges
        cur.execute(f"DELETE FROM {qt} WHERE k = 'Ab'")  # noqa: S608 - extra in the mirror
        cur.execute(f"INSERT INTO {qt} VALUES ('bb', 7)")  # noqa: S608 - missing from the mirror
        res = verify_table(d, data, d.source, t, chunk_rows=3)
        assert (res.missing, res.extra, res.different) == (1, 1, 1), res.to_dict()
        _same_report(res, verify_table(d, data, d.source, t, chunk_rows=3, method="rows"))
    finally:
        d.close()
        cur.execute(f"DROP TABLE IF EXISTS {qt}")
        conn.close()
