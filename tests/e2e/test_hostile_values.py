"""Every value (I2, I10): the values Arrow and Python's datetime cannot hold go through the
real DAGs on both databases and come back exactly.

Per database, three tables whose primary keys are the edge-prone types themselves
(PostgreSQL: timestamp with infinities, BC and years past 9999; float8 with NaN, infinities
and subnormals; date likewise. MariaDB: DATETIME(6) and DATE with zero and partial dates,
FLOAT with values at the type's limits), and value columns holding the other edge values.
One cdc_snapshot run copies them; updates to other edge values, a delete of an edge key and
inserts go through cdc_changelog. Each table ends with verify at 0 mismatched and the Delta
mirror's live row count equal to the source's. Then a value changed in the mirror by the
smallest step (an infinity one day short, a zero date made NULL) must fail verify.
"""

from __future__ import annotations

import datetime as dt
import struct
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from airflow_provider_cdc import airflow_variables
from airflow_provider_cdc.core.arrow_types import DELETED_COLUMN, KEY_COLUMN
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.pipeline.verify import check_event_log, verify_table
from airflow_provider_cdc.sinks.mirror_compaction import compact
from airflow_provider_cdc.sinks.mirror_readers import read_mirror, read_mirror_raw
from airflow_provider_cdc.storage.layout import mirror_dir

from .hostile import HostileSource, running

pytestmark = pytest.mark.timeout(900)

ROWS = 60
F32_MAX = "3.40282e38"  # MariaDB prints FLOAT's maximum like this; stored, it is the type's max
# (ddl, edge values as SQL text literals, or None for SQL NULL)
PG_COLUMNS = {
    "d": ("date", ["infinity", "-infinity", "0044-03-15 BC", "0001-01-01 BC", "12345-01-01", "2024-02-29"]),
    "tz": ("timestamptz", ["infinity", "-infinity", "0044-03-15 12:00:00.5+00 BC", "275000-06-07 08:09:10.123456+00",
                           "2024-01-01 00:00:00+05:30"]),
    "f8": ("double precision", ["NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e308"]),
    "f4": ("real", ["NaN", "3.4028235e38", "1e-45", "-Infinity"]),
    "n": ("numeric", ["NaN", "Infinity", "-Infinity", "1e-30", "123456789012345678901234567890.5"]),
    "n2": ("numeric(20,6)", ["-99999999999999.999999", "0.000001", None]),
}
PG_KEYS = {
    "ts": ("timestamp", ["-infinity", "infinity", "0044-03-15 12:00:00.5 BC", "4713-11-24 00:00:00 BC",
                         "10000-01-01 00:00:00", "275000-06-07 08:09:10.123456"]),
    "f": ("double precision", ["NaN", "Infinity", "-Infinity", "1.7976931348623157e308", "-1.7976931348623157e308",
                               "5e-324", "-5e-324", "0.1"]),
    "d": ("date", ["-infinity", "infinity", "0044-03-15 BC", "0001-01-01 BC", "12345-01-01"]),
}
MY_COLUMNS = {
    "d": ("date", ["0000-00-00", "2020-00-00", "2020-05-00", "0000-01-01", "9999-12-31"]),
    "dtm": ("datetime(6)", ["0000-00-00 00:00:00", "2020-00-00 10:00:00", "2020-05-00 00:00:00.5",
                            "9999-12-31 23:59:59.999999"]),
    "ts": ("timestamp(6) NULL", ["0000-00-00 00:00:00", "1970-01-01 00:00:01", "2038-01-19 03:14:07.999999", None]),
    "f4": ("float", [F32_MAX, f"-{F32_MAX}", "1e-45", "0.1"]),
    "f8": ("double", ["1.7976931348623157e308", "5e-324", "-0"]),
    "dc": ("decimal(65,30)", ["99999999999999999999999999999999999.999999999999999999999999999999", "-0.000000000000000000000000000001"]),
}
MY_KEYS = {
    "dtm": ("datetime(6)", ["0000-00-00 00:00:00", "2020-00-00 00:00:00", "2020-05-00 00:00:00.5",
                            "1000-01-01 00:00:00", "9999-12-31 23:59:59.999999"]),
    "f": ("float", [F32_MAX, f"-{F32_MAX}", "1e-45", "-1e-45", "0.1", "0.3"]),
    "d": ("date", ["0000-00-00", "2020-00-00", "2020-05-00", "0000-01-01", "1000-01-01", "9999-12-31"]),
}


def _ordinary_key(kind: str, i: int) -> str:
    if kind in ("ts", "dtm"):
        return str(dt.datetime(2020, 1, 1) + dt.timedelta(minutes=i))
    if kind == "d":
        return str(dt.date(2020, 1, 1) + dt.timedelta(days=i))
    return str(i * 0.25 + 1)  # exact in float32 and float64


class ValueSource(HostileSource):
    """Three tables keyed by edge-prone types, value columns of edge values."""

    sql_mode = ""  # zero dates are written under the permissive mode that lets applications store them

    def __init__(self, uri, name, data_dir, monkeypatch, schema: str) -> None:
        self.keys = PG_KEYS if uri.startswith("postgres") else MY_KEYS
        self.columns = PG_COLUMNS if uri.startswith("postgres") else MY_COLUMNS
        tables = [TableName(schema, f"v_{kind}_{name}") for kind in self.keys]
        super().__init__(uri, name, data_dir, monkeypatch, tables)
        self.kind_of = {t: kind for t, kind in zip(tables, self.keys, strict=True)}

    def key_values(self, t: TableName) -> list[str]:
        kind = self.kind_of[t]
        edges = self.keys[kind][1]
        return edges + [_ordinary_key(kind, i) for i in range(ROWS - len(edges))]

    def row_values(self, i: int, shift: int = 0) -> list[str | None]:
        return [edges[(i + shift) % len(edges)] for _, edges in self.columns.values()]

    def create(self) -> None:
        stmts = []
        names = ", ".join(["k", *self.columns])
        marks = ", ".join(["%s"] * (1 + len(self.columns)))
        for t, kind in self.kind_of.items():
            cols = ", ".join(f"{c} {ddl}" for c, (ddl, _) in self.columns.items())
            stmts.append((f"CREATE TABLE {self.qt(t)} (k {self.keys[kind][0]} PRIMARY KEY, {cols})", ()))
            stmts += [(f"INSERT INTO {self.qt(t)} ({names}) VALUES ({marks})", (k, *self.row_values(i)))  # noqa: S608
                      for i, k in enumerate(self.key_values(t))]
        self.sql(stmts)

    def change(self) -> None:
        """Every edge-key row's values move to other edge values; one edge key is deleted, one
        ordinary row inserted: the changelog path carries every edge value too."""
        stmts = []
        sets = ", ".join(f"{c} = %s" for c in self.columns)
        for t, kind in self.kind_of.items():
            keys = self.key_values(t)
            if self.scheme == "mysql" and kind == "f":
                # FLOAT = '0.1' compares the stored float32 with a double: bind the float32 itself
                keys = [struct.unpack("<f", struct.pack("<f", float(k)))[0] for k in keys]
            n_edges = len(self.keys[kind][1])
            for i, k in enumerate(keys[:n_edges]):
                stmts.append((f"UPDATE {self.qt(t)} SET {sets} WHERE k = %s", (*self.row_values(i, shift=1), k)))  # noqa: S608
            stmts.append((f"DELETE FROM {self.qt(t)} WHERE k = %s", (keys[1],)))  # noqa: S608
            stmts.append((f"INSERT INTO {self.qt(t)} (k, {', '.join(self.columns)}) VALUES "  # noqa: S608
                          f"({', '.join(['%s'] * (1 + len(self.columns)))})",
                          (_ordinary_key(kind, ROWS + 1), *self.row_values(3, shift=2))))
        self.sql(stmts)

    def drop(self) -> None:
        self.sql([(f"DROP TABLE IF EXISTS {self.qt(t)}", ()) for t in self.tables])


@pytest.fixture(params=["pg", "mysql"])
def values_source(request, unique_name, tmp_path, monkeypatch):
    uri = request.getfixturevalue("pg_uri" if request.param == "pg" else "mysql_uri")
    schema = "public" if request.param == "pg" else urlsplit(uri).path.lstrip("/")
    yield from running(ValueSource(uri, unique_name, tmp_path / "data", monkeypatch, schema), monkeypatch)


def _verify(p: ValueSource, t: TableName):
    with p.dialect() as d:
        return verify_table(d, p.data_dir, p.source, t, chunk_rows=1000)


def test_edge_values_and_keys_round_trip_through_the_dags(values_source):
    p = values_source
    p.run("cdc_snapshot", {"action": "start", "tables": [t.id for t in p.tables], "chunk_size": 7, "parallelism": 2})
    for t in p.tables:
        prog = airflow_variables.load(p.source, t.id, p.data_dir)
        assert prog is not None and prog.status == "done", (t, prog)
        res = _verify(p, t)
        assert res.ok, f"{t} after the snapshot: {res.summary()}: {[m.describe() for m in res.examples]}"
    p.change()
    p.catch_up()
    for t in p.tables:
        res = _verify(p, t)
        assert res.ok, f"{t}: {res.summary()}: {[m.describe() for m in res.examples]}"
        live = read_mirror(p.data_dir, p.source, t)
        assert live.num_rows == p.count(t) == res.rows_checked == ROWS  # one deleted, one inserted
        rep = check_event_log(p.data_dir, p.source, t, primary_key=("k",))
        assert rep.ok, rep.summary()

    # verify compares exact values: a mirror value one step off (an edge value) must fail it
    col = "d" if p.scheme == "pg" else "dtm"  # infinities / zero dates live there
    for t in p.tables:
        # folded, so the mirror holds one row per key (rounds leave change files beside the base)
        compact(p.data_dir, p.source, t)
        raw = read_mirror_raw(p.data_dir, p.source, t)
        live = raw.filter(pc.and_(pc.invert(raw[DELETED_COLUMN]), pc.is_valid(raw[col])))
        row = live.slice(0, 1)
        as_int = pa.int32() if p.scheme == "pg" else pa.int64()
        v = row[col].cast(as_int)[0].as_py()
        if p.scheme == "pg":  # one day off (never past the type's end)
            changed = pa.array([v - 1 if v > -(2**31) else v + 1], as_int).cast(row[col].type)
        else:  # NULL, as zero dates used to become
            changed = pa.array([None], row[col].type)
        tampered = row.set_column(row.schema.get_field_index(col), col, changed)
        # rewritten in place, as a faulty writer would (the mirror holds one row per key)
        DeltaTable(mirror_dir(p.data_dir, p.source, t)).merge(
            tampered, predicate=f"t.{KEY_COLUMN} = s.{KEY_COLUMN}", source_alias="s", target_alias="t"
        ).when_matched_update(updates={col: f"s.{col}"}).execute()
        res = _verify(p, t)
        assert not res.ok and res.different == 1 and res.mismatched == 1, (t, res.summary())
        assert res.examples[0].key == row[KEY_COLUMN][0].as_py() and res.examples[0].columns == (col,)
