"""verify.py without a database: the chunk compare and the event-log replay on built inputs."""

from __future__ import annotations

import pyarrow as pa

from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.pipeline.verify import MirrorIndex, check_events, compare
from airflow_provider_cdc.sinks.mirror_delta import events_to_mirror_rows

SCHEMA = TableSchema(
    TableName("s", "t"),
    (
        Column("id", "int64"),
        Column("name", "string"),
        Column("amount", "decimal(12,2)"),
        Column("ts", "timestamptz"),
        Column("naive", "timestamp"),
        Column("day", "date"),
        Column("flag", "bool"),
        Column("doc", "json"),
        Column("blob", "binary"),
        Column("f4", "float32"),
        Column("f8", "float64"),
        Column("big", "uint64"),
        Column("tags", "array<int32>"),
    ),
    ("id",),
)


def row(i: int, **over) -> dict:
    r = {
        "id": i,
        "name": f"n{i} é",
        "amount": f"{i}.50",
        "ts": f"2024-01-0{1 + i % 9}T10:00:00.{i:06d}Z",
        "naive": "2024-02-03T04:05:06.000007",
        "day": "2024-03-04",
        "flag": i % 2 == 0,
        "doc": '{"a": 1}',
        "blob": "AAEC",
        "f4": 0.1,
        "f8": "NaN" if i == 3 else 1.25,
        "big": 18446744073709551615,
        "tags": [1, i],
    }
    r.update(over)
    return r


def mirror_of(rows: list[dict], schema: TableSchema = SCHEMA, **kw) -> MirrorIndex:
    events = pa.table(
        {
            "table": ["s.t"] * len(rows),
            "op": ["u"] * len(rows),
            "key": [encode_key([r["id"]]) for r in rows],
            "position": [Position(i + 1).encode() for i in range(len(rows))],
            "after": [encode_row(r) for r in rows],
        }
    )
    return MirrorIndex(schema, events_to_mirror_rows(schema, events), **kw)


def chunks(rows: list[dict], n: int):
    pairs = [(encode_key([r["id"]]), r) for r in rows]
    return [pairs[i : i + n] for i in range(0, len(pairs), n)]


def test_equal_mirror_through_typed_columns_compares_equal():
    src = [row(i) for i in range(1, 26)]
    res = compare(SCHEMA, chunks(src, 7), mirror_of(src))
    assert res.ok, [m.describe() for m in res.examples]
    assert (res.rows_checked, res.chunks, res.mismatched_chunks) == (25, 4, 0)
    assert res.summary() == "25 rows checked, 0 mismatched"


def test_missing_extra_and_different_rows_are_found_and_named():
    src = [row(i) for i in range(1, 26)]
    mir = [r for r in src if r["id"] != 5] + [row(99)]
    mir = [row(12, amount="12.51") if r["id"] == 12 else r for r in mir]
    res = compare(SCHEMA, chunks(src, 10), mirror_of(mir))
    assert (res.missing, res.extra, res.different) == (1, 1, 1)
    assert res.mismatched == 3 and res.rows_checked == 26
    assert res.mismatched_chunks == 3  # chunks 1-10 and 11-20, and 21-25, whose range holds the extra key 99
    text = "\n".join(m.describe() for m in res.examples)
    assert "key [5]: missing from the mirror" in text
    assert "key [99]: in the mirror, not in the source" in text
    assert 'amount: source="12.50" mirror="12.51"' in text


def test_each_logical_type_difference_is_seen():
    src = [row(i) for i in range(1, 4)]
    for col, val in [("ts", "2024-01-02T10:00:00.000002Z"), ("blob", "AAED"), ("flag", True), ("f4", 0.2),
                     ("tags", [1, 9]), ("doc", '{"a": 2}'), ("day", "2024-03-05")]:
        mir = [row(1, **{col: val}), *src[1:]]
        res = compare(SCHEMA, chunks(src, 10), mirror_of(mir))
        assert res.different == 1, col
        assert res.examples[0].columns == (col,)


def ev(op, key, pos, before=None, after=None):
    return {"op": op, "key": key, "position": Position(pos).encode(), "before": before, "after": after}


def test_event_log_consistent_chain_passes_and_duplicates_are_counted():
    a1, a2, a3 = {"id": 1, "v": 1}, {"id": 1, "v": 2}, {"id": 1, "v": 3}
    evs = [
        ev("r", "[1]", 5, None, a1),
        ev("u", "[1]", 7, a1, a2),
        ev("u", "[1]", 7, a1, a2),  # a retried write: identical copy
        ev("r", "[1]", 9, None, a2),  # a second snapshot sees the same state
        ev("d", "[1]", 11, a2, None),
        ev("c", "[1]", 12, None, a3),
        ev("u", "[2]", 3, {"id": 2}, {"id": 2, "v": 0}),  # key-only before-image: not compared
    ]
    rep = check_events("s.t", evs, primary_key=("id",))
    assert rep.ok, rep.violations
    assert (rep.events, rep.keys, rep.duplicates) == (6, 2, 1)


def test_event_log_violations_are_reported():
    a1, a2 = {"id": 1, "v": 1}, {"id": 1, "v": 2}
    cases = {
        "stale": [ev("u", "[1]", 7, a1, a2), ev("r", "[1]", 9, None, a1)],
        "resurrected": [ev("d", "[1]", 7, a1, None), ev("r", "[1]", 9, None, a1)],
        "live": [ev("c", "[1]", 7, None, a1), ev("c", "[1]", 9, None, a2)],
        "two different": [ev("u", "[1]", 7, a1, a2), ev("d", "[1]", 7, a2, None)],
        "before-image": [ev("u", "[1]", 7, a1, a2), ev("u", "[1]", 8, a1, a2)],
    }
    for word, evs in cases.items():
        rep = check_events("s.t", evs, primary_key=("id",))
        assert not rep.ok and rep.violation_count == 1, (word, rep.violations)
        assert word in rep.violations[0], (word, rep.violations)


def test_status_says_when_the_snapshot_dag_is_paused():
    """A running snapshot behind a paused DAG reads as such in `airflow-cdc status`."""
    from airflow_provider_cdc.cli import describe_progress

    assert describe_progress({"status": "running", "dag_paused": True}).startswith(
        "running (DAG cdc_snapshot is paused: no task runs until it is unpaused)")
    assert describe_progress({"status": "running", "dag_paused": False}) == "running"


def test_repair_covers_only_the_chunks_that_differed_and_joins_adjacent_ones():
    src = [row(i) for i in range(1, 46)]  # chunks of 10: 1-10, 11-20, 21-30, 31-40, 41-45
    mir = [r for r in src if r["id"] != 5]  # chunk 1 (missing)
    mir = [row(r["id"], name="x") if r["id"] in (15, 44) else r for r in mir]  # chunks 2 and 5 (different)
    res = compare(SCHEMA, chunks(src, 10), mirror_of(mir))
    assert (res.missing, res.extra, res.different) == (1, 0, 2)
    assert [(r.start, r.end) for r in res.repair_ranges] == [((1,), (21,)), ((41,), None)]
    assert res.repair_conf() == {"action": "start", "tables": ["s.t"],
                                 "key_ranges": {"s.t": [{"start": [1], "end": [21]}, {"start": [41], "end": None}]},
                                 "parallelism": 2}
    assert res.to_dict()["repair_ranges"] == [{"start": [1], "end": [21]}, {"start": [41], "end": None}]


def test_repair_of_rows_the_source_no_longer_has_reads_the_ranges_that_hold_them():
    """Issue 57: with a one-integer key an extra mirror row counts in the chunk whose range
    holds its key (one below the first chunk widens the first range down to it), so the repair
    is a snapshot of those ranges, which converges inside them; the whole table otherwise."""
    src = [row(i) for i in range(3, 46)]  # chunks of 10: 3-12, 13-22, 23-32, 33-42, 43-45
    res = compare(SCHEMA, chunks(src, 10), mirror_of([row(1), *src, row(99)]))
    assert res.extra == 2 and res.different == 0, res.to_dict()
    assert [(r.start, r.end) for r in res.repair_ranges] == [((1,), (13,)), ((43,), None)]
    assert res.repair_conf()["key_ranges"] == {"s.t": [{"start": [1], "end": [13]}, {"start": [43], "end": None}]}
    assert compare(SCHEMA, chunks(src, 10), mirror_of(src)).repair_conf() is None
    # a text key: the mirror cannot place a key in the database's order, so the whole table
    text = TableSchema(SCHEMA.table, tuple(Column(c.name, "string" if c.name == "id" else c.type) for c in SCHEMA.columns),
                       ("id",))
    trows = [{**r, "id": f"k{r['id']:03d}"} for r in src]
    tpairs = [(encode_key([r["id"]]), r) for r in trows]
    tres = compare(text, [tpairs[i:i + 10] for i in range(0, len(tpairs), 10)],
                   mirror_of(trows + [{**row(99), "id": "k999"}], schema=text))
    assert tres.extra == 1 and tres.repair_conf() == {"action": "start", "tables": ["s.t"]}


def _found(res) -> tuple:
    return (res.missing, res.extra, res.different, res.mismatched_chunks, res.rows_checked, res.source_rows,
            res.mirror_rows, [(r.start, r.end) for r in res.repair_ranges], sorted(m.describe() for m in res.examples))


def test_hash_partitions_find_what_one_partition_finds():
    """A mirror larger than a partition is compared a hash partition at a time (both sides
    spilled to scratch files): the same counts, chunks, repair ranges and examples."""
    src = [row(i) for i in range(1, 60)]
    mir = [r for r in src if r["id"] not in (5, 33)] + [row(99), row(100)]
    mir = [row(r["id"], name="x") if r["id"] in (15, 44, 45) else r for r in mir]
    whole = compare(SCHEMA, chunks(src, 10), mirror_of(mir))
    assert (whole.missing, whole.extra, whole.different, whole.mismatched_chunks) == (2, 2, 3, 5)  # 51-59: 99, 100
    for partition_rows in (7, 2, 1):
        index = mirror_of(mir, partition_rows=partition_rows)
        assert index.parts == -(-len(mir) // partition_rows)
        assert _found(compare(SCHEMA, chunks(src, 10), index)) == _found(whole), partition_rows


def test_the_mirror_is_read_a_batch_at_a_time_and_the_source_chunks_once():
    """verify_table hands the mirror over as batches (never the whole table) and the source as
    a generator of chunks: each is consumed once, and the rows of the examples are read again
    through ``reread`` (only the chunk that holds them)."""
    src = [row(i) for i in range(1, 31)]
    rows = events_to_mirror_rows(SCHEMA, pa.table({
        "table": ["s.t"] * 29, "op": ["u"] * 29,
        "key": [encode_key([r["id"]]) for r in src if r["id"] != 17],
        "position": [Position(i + 1).encode() for i in range(29)],
        "after": [encode_row(r) for r in src if r["id"] != 17]}))
    handed = []

    def batches():
        for b in rows.to_batches(max_chunksize=4):
            handed.append(b.num_rows)
            yield b

    index = MirrorIndex(SCHEMA, batches(), count=rows.num_rows, partition_rows=10)
    assert sum(handed) == 29 and max(handed) <= 4 and index.rows == 29 and index.parts == 3
    reads = []

    def reread(i, after):
        reads.append((i, after))
        return chunks(src, 10)[i]

    res = compare(SCHEMA, iter(chunks(src, 10)), index, reread=reread)
    assert (res.missing, res.mismatched_chunks) == (1, 1)
    assert reads == [(1, (10,))]  # the second chunk, read on after key 10
    assert res.examples[0].describe() == "key [17]: missing from the mirror"
    assert res.examples[0].source["name"] == "n17 é"
