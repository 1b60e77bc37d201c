"""The snapshot state's authority: a register with compare-and-set (storage/register.py) and
the progress store over it (pipeline/snapshot_state.py), model-tested against the in-memory
reference with every interleaving of read and write steps that hypothesis finds."""

from __future__ import annotations

import shutil
import tempfile
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.errors import StateError
from airflow_provider_cdc.core.progress import TRANSITIONS, SnapshotProgress, Status
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.pipeline.snapshot_state import (
    ConflictError,
    MemoryProgressStore,
    RegisterProgressStore,
    update,
)
from airflow_provider_cdc.storage.register import Register

SRC, TID = "src", "public.t"
RANGES = [ChunkRange(None, (100,)), ChunkRange((100,), None)]


def started(sid: str = "S1") -> SnapshotProgress:
    return SnapshotProgress.start(SRC, sid, {TID: RANGES}, {TID: (200,)}, now=1000.0)


def test_a_register_writes_only_on_top_of_the_version_it_read(tmp_path):
    r = Register(str(tmp_path / "reg"))
    assert r.read() == (None, 0)
    assert r.write("a", 0) == 1
    with pytest.raises(ConflictError):
        r.write("b", 0)  # created by another writer first
    assert r.write("b", 1) == 2
    with pytest.raises(ConflictError):
        r.write("c", 1)  # a writer that read version 1 lost to the one that wrote version 2
    assert r.read() == ("b", 2)
    # one value file is left: the replaced ones are deleted after each commit
    assert len([p for p in (tmp_path / "reg").iterdir() if p.suffix == ".parquet"]) == 1


def test_a_register_under_a_hostile_folder_name(tmp_path):
    """file_uris() percent-encodes the location: the register reads by the path it was given."""
    r = Register(str(tmp_path / "data dir é" / "reg"))
    assert r.write("a", 0) == 1 and r.write("b", 1) == 2
    assert r.read() == ("b", 2)


def test_concurrent_updates_lose_nothing(tmp_path):
    store = RegisterProgressStore(str(tmp_path))
    store.write(SRC, TID, started(), 0)
    per_thread, threads = 8, 4

    def bump(p):
        p.tables[TID].rows += 1
        return p

    def worker():
        for _ in range(per_thread):
            update(store, SRC, TID, bump)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    got = store.read(SRC, TID)
    assert got.progress.tables[TID].rows == per_thread * threads
    assert got.version == 1 + per_thread * threads


def test_a_change_is_applied_again_to_what_another_writer_stored_meanwhile(tmp_path):
    """pause vs stop at the store: the stop lands between the pause's read and write; the
    pause's write conflicts and its change, applied to the stopped snapshot, is refused."""
    store = RegisterProgressStore(str(tmp_path))
    store.write(SRC, TID, started(), 0)
    seen = []

    def pause_if_running(p):
        seen.append(p.status)
        if p.status != Status.RUNNING:
            return None
        p.pause()
        return p

    def stop():
        if not seen[1:]:
            update(store, SRC, TID, lambda p: (p.stop(), p)[1])

    out = update(store, SRC, TID, pause_if_running, between=stop)
    assert seen == [Status.RUNNING, Status.STOPPED] and out.status == Status.STOPPED
    assert store.read(SRC, TID).progress.status == Status.STOPPED


def test_a_store_refuses_another_tables_progress(tmp_path):
    store = RegisterProgressStore(str(tmp_path))
    with pytest.raises(StateError, match="cannot be stored"):
        store.write(SRC, "public.other", started(), 0)


def chunk(range_index: int, seq: int, after, last, rows: int, exhausted: bool) -> ChunkResult:
    return ChunkResult(SRC, TID, "S1", seq, "lw", "hw", f"p{seq}", RANGES[range_index], after, last, rows, exhausted)


#: what writers do to a snapshot, each a change of the stored progress (None: leave it)
def _verb(name):
    def change(p):
        if p is None:
            return None
        getattr(p, name)()
        return p
    return change


def _fail(p):
    if p is None or p.status not in (Status.RUNNING, Status.PAUSED):
        return None
    p.fail("boom")
    return p


def _record(range_index: int):
    def change(p):
        if p is None or p.status in (Status.STOPPED, Status.DONE):
            return None
        st_ = next(r for r in p.tables[TID].ranges if r.range.start == RANGES[range_index].start or r.done)
        if st_.done:
            return None
        seq = st_.last_seq + 1 + range_index * 1000
        last = (st_.last_key[0] + 10,) if st_.last_key else ((10,) if range_index == 0 else (110,))
        p.record_chunk(chunk(range_index, seq, st_.last_key, last, 10, last[0] % 100 >= 50))
        if p.status == Status.RUNNING and p.tables[TID].done:
            p.finish()
        return p
    return change


CHANGES = {"pause": _verb("pause"), "resume": _verb("resume"), "stop": _verb("stop"), "fail": _fail,
           "record0": _record(0), "record1": _record(1)}


class StoreMachine(RuleBasedStateMachine):
    """Three writers, each reading then (later) writing, in any interleaving, against the
    register-backed store and the in-memory reference side by side: both accept and refuse
    the same writes, hold the same progress at the same version, and every accepted write is
    a valid transition of the state it was computed from (nothing overwritten unseen)."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="progress-model-")
        self.real, self.ref = RegisterProgressStore(self.dir), MemoryProgressStore()
        for s in (self.real, self.ref):
            s.write(SRC, TID, started(), 0)
        self.pending: dict[int, tuple[SnapshotProgress, SnapshotProgress, int]] = {}
        self.rows_written = 0

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(w=st.integers(0, 2), what=st.sampled_from(sorted(CHANGES)))
    def read_and_change(self, w, what):
        real, ref = self.real.read(SRC, TID), self.ref.read(SRC, TID)
        assert real.version == ref.version and real.progress.to_json() == ref.progress.to_json()
        base = SnapshotProgress.from_json(real.progress.to_json())
        try:
            new = CHANGES[what](SnapshotProgress.from_json(real.progress.to_json()))
        except StateError:
            new = None  # refused by the state it was applied to: nothing to write
        if new is None:
            self.pending.pop(w, None)
        else:
            self.pending[w] = (base, new, real.version)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def write(self, data):
        w = data.draw(st.sampled_from(sorted(self.pending)))
        base, new, version = self.pending.pop(w)
        outcomes = []
        for s in (self.real, self.ref):
            try:
                outcomes.append(s.write(SRC, TID, new, version))
            except ConflictError:
                outcomes.append("conflict")
        assert outcomes[0] == outcomes[1]
        if outcomes[0] != "conflict":
            # accepted only on top of the state it was computed from: a valid step from it
            assert new.status == base.status or new.status in TRANSITIONS[base.status]
            assert new.rows >= base.rows
            self.rows_written = new.rows

    @invariant()
    def same_everywhere(self):
        real, ref = self.real.read(SRC, TID), self.ref.read(SRC, TID)
        assert real.version == ref.version and real.progress.to_json() == ref.progress.to_json()
        assert real.progress.rows == self.rows_written


StoreMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=14, deadline=None)
test_the_register_store_behaves_as_the_in_memory_reference = StoreMachine.TestCase
