"""The mirror's merge-on-read layout (sinks/delta_buckets.py): writes append change files whose
cost follows the changes, readers take the newest version per key, background compaction folds
and splits buckets within a budget, a mirror written by the copy-on-write code migrates in
place, and every reader returns the live rows while compaction runs. A hypothesis state
machine drives writes, late rows, replays, compactions and unit changes against a model."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from airflow_provider_cdc import storage
from airflow_provider_cdc.core import arrow_types
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import bucket_fold, key_index, mirror_compaction, mirror_readers, mirror_table
from airflow_provider_cdc.sinks import delta_buckets as db
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

pytestmark = pytest.mark.integration

SOURCE = "src"
T = TableName("public", "items")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("v", "string")), ("id",))
FIXTURE = Path(__file__).parent.parent / "fixtures" / "mirror_v1"


def ev(pos: int, op: str, key: int, value: str | None = None) -> dict:
    return {
        "position": Position(pos).encode(), "table": T.id, "op": op, "key": encode_key([key]), "before": None,
        "after": None if op == "d" else encode_row({"id": key, "v": value}), "ts_ms": pos, "watermark": None,
        "snapshot": op == "r", "batch": f"b{pos}",
    }


def write(data_dir: str, events: list[dict]) -> None:
    MirrorDeltaSink(data_dir, SOURCE).write(pa.Table.from_pylist(events, schema=EVENT_SCHEMA))


def live(data_dir: str) -> dict[int, str]:
    return {r["id"]: r["v"] for r in mirror_readers.read_mirror(data_dir, SOURCE, T).to_pylist()}


def version(data_dir: str) -> db.MirrorVersion:
    path = mirror_dir(data_dir, SOURCE, T)
    return db.read_version(mirror_table._delta(path), path)


def set_unit(data_dir: str, rows: int) -> None:
    mirror_table._set_properties(mirror_table._delta(mirror_dir(data_dir, SOURCE, T)),
                                 {mirror_table.BUCKET_ROWS_PROPERTY: str(rows)})


def check_layout(v: db.MirrorVersion) -> None:
    """Files only in leaves, and no file holds a key twice."""
    with_files = {b for b, f in v.files.items() if f}
    assert not (with_files & v.inner), f"files in split buckets {sorted(with_files & v.inner)}"
    for paths in v.files.values():
        for p in paths:
            keys = db.read_bucket(v.table_uri, [p], v.schema)[arrow_types.KEY_COLUMN]
            assert len(keys) == len(set(keys.to_pylist())), p


def every_reader(data_dir: str) -> list[dict[int, str]]:
    import duckdb

    count, batches = mirror_readers.mirror_batches(data_dir, SOURCE, T, batch_rows=7)
    streamed = {r["id"]: r["v"] for b in batches for r in b.to_pylist()}
    assert count >= len(streamed)
    keys = [encode_key([k]) for k in range(0, 1100)]
    by_key = {r["id"]: r["v"] for r in mirror_readers.mirror_rows_of(data_dir, SOURCE, T, keys).to_pylist()}
    duck = dict(mirror_readers.read_duckdb(duckdb.connect(), data_dir, SOURCE, T).fetchall())
    pandas = dict(zip(*[mirror_readers.read_pandas(data_dir, SOURCE, T)[c].tolist() for c in ("id", "v")], strict=True))
    return [live(data_dir), streamed, by_key, duck, pandas]


@pytest.fixture
def data_dir(tmp_path) -> str:
    d = str(tmp_path)
    storage.write_text(schema_path(d, SOURCE, T), SCHEMA.to_json())
    return d


def test_a_write_appends_change_files_whose_bytes_follow_the_changes(data_dir):
    write(data_dir, [ev(1 + i, "c", i, f"v{i}" * 20) for i in range(20_000)])
    mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), budget_rows=None, everything=True)
    before = version(data_dir)
    assert not any(i.change for i in before.info.values())
    table_bytes = sum(before.sizes.values())
    write(data_dir, [ev(100_000 + i, "u", i * 97 % 20_000, "changed") for i in range(40)])
    after = version(data_dir)
    new = set(after.sizes) - set(before.sizes)
    assert set(before.sizes) <= set(after.sizes), "a write removed (rewrote) a stored file"
    assert new and all(after.info[p].change for p in new)
    assert sum(after.sizes[p] for p in new) < 0.05 * table_bytes
    got = live(data_dir)
    assert len(got) == 20_000 and sum(v == "changed" for v in got.values()) == 40
    # plain Delta readers see the superseded versions until compaction folds them
    assert mirror_readers.read_mirror_files(data_dir, SOURCE, T).num_rows == 20_040
    mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), budget_rows=None, everything=True)
    assert mirror_readers.read_mirror_files(data_dir, SOURCE, T).num_rows == 20_000 and live(data_dir) == got


def test_a_row_at_or_before_the_horizon_only_updates(data_dir):
    write(data_dir, [ev(1, "c", 1, "a"), ev(2, "c", 2, "b"), ev(5, "d", 1)])
    # the tombstone of 1 goes, the horizon is its position
    assert mirror_compaction.compact(data_dir, SOURCE, T) == 1
    assert mirror_table.horizon(data_dir, SOURCE, T) == Position(5).encode()
    write(data_dir, [ev(1, "c", 1, "a"), ev(4, "u", 2, "late update"), ev(3, "r", 3, "old insert")])
    assert live(data_dir) == {2: "late update"}  # 1 not resurrected, 3 not inserted, 2 updated
    write(data_dir, [ev(6, "c", 3, "new")])
    assert live(data_dir) == {2: "late update", 3: "new"}


def test_of_equal_positions_the_first_written_row_wins_through_compaction_and_splits(data_dir):
    """A row replaces a stored one only when strictly newer (the copy-on-write rule): readers
    resolve equal positions to the first written, in change-file commit order, and compaction
    and splits keep that order (the state machine found the case)."""
    write(data_dir, [ev(12, "c", 0, "first")])
    write(data_dir, [ev(13, "c", 1, "other")])
    write(data_dir, [ev(12, "r", 0, "second")])
    assert live(data_dir) == {0: "first", 1: "other"}
    set_unit(data_dir, 1)
    mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), budget_rows=None)
    assert live(data_dir) == {0: "first", 1: "other"}
    write(data_dir, [ev(12, "u", 0, "third")])
    assert live(data_dir) == {0: "first", 1: "other"}


def test_compaction_splits_a_bucket_past_the_unit_and_writes_follow_the_split(data_dir):
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(400)])
    set_unit(data_dir, 20)
    path = mirror_dir(data_dir, SOURCE, T)
    # one round spreads the oversized buckets a file at a time, then compacts within its budget
    got = mirror_compaction.compact_buckets(path, budget_rows=None)
    assert got["split"] == 8
    while mirror_compaction.due_buckets(version(data_dir)):
        mirror_compaction.compact_buckets(path, budget_rows=None)
    v = version(data_dir)
    check_layout(v)
    assert max(db.level_of(b, v.buckets) for b, f in v.files.items() if f) == 2  # 50 rows a root: 4 of ~13
    assert all(v.info[p].rows <= 20 for f in v.files.values() for p in f)
    write(data_dir, [ev(1000 + i, "u", i, f"w{i}") for i in range(0, 400, 3)] + [ev(2000, "d", 7)])
    check_layout(version(data_dir))
    expect = {i: (f"w{i}" if i % 3 == 0 else f"v{i}") for i in range(400) if i != 7}
    assert all(r == expect for r in every_reader(data_dir))


def _layout(data_dir: str) -> dict[int, list[tuple[int, list]]]:
    """Per bucket with files: each file's rows and keys, in file order."""
    v = version(data_dir)
    return {
        b: sorted((v.info[p].rows, db.read_bucket(v.table_uri, [p], v.schema)[arrow_types.KEY_COLUMN].to_pylist())
                  for p in paths)
        for b, paths in v.files.items() if paths
    }


def test_compaction_folds_a_bucket_a_key_range_at_a_time(data_dir, monkeypatch):
    """Compaction holds a slice of a bucket's rows, not the bucket (sinks/bucket_fold.py): folded
    in slices of 10 kept rows, buckets that split past the unit and drop tombstones end as the
    fold in one slice leaves them (same files, rows and key order), and no read holds more than
    the versions of a slice's keys."""
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(4000)])
    write(data_dir, [ev(10_000 + i, "u", i, f"w{i}") for i in range(0, 4000, 2)])
    write(data_dir, [ev(20_000 + i, "d", i) for i in range(0, 4000, 5)])
    set_unit(data_dir, 300)
    whole = tempfile.mkdtemp(dir=Path(data_dir).parent)
    shutil.copytree(data_dir, whole, dirs_exist_ok=True)
    reads: list[int] = []
    real = bucket_fold.read_range

    def spy(*args, **kwargs):
        t = real(*args, **kwargs)
        reads.append(t.num_rows)
        return t

    monkeypatch.setattr(bucket_fold, "read_range", spy)
    upto = Position(30_000).encode()
    monkeypatch.setattr(bucket_fold, "FOLD_SLICE_ROWS", 10**9)
    one = mirror_compaction.compact_buckets(mirror_dir(whole, SOURCE, T), tombstones_upto=upto,
                                            budget_rows=None, everything=True)
    whole_reads, reads[:] = list(reads), []
    monkeypatch.setattr(bucket_fold, "FOLD_SLICE_ROWS", 10)
    sliced = mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), tombstones_upto=upto,
                                               budget_rows=None, everything=True)
    assert sliced == one and sliced["tombstones"] == 800
    expect = {i: (f"w{i}" if i % 2 == 0 else f"v{i}") for i in range(4000) if i % 5}
    assert live(data_dir) == expect == live(whole)
    assert mirror_readers.read_mirror_files(data_dir, SOURCE, T).num_rows == len(expect)
    v = version(data_dir)
    check_layout(v)
    assert v.inner, "no bucket split past the unit of 300 rows"
    assert _layout(data_dir) == _layout(whole)
    for _b, files in _layout(data_dir).items():
        assert all(keys == sorted(keys) for _n, keys in files)
    # a slice: the versions of 10 kept keys and of the deleted keys between them; the bucket
    # whole: hundreds of keys
    assert 3 * max(reads) < max(whole_reads), (max(reads), max(whole_reads))
    assert len(reads) > 2 * len(whole_reads)


def test_a_bucket_past_twice_the_unit_is_read_a_part_at_a_time(data_dir, monkeypatch):
    """Writes that outpace compaction (a large snapshot's merges) leave buckets far past the
    unit; a reader of the resolved state (tombstones included) then resolves each in parts of about a
    unit by key hash, never whole; a reader of live rows reads a file at a time."""
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(400)])
    set_unit(data_dir, 10)
    write(data_dir, [ev(1000 + i, "u", i, f"w{i}") for i in range(0, 400, 2)] + [ev(2000, "d", 5)])
    parts, real = [], db.read_bucket

    def recording(uri, paths, schema, *, part=None):
        parts.append(part)
        return real(uri, paths, schema, part=part)

    monkeypatch.setattr(mirror_readers, "read_bucket", recording)
    expect = {i: (f"w{i}" if i % 2 == 0 else f"v{i}") for i in range(400) if i != 5}
    assert live(data_dir) == expect
    assert parts == []  # live rows: each file's unmasked rows, a batch at a time, nothing resolved
    assert mirror_readers.read_mirror_raw(data_dir, SOURCE, T).num_rows == 400  # tombstones: resolved
    assert parts and all(p is not None and p[1] >= 4 for p in parts)  # ~75 stored rows a bucket, a unit of 10


def test_the_budget_bounds_a_rounds_compaction_and_the_most_changed_go_first(data_dir):
    write(data_dir, [ev(1 + i, "c", i, "v") for i in range(2_000)])
    mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), budget_rows=None, everything=True)
    root = {b: db.bucket_of(pa.array([encode_key([i])]), 8)[0].as_py() for b, i in ((i, i) for i in range(2_000))}
    heavy = root[0]
    keys = [i for i in range(2_000) if root[i] == heavy][:200] + [i for i in range(2_000) if root[i] != heavy][:30:3]
    write(data_dir, [ev(10_000 + n, "u", k, "x") for n, k in enumerate(keys)])
    v = version(data_dir)
    per = max(v.info[p].rows for f in v.files.values() for p in f if not v.info[p].change)
    mirror_compaction.CHANGE_SHARE, share = 0.5, mirror_compaction.CHANGE_SHARE  # 200 changes of ~250 rows: due
    try:
        assert mirror_compaction.due_buckets(v, budget_rows=per + 1)[0] == heavy
        out = mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), budget_rows=per + 1)
    finally:
        mirror_compaction.CHANGE_SHARE = share
    assert out["buckets"] == 1
    after = version(data_dir)
    assert not any(after.info[p].change for p in after.files[heavy])
    assert sum(1 for f in after.files.values() for p in f if after.info[p].change) == len({root[k] for k in keys}) - 1
    assert sum(v == "x" for v in live(data_dir).values()) == len(keys)


def test_a_mirror_written_before_merge_on_read_migrates_in_place(data_dir):
    """tests/fixtures/mirror_v1 was written by the copy-on-write code (tests/fixtures/make_mirror_v1.py)."""
    path = mirror_dir(data_dir, SOURCE, T)
    shutil.copytree(FIXTURE, path)
    expect = {i: f"v{i}" for i in range(400)}
    expect.update({i: f"u{i}" for i in range(0, 400, 7)})
    for i in range(3, 400, 11):
        expect.pop(i)
    old = version(data_dir)
    assert old.buckets == 8 and not old.inner and not any(i.change for i in old.info.values())
    assert all(r == expect for r in every_reader(data_dir))
    write(data_dir, [ev(5000 + i, "u", i, f"n{i}") for i in range(0, 400, 5)] + [ev(6000, "c", 1000, "new")])
    expect.update({i: f"n{i}" for i in range(0, 400, 5)}, **{})
    expect[1000] = "new"
    assert all(r == expect for r in every_reader(data_dir))
    set_unit(data_dir, 30)
    mirror_compaction.compact_buckets(path, tombstones_upto=Position(6000).encode(), budget_rows=None, everything=True)
    while mirror_compaction.due_buckets(version(data_dir)):
        mirror_compaction.compact_buckets(path, tombstones_upto=Position(6000).encode(), budget_rows=None)
    v = version(data_dir)
    check_layout(v)
    assert v.inner and v.version > old.version and mirror_compaction.tombstone_count(data_dir, SOURCE, T) == 0
    assert all(r == expect for r in every_reader(data_dir))


def test_every_reader_returns_the_live_rows_while_compaction_runs(data_dir, monkeypatch):
    """A write lands between compaction's read and its commit (forced through the commit): the
    readers are right at that point, compaction's commit conflicts, it reads again and folds
    the write in, and nothing is lost."""
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(50)])
    write(data_dir, [ev(100 + i, "u", i, f"w{i}") for i in range(0, 50, 2)] + [ev(200, "d", 3)])
    expect = {i: (f"w{i}" if i % 2 == 0 else f"v{i}") for i in range(50) if i != 3}
    seen, real_commit = [], db.commit

    def commit_after_a_write(v, adds, removed, *, operation, **kw):
        if operation == "compact" and not seen:
            assert all(r == expect for r in every_reader(data_dir))  # compaction's files are not visible yet
            write(data_dir, [ev(300, "u", 1, "during"), ev(301, "d", 4)])
            expect[1] = "during"
            expect.pop(4)
            seen.append(v.version)
            assert all(r == expect for r in every_reader(data_dir))
        return real_commit(v, adds, removed, operation=operation, **kw)

    monkeypatch.setattr(mirror_table, "commit", commit_after_a_write)
    monkeypatch.setattr(mirror_compaction, "CHANGE_SHARE", 0.0)  # any change makes a bucket due
    out = mirror_compaction.compact_buckets(mirror_dir(data_dir, SOURCE, T), tombstones_upto=Position(250).encode(),
                                            budget_rows=None)
    assert seen and out["buckets"] >= 1
    v = version(data_dir)
    assert v.version > seen[0] + 1  # the write, then compaction's retry
    check_layout(v)
    assert all(r == expect for r in every_reader(data_dir))


# --- storage that follows the changes (issue 49): rounds that each change a few rows of every
# bucket write about those rows, compactions included, not the buckets; change files merge in
# size tiers so a bucket's file count stays bounded; a bucket folds into its base once its
# changes reach CHANGE_SHARE of it; readers see the live rows throughout

ROWS, ROUNDS, CHANGED = 4_000, 40, 80


def _files(data_dir: str) -> dict[str, int]:
    return dict(version(data_dir).sizes)


def test_rounds_of_small_changes_write_about_the_changed_rows_and_keep_few_files(data_dir):
    path = mirror_dir(data_dir, SOURCE, T)
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(ROWS)])
    mirror_compaction.compact_buckets(path, budget_rows=None, everything=True)
    model = {i: f"v{i}" for i in range(ROWS)}
    rng = random.Random(7)
    pos = 10_000
    changed_bytes = compaction_bytes = 0
    seen = _files(data_dir)
    for r in range(ROUNDS):
        events = []
        for k in rng.sample(range(ROWS), CHANGED):
            pos += 1
            events.append(ev(pos, "u", k, f"r{r}k{k}"))
            model[k] = f"r{r}k{k}"
        write(data_dir, events)
        now = _files(data_dir)
        changed_bytes += sum(now[p] for p in set(now) - set(seen))
        seen = now
        mirror_compaction.compact_buckets(path, budget_rows=None)
        now = _files(data_dir)
        compaction_bytes += sum(now[p] for p in set(now) - set(seen))
        seen = now
        v = version(data_dir)
        most = max(len(f) for f in v.files.values())
        # a base and at most CHANGE_FILES - 1 files in each of two tiers, plus the newest
        assert most <= 1 + 2 * mirror_compaction.CHANGE_FILES, (r, most)
    assert live(data_dir) == model
    # 80 changed rows a round over 8 buckets of ~500 rows: folding the changed buckets every
    # round (the rule before) wrote ~50 times the changed bytes; the tiers write about 1-2 times
    assert compaction_bytes <= 2 * changed_bytes, (compaction_bytes, changed_bytes)
    v = version(data_dir)
    assert any(v.info[p].change for f in v.files.values() for p in f)
    check_layout(v)
    readers = every_reader(data_dir)  # the look-up by key asks for keys below 1,100
    assert readers[2] == {k: v for k, v in model.items() if k < 1_100}
    assert all(got == model for i, got in enumerate(readers) if i != 2)


def test_a_bucket_folds_into_its_base_once_its_changes_reach_the_share(data_dir):
    path = mirror_dir(data_dir, SOURCE, T)
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(800)])
    mirror_compaction.compact_buckets(path, budget_rows=None, everything=True)
    bases = {b: f for b, f in version(data_dir).files.items() if f}
    write(data_dir, [ev(5_000 + i, "u", i, "x") for i in range(0, 800, 10)] + [ev(6_000, "d", 3)])
    assert mirror_compaction.compact_buckets(path, budget_rows=None)["buckets"] == 0  # 10% of each bucket: not yet
    assert all(set(bases[b]) <= set(f) for b, f in version(data_dir).files.items() if b in bases)
    write(data_dir, [ev(7_000 + i, "u", i, "y") for i in range(800)])  # every row: due everywhere
    out = mirror_compaction.compact_buckets(path, budget_rows=None)
    assert out["buckets"] == len(bases)
    v = version(data_dir)
    assert all(len(f) == 1 and not v.info[f[0]].change for f in v.files.values() if f)
    assert live(data_dir) == {i: "y" for i in range(800)}


def test_a_change_run_is_the_newest_files_of_one_tier(data_dir, monkeypatch):
    """The merge rule alone: files join the run from the newest back while no larger than the
    run so far; CHANGE_FILES of them merge, keeping the older, larger file and tombstones."""
    monkeypatch.setattr(mirror_compaction, "CHANGE_FILES", 3)
    path = mirror_dir(data_dir, SOURCE, T)
    one_bucket = [k for k in range(2_000) if db.bucket_of(pa.array([encode_key([k])]), 8)[0].as_py() == 0]
    write(data_dir, [ev(1 + i, "c", k, "base") for i, k in enumerate(one_bucket[:20])])  # the base: 20 rows
    pos = 100
    for n in (1, 1):
        pos += 1
        write(data_dir, [ev(pos, "u", k, f"p{pos}") for k in one_bucket[:n]])
    v = version(data_dir)
    assert mirror_compaction.change_run(v, v.files[0]) == []  # 20, 1, 1: two of the tier only
    write(data_dir, [ev(200, "d", one_bucket[1])])
    v = version(data_dir)
    run = mirror_compaction.change_run(v, v.files[0])
    assert len(run) == 3 and run == list(v.files[0][-3:])
    assert mirror_compaction.merge_change_runs(path) == 1
    after = version(data_dir)
    assert len(after.files[0]) == 2 and after.info[after.files[0][1]].change
    assert after.files[0][0] == v.files[0][0]  # the older, larger file (the first write: the base) stays
    got = live(data_dir)
    assert one_bucket[1] not in got and got[one_bucket[0]] == "p102"
    assert mirror_compaction.tombstone_count(data_dir, SOURCE, T) == 1


class MirrorMachine(RuleBasedStateMachine):
    """Writes (new positions), late snapshot rows (newer than the horizon), replays of earlier
    batches, budgeted and full compactions and changes of the unit, in any order: the live
    rows always equal the model's, and the layout stays valid."""

    @initialize()
    def start(self):
        self.dir = tempfile.mkdtemp(prefix="mirror-machine-")
        storage.write_text(schema_path(self.dir, SOURCE, T), SCHEMA.to_json())
        self.pos = 10
        self.state: dict[int, tuple[int, str | None]] = {}  # key -> (position, value; None: deleted)
        self.batches: list[list[dict]] = []

    def teardown(self):
        mirror_compaction.CHANGE_FILES, mirror_compaction.CHANGE_SHARE = POLICY
        key_index.MIN_ROWS, key_index.BLOCK = INDEXING
        shutil.rmtree(self.dir, ignore_errors=True)

    def _apply(self, events: list[dict]) -> None:
        h = mirror_table.horizon(self.dir, SOURCE, T)
        for e in events:
            k, p = int(e["key"][1:-1]), Position.decode(e["position"]).major
            stored = self.state.get(k)
            if (stored is not None and p > stored[0]) or (stored is None and (h is None or e["position"] > h)):
                self.state[k] = (p, None if e["op"] == "d" else f"{e['op']}{p}")
        write(self.dir, events)

    @rule(changes=st.lists(st.tuples(st.integers(0, 40), st.sampled_from("cud")), min_size=1, max_size=12))
    def changes(self, changes):
        batch, seen = [], set()
        for k, op in changes:
            if k in seen:
                continue
            seen.add(k)
            self.pos += 1
            batch.append(ev(self.pos, op, k, f"{op}{self.pos}"))
        self.batches.append(batch)
        self._apply(batch)

    @rule(key=st.integers(0, 40), back=st.integers(1, 5))
    def late_row(self, key, back):
        h = mirror_table.horizon(self.dir, SOURCE, T)
        low = 0 if h is None else Position.decode(h).major
        p = max(low + 1, self.pos - back)
        if p >= self.pos:
            return
        self._apply([ev(p, "r", key, f"r{p}")])

    @rule(i=st.integers(0, 100))
    def replay(self, i):
        if self.batches:
            self._apply(self.batches[i % len(self.batches)])

    @rule(budget=st.sampled_from([None, 10, 60]), bound=st.booleans())
    def compact_round(self, budget, bound):
        upto = Position(self.pos).encode() if bound else None
        mirror_compaction.compact_buckets(mirror_dir(self.dir, SOURCE, T), tombstones_upto=upto,
                                          budget_rows=budget)
        self._forget_removed()

    @rule()
    def compact_all(self):
        mirror_compaction.compact(self.dir, SOURCE, T)
        self._forget_removed()

    @rule(files=st.sampled_from([2, 3, 8]), share=st.sampled_from([0.3, 1.0, 4.0]))
    def compaction_policy(self, files, share):
        """How soon change files merge among themselves and fold into the base."""
        mirror_compaction.CHANGE_FILES, mirror_compaction.CHANGE_SHARE = files, share

    @rule(min_rows=st.sampled_from([2, 10**9]), block=st.sampled_from([1, 3, 256]))
    def key_indexes(self, min_rows, block):
        """Files written from now on get a key index (or not), in blocks of this size: a write
        finds the rows it masks through it (sinks/key_index.py)."""
        key_index.MIN_ROWS, key_index.BLOCK = min_rows, block

    @rule(i=st.integers(0, 100), how=st.sampled_from(["delete", "truncate", "foreign"]))
    def damage_an_index(self, i, how):
        """A missing, torn or misplaced index only costs time: the write reads the keys."""
        if mirror_table._open(mirror_dir(self.dir, SOURCE, T)) is None:
            return
        uri = version(self.dir).table_uri
        indexed = [p for p in version(self.dir).sizes if storage.exists(key_index.location(uri, p))]
        if not indexed:
            return
        where = key_index.location(uri, indexed[i % len(indexed)])
        if how == "delete":
            storage.delete(where)
        elif how == "truncate":
            data = storage.read_bytes(where)
            storage.write_bytes(where, data[: len(data) // 2])
        else:
            others = [p for p in indexed if key_index.location(uri, p) != where]
            if others:
                storage.write_bytes(where, storage.read_bytes(key_index.location(uri, others[0])))

    @rule()
    def vacuum_now(self):
        """Past the retention: an index goes with its file, and stays while its file is live."""
        path = mirror_dir(self.dir, SOURCE, T)
        if mirror_table._open(path) is None:
            return
        mirror_compaction.vacuum(path, 0)
        active = set(version(self.dir).sizes)
        root = Path(storage.local_path(storage.join(version(self.dir).table_uri, key_index.INDEX_DIR)))
        left = {str(p.relative_to(root))[: -len(key_index.SUFFIX)] for p in root.rglob("*" + key_index.SUFFIX)}
        assert left <= active, f"indexes of removed files kept: {sorted(left - active)}"

    @rule(unit=st.sampled_from([3, 8, 1000]))
    def unit(self, unit):
        if mirror_table._open(mirror_dir(self.dir, SOURCE, T)) is not None:
            set_unit(self.dir, unit)

    def _forget_removed(self):
        """Tombstones compaction removed: the key is absent now (the horizon keeps it out)."""
        if mirror_table._open(mirror_dir(self.dir, SOURCE, T)) is None:
            return
        stored = {r["id"] for r in mirror_readers.read_mirror_raw(self.dir, SOURCE, T).to_pylist()}
        for k in [k for k, (_p, v) in self.state.items() if v is None and k not in stored]:
            del self.state[k]

    @invariant()
    def matches_the_model(self):
        if mirror_table._open(mirror_dir(self.dir, SOURCE, T)) is None:
            return
        expect = {k: v for k, (_p, v) in self.state.items() if v is not None}
        assert live(self.dir) == expect
        # I16: a plain Delta reader (delta-rs, deletion vectors applied) sees the same rows, once each
        plain = mirror_readers.read_delta(self.dir, SOURCE, T).to_pylist() if expect or self.state else []
        assert sorted((r["id"], r["v"]) for r in plain) == sorted(expect.items())
        check_layout(version(self.dir))


POLICY = mirror_compaction.CHANGE_FILES, mirror_compaction.CHANGE_SHARE
INDEXING = key_index.MIN_ROWS, key_index.BLOCK
TestMirrorMachine = MirrorMachine.TestCase
TestMirrorMachine.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


def test_a_hot_small_tables_round_reads_only_the_files_it_can_change(data_dir, monkeypatch):
    """Each round updates every row of a small table (pgbench's tellers): every bucket gains a
    change file and the one before is masked whole. A round reads only the newest file of each
    bucket (a file masked whole and older than the write's rows can neither hold a live row nor
    stop one), writes no vector for a file whose rows are masked already, and every reader, the
    package's and delta-rs's, sees the live rows; a replayed round and a replay after a delete
    change nothing."""
    from deltalake import DeltaTable

    from airflow_provider_cdc.sinks import bucket_masks
    from airflow_provider_cdc.sinks.bucket_files import read_order

    keys = range(40)
    pos = 0

    def round_of(r: int) -> list[dict]:
        nonlocal pos
        out = []
        for k in keys:
            pos += 1
            out.append(ev(pos, "u" if r else "c", k, f"r{r}k{k}"))
        return out

    rounds = [round_of(r) for r in range(12)]
    for events in rounds[:-1]:
        write(data_dir, events)
    reads, remasks = [], []
    real_lookup, real_write = key_index.lookup, bucket_masks.dvs.write_vectors
    monkeypatch.setattr(key_index, "lookup", lambda *a, **k: reads.append(a[1]) or real_lookup(*a, **k))
    monkeypatch.setattr(bucket_masks.dvs, "write_vectors",
                        lambda uri, vectors: remasks.append(len(vectors)) or real_write(uri, vectors))
    before = version(data_dir)
    write(data_dir, rounds[-1])
    newest = {read_order(f)[-1] for f in before.files.values() if f}
    assert sorted(reads) == sorted(newest), "a round read files masked whole before it"
    assert max(len(f) for f in before.files.values()) >= 10  # the files it did not read
    # each bucket's vectors: the new file's none (no tombstone), the newest file's rows masked
    assert remasks and all(n == 1 for n in remasks), remasks
    model = {k: f"r11k{k}" for k in keys}
    path = mirror_dir(data_dir, SOURCE, T)
    by_delta_rs = {r["id"]: r["v"] for r in pa.table(DeltaTable(path).scan()).to_pylist()}
    assert live(data_dir) == model and by_delta_rs == model
    monkeypatch.undo()
    write(data_dir, rounds[5])  # a replay: older than every stored winner
    assert live(data_dir) == model
    pos += 1
    write(data_dir, [ev(pos, "d", 3)])
    write(data_dir, rounds[-1][3:4])  # key 3's last update, replayed after its delete
    del model[3]
    assert live(data_dir) == model
    assert {r["id"]: r["v"] for r in pa.table(DeltaTable(path).scan()).to_pylist()} == model
    assert all(got == model for got in every_reader(data_dir)[:2] + every_reader(data_dir)[3:])
