"""Storage that follows the changes (issue 49): rounds that each change a few rows of every
bucket write about those rows, compactions included, not the buckets; change files merge in
size tiers so a bucket's file count stays bounded; a bucket folds into its base once its
changes reach CHANGE_SHARE of it; readers see the live rows throughout."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from airflow_provider_cdc.core.schema import encode_key
from airflow_provider_cdc.sinks import delta_buckets as db
from airflow_provider_cdc.sinks import mirror_compaction as compaction
from airflow_provider_cdc.sinks import mirror_delta as md
from airflow_provider_cdc.storage.layout import mirror_dir

from .test_mirror_layout import SOURCE, T, check_layout, data_dir, ev, every_reader, live, version, write

pytestmark = pytest.mark.integration
__all__ = ["data_dir"]  # the fixture, used by name

ROWS, ROUNDS, CHANGED = 4_000, 40, 80


def _files(data_dir: str) -> dict[str, int]:
    return dict(version(data_dir).sizes)


def test_rounds_of_small_changes_write_about_the_changed_rows_and_keep_few_files(data_dir):
    path = mirror_dir(data_dir, SOURCE, T)
    write(data_dir, [ev(1 + i, "c", i, f"v{i}") for i in range(ROWS)])
    md.compact_buckets(path, budget_rows=None, everything=True)
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
        md.compact_buckets(path, budget_rows=None)
        now = _files(data_dir)
        compaction_bytes += sum(now[p] for p in set(now) - set(seen))
        seen = now
        v = version(data_dir)
        most = max(len(f) for f in v.files.values())
        # a base and at most CHANGE_FILES - 1 files in each of two tiers, plus the newest
        assert most <= 1 + 2 * compaction.CHANGE_FILES, (r, most)
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
    md.compact_buckets(path, budget_rows=None, everything=True)
    bases = {b: f for b, f in version(data_dir).files.items() if f}
    write(data_dir, [ev(5_000 + i, "u", i, "x") for i in range(0, 800, 10)] + [ev(6_000, "d", 3)])
    assert md.compact_buckets(path, budget_rows=None)["buckets"] == 0  # 10% of each bucket: not yet
    assert all(set(bases[b]) <= set(f) for b, f in version(data_dir).files.items() if b in bases)
    write(data_dir, [ev(7_000 + i, "u", i, "y") for i in range(800)])  # every row: due everywhere
    out = md.compact_buckets(path, budget_rows=None)
    assert out["buckets"] == len(bases)
    v = version(data_dir)
    assert all(len(f) == 1 and not v.info[f[0]].change for f in v.files.values() if f)
    assert live(data_dir) == {i: "y" for i in range(800)}


def test_a_change_run_is_the_newest_files_of_one_tier(data_dir, monkeypatch):
    """The merge rule alone: files join the run from the newest back while no larger than the
    run so far; CHANGE_FILES of them merge, keeping the older, larger file and tombstones."""
    monkeypatch.setattr(compaction, "CHANGE_FILES", 3)
    path = mirror_dir(data_dir, SOURCE, T)
    one_bucket = [k for k in range(2_000) if db.bucket_of(pa.array([encode_key([k])]), 8)[0].as_py() == 0]
    write(data_dir, [ev(1 + i, "c", k, "base") for i, k in enumerate(one_bucket[:20])])  # the base: 20 rows
    pos = 100
    for n in (1, 1):
        pos += 1
        write(data_dir, [ev(pos, "u", k, f"p{pos}") for k in one_bucket[:n]])
    v = version(data_dir)
    assert compaction.change_run(v, v.files[0]) == []  # 20, 1, 1: two of the tier only
    write(data_dir, [ev(200, "d", one_bucket[1])])
    v = version(data_dir)
    run = compaction.change_run(v, v.files[0])
    assert len(run) == 3 and run == list(v.files[0][-3:])
    assert compaction.merge_change_runs(path) == 1
    after = version(data_dir)
    assert len(after.files[0]) == 2 and after.info[after.files[0][1]].change
    assert after.files[0][0] == v.files[0][0]  # the older, larger file (the first write: the base) stays
    got = live(data_dir)
    assert one_bucket[1] not in got and got[one_bucket[0]] == "p102"
    assert md.tombstone_count(data_dir, SOURCE, T) == 1
