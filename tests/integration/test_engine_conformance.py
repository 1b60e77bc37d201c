"""Engine conformance (I8): the same staged inputs through every engine give the same
``r`` events, the same event-log rows and the same mirror.

Like ibis's backend suite, every test here runs once per engine, through one small
adaptor per engine (:class:`Engine`): the in-process Arrow engine
(pipeline/arrow_engine.py, what a worker runs for small rounds) and the Spark engine
(pipeline/spark/merge_job.py and apply_job.py as functions of one local session, the code
spark-submit runs). The expected outputs come from core.window (merge_window +
mirror_apply) over the staged files; a test that compares the engines with each other
runs both on copies of the same scenario.

Both engines run here on local disk and on a real S3 HTTP server (moto_server on
127.0.0.1): object storage gives the same answer. Spark reaches object storage through its
executors' pyarrow (pipeline/spark/distributed.py; no Hadoop S3 jars).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.pipeline.spark import apply_job, merge_job
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.sinks.mirror_readers import read_mirror_raw
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import atomic_write_table, read_log_events, read_table

from .staged_scenario import (
    ITEMS,
    ITEMS_SCHEMA,
    OTHER,
    OTHER_SCHEMA,
    SOURCE,
    Stage,
    as_tuples,
    build_scenario,
    event_files,
    expected_mirror_list,
    item,
    mirror_list,
    spark_tuples,
)

pytestmark = pytest.mark.integration


# --- the engines -------------------------------------------------------------------------------
@dataclass
class Engine:
    """One engine behind the calls the operators make: ``merge`` (the round's ``r`` events,
    not written), ``merge_round`` (merge and write to the sinks), ``apply`` (staged changelog
    to the sinks)."""

    name: str
    merge: Callable[[list, str], pa.Table]
    merge_round: Callable[[Stage, str], dict]
    apply: Callable[[Stage], dict]


def _sinks(st: Stage, job: str):
    return build_sinks("events,mirror", data_dir=st.data_dir, source=SOURCE, database=None, require_schema=job == "merge")


def _arrow_round(st: Stage, round_file: str) -> dict:
    sinks = _sinks(st, "merge")
    try:
        return arrow_engine.merge_round(merge_job.load_chunks(round_file), data_dir=st.data_dir, source=SOURCE, sinks=sinks)
    finally:
        for s in sinks:
            s.close()


def _arrow_apply(st: Stage) -> dict:
    sinks = _sinks(st, "apply")
    try:
        return arrow_engine.apply_changelog(st.data_dir, SOURCE, sinks)
    finally:
        for s in sinks:
            s.close()


def _spark_engine(spark) -> Engine:
    def args(st: Stage) -> list[str]:
        return ["--data-dir", st.data_dir, "--source", SOURCE, "--sinks", "events,mirror"]

    return Engine(
        "spark",
        merge=lambda chunks, changelog: pa.Table.from_pylist([r.asDict() for r in
                                                              merge_job.merge_chunks(spark, chunks, changelog).collect()]),
        # groups of at most 15 chunk rows: each chunk its own sink write, unlike the Arrow engine
        merge_round=lambda st, rf: merge_job.main(["--chunks", rf, "--max-batch-rows", "15", *args(st)]),
        apply=lambda st: apply_job.main(args(st)),
    )


ARROW = Engine("arrow", merge=arrow_engine.merge_chunks, merge_round=_arrow_round, apply=_arrow_apply)


@pytest.fixture(params=["arrow", "spark"])
def engine(request) -> Engine:
    return ARROW if request.param == "arrow" else _spark_engine(request.getfixturevalue("spark"))


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path, monkeypatch) -> str:
    """Where a test stages its inputs: a local folder, or a prefix on the S3 server."""
    if request.param == "local":
        return str(tmp_path)
    s3 = request.getfixturevalue("s3_server")
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    return f"s3://{s3['bucket']}/conformance-{tmp_path.name}"


def _merged(engine: Engine, st: Stage) -> set:
    return spark_tuples(engine.merge(st.chunks, changelog_dir(st.data_dir, SOURCE)))


# --- merge: DBLog steps 4-5 ---------------------------------------------------------------------
def test_a_fixed_round_merges_as_core_says(engine, root):
    st = build_scenario(root if root.startswith("s3://") else Path(root) / "fixed dir %20+ü")  # Spark URL-encodes paths
    got = _merged(engine, st)
    want = st.expected_merge()
    assert got == as_tuples(want)
    keys = {(e.table, e.key) for e in want}
    # the window rules this scenario exercises, spelled out
    assert (ITEMS.id, "[3]") not in keys and (ITEMS.id, "[15]") not in keys  # changed in A's window
    assert (ITEMS.id, "[25]") not in keys and (ITEMS.id, "[30]") not in keys  # in B's window
    assert (ITEMS.id, "[12]") in keys  # changed only after the first hwA
    assert (ITEMS.id, "[1]") not in keys and ("shop.other", '["k2"]') not in keys
    assert ("shop.other", '["k1"]') in keys and (ITEMS.id, "[10]") in keys  # 10: deleted after hwA


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_rounds_merge_as_core_says(engine, tmp_path, seed):
    """Random interleavings of many chunks' watermarks and changes (keys reused across
    windows, duplicate watermark ids, orphans, TRUNCATEs)."""
    rnd = random.Random(seed)
    st = Stage(tmp_path / f"r{seed}")
    n_chunks = rnd.randint(3, 7)
    opened: list[int] = []
    pending = list(range(n_chunks))
    while pending or opened:
        r = rnd.random()
        if pending and r < 0.25:
            c = pending.pop(0)
            st.watermark(f"lw{c}")
            opened.append(c)
        elif opened and r < 0.4:
            c = opened.pop(rnd.randrange(len(opened)))
            st.watermark(f"hw{c}")
            if rnd.random() < 0.2:
                st.watermark(f"hw{c}")  # re-delivered id
        elif r < 0.45:
            st.watermark(f"orphan{rnd.randint(0, 99)}")
        elif r < 0.47:  # a TRUNCATE: drops every chunk whose window holds it
            st.log.append(ChangeEvent(ITEMS.id, "t", None, st._next(), None, None, ts_ms=st.pos))
        else:
            k = rnd.randint(1, 10 * n_chunks + 5)
            op = rnd.choice("cud")
            st.change(ITEMS, op, [k], None if op == "d" else item(k, rnd.randint(0, 9)))
    for c in range(n_chunks):
        rows = [item(k, rnd.randint(0, 9)) for k in range(10 * c + 1, 10 * c + 11) if rnd.random() < 0.8]
        st.chunk(ITEMS, c, f"lw{c}", f"hw{c}", rows, "id")
    st.stage_log(cuts=sorted(rnd.sample(range(1, max(2, len(st.log))), k=min(3, len(st.log) - 1))), overlap=2)
    assert _merged(engine, st) == as_tuples(st.expected_merge())


def test_a_replaced_chunk_file_fails_the_round_by_name_and_commits_nothing(engine, tmp_path):
    """The chunk file of another attempt (fewer rows than the result says): the round fails
    with the error that names the chunk, raised as itself even when an executor found it,
    and the mirror commits nothing of the round."""
    st = build_scenario(tmp_path / engine.name)
    victim = st.chunks[1]
    atomic_write_table(read_table(victim.path).slice(0, 1), victim.path)
    with pytest.raises(ConfigurationError, match=rf"chunk {victim.seq} of table {victim.table}.* holds 1 rows but the "
                                                 rf"chunk result says {victim.rows}.*re-run the chunk task"):
        engine.merge_round(st, st.round_file())
    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        assert read_mirror_raw(st.data_dir, SOURCE, schema.table).num_rows == 0


def test_a_truncate_inside_a_window_drops_that_chunk(engine, tmp_path):
    st = Stage(tmp_path / engine.name)
    st.watermark("lw0")
    st.watermark("lw1")
    st.log.append(ChangeEvent(ITEMS.id, "t", None, st._next(), None, None, ts_ms=st.pos))
    st.watermark("hw0")
    st.watermark("lw2")
    st.watermark("hw1")
    st.watermark("hw2")
    for c in range(3):
        st.chunk(ITEMS, c, f"lw{c}", f"hw{c}", [item(k, 1) for k in range(10 * c + 1, 10 * c + 4)], "id")
    st.stage_log(cuts=[3])
    got = _merged(engine, st)
    assert got == as_tuples(st.expected_merge())
    assert sorted(t[1] for t in got) == ["[21]", "[22]", "[23]"]  # chunks 0 and 1 held the TRUNCATE


# --- merge + apply through the sinks ------------------------------------------------------------
def test_merge_and_apply_write_the_mirror_core_expects(engine, root):
    """Both jobs through the sinks: the mirror equals core's reference (the round's ``r``
    events and the log applied with mirror_apply), and a re-run changes nothing (I3)."""
    st = build_scenario(root if root.startswith("s3://") else Path(root) / "s")
    ms = engine.merge_round(st, st.round_file())
    ap = engine.apply(st)
    assert ms["chunks"] == 3 and ms["emitted"] == len(st.expected_merge())
    assert ap["events"] == sum(1 for e in read_log_events(changelog_dir(st.data_dir, SOURCE)) if isinstance(e, ChangeEvent))
    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        assert mirror_list(st.data_dir, schema) == expected_mirror_list(st, schema)
    files = event_files(st.data_dir)
    assert sum(len(rows) for rows in files.values()) == ms["emitted"] + ap["events"]
    mirror = read_mirror_raw(st.data_dir, SOURCE, ITEMS).to_pylist()
    for sink in ("events", "mirror"):  # forget what was applied: everything is written again
        storage.delete(storage.join(st.data_dir, "output", SOURCE, "_applied", f"{sink}.json"))
    engine.merge_round(st, st.round_file())
    engine.apply(st)
    assert event_files(st.data_dir) == files
    assert read_mirror_raw(st.data_dir, SOURCE, ITEMS).to_pylist() == mirror


def test_a_truncate_in_the_changelog_empties_its_table_up_to_it(engine, tmp_path):
    """A TRUNCATE among an apply batch's changes: the table's rows older than it go (those of
    earlier batches and of this one), rows after it stay, the other table is untouched; a
    replay of every batch changes nothing."""
    st = Stage(tmp_path / engine.name)
    for k in (1, 2, 3):
        st.change(ITEMS, "c", [k], item(k, 0))
    st.change(OTHER, "c", ["k1"], {"code": "k1", "n": 1})
    st.stage_log(cuts=[])
    engine.apply(st)
    st.change(ITEMS, "c", [4], item(4, 0))
    st.log.append(ChangeEvent(ITEMS.id, "t", None, st._next(), None, None, ts_ms=st.pos))
    st.change(ITEMS, "c", [5], item(5, 0))
    st.change(ITEMS, "u", [1], item(1, 2))
    st.stage_log(cuts=[len(st.log) - 2])  # the TRUNCATE's batch re-delivers the first one's events
    engine.apply(st)
    assert [r["id"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)] == [1, 5]
    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        assert mirror_list(st.data_dir, schema) == expected_mirror_list(st, schema)
    mirror = read_mirror_raw(st.data_dir, SOURCE, ITEMS).to_pylist()
    for sink in ("events", "mirror"):
        storage.delete(storage.join(st.data_dir, "output", SOURCE, "_applied", f"{sink}.json"))
    engine.apply(st)
    assert read_mirror_raw(st.data_dir, SOURCE, ITEMS).to_pylist() == mirror


def test_a_value_the_mirror_cannot_hold_stops_only_its_table(engine, tmp_path):
    """A changelog NaN into items' numeric(12,2) amount: the apply stops the items mirror,
    naming table, column and key, still applies the other table, and the event log keeps
    every event; a merge round (fenced) fails on the same value instead."""
    from airflow_provider_cdc.sinks.mirror_fencing import schema_stopped
    from airflow_provider_cdc.storage.layout import mirror_dir

    st = Stage(tmp_path / engine.name)
    st.change(ITEMS, "c", [1], item(1, 0))
    st.change(OTHER, "c", ["k1"], {"code": "k1", "n": 1})
    st.stage_log(cuts=[])
    engine.apply(st)
    st.change(ITEMS, "u", [1], {**item(1, 1), "amount": "NaN"})
    st.change(OTHER, "c", ["k2"], {"code": "k2", "n": 2})
    st.stage_log(cuts=[])
    ap = engine.apply(st)
    assert ap["events"] == 2
    assert re.search(r"table public\.items, column 'amount', key \[1\]", schema_stopped(mirror_dir(st.data_dir, SOURCE, ITEMS)))
    assert [r["n"] for r in mirror_list(st.data_dir, OTHER_SCHEMA)] == [1, 2]
    assert [r["name"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)] == ["item 1 v0 ü"]
    assert sum(len(rows) for rows in event_files(st.data_dir).values()) == 4
    bad = Stage(tmp_path / f"{engine.name}-merge")
    bad.watermark("lw0")
    bad.watermark("hw0")
    bad.stage_log(cuts=[])
    bad.chunk(OTHER, 0, "lw0", "hw0", [{"code": "k1", "n": 1}], "code")
    bad.chunk(ITEMS, 1, "lw0", "hw0", [{**item(1, 0), "amount": "NaN"}], "id")
    with pytest.raises(ConfigurationError, match=r"table public\.items, column 'amount', key \[1\]"):
        engine.merge_round(bad, bad.round_file())


def test_the_engines_write_the_same_event_log_and_mirror(spark, tmp_path):
    """Arrow and Spark on copies of one scenario: the same event files, row for row, and the
    same mirror, tombstones and positions included."""
    out = {}
    for e in (ARROW, _spark_engine(spark)):
        st = build_scenario(tmp_path / e.name)
        e.merge_round(st, st.round_file())
        e.apply(st)
        out[e.name] = (event_files(st.data_dir),
                       {s.table.id: read_mirror_raw(st.data_dir, SOURCE, s.table).to_pylist()
                        for s in (ITEMS_SCHEMA, OTHER_SCHEMA)})
    assert out["arrow"][0] and out["arrow"][1][ITEMS.id]
    # the origin staged with each change reaches the event log's source block (r rows have none)
    sources = [r["source"] for rows in out["arrow"][0].values() for r in rows]
    assert {s["file"] for s in sources if not s["snapshot"]} == {"bin.000001"}
    assert {s["tx"] for s in sources if s["snapshot"]} == {None} and any(s["thread"] == 7 for s in sources)
    assert out["arrow"] == out["spark"]


def test_object_storage_gives_what_local_disk_gives(s3_server, tmp_path, monkeypatch):
    """The Arrow engine on a real S3 server and on local disk: the same event log and mirror."""
    for k, v in s3_server["env"].items():
        monkeypatch.setenv(k, v)
    out = []
    for root in (str(tmp_path / "local"), f"s3://{s3_server['bucket']}/same-{tmp_path.name}"):
        st = build_scenario(root)
        ARROW.merge_round(st, st.round_file())
        ARROW.apply(st)
        out.append((event_files(st.data_dir), read_mirror_raw(st.data_dir, SOURCE, ITEMS).to_pylist()))
    assert out[0][0] and out[0] == out[1]
    assert json.dumps(out[0], default=str) == json.dumps(out[1], default=str)


def test_a_multiset_table_applies_its_single_copy_changes_in_each_engine(engine, tmp_path):
    """A keyless table captured as a multiset among keyed ones: each engine (the Spark apply hands
    it to the driver, sinks/base.py Sink.deferred) applies its changes to its copies, the keyed
    table's mirror as before, and a replay of every batch changes nothing."""
    from collections import Counter

    from deltalake import DeltaTable

    from airflow_provider_cdc.core.multiset import Alignment
    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.core.schema import MULTISET, Column, TableName, TableSchema
    from airflow_provider_cdc.sinks import multiset, refreshed
    from airflow_provider_cdc.storage.layout import mirror_dir, schema_path
    from airflow_provider_cdc.storage.staged import write_segment

    from .staged_scenario import SCHEMAS, WM_TABLE

    lines = TableName("public", "lines")
    schema = TableSchema(lines, (Column("sku", "string"), Column("qty", "int32")), (), {MULTISET: "true"})
    st = Stage(tmp_path / engine.name)
    storage.write_text(schema_path(st.data_dir, SOURCE, lines), schema.to_json())
    uri = mirror_dir(st.data_dir, SOURCE, lines)
    multiset.mark(uri)
    epoch = refreshed.claim(uri, multiset.table_schema(schema), 1.0)
    base = multiset.write_base(uri, schema, [], 1)  # loaded empty, before the changes below
    multiset.publish(uri, epoch, schema, base, Alignment(Position(1).encode()), lambda: (None, None), {})
    a, b = {"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}
    for op, before, after in [("c", None, a), ("c", None, a), ("c", None, b), ("u", a, b), ("d", b, None), ("c", None, a)]:
        st.log.append(ChangeEvent(lines.id, op, "[]", st._next(), before, after, ts_ms=st.pos, origin=(str(st.pos),) + (None,) * 5))
    st.change(ITEMS, "c", [1], item(1, 0))
    bounds = [0, 3, len(st.log)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        write_segment(st.log[lo:hi], changelog_dir(st.data_dir, SOURCE), WM_TABLE, {**SCHEMAS, lines.id: schema})
    engine.apply(st)

    def copies() -> Counter:
        t = DeltaTable(uri).to_pyarrow_table(columns=["sku", "qty"])
        return Counter(zip(t["sku"].to_pylist(), t["qty"].to_pylist(), strict=True))

    assert copies() == Counter({("a", 1): 2, ("b", 2): 1})
    assert [r["id"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)] == [1]
    for sink in ("events", "mirror"):
        storage.delete(storage.join(st.data_dir, "output", SOURCE, "_applied", f"{sink}.json"))
    engine.apply(st)
    assert copies() == Counter({("a", 1): 2, ("b", 2): 1})
