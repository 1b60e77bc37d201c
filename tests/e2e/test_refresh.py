"""A table without any key, with duplicate rows, refreshed whole by the ``cdc_refresh`` DAG
(``dag.test()``) while writers change it and a reader reads it (pipeline/refresh.py).

The table holds 2,000 groups of 100 identical rows (200,000 rows, no key, no replica identity
change). Each writer transaction bumps one group's version on all its rows, deletes one copy
and inserts it back with the new version: every state of the source has each group at 100 rows
of one version, and a refresh that read rows of two states (a row moved by an UPDATE read twice,
or not at all) breaks that. Checked on every Delta version of the refreshed table (read by
deltalake, delta-rs: not the package's reader) and on every read of a reader polling during the
refreshes; after the writers stop, one more refresh equals the source row for row (as a
multiset). The writers' statements never fail.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.storage.layout import refreshed_dir
from tools import workload as w

from .helpers import Pipeline

pytestmark = pytest.mark.timeout(900)

GROUPS, COPIES = 2000, 100


def _groups_whole(t: pa.Table) -> str | None:
    """None when every group has COPIES rows of one version; else what is wrong."""
    if t.num_rows != GROUPS * COPIES:
        return f"{t.num_rows} rows, not {GROUPS * COPIES}"
    g = t.group_by("grp").aggregate([("ver", "min"), ("ver", "max"), ("ver", "count")])
    if g.num_rows != GROUPS:
        return f"{g.num_rows} groups"
    bad = [
        (grp, lo, hi, n)
        for grp, lo, hi, n in zip(*(g[c].to_pylist() for c in ("grp", "ver_min", "ver_max", "ver_count")), strict=True)
        if lo != hi or n != COPIES
    ]
    return f"groups of two states or a wrong count: {bad[:5]}" if bad else None


@pytest.mark.parametrize("server", ["pg", "mysql"])
def test_a_keyless_table_refreshed_under_writers_shows_only_source_states(
    server, request, unique_name, tmp_path, monkeypatch
):
    uri = request.getfixturevalue("pg_uri" if server == "pg" else "mysql_uri")
    p = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    table = w.default_table(uri, f"nokey_{unique_name}")
    p.table, p.tables = table, [table]
    try:
        _refresh_under_writers(p, uri, server == "pg")
    finally:
        p.cleanup()


def _refresh_under_writers(p: Pipeline, uri: str, pg: bool) -> None:
    table = p.table
    p.mp.setenv("CDC_REFRESH_TABLES", table.id)
    p.mp.setenv("CDC_TABLES", f"{table.schema}.captured_{table.name}")  # (a refresh needs none)
    qt = f'"{table.schema}"."{table.name}"' if pg else f"`{table.schema}`.`{table.name}`"
    conn = w.connect(uri)
    try:
        cur = conn.cursor()
        # an index (not a key): the shared MariaDB replica finds each row event's row by it; without
        # one it scans the whole table per row, falls minutes behind, and the replica tests time out
        index = "" if pg else ", KEY (grp)"
        cur.execute(f"CREATE TABLE {qt} (grp int NOT NULL, ver int NOT NULL, pad varchar(40){index})")
        if pg:
            cur.execute(
                f"INSERT INTO {qt} SELECT g, 0, 'copy' FROM generate_series(1, {GROUPS}) g, "  # noqa: S608
                f"generate_series(1, {COPIES}) c"
            )
        else:
            cur.execute(
                f"INSERT INTO {qt} SELECT g.seq, 0, 'copy' FROM seq_1_to_{GROUPS} g, seq_1_to_{COPIES} c"  # noqa: S608
            )
        conn.commit()
    finally:
        conn.close()

    stop, errors, committed = threading.Event(), [], Counter()

    def writer(n: int) -> None:
        rnd = random.Random(n)
        c = w.connect(uri)
        try:
            cur = c.cursor()
            while not stop.is_set():
                g = rnd.randrange(1, GROUPS // 2 + 1) * 2 - n  # disjoint groups per writer
                try:
                    cur.execute(f"UPDATE {qt} SET ver = ver + 1 WHERE grp = %s", (g,))  # noqa: S608
                    if pg:
                        cur.execute(
                            f"DELETE FROM {qt} WHERE ctid = (SELECT ctid FROM {qt} WHERE grp = %s LIMIT 1)",  # noqa: S608
                            (g,),
                        )
                    else:
                        cur.execute(f"DELETE FROM {qt} WHERE grp = %s LIMIT 1", (g,))  # noqa: S608
                    cur.execute(
                        f"INSERT INTO {qt} SELECT grp, ver, pad FROM {qt} WHERE grp = %s LIMIT 1",  # noqa: S608
                        (g,),
                    )
                    c.commit()
                    committed[n] += 1
                    stop.wait(0.02)  # a steady rate the shared replica applies as it comes
                except Exception as exc:  # noqa: BLE001 - the test's finding: the application failed
                    errors.append(repr(exc))
                    c.rollback()
        finally:
            c.close()

    location = refreshed_dir(p.data_dir, p.source, TableName.parse(table.id))
    reads, torn = Counter(), []

    def reader() -> None:
        while not stop.is_set():
            try:
                t = DeltaTable(location).to_pyarrow_table(columns=["grp", "ver"])
            except Exception:  # noqa: BLE001 - no table before the first claim
                continue
            if t.num_rows:
                reads["reads"] += 1
                why = _groups_whole(t)
                if why:
                    torn.append(why)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 1)] + [threading.Thread(target=reader)]
    for th in threads:
        th.start()
    try:
        for _ in range(3):
            p.run("cdc_refresh")
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert not errors, errors[:3]
    assert sum(committed.values()) > 0 and reads["reads"] > 0, (committed, reads)
    assert not torn, torn[:3]

    p.run("cdc_refresh", {"tables": [table.id]})
    dt = DeltaTable(location)
    published = [
        h["version"] for h in dt.history() if h.get("operation") == "WRITE"
    ]
    assert len(published) == 4, dt.history()
    for v in published:
        why = _groups_whole(DeltaTable(location, version=v).to_pyarrow_table(columns=["grp", "ver"]))
        assert why is None, f"version {v}: {why}"
    mirror = DeltaTable(location).to_pyarrow_table()
    got = Counter(zip(*(mirror[c].to_pylist() for c in ("grp", "ver", "pad")), strict=True))
    conn = w.connect(uri)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT grp, ver, pad FROM {qt}")  # noqa: S608
        want = Counter(tuple(r) for r in cur.fetchall())
    finally:
        conn.close()
    assert got == want
    assert len(want) < GROUPS * COPIES  # duplicates: fewer distinct rows than rows


def test_a_run_naming_a_table_outside_the_refresh_tables_reads_nothing(pg_uri, unique_name, tmp_path, monkeypatch):
    """A run's conf narrows CDC_REFRESH_TABLES, never widens it: a captured table, another
    table and the catalogs are refused by name before anything is read or written."""
    p = Pipeline(pg_uri, unique_name, tmp_path / "data", monkeypatch)
    monkeypatch.setenv("CDC_REFRESH_TABLES", f"public.nokey_{unique_name}")
    try:
        for name in (p.table.id, "public.other", "pg_catalog.pg_authid"):
            p.run("cdc_refresh", {"tables": [name]}, expect="failed")
        assert not (tmp_path / "data" / "output").exists()
    finally:
        p.cleanup()


def test_a_keyless_table_in_the_capture_scope_fails_capture_visibly(pg_uri, unique_name, tmp_path, monkeypatch,
                                                                      capsys):
    """The refusal stays for a keyless table named in CDC_TABLES (issue 57), and the failing capture is
    seen where operators look (issue 58): status leads with it, names the table and the way out
    (CDC_REFRESH_TABLES), and exits 1; nothing was created on the source."""
    from airflow_provider_cdc import cli

    p = Pipeline(pg_uri, unique_name, tmp_path / "data", monkeypatch)
    conn = w.connect(pg_uri)
    try:
        cur = conn.cursor()
        cur.execute(f'CREATE TABLE "public"."{p.table.name}" (grp int, pad text)')
        conn.commit()
        p.run("cdc_changelog", expect="failed")
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE %s", (f"%{p.source}%",))
        assert cur.fetchone()[0] == 0
    finally:
        conn.close()
    try:
        capsys.readouterr()
        assert cli.run(["status", "--source", p.source]) == 1
        out = capsys.readouterr().out
        failing = out[out.index("CAPTURE FAILING"):out.index("NOT HEALTHY")]  # (the error spans lines)
        assert p.table.id in failing and "CDC_REFRESH_TABLES" in failing, out
    finally:
        p.cleanup()
