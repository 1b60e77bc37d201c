"""Fencing of the mirror's writers (docs/DESIGN.md, Fencing; I7 no resurrection).

Real Delta tables on local disk; the interleavings a scheduler produces (a stop while a
merge writes, a retry beside its zombie, compaction between two batches of a merge) are
forced step by step, and a hypothesis state machine drives start / pause / resume / stop /
fail / chunk reads / merge starts, retries and commits / changelog applies / compaction in
any order against an in-memory source, checking after every step that no key the applied
changelog deleted or changed is live in the mirror at an older position.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.errors import FencedError
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.sinks import (
    bucket_fold,
    delta_buckets,
    mirror_compaction,
    mirror_delta,
    mirror_table,
)
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA, write_marker
from airflow_provider_cdc.sinks.event_log import EventLogSink
from airflow_provider_cdc.sinks.mirror_compaction import compact, compact_inactive
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.sinks.mirror_fencing import MergeFence, fence_out_merges
from airflow_provider_cdc.sinks.mirror_readers import read_mirror_raw
from airflow_provider_cdc.sinks.mirror_table import horizon
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

SOURCE = "s"
T = TableName("public", "fenced")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("v", "int64")), ("id",))


def ev(pos: int, op: str, key: int, value: int | None = None, *, batch: str = "b") -> dict:
    after = None if op == "d" else encode_row({"id": key, "v": value})
    return {
        "position": Position(pos).encode(), "table": T.id, "op": op, "key": encode_key([key]), "before": None,
        "after": after, "ts_ms": pos, "watermark": None, "snapshot": op == "r", "batch": batch,
    }


def events(*rows: dict) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=EVENT_SCHEMA)


def stage(data_dir: str) -> None:
    storage.write_text(schema_path(data_dir, SOURCE, T), SCHEMA.to_json())


def mirror_state(data_dir: str) -> dict[int, tuple[int, bool]]:
    """key -> (position, deleted) of every stored row, tombstones included."""
    raw = read_mirror_raw(data_dir, SOURCE, T).to_pylist()
    return {r["id"]: (Position.decode(r["__position"]).major, r["__deleted"]) for r in raw} if raw else {}


def live_keys(data_dir: str) -> set[int]:
    return {k for k, (_p, deleted) in mirror_state(data_dir).items() if not deleted}


@pytest.fixture(params=["local", "s3"])
def data_dir(request, tmp_path, monkeypatch) -> str:
    """The forced interleavings run on local disk and on a real S3 server: the fences are
    Delta commits, and on S3 a commit must fail when its version exists (conditional put)."""
    if request.param == "local":
        d = str(tmp_path)
    else:
        s3 = request.getfixturevalue("s3_server")
        for k, v in s3["env"].items():
            monkeypatch.setenv(k, v)
        d = f"s3://{s3['bucket']}/fencing-{tmp_path.name}"
    stage(d)
    return d


def test_stop_during_a_merge_cannot_bring_a_deleted_row_back(data_dir):
    """The issue's bug, step by step: a merge writes its first batch, the snapshot is stopped,
    the changelog deletes a key the merge's next batch still holds (read before the delete),
    compaction removes the tombstone, then the merge's next batch arrives."""
    mirror = MirrorDeltaSink(data_dir, SOURCE)
    mirror.write(events(ev(1, "c", 1, 10), ev(2, "c", 2, 20)))
    sinks = build_sinks("events,mirror", data_dir=data_dir, source=SOURCE, database=None, require_schema=True, fence_tables=[T.id])
    merge_events, merge_mirror = sinks
    merge_mirror.write(events(ev(5, "r", 1, 10)))  # batch 1 of the round, chunk rows at hw 5
    fence_out_merges(data_dir, SOURCE, T)  # `stop`
    mirror.write(events(ev(7, "d", 2)))  # the changelog deletes key 2 after the chunk's hw
    write_marker(data_dir, SOURCE, "mirror", Position(7))
    assert compact_inactive(data_dir, SOURCE, lambda _t: "stopped") == {T.id: 1}
    assert 2 not in mirror_state(data_dir)  # the tombstone is gone
    with pytest.raises(FencedError, match="epoch"):
        merge_mirror.write(events(ev(5, "r", 2, 20, batch="w2")))  # batch 2: key 2 as of hw 5
    with pytest.raises(FencedError, match="epoch"):
        merge_events.write(events(ev(5, "r", 2, 20, batch="w2")))
    assert live_keys(data_dir) == {1}
    assert not list(Path(data_dir).rglob("w2.parquet"))  # nothing of the fenced batch in the event log


def test_a_stop_before_the_merge_claims_still_wins(data_dir):
    """The merge task checked the snapshot (running), then the stop landed, then the job
    claimed: the claim itself refuses a stopped snapshot, even on a first snapshot whose
    mirror did not exist yet (the stop creates it from the staged schema)."""
    assert fence_out_merges(data_dir, SOURCE, T, "S1") == 1  # no mirror before: created by the stop
    with pytest.raises(FencedError, match="S1 were stopped"):
        build_sinks("events,mirror", data_dir=data_dir, source=SOURCE, database=None, require_schema=True, fence_tables=[(T.id, "S1")])
    fence = MergeFence(data_dir, SOURCE).claim([SCHEMA], {T.id: {"S2"}})  # a new snapshot merges normally
    MirrorDeltaSink(data_dir, SOURCE, fence=fence).write(events(ev(5, "r", 1, 10)))
    assert mirror_state(data_dir) == {1: (5, False)}


def test_a_replay_older_than_the_compaction_horizon_only_updates(data_dir):
    """Without an epoch (a changelog apply replaying a batch, a merge that lost its fence
    check race): rows at or before the horizon never insert, so a compacted delete stays."""
    mirror = MirrorDeltaSink(data_dir, SOURCE)
    mirror.write(events(ev(1, "c", 1, 10), ev(2, "c", 2, 20), ev(3, "d", 2), ev(4, "u", 1, 11)))
    assert compact(data_dir, SOURCE, T) == 1
    assert horizon(data_dir, SOURCE, T) == Position(3).encode()
    mirror.write(events(ev(2, "c", 2, 20), ev(1, "c", 1, 10)))  # the whole batch replayed
    assert mirror_state(data_dir) == {1: (4, False)}
    mirror.write(events(ev(6, "c", 2, 21), ev(5, "u", 1, 12)))  # newer than the horizon: normal writes
    assert mirror_state(data_dir) == {1: (5, False), 2: (6, False)}


def test_a_retried_merge_fences_out_its_zombie(data_dir):
    zombie = MergeFence(data_dir, SOURCE).claim([SCHEMA])
    retry = MergeFence(data_dir, SOURCE).claim([SCHEMA])
    assert retry.epoch(T.id) == zombie.epoch(T.id) + 1
    MirrorDeltaSink(data_dir, SOURCE, fence=retry).write(events(ev(5, "r", 1, 10)))
    with pytest.raises(FencedError):
        MirrorDeltaSink(data_dir, SOURCE, fence=zombie).write(events(ev(5, "r", 1, 10)))
    with pytest.raises(FencedError):
        EventLogSink(data_dir, SOURCE, fence=zombie).write(events(ev(5, "r", 1, 10)))
    zombie_again = MergeFence(data_dir, SOURCE)
    zombie_again.epochs = dict(zombie.epochs)
    with pytest.raises(FencedError):
        zombie_again.check(T.id)
    assert mirror_state(data_dir) == {1: (5, False)}


def test_a_merge_that_read_before_a_fence_change_conflicts_and_rechecks(data_dir, monkeypatch):
    """The check and the commit are one step: a stop landing between the merge's read of the
    table and its commit makes the commit conflict, and the re-read sees the new epoch."""
    fence = MergeFence(data_dir, SOURCE).claim([SCHEMA])
    real_commit = mirror_table.commit
    stopped = []

    def stop_then_commit(v, *args, **kwargs):
        if not stopped:  # the stop commits after this writer read the table version
            stopped.append(fence_out_merges(data_dir, SOURCE, T))
        return real_commit(v, *args, **kwargs)

    monkeypatch.setattr(mirror_table, "commit", stop_then_commit)  # the one commit loop
    with pytest.raises(FencedError):
        MirrorDeltaSink(data_dir, SOURCE, fence=fence).write(events(ev(5, "r", 1, 10)))
    assert stopped and mirror_state(data_dir) == {}


def test_compaction_retries_a_commit_conflict_and_keeps_the_concurrent_write(data_dir, monkeypatch):
    mirror = MirrorDeltaSink(data_dir, SOURCE)
    mirror.write(events(ev(1, "c", 1, 10), ev(2, "c", 2, 20), ev(3, "d", 1)))
    real_commit = mirror_table.commit
    conflicts = []

    def concurrent_write_then_commit(v, *args, **kwargs):
        if not conflicts and kwargs.get("operation") == "compact":  # another writer commits between
            conflicts.append(1)                                    # compaction's read and its commit
            mirror.write(events(ev(9, "d", 2)))
        return real_commit(v, *args, **kwargs)

    backoffs = []
    monkeypatch.setattr(mirror_table, "commit", concurrent_write_then_commit)
    monkeypatch.setattr(mirror_table, "_backoff", lambda attempt: backoffs.append(attempt))
    assert compact(data_dir, SOURCE, T, upto_position=Position(3).encode()) == 1
    assert backoffs, "the concurrent commit should have made the delete conflict and retry"
    assert mirror_state(data_dir) == {2: (9, True)}  # the concurrent tombstone (after the bound) stays
    assert compact(data_dir, SOURCE, T, upto_position=Position(3).encode()) == 0  # idempotent


# ----------------------------------------------------------------------------- state machine
KEYS = range(3)


class FencingMachine(RuleBasedStateMachine):
    """The snapshot's lifecycle, its merges (with retries leaving zombies) and the changelog,
    in any order. The source is a dict; every change gets the next position."""

    def __init__(self):
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="fencing-")
        stage(self.dir)
        self.pos = 0
        self.src: dict[int, int] = {}
        self.log: list[tuple[int, int, str, int | None]] = []  # (pos, key, op, value)
        self.applied = 0
        self.status: str | None = None
        self.sid = 0
        self.rounds: list[tuple[int, list[dict]]] = []  # (snapshot, r events) read, not merging yet
        self.checked: list[tuple[int, list[dict]]] = []  # merge tasks past their pre-check, not claimed yet
        self.writers: list[tuple[int, MergeFence, list[dict]]] = []  # merges in flight (and zombies)
        self.seen: dict[int, int] = {}  # key -> newest position the mirror ever stored

    def _next(self) -> int:
        self.pos += 1
        return self.pos

    @initialize()
    def start_table(self):
        MirrorDeltaSink(self.dir, SOURCE).write(events(ev(self._next(), "c", 0, 0)))
        self.src[0] = 0
        self.log.append((self.pos, 0, "c", 0))
        self.applied = self.pos
        write_marker(self.dir, SOURCE, "mirror", Position(self.applied))

    # --- the source and the changelog
    @rule(key=st.sampled_from(list(KEYS)), delete=st.booleans(), value=st.integers(0, 99))
    def source_change(self, key, delete, value):
        if delete and key in self.src:
            del self.src[key]
            self.log.append((self._next(), key, "d", None))
        elif not delete:
            self.src[key] = value
            self.log.append((self._next(), key, "u", value))

    @precondition(lambda self: self.applied > 1)
    @rule(data=st.data())
    def changelog_batch_replayed(self, data):
        """A zombie or retried apply writes an already applied batch again."""
        hi = self.applied - data.draw(st.integers(0, min(3, self.applied - 1)))
        lo = hi - data.draw(st.integers(0, min(3, hi - 1)))
        batch = [ev(p, op if op != "u" else "c", k, v) for p, k, op, v in self.log if lo <= p <= hi]
        if batch:
            MirrorDeltaSink(self.dir, SOURCE).write(events(*batch))

    @rule()
    def apply_changelog(self):
        batch = [ev(p, op if op != "u" else "c", k, v) for p, k, op, v in self.log if p > self.applied]
        if batch:
            MirrorDeltaSink(self.dir, SOURCE).write(events(*batch))
            self.applied = max(p for p, *_ in self.log)
            write_marker(self.dir, SOURCE, "mirror", Position(self.applied))

    # --- the snapshot's state machine
    @precondition(lambda self: self.status in (None, "stopped", "done"))
    @rule()
    def start(self):
        self.sid += 1
        self.status = "running"

    @precondition(lambda self: self.status == "running")
    @rule()
    def pause(self):
        self.status = "paused"

    @precondition(lambda self: self.status in ("paused", "failed"))
    @rule()
    def resume(self):
        self.status = "running"

    @precondition(lambda self: self.status == "running")
    @rule()
    def fail(self):
        self.status = "failed"

    @precondition(lambda self: self.status in ("running", "paused", "failed"))
    @rule()
    def stop(self):
        self.status = "stopped"
        fence_out_merges(self.dir, SOURCE, T, f"S{self.sid}")

    @precondition(lambda self: self.status == "running")
    @rule(keys=st.sets(st.sampled_from(list(KEYS)), min_size=1))
    def read_chunk(self, keys):
        """DBLog steps 1-5 with an empty window: the chunk rows are the source at its hw."""
        self._next()  # low watermark
        hw = self._next()
        rows = [ev(hw, "r", k, self.src[k], batch=f"w{hw}") for k in sorted(keys) if k in self.src]
        self.rounds.append((self.sid, rows))

    @precondition(lambda self: self.rounds)
    @rule(data=st.data())
    def merge_task_checks(self, data):
        """The merge operator's pre-check (stopped or replaced snapshot: not merged); its
        claim comes in a later step, so a stop can land in between, as in a scheduler."""
        sid, rows = self.rounds.pop(data.draw(st.integers(0, len(self.rounds) - 1)))
        if sid == self.sid and self.status != "stopped":
            self.checked.append((sid, rows))

    @precondition(lambda self: self.checked)
    @rule(data=st.data())
    def merge_job_claims(self, data):
        sid, rows = self.checked.pop(data.draw(st.integers(0, len(self.checked) - 1)))
        try:
            fence = MergeFence(self.dir, SOURCE).claim([SCHEMA], {T.id: {f"S{sid}"}})
        except FencedError:
            assert self.status == "stopped" or sid != self.sid, "a claim was refused for a live snapshot"
            return
        self.writers.append((sid, fence, rows))

    @precondition(lambda self: self.writers)
    @rule(data=st.data())
    def merge_retried_beside_its_zombie(self, data):
        sid, _fence, rows = self.writers[data.draw(st.integers(0, len(self.writers) - 1))]
        if sid == self.sid and self.status != "stopped":
            self.checked.append((sid, list(rows)))

    @precondition(lambda self: self.writers)
    @rule(data=st.data())
    def merge_commits_a_batch(self, data):
        i = data.draw(st.integers(0, len(self.writers) - 1))
        _sid, fence, rows = self.writers[i]
        if rows:
            try:
                MirrorDeltaSink(self.dir, SOURCE, fence=fence).write(events(rows[0]))
            except FencedError:
                self.writers.pop(i)
                return
            rows.pop(0)
        if not rows:
            self.writers.pop(i)

    @precondition(lambda self: self.status == "running")
    @rule()
    def finish(self):
        """The commit task: every round of this snapshot merged -> done, then compaction."""
        pending = [s for s, _ in self.rounds + self.checked] + [s for s, _f, _r in self.writers]
        if self.sid in pending:
            return
        self.status = "done"
        compact(self.dir, SOURCE, T, upto_position=Position(self.applied).encode())

    @rule()
    def changelog_compaction(self):
        compact_inactive(self.dir, SOURCE, lambda _t: self.status)

    # --- I7
    @invariant()
    def no_resurrection_no_step_back(self):
        for key, (pos, deleted) in mirror_state(self.dir).items():
            assert pos >= self.seen.get(key, 0), f"key {key} moved back in time: {self.seen[key]} -> {pos}"
            self.seen[key] = pos
            if not deleted:
                newer = [(p, op) for p, k, op, _v in self.log if k == key and pos < p <= self.applied]
                assert not newer, f"key {key} is live at position {pos} but the applied changelog has {newer} after it"


TestFencingMachine = FencingMachine.TestCase
TestFencingMachine.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def trunc(pos: int, *, batch: str = "b") -> dict:
    return {"position": Position(pos).encode(), "table": T.id, "op": "t", "key": None, "before": None,
            "after": None, "ts_ms": pos, "watermark": None, "snapshot": False, "batch": batch}


def test_a_truncate_removes_older_rows_and_a_late_chunk_cannot_bring_them_back(data_dir):
    """TRUNCATE at 6 in an apply batch: rows written before it go (earlier in the same batch
    too), rows after it stay; then a merge that read its chunk before the TRUNCATE (hw 5)
    commits late: its rows are older than the horizon the TRUNCATE left, so none comes back."""
    mirror = MirrorDeltaSink(data_dir, SOURCE)
    mirror.write(events(ev(1, "c", 1, 10), ev(2, "c", 2, 20)))
    mirror.write(events(ev(3, "u", 1, 11), trunc(6), ev(7, "c", 3, 30), ev(8, "c", 1, 12)))
    assert mirror_state(data_dir) == {3: (7, False), 1: (8, False)}
    assert horizon(data_dir, SOURCE, T) == Position(6).encode()
    late = build_sinks("mirror", data_dir=data_dir, source=SOURCE, database=None, require_schema=True, fence_tables=[T.id])[0]
    late.write(events(ev(5, "r", 1, 10), ev(5, "r", 2, 20)))  # the chunk read before the TRUNCATE
    assert mirror_state(data_dir) == {3: (7, False), 1: (8, False)}
    mirror.write(events(ev(3, "u", 1, 11), trunc(6), ev(7, "c", 3, 30)))  # the batch replayed: no change
    assert mirror_state(data_dir) == {3: (7, False), 1: (8, False)}


def test_a_truncate_before_the_first_row_still_fences_older_writers(data_dir):
    """The apply of a TRUNCATE reaches the mirror before any merge created it: the table is
    created with the horizon, so a later merge of an older chunk inserts nothing."""
    MirrorDeltaSink(data_dir, SOURCE).write(events(trunc(6)))
    MirrorDeltaSink(data_dir, SOURCE).write(events(ev(5, "r", 1, 10), ev(9, "r", 2, 20)))
    assert mirror_state(data_dir) == {2: (9, False)}


def test_sweep_removes_rows_older_than_the_mark_live_or_tombstone(data_dir):
    mirror = MirrorDeltaSink(data_dir, SOURCE)
    mirror.write(events(ev(1, "c", 1, 10), ev(2, "c", 2, 20), ev(3, "d", 2), ev(8, "c", 4, 40)))
    path = mirror_dir(data_dir, SOURCE, T)
    assert mirror_delta.sweep(path, Position(5).encode()) == 2  # key 1 (live) and key 2's tombstone
    assert mirror_state(data_dir) == {4: (8, False)}
    assert mirror_delta.sweep(path, Position(5).encode()) == 0  # idempotent
    assert horizon(data_dir, SOURCE, T) == Position(5).encode()


def test_sweep_and_compaction_read_whole_only_the_buckets_they_change(data_dir, monkeypatch):
    """A finished snapshot's convergence usually removes nothing: the buckets are told apart by
    their position and deleted columns alone, and only a bucket that loses rows is read whole
    (the commit task of a 50M-row snapshot held 2 GB reading every bucket)."""
    mirror = MirrorDeltaSink(data_dir, SOURCE)
    mirror.write(events(*(ev(10 + k, "c", k, k) for k in range(1, 41)), ev(60, "d", 7)))
    path = mirror_dir(data_dir, SOURCE, T)
    read = []
    real = delta_buckets.read_bucket
    for module in (mirror_delta, mirror_compaction):  # the sweep and compaction
        monkeypatch.setattr(module, "read_bucket",
                            lambda uri, paths, schema: read.append(tuple(paths)) or real(uri, paths, schema))
    assert mirror_delta.sweep(path, Position(5).encode()) == 0  # every row is newer than the mark
    assert read == []
    assert mirror_delta.sweep(path, Position(12).encode()) == 1  # key 1 (position 11) goes
    assert len(read) == 1  # its bucket only
    assert mirror_state(data_dir)[2] == (12, False) and 1 not in mirror_state(data_dir)
    read.clear()
    real_range = bucket_fold.read_range  # compaction folds a key range at a time
    monkeypatch.setattr(bucket_fold, "read_range",
                        lambda uri, paths, schema, bound: read.append(tuple(paths)) or real_range(uri, paths, schema, bound))
    assert mirror_compaction.compact(data_dir, SOURCE, T) == 1  # key 7's tombstone: its bucket only
    assert len(read) == 1 and 7 not in mirror_state(data_dir)
