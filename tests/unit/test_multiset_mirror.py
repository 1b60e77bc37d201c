"""The multiset mirror (sinks/multiset.py) and the alignment of a load with the log
(core/multiset.py), against a model: a Counter of rows.

The property test runs random single-copy changes through a real Delta table on local disk in
random batches, replaying random runs of batches (a crash between a commit and the applied
marker) and starting from a load whose snapshot saw a random prefix of the changes: the table
always holds exactly the model's copies.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.core.multiset import Alignment
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import MULTISET, Column, TableName, TableSchema
from airflow_provider_cdc.sinks import multiset, refreshed
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA, type_json_events

pytestmark = pytest.mark.unit

T = TableName("public", "lines")
SCHEMA = TableSchema(T, (Column("a", "int32"), Column("b", "string")), (), {MULTISET: "true"})


def _events(changes: list[tuple[str, tuple | None, tuple | None, int, int]]):
    """(op, before, after, position index, xid) -> the table's TableEvents."""
    rows = [
        {
            "position": Position(1000 + i, 0, 0).encode(),
            "table": T.id,
            "op": op,
            "key": "[]",
            "before": None if b is None else json.dumps({"a": b[0], "b": b[1]}),
            "after": None if a is None else json.dumps({"a": a[0], "b": a[1]}),
            "ts_ms": 0,
            "watermark": None,
            "origin": {"tx": str(xid), "lsn": None, "last_commit_lsn": None, "server_id": None, "thread": None,
                       "file": None},
            "snapshot": False,
            "batch": "b",
        }
        for op, b, a, i, xid in changes
    ]
    return type_json_events(T.id, pa.Table.from_pylist(rows, schema=EVENT_SCHEMA), SCHEMA)


def _table(uri: str) -> Counter:
    t = DeltaTable(uri).to_pyarrow_table(columns=["a", "b"])
    return Counter(zip(t["a"].to_pylist(), t["b"].to_pylist(), strict=True))


def _load(uri: str, rows: Counter, alignment: Alignment, catch_up=None) -> None:
    """A load of ``rows`` as the snapshot ``alignment`` saw them (staged as the load stages)."""
    import pyarrow.parquet as pq

    from airflow_provider_cdc.storage.staged import ChunkWriter

    multiset.mark(uri)
    epoch = refreshed.claim(uri, multiset.table_schema(SCHEMA), 1.0)
    path = f"{uri}-staged.parquet"
    flat = [{"a": a, "b": b} for (a, b), n in rows.items() for _ in range(n)]
    with ChunkWriter(SCHEMA, path) as w:
        if flat:
            w.add(pa.repeat(pa.scalar("[]"), len(flat)), flat)
    assert pq.ParquetFile(path).metadata.num_rows == len(flat)
    base = multiset.write_base(uri, SCHEMA, [path], max(1, len(flat)))
    multiset.publish(uri, epoch, SCHEMA, base, alignment, catch_up or (lambda: (None, None)), {})


def test_a_bucket_folds_single_copy_changes_as_a_counter_does():
    ids = ["x", "x", "y", "z", "z", "z"]
    current = pa.table({"v": list(range(6)), multiset.ROW_COLUMN: ids})
    plus = pa.table({"v": [10, 11, 12], multiset.ROW_COLUMN: ["y", "w", "w"]})
    out, missing = multiset.fold_bucket(current, pa.array(["z", "x", "x", "q"]), plus)
    assert Counter(out[multiset.ROW_COLUMN].to_pylist()) == Counter({"y": 2, "z": 2, "w": 2})
    assert missing == 1  # q: a copy the bucket did not hold
    assert multiset._ranks(np.array([3, 1, 3, 3, 1])).tolist() == [0, 0, 1, 2, 1]


def test_a_row_s_bucket_is_its_digest_s_first_eight_hex_digits():
    ids = pa.array(["0cc175b9c0f1b6a831c399e269772661", "ffffffff00000000000000000000000a"]).slice(1)
    assert multiset.bucket_of(ids, 16).tolist() == [int("ffffffff", 16) % 16]
    assert multiset.bucket_of(pa.array(["0cc175b9" + "0" * 24]), 7).tolist() == [int("0cc175b9", 16) % 7]


def test_a_postgres_alignment_holds_what_its_snapshot_saw_before_its_mark():
    mark = Position(500).encode()
    a = Alignment(mark, "100:105:102")
    pos = pa.array([Position(p).encode() for p in (400, 400, 400, 500, 501)])
    txs = pa.array(["99", "102", "106", "101", "101"])
    # seen: xid 99 (finished); running 102 and 106 (after xmax) were not; past the mark nothing is
    assert a.holds(pos, txs).tolist() == [True, False, False, True, False]
    assert Alignment(mark).holds(pos, txs).tolist() == [True, True, True, True, False]  # MariaDB: the mark only
    assert Alignment.from_text(a.to_text()) == a


def test_a_load_read_on_a_standby_is_refused_by_name():
    from airflow_provider_cdc.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="from the primary"):
        Alignment.of_read(T.id, "pos-" + Position(5).encode() + "-0", "replayed-before:0/5")


_ROWS = [(i % 3, "abc"[i % 3]) for i in range(6)]


@st.composite
def _histories(draw):
    """A start state, a run of single-copy changes the source could make from it, the number of
    them the load's snapshot saw, and cuts of the rest into apply batches."""
    start = Counter(draw(st.lists(st.sampled_from(_ROWS), max_size=12)))
    state = Counter(start)
    changes = []
    for i in range(draw(st.integers(0, 25))):
        have = sorted(r for r, n in state.items() if n)
        kind = draw(st.sampled_from(["c", "u", "d"] if have else ["c"]))
        if kind == "c":
            row = draw(st.sampled_from(_ROWS))
            state[row] += 1
            changes.append(("c", None, row, i, 10 + i))
        else:
            old = draw(st.sampled_from(have))
            state[old] -= 1
            new = draw(st.sampled_from(_ROWS)) if kind == "u" else None
            if new is not None:
                state[new] += 1
            changes.append((kind, old, new, i, 10 + i))
    seen = draw(st.integers(0, len(changes)))
    cuts = sorted(set(draw(st.lists(st.integers(seen, len(changes)), max_size=4))))
    replay = draw(st.booleans())
    return start, changes, seen, cuts, replay


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_histories())
def test_loads_and_applies_in_any_batches_with_replays_equal_the_model(tmp_path_factory, history):
    start, changes, seen, cuts, replay = history
    uri = str(tmp_path_factory.mktemp("ms"))
    at_load = Counter(start)
    for _op, b, a, *_ in changes[:seen]:
        if b is not None:
            at_load[b] -= 1
        if a is not None:
            at_load[a] += 1
    # the load's snapshot saw the first ``seen`` changes: its mark is the last of them (MariaDB's rule)
    _load(uri, +at_load, Alignment(Position(1000 + seen - 1 if seen else 999).encode()))
    model = +at_load
    bounds = [seen, *cuts, len(changes)]
    done = seen
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi <= lo:
            continue
        # every batch also holds changes the load saw, or an earlier batch applied (a replay)
        first = 0 if replay else lo
        multiset.apply(uri, _events(changes[first:hi]), SCHEMA)
        for _op, b, a, *_ in changes[max(lo, done):hi]:
            if b is not None:
                model[b] -= 1
            if a is not None:
                model[a] += 1
        done = hi
        assert _table(uri) == +model


def test_a_load_racing_an_apply_recomputes_its_catch_up_and_a_superseded_load_publishes_nothing(tmp_path):
    """An apply commits between a reload's catch-up read and its commit (forced by the catch-up
    hook): the reload's put-if-absent commit loses, it reads the staged changes again and wins
    with them. A load whose epoch a newer load claimed cannot publish."""
    from airflow_provider_cdc.core.errors import FencedError

    uri = str(tmp_path / "t")
    r1, r2 = (1, "a"), (2, "b")
    _load(uri, Counter({r1: 2}), Alignment(Position(999).encode()))
    staged = [("c", None, r2, 0, 10), ("d", r1, None, 1, 11)]  # what capture staged after the reload's read
    calls = []

    def catch_up():
        calls.append(1)
        if len(calls) == 1:  # the race: an apply of the first change commits now
            assert multiset.apply(uri, _events(staged[:1]), SCHEMA) == 1
        return _events(staged), Position(1001).encode()

    # the reload's snapshot saw the table as it was loaded (its mark before the staged changes)
    _load(uri, Counter({r1: 2}), Alignment(Position(999).encode()), catch_up)
    assert len(calls) == 2, "the reload's first commit must have lost to the apply"
    assert _table(uri) == Counter({r1: 1, r2: 1})
    assert multiset.apply(uri, _events(staged), SCHEMA) == 0  # the apply's replay: applied already

    old = refreshed.claim(uri, multiset.table_schema(SCHEMA), 1.0)
    refreshed.claim(uri, multiset.table_schema(SCHEMA), 1.0)  # a newer load
    base = multiset.write_base(uri, SCHEMA, [], 1)
    with pytest.raises(FencedError):
        multiset.publish(uri, old, SCHEMA, base, Alignment(Position(999).encode()), lambda: (None, None), {})
    assert _table(uri) == Counter({r1: 1, r2: 1})
