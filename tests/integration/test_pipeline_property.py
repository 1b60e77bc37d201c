"""A property over whole pipelines (I2, I9, I10): hypothesis draws a table (hostile table and
column names, a key type, value columns with edge values), rows, and changes interleaved with
the snapshot's chunk reads, then runs DBLog on the real database without Airflow or Spark:
chunks (lw -> SELECT -> hw, staged), capture, the in-process merge, the changelog apply (in
either order), and checks that verify finds 0 mismatches and the Delta mirror holds exactly
the source's live rows.

Each example is one fresh table and source (slot / binlog offset) on the private instance; a
few examples per database keep the tier fast (CDC_HYPOTHESIS_PROFILE=cdc-thorough: more).
"""

from __future__ import annotations

import os
import struct
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.sqlnames import quote_mysql, quote_pg
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.arrow_engine import apply_changelog, merge_round
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.snapshot import snapshot_chunk
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.pipeline.verify import verify_table
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import schema_path

EXAMPLES = 40 if os.environ.get("CDC_HYPOTHESIS_PROFILE", "").endswith("thorough") else 6

# --- names ------------------------------------------------------------------------------------
_name_chars = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs", "Cc"))


def ident(db: str) -> st.SearchStrategy[str]:
    """A name the database accepts: PostgreSQL 63 bytes; MariaDB 64 characters of the Basic
    Multilingual Plane (identifiers are utf8mb3), no trailing space, and table names without
    '/', '\\' or '.' (file names on the server)."""
    if db == "pg":
        return st.text(_name_chars, min_size=1, max_size=20).filter(lambda s: len(s.encode()) <= 63)
    bmp = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs", "Cc"), max_codepoint=0xFFFF)
    return st.text(bmp, min_size=1, max_size=20).filter(lambda s: not s.endswith(" ") and s.strip())


# --- types: (SQL type, strategy of Python values bound as parameters) ----------------------------
def _text(max_size: int = 12):
    return st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=max_size)


_F32_MAX = 3.4028234663852886e38
# edge values the databases hold and Python's datetime cannot: bound as text
_PG_TS_EDGES = st.sampled_from(["infinity", "-infinity", "0044-03-15 12:00:00.5 BC", "4713-11-24 00:00:00 BC",
                                 "10000-01-01 00:00:00", "275000-06-07 08:09:10.123456"])
_PG_DATE_EDGES = st.sampled_from(["infinity", "-infinity", "0044-03-15 BC", "0001-01-01 BC", "12345-01-01"])
_MY_DATE_EDGES = st.sampled_from(["0000-00-00", "2020-00-00", "2020-05-00", "0000-01-01"])
_MY_DATETIME_EDGES = st.sampled_from(["0000-00-00 00:00:00", "2020-00-00 10:00:00", "2020-05-00 00:00:00.5"])
# the smallest float32 denormal exactly as a double (1.401298464324817e-45): the harness binds
# keys in its own DELETE/UPDATE ... WHERE key = %s, and 1e-45 is not equal to the stored value
_F32_MIN_DENORMAL = struct.unpack("<f", struct.pack("<f", 1e-45))[0]
_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False) | st.sampled_from([_F32_MAX, -_F32_MAX, _F32_MIN_DENORMAL])

PG_VALUE_TYPES = {
    "int4": ("integer", st.integers(-(2**31), 2**31 - 1)),
    "int8": ("bigint", st.integers(-(2**63), 2**63 - 1)),
    "text": ("text", _text()),
    "numeric": ("numeric(20,6)", st.decimals(min_value=-(10**13), max_value=10**13, places=6, allow_nan=False)),
    "float8": ("double precision", st.floats(allow_nan=False, allow_infinity=False)),
    "bool": ("boolean", st.booleans()),
    "date": ("date", st.dates() | _PG_DATE_EDGES),
    "ts": ("timestamp", st.datetimes() | _PG_TS_EDGES),
    "tstz": ("timestamptz", st.datetimes(timezones=st.just(__import__("datetime").UTC)) | _PG_TS_EDGES),
    "bytea": ("bytea", st.binary(max_size=8)),
    "float8x": ("double precision", st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 5e-324])),
    "numeric_any": ("numeric", st.sampled_from(["NaN", "Infinity", "-Infinity", "1e-30", "123456789012345678901234567890.5"])),
}
MY_VALUE_TYPES = {
    "int": ("int", st.integers(-(2**31), 2**31 - 1)),
    "bigint": ("bigint", st.integers(-(2**63), 2**63 - 1)),
    "varchar": ("varchar(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", _text()),
    "decimal": ("decimal(20,6)", st.decimals(min_value=-(10**13), max_value=10**13, places=6, allow_nan=False)),
    "double": ("double", st.floats(allow_nan=False, allow_infinity=False, width=64)),
    "date": ("date", st.dates(min_value=__import__("datetime").date(1000, 1, 1)) | _MY_DATE_EDGES),
    "datetime": ("datetime(6)", st.datetimes(min_value=__import__("datetime").datetime(1000, 1, 1)) | _MY_DATETIME_EDGES),
    "blob": ("varbinary(16)", st.binary(max_size=8)),
    "float": ("float", _F32),
}
# key types: values hypothesis draws unique under the database's equality
PG_KEY_TYPES = {"int8": PG_VALUE_TYPES["int8"], "text": ("text COLLATE \"C\"", _text(8)),
                "numeric": PG_VALUE_TYPES["numeric"], "date": PG_VALUE_TYPES["date"], "ts": PG_VALUE_TYPES["ts"]}
MY_KEY_TYPES = {"bigint": MY_VALUE_TYPES["bigint"], "varchar": MY_VALUE_TYPES["varchar"],
                "decimal": MY_VALUE_TYPES["decimal"], "datetime": MY_VALUE_TYPES["datetime"],
                "date": MY_VALUE_TYPES["date"], "float": MY_VALUE_TYPES["float"]}


@st.composite
def table_cases(draw, db: str):
    keys = PG_KEY_TYPES if db == "pg" else MY_KEY_TYPES
    values = PG_VALUE_TYPES if db == "pg" else MY_VALUE_TYPES
    names = draw(st.lists(ident(db), min_size=3, max_size=5, unique_by=lambda s: s.casefold() if db == "mysql" else s.lower()))
    key_name, *col_names = names
    key_kind = draw(st.sampled_from(sorted(keys)))
    col_kinds = [draw(st.sampled_from(sorted(values))) for _ in col_names]
    key_sql, key_strategy = keys[key_kind]
    if key_kind.startswith("numeric") or key_kind == "decimal":
        key_strategy = key_strategy.map(lambda d: d.normalize() if d == d.to_integral() else d)
    if db == "mysql" and key_kind == "varchar":
        key_strategy = key_strategy.filter(lambda s: not s.endswith(" "))  # PAD SPACE: 'a' = 'a '
    n = draw(st.integers(0, 25))
    row_keys = draw(st.lists(key_strategy, min_size=n, max_size=n, unique_by=_key_identity))
    rows = [(k, *(draw(values[c][1] | st.none()) for c in col_kinds)) for k in row_keys]
    # changes interleaved with the chunk reads: (after chunk i, op, key index, new values)
    ops = draw(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["insert", "update", "delete"]),
                                  st.integers(0, 10**6)), max_size=12))
    new_keys = draw(st.lists(key_strategy, max_size=6, unique_by=_key_identity))
    new_values = [tuple(draw(values[c][1] | st.none()) for c in col_kinds) for _ in range(len(ops))]
    return {
        "table": draw(ident(db).filter(lambda s: db == "pg" or not any(c in s for c in "/\\."))),
        "key": (key_name, key_sql), "cols": [(c, values[k][0]) for c, k in zip(col_names, col_kinds, strict=True)],
        "rows": rows, "ops": ops, "new_keys": new_keys, "new_values": new_values,
        "merge_first": draw(st.booleans()), "chunk_size": draw(st.integers(1, 9)),
    }


def _key_identity(v):
    import datetime as dt

    if isinstance(v, float):
        v += 0.0  # -0.0 and 0.0 are one key to the database
        return ("f", struct.pack("<f", v) if abs(v) <= _F32_MAX else v)
    if isinstance(v, dt.datetime):
        return ("t", v.isoformat())
    if isinstance(v, dt.date):
        return ("t", v.isoformat())
    if isinstance(v, str):
        # dates given as text: equal when the database would store the same value
        return ("t", v.replace(".5", ".500000")) if v[:1].isdigit() or v[:1] == "-" or v in ("infinity",) else ("s", v)
    if hasattr(v, "normalize"):
        return ("d", v.normalize())
    return (type(v).__name__, v)


class Source:
    def __init__(self, db: str, uri: str, case: dict, tmp: Path) -> None:
        self.db, self.uri, self.case = db, uri, case
        u = uuid.uuid4().hex[:8]
        schema = "public" if db == "pg" else urlsplit(uri).path.lstrip("/")
        self.table = TableName(schema, f"{case['table']}_{u}")
        self.source = f"prop_{u}"
        self.data_dir = str(tmp / u)
        self.q = quote_pg if db == "pg" else quote_mysql
        params = ConnectionParams.from_uri(uri)
        extra = {"slot_name": f"prop_{u}", "publication_name": f"prop_{u}"} if db == "pg" else {}
        self.d = get_dialect(params, source=self.source, tables=[self.table], watermark_schema="cdc" if db == "pg" else schema,
                             watermark_table=f"wm_{u}", **extra)

    def qt(self) -> str:
        return f"{self.q(self.table.schema)}.{self.q(self.table.name)}"

    def sql(self, statement: str, args: tuple = ()) -> None:
        self.d._query(statement, args)  # the dialect's own connection: %-formatting always on
        if self.db == "pg":
            self.d.conn.commit()

    def columns(self) -> list[str]:
        return [self.case["key"][0], *(c for c, _ in self.case["cols"])]

    def create(self) -> None:
        key, key_sql = self.case["key"]
        cols = "".join(f", {self.q(c)} {t}" for c, t in self.case["cols"])
        self.sql(f"CREATE TABLE {self.qt()} ({self.q(key)} {key_sql} PRIMARY KEY{cols})")
        for row in self.case["rows"]:
            self.insert(row)

    def insert(self, row: tuple) -> None:
        names = ", ".join(self.q(c) for c in self.columns())
        marks = ", ".join(["%s"] * len(row))
        self.sql(f"INSERT INTO {self.qt()} ({names}) VALUES ({marks})", row)  # noqa: S608 - quoted, bound

    def drop(self) -> None:
        try:
            if self.db == "pg":
                self.d.drop_slot()
                self.d.drop_publication()
            self.sql(f"DROP TABLE IF EXISTS {self.qt()}")
            self.sql(f"DROP TABLE IF EXISTS {self.d.quote_table(self.d.watermark_table)}")
        finally:
            self.d.close()


def run_case(db: str, uri: str, case: dict, tmp: Path) -> None:
    s = Source(db, uri, case, tmp)
    try:
        s.create()
        s.d.ensure_watermark_table()
        s.d.load_offset(s.data_dir)  # the slot / binlog offset exists from here on
        schema = s.d.describe_table(s.table)
        p = Path(schema_path(s.data_dir, s.source, s.table))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(schema.to_json(), encoding="utf-8")

        live = [r[0] for r in case["rows"]]
        fresh = list(case["new_keys"])
        ops = sorted(enumerate(case["ops"]), key=lambda t: t[1][0])

        def change(i: int, op: str, pick: int) -> None:
            key_col = s.q(case["key"][0])
            values = case["new_values"][i]
            if op == "insert" and fresh:
                k = fresh.pop()
                if _key_identity(k) in {_key_identity(x) for x in live}:
                    return
                s.insert((k, *values))
                live.append(k)
            elif op == "update" and live and case["cols"]:
                k = live[pick % len(live)]
                sets = ", ".join(f"{s.q(c)} = %s" for c, _ in case["cols"])
                s.sql(f"UPDATE {s.qt()} SET {sets} WHERE {key_col} = %s", (*values, k))  # noqa: S608
            elif op == "delete" and live:
                k = live.pop(pick % len(live))
                s.sql(f"DELETE FROM {s.qt()} WHERE {key_col} = %s", (k,))  # noqa: S608

        chunks, after, seq = [], None, 0
        while True:
            for i, (at, op, pick) in ops:
                if at == seq:
                    change(i, op, pick)
            seq += 1
            c = snapshot_chunk(s.d, schema, ChunkRange(), data_dir=s.data_dir, snapshot_id="prop", seq=seq,
                               limit=case["chunk_size"], after_key=after)
            chunks.append(c)
            if c.exhausted:
                break
            after = c.last_key
        for i, (at, op, pick) in ops:
            if at >= seq:
                change(i, op, pick)
        stage_changelog(s.d, s.data_dir)
        sinks = build_sinks("events,mirror", data_dir=s.data_dir, source=s.source, database=None, require_schema=True)
        steps = [lambda: merge_round(chunks, data_dir=s.data_dir, source=s.source, sinks=sinks),
                 lambda: apply_changelog(s.data_dir, s.source, sinks)]
        for step in steps if case["merge_first"] else reversed(steps):
            step()

        res = verify_table(s.d, s.data_dir, s.source, s.table, chunk_rows=1000)
        assert res.ok, f"{res.summary()}: {[m.describe() for m in res.examples]}"
        assert read_mirror(s.data_dir, s.source, s.table).num_rows == len(live) == res.rows_checked
    finally:
        s.drop()


@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_any_table_snapshot_and_changes_converge(db, request, tmp_path):
    uri = request.getfixturevalue("pg_uri" if db == "pg" else "mysql_uri")

    @settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(table_cases(db))
    def prop(case):
        run_case(db, uri, case, tmp_path)

    prop()


@pytest.mark.parametrize("db", ["pg", "mysql"])
def test_float_key_edges_insert_update_delete_converge(db, request, tmp_path):
    """The cases hypothesis once drew with 1e-45 as a FLOAT key (fixed there to the stored
    float32 value), kept as a fixed case: the smallest denormal, the largest float32 and zero
    as keys, inserted, updated and deleted around a snapshot."""
    uri = request.getfixturevalue("pg_uri" if db == "pg" else "mysql_uri")
    key = ("k", "real" if db == "pg" else "float")
    case = {"table": "fk", "key": key, "cols": [("v", "bigint")],
            "rows": [(0.0, 1), (_F32_MIN_DENORMAL, 2), (1.0, 3), (-_F32_MAX, 4)],
            "ops": [(0, "delete", 1), (0, "insert", 0), (1, "update", 0), (2, "delete", 0)],
            "new_keys": [_F32_MAX, 0.5, _F32_MIN_DENORMAL], "new_values": [(5,), (6,), (7,), (8,)],
            "merge_first": False, "chunk_size": 1}
    run_case(db, uri, case, tmp_path)
