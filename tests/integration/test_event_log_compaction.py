"""Event-log compaction (issue 33): runs of small changelog files the event log has applied are
merged into one file per run, and the readers (the Debezium export, read_events) see the same
events in the same order before, during (merged file and its inputs side by side in the folder,
only the merged file in the table's Delta log) and after."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.export.debezium import DebeziumOptions, export_table
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.event_log import (
    EventLogSink,
    compact_event_log,
    compact_table,
    event_files,
    read_events,
    table_dir,
)
from airflow_provider_cdc.storage.layout import schema_path

pytestmark = pytest.mark.integration

T = TableName("public", "orders")
SCHEMA = TableSchema(T, (Column("id", "int64", "bigint", False), Column("v", "string", "text")), ("id",))
WIDER = TableSchema(T, (*SCHEMA.columns, Column("w", "int32", "integer")), ("id",))


def p(i: int) -> str:
    return Position(i, 0, 0).encode()


def stage_schema(data: str, schema: TableSchema) -> None:
    Path(schema_path(data, "src", T)).parent.mkdir(parents=True, exist_ok=True)
    Path(schema_path(data, "src", T)).write_text(schema.to_json())


def write_batches(data: str, batches: range, schema: TableSchema = SCHEMA) -> None:
    """One changelog file per batch b: positions 10b+1..10b+3 (an insert, an update, a delete
    of key b), named as the apply names them."""
    stage_schema(data, schema)
    sink = EventLogSink(data, "src", "shop")
    for b in batches:
        row = {"id": b, "v": f"v{b}"} | ({"w": b} if schema is WIDER else {})
        rows = [
            {"position": p(10 * b + 1), "op": "c", "after": encode_row(row), "before": None},
            {"position": p(10 * b + 2), "op": "u", "after": encode_row(row | {"v": "u"}), "before": encode_row(row)},
            {"position": p(10 * b + 3), "op": "d", "after": None, "before": encode_row(row | {"v": "u"})},
        ]
        sink.write(pa.Table.from_pylist([
            r | {"table": T.id, "key": encode_key([b]), "ts_ms": 1, "watermark": None, "snapshot": False,
                 "batch": f"c-{p(10 * b + 1)}-{p(10 * b + 3)}"} for r in rows], schema=EVENT_SCHEMA))


def exported(data: str, tmp_path, tag: str) -> str:
    out = str(tmp_path / f"{tag}.jsonl")
    export_table(data, "src", T, out, DebeziumOptions("src", connector="postgresql"))
    return Path(out).read_text()


def events(data: str) -> list:
    t = read_events(data, "src", T).drop_columns(["file"])
    return sorted(zip(*(t[c].to_pylist() for c in t.column_names), strict=True))


def parquet(folder: str) -> list[str]:
    return sorted(n.name for n in Path(folder).iterdir() if n.name.endswith(".parquet"))


def test_applied_runs_merge_and_readers_see_the_same_events_before_during_and_after(tmp_path):
    data = str(tmp_path / "d")
    write_batches(data, range(1, 13))
    folder = table_dir(data, "src", T)
    before_export, before_events = exported(data, tmp_path, "before"), events(data)
    applied = Position(10 * 10 + 3)  # the event log applied batches 1..10; 11 and 12 are past its marker
    merged, removed = compact_table(folder, applied.encode(), min_files=4)
    names = parquet(folder)
    assert merged == 10 and removed == 0 and len(names) == 13  # inputs stay for their grace period
    assert event_files(folder) == [f"c-{p(11)}-{p(103)}.parquet", f"c-{p(111)}-{p(113)}.parquet",
                                   f"c-{p(121)}-{p(123)}.parquet"]
    assert exported(data, tmp_path, "during") == before_export and events(data) == before_events
    import time

    merged, removed = compact_table(folder, applied.encode(), min_files=4, now=time.time() + 7200)
    assert merged == 0 and removed == 10 and len(parquet(folder)) == 3
    assert exported(data, tmp_path, "after") == before_export and events(data) == before_events


def test_a_schema_change_starts_a_new_run_and_short_runs_wait(tmp_path):
    data = str(tmp_path / "d")
    write_batches(data, range(1, 6))
    write_batches(data, range(6, 9), WIDER)  # ADD COLUMN w: files typed with another schema
    folder = table_dir(data, "src", T)
    before = exported(data, tmp_path, "before")
    merged, _ = compact_table(folder, p(10 ** 6), min_files=3)
    assert merged == 8
    assert event_files(folder) == [f"c-{p(11)}-{p(53)}.parquet", f"c-{p(61)}-{p(83)}.parquet"]
    assert exported(data, tmp_path, "after") == before
    write_batches(data, range(9, 10), WIDER)  # one more small file: a run of 2 < min_files waits
    assert compact_event_log(data, "src", Position(10 ** 6), min_files=3) == {}
    write_batches(data, range(10, 11), WIDER)  # a merged file under the target joins the next run
    expected = exported(data, tmp_path, "expected")
    assert compact_event_log(data, "src", Position(10 ** 6), min_files=3) == {"table=public.orders": (3, 0)}
    assert event_files(folder)[-1] == f"c-{p(61)}-{p(103)}.parquet"
    assert exported(data, tmp_path, "later") == expected


def test_nothing_past_the_applied_marker_or_without_one_is_merged(tmp_path):
    data = str(tmp_path / "d")
    write_batches(data, range(1, 8))
    assert compact_event_log(data, "src", None, min_files=2) == {}
    assert compact_event_log(data, "src", Position(10 * 1 + 3), min_files=2) == {}  # one file applied: no run
    assert len(parquet(table_dir(data, "src", T))) == 7


def test_merged_inputs_go_once_their_removal_is_older_than_the_grace_however_often_merged_again(tmp_path):
    """A merged file under the target is merged again with the next run: each file goes once the
    commit that removed it from the table's Delta log is older than the grace, so the first
    merge's inputs go on time although the file that now holds their events is young, and that
    first merged file stays for its own grace (readers of an older version may still open it)."""
    import time

    data = str(tmp_path / "d")
    write_batches(data, range(1, 5))
    folder = Path(table_dir(data, "src", T))
    compact_table(str(folder), p(10 ** 6), min_files=2)
    first_merge = folder / f"c-{p(11)}-{p(43)}.parquet"
    removed_at = time.time()
    write_batches(data, range(5, 7))
    time.sleep(0.01)  # the two commits' removals are at different milliseconds
    compact_table(str(folder), p(10 ** 6), min_files=2)  # the first merge merged again with the new files
    again_at = time.time()
    assert (folder / f"c-{p(11)}-{p(63)}.parquet").exists()
    # between the two removals' graces: batches 1-4 go, the first merge and batches 5-6 stay
    grace = 500.0
    merged, removed = compact_table(str(folder), p(10 ** 6), min_files=2, grace_seconds=grace,
                                    now=removed_at + grace + (again_at - removed_at) / 2 + 0.001)
    left = parquet(str(folder))
    assert removed == 4, left
    assert first_merge.name in left
    assert f"c-{p(51)}-{p(53)}.parquet" in left and f"c-{p(61)}-{p(63)}.parquet" in left
    merged, removed = compact_table(str(folder), p(10 ** 6), min_files=2, grace_seconds=grace,
                                    now=again_at + grace + 1)
    assert removed == 3 and parquet(str(folder)) == [f"c-{p(11)}-{p(63)}.parquet"]


def test_a_run_in_order_is_copied_a_batch_at_a_time_and_a_widened_table_merges_it_again(tmp_path, monkeypatch):
    """Each file is sorted and a run of files whose ranges do not overlap is in order: it is copied
    a batch at a time, never held whole or sorted (sinks/event_log.py). When a column widens
    between that copy and the commit, the copy is not in the table's types: it is dropped and
    the run merged again in memory, in the new types. Readers see the same events either way."""
    from airflow_provider_cdc.sinks import event_log, event_log_table

    data = str(tmp_path / "d")
    write_batches(data, range(1, 9))
    folder = table_dir(data, "src", T)
    before = events(data)
    in_memory = []
    real_in_memory = event_log._merge_run_in_memory
    monkeypatch.setattr(event_log, "_merge_run_in_memory",
                        lambda *a: in_memory.append(a[1]) or real_in_memory(*a))
    assert compact_table(folder, p(43), min_files=4) == (4, 0)
    assert in_memory == [] and event_files(folder)[0] == f"c-{p(11)}-{p(43)}.parquet"
    assert events(data) == before

    real_matches = event_log_table._physical_matches
    checks = []

    def widened_once(schema, want):  # the first check of the copied file: a column widened meanwhile
        checks.append(schema)
        return len(checks) > 1 and real_matches(schema, want)

    monkeypatch.setattr(event_log_table, "_physical_matches", widened_once)
    assert compact_table(folder, p(83), min_files=4) == (5, 0)  # the small merged file joins the run
    assert len(in_memory) == 1 and events(data) == before
    assert event_files(folder) == [f"c-{p(11)}-{p(83)}.parquet"]
