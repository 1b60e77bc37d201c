"""A new sink is one class and one registry entry (docs/DESIGN.md, Adding a sink): a minimal
in-memory sink, registered by this test under a name of its own, receives a snapshot round
and a changelog round through both engines (the in-process Arrow engine and Spark local, the
code spark-submit runs) with no change to either engine: they build it from ``--sinks`` by
name and call it through the Sink protocol only."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.pipeline.spark import apply_job, merge_job
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.sinks import registry
from airflow_provider_cdc.sinks.base import Events, SchemaCache, Sink, table_events
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import read_log_events

from .staged_scenario import SOURCE, build_scenario

pytestmark = pytest.mark.integration

NAME = "memory_test"


class MemorySink(Sink):
    """Keeps every event it is given as (table, op, key, position, after as canonical JSON)."""

    name = NAME  # placement: DRIVER, the default: any engine hands it the events where it runs

    def __init__(self, data_dir: str, source: str, received: list) -> None:
        self.schemas = SchemaCache(data_dir, source)
        self.received = received

    def write(self, events: Events) -> None:
        for te in table_events(events, self.schemas.get):
            ev = te.events
            afters = te.canonical("after", keep_nulls=True)
            for table, op, key, pos, after in zip(ev["table"].to_pylist(), ev["op"].to_pylist(), ev["key"].to_pylist(),
                                                  ev["position"].to_pylist(), afters, strict=True):
                self.received.append((table, op, key, pos, None if after is None else json.dumps(after, sort_keys=True)))


@pytest.fixture
def received():
    got: list = []
    registry.register(NAME, lambda c: MemorySink(c.data_dir, c.source, got))
    try:
        yield got
    finally:
        registry.unregister(NAME)


def _tuples(events) -> list:
    return sorted((e.table, e.op, e.key, e.position.encode(), None if e.after is None else json.dumps(e.after, sort_keys=True))
                  for e in events)


def _arrow(st, job: str) -> dict:
    sinks = build_sinks(NAME, data_dir=st.data_dir, source=SOURCE, database=None, require_schema=job == "merge")
    assert [type(s) for s in sinks] == [MemorySink]
    try:
        if job == "merge":
            return arrow_engine.merge_round(merge_job.load_chunks(st.round_file()), data_dir=st.data_dir,
                                            source=SOURCE, sinks=sinks)
        return arrow_engine.apply_changelog(st.data_dir, SOURCE, sinks)
    finally:
        for s in sinks:
            s.close()


def _spark(st, job: str) -> dict:
    args = ["--data-dir", st.data_dir, "--source", SOURCE, "--sinks", NAME]
    if job == "merge":
        return merge_job.main(["--chunks", st.round_file(), *args])
    return apply_job.main(args)


@pytest.mark.parametrize("engine", ["arrow", "spark"])
def test_a_registered_sink_gets_a_snapshot_round_and_a_changelog_round_from_both_engines(engine, received, tmp_path,
                                                                                         request):
    run = _arrow if engine == "arrow" else (request.getfixturevalue("spark") and _spark)
    st = build_scenario(tmp_path / engine)

    merged = run(st, "merge")  # the snapshot round: the chunks' rows that survive their windows
    want = st.expected_merge()
    assert merged["emitted"] == len(want) > 0
    assert sorted(received) == _tuples(want)
    assert {op for _t, op, *_ in received} == {"r"}

    received.clear()  # the changelog round: every staged change, once (the segments overlap)
    applied = run(st, "apply")
    changes = [e for e in read_log_events(changelog_dir(st.data_dir, SOURCE)) if isinstance(e, ChangeEvent)]
    assert applied["events"] == len(changes)
    assert sorted(received) == _tuples(changes)
    assert {op for _t, op, *_ in received} == {"u", "c", "d"}

    received.clear()  # its marker moved like any sink's: nothing again
    run(st, "apply")
    assert received == []
