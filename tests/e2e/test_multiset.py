"""A table without a key, with duplicate rows, captured as a multiset (CDC_KEY_COLUMNS names it
with ``*``; PostgreSQL: its owner set REPLICA IDENTITY FULL) through the DAGs (``dag.test()``)
while writers change single copies (pipeline/multiset.py, sinks/multiset.py).

The table holds 2,000 groups of 100 identical rows (200,000 rows). Writers update one copy of a
group, delete one copy and insert one, committing throughout the snapshot (which loads the
table) and the changelog rounds after it. Once they stop and a last round ran: the mirror, read
by deltalake (not the package's reader), equals the source as a multiset; verify (multiset) reports 0
mismatched; the writers' statements never failed.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
from deltalake import DeltaTable

from airflow_provider_cdc.pipeline.verify import verify_table
from airflow_provider_cdc.storage.layout import mirror_dir
from tools import workload as w

from .helpers import Pipeline

pytestmark = pytest.mark.timeout(900)

GROUPS, COPIES = 2000, 100


@pytest.mark.parametrize("server", ["pg", "mysql"])
def test_a_keyless_table_captured_as_a_multiset_under_single_copy_writers_equals_the_source(
    server, request, unique_name, tmp_path, monkeypatch
):
    uri = request.getfixturevalue("pg_uri" if server == "pg" else "mysql_uri")
    p = Pipeline(uri, unique_name, tmp_path / "data", monkeypatch)
    pg = server == "pg"
    table = w.default_table(uri, f"ms_{unique_name}")
    p.table, p.tables = table, [table]
    p.mp.setenv("CDC_TABLES", table.id)
    p.mp.setenv("CDC_KEY_COLUMNS", f"{table.id}:*")
    qt = f'"{table.schema}"."{table.name}"' if pg else f"`{table.schema}`.`{table.name}`"
    one = (
        (lambda where: f"ctid = (SELECT ctid FROM {qt} WHERE {where} LIMIT 1)")
        if pg
        else (lambda where: f"{where} LIMIT 1")
    )
    conn = w.connect(uri)
    try:
        cur = conn.cursor()
        # an index (not a key): the shared MariaDB replica finds each row event's row by it; without
        # one it scans the whole table per row, falls minutes behind, and the replica tests time out
        index = "" if pg else ", KEY (grp)"
        cur.execute(f"CREATE TABLE {qt} (grp int NOT NULL, ver int NOT NULL, pad varchar(40){index})")
        if pg:
            cur.execute(f"ALTER TABLE {qt} REPLICA IDENTITY FULL")  # the table's owner's choice
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
                g = rnd.randrange(1, GROUPS + 1)
                try:
                    kind = rnd.randrange(3)
                    if kind == 0:  # one copy changes (the others stay as they were)
                        cur.execute(f"UPDATE {qt} SET ver = ver + 1 WHERE {one('grp = %s')}", (g,))  # noqa: S608
                    elif kind == 1:  # one copy goes
                        cur.execute(f"DELETE FROM {qt} WHERE {one('grp = %s')}", (g,))  # noqa: S608
                    else:  # one more copy of a row there is
                        cur.execute(f"INSERT INTO {qt} SELECT grp, ver, pad FROM {qt} WHERE grp = %s LIMIT 1", (g,))  # noqa: S608
                    c.commit()
                    committed[kind] += 1
                    stop.wait(0.005)  # a steady rate the shared replica applies as it comes
                except Exception as exc:  # noqa: BLE001 - the test's finding: the application failed
                    errors.append(repr(exc))
                    c.rollback()
        finally:
            c.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in (0, 1)]
    for th in threads:
        th.start()
    try:
        p.capture_now()  # capture first: the table joins the publication, the load's changes are in the log
        p.run("cdc_snapshot", {"action": "start", "tables": [table.id]})
        for _ in range(3):
            p.run("cdc_changelog")
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert not errors, errors[:3]
    assert all(committed[k] > 0 for k in range(3)), committed
    p.run("cdc_changelog")

    m = DeltaTable(mirror_dir(p.data_dir, p.source, table)).to_pyarrow_table(columns=["grp", "ver", "pad"])
    got = Counter(zip(*(m[c].to_pylist() for c in ("grp", "ver", "pad")), strict=True))
    conn = w.connect(uri)
    try:
        cur = conn.cursor()
        cur.execute(f"SELECT grp, ver, pad FROM {qt}")  # noqa: S608
        want = Counter(tuple(r) for r in cur.fetchall())
    finally:
        conn.close()
    assert max(want.values()) > 1 and len(want) < sum(want.values())  # duplicates
    assert got == want
    with p.dialect() as d:
        res = verify_table(d, p.data_dir, p.source, table)
    assert res.ok and res.method == "multiset", res.to_dict()
    assert res.source_rows == sum(want.values()) and res.rows_checked == len(want)
    from airflow_provider_cdc import cli

    assert cli.run(["status", "--source", p.source]) == 0
    assert cli.run(["verify", "--source", p.source, "--table", table.id, "--events"]) == 0
    p.cleanup()
