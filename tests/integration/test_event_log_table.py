"""The event log's Delta log (sinks/event_log_table.py, invariant I16): a reader of a table's
event log through its Delta log sees every event once, whatever a compaction, a type change,
a retried batch, a racing writer or a writer that stopped before its commit left in the folder.
Read with deltalake (delta-rs), which this package does not write through."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import event_log_table
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.event_log import (
    EventLogSink,
    compact_table,
    event_files,
    read_events,
    table_dir,
)
from airflow_provider_cdc.storage.layout import log_schema_path

pytestmark = pytest.mark.integration

SOURCE = "src"
T = TableName("public", "t")


def p(i: int) -> str:
    return Position(i).encode()


def log_schema(data: str, n_type: str) -> None:
    path = Path(log_schema_path(data, SOURCE, T))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TableSchema(T, (Column("id", "int64"), Column("n", n_type)), ("id",)).to_json())


def write(data: str, batch: int, n, *, n_type: str = "int32") -> None:
    """Batch ``batch``: an insert of key ``batch`` with n = ``n`` at position 10 * batch."""
    log_schema(data, n_type)
    EventLogSink(data, SOURCE).write(pa.Table.from_pylist([{
        "position": p(10 * batch), "table": T.id, "op": "c", "key": encode_key([batch]), "before": None,
        "after": encode_row({"id": batch, "n": n}), "ts_ms": batch, "watermark": None, "snapshot": False,
        "batch": f"c-{p(10 * batch)}-{p(10 * batch)}"}], schema=EVENT_SCHEMA))


def folder(data: str) -> str:
    return table_dir(data, SOURCE, T)


def names(data: str) -> list[str]:
    """The table's files, a rewrite's unique suffix left out (``c-...g2``)."""
    return [re.sub(r"-[0-9a-f]{8}\.parquet$", ".parquet", n) for n in event_files(folder(data))]


def plain(data: str, version: int | None = None) -> list[tuple]:
    """(key, position, after) of every event a Delta reader sees."""
    t = DeltaTable(folder(data), version=version).to_pyarrow_table()
    return sorted(zip(t["key"].to_pylist(), [s["position"] for s in t["source"].to_pylist()],
                      t["after"].to_pylist(), strict=True))


def ours(data: str) -> list[tuple]:
    t = read_events(data, SOURCE, T)
    return sorted(zip(t["key"].to_pylist(), t["position"].to_pylist(), strict=True))


def test_a_compaction_is_one_commit_and_an_older_version_still_reads_its_inputs(tmp_path):
    data = str(tmp_path)
    for b in range(1, 7):
        write(data, b, b)
    before = plain(data)
    assert len(before) == 6 and [(k, pos) for k, pos, _ in before] == ours(data)
    version = DeltaTable(folder(data)).version()
    merged, _ = compact_table(folder(data), p(10 ** 6), min_files=3)
    assert merged == 6
    assert len(list(Path(folder(data)).glob("*.parquet"))) == 7  # the inputs stay for their grace...
    assert plain(data) == before  # ...but a reader of the log sees only the merged file
    assert event_files(folder(data)) == [f"c-{p(10)}-{p(60)}.parquet"]
    assert plain(data, version) == before  # time travel to before the compaction reads the inputs
    history = DeltaTable(folder(data)).history(1)[0]
    assert history["operation"] == "OPTIMIZE"


def test_a_wider_type_retypes_the_files_before_it_and_a_type_nothing_fits_becomes_text(tmp_path):
    data = str(tmp_path)
    write(data, 1, 5)
    write(data, 2, 6, n_type="int64")  # widened at the source; its values still fit int32: no rewrite
    assert event_files(folder(data)) == [f"c-{p(10)}-{p(10)}.parquet", f"c-{p(20)}-{p(20)}.parquet"]
    write(data, 3, 2**40, n_type="int64")  # a value int32 cannot hold: the table takes int64
    dt = DeltaTable(folder(data))
    assert json.loads(dt.schema().to_json())["fields"][3]["type"]["fields"][1]["type"] == "long"
    assert names(data) == [f"c-{p(10)}-{p(10)}.g2.parquet", f"c-{p(20)}-{p(20)}.g2.parquet",
                           f"c-{p(30)}-{p(30)}.parquet"]
    assert [r[2]["n"] for r in plain(data)] == [5, 6, 2**40]
    write(data, 4, "x", n_type="string")  # then text at the source: every earlier value fits text
    assert [r[2]["n"] for r in plain(data)] == ["5", "6", str(2**40), "x"]
    assert len(ours(data)) == 4 and len(event_files(folder(data))) == 4
    typing = event_log_table.typing_of(event_log_table.current(folder(data))[1])
    assert typing.logical()["n"] == "string"
    write(data, 5, 7)  # an int again: held as text, no rewrite
    assert [r[2]["n"] for r in plain(data)] == ["5", "6", str(2**40), "x", "7"]


def test_a_retried_batch_replaces_its_earlier_file_retyped_or_not(tmp_path):
    data = str(tmp_path)
    write(data, 1, 5)
    write(data, 1, 5)  # the same batch again (a retried task): one file, one event
    assert len(plain(data)) == 1 and names(data) == [f"c-{p(10)}-{p(10)}.g1.parquet"]
    assert len(plain(data, 0)) == 1  # version 0 still reads the file it named
    write(data, 2, 2**40, n_type="int64")  # version 2: retypes batch 1 as c-...g2
    assert f"c-{p(10)}-{p(10)}.g2.parquet" in names(data)
    write(data, 1, 5)  # batch 1 once more, typed int32: it replaces its retyped file, converted
    assert names(data) == [f"c-{p(10)}-{p(10)}.g3.parquet", f"c-{p(20)}-{p(20)}.parquet"]
    assert [r[2]["n"] for r in plain(data)] == [5, 2**40]
    assert [r[2]["n"] for r in plain(data, 0)] == [5]  # version 0's file untouched (int32)
    newest = Path(folder(data)) / event_files(folder(data))[0]
    assert pq.read_schema(newest).field("after").type.field("n").type == pa.int64()


def test_a_writer_that_loses_the_race_for_a_version_commits_the_next_one(tmp_path, monkeypatch):
    """A hook between a writer's reading of the log and its commit lets another writer commit
    first: the loser reads the log again and commits the next version; both files are in."""
    data = str(tmp_path)
    write(data, 1, 5)
    real = event_log_table.write_commit
    raced = []

    def hooked(uri, version, actions):
        if not raced:
            raced.append(version)
            monkeypatch.setattr(event_log_table, "write_commit", real)
            write(data, 2, 2**40, n_type="int64")  # the other writer: takes the version, retypes batch 1
        return real(uri, version, actions)

    monkeypatch.setattr(event_log_table, "write_commit", hooked)
    write(data, 3, 7)  # typed int32, committed after the retype: converted to int64 on its retry
    assert raced == [1] and DeltaTable(folder(data)).version() == 2
    assert [r[2]["n"] for r in plain(data)] == [5, 2**40, 7]
    assert len(ours(data)) == 3
    # the loser wrote its own file again under its own name (no version named it): nothing left over
    assert f"c-{p(30)}-{p(30)}.parquet" in event_files(folder(data))
    assert not list(Path(folder(data)).glob(f"c-{p(30)}-*.g*.parquet"))


def test_a_fenced_writer_commits_nothing(tmp_path):
    data = str(tmp_path)
    write(data, 1, 5)

    class Fenced(Exception):
        pass

    def check():
        raise Fenced

    with pytest.raises(Fenced):
        event_log_table.commit(folder(data), [], check=check)
    assert DeltaTable(folder(data)).version() == 0


def test_a_folder_written_before_the_log_is_adopted_and_a_left_file_is_never_read(tmp_path):
    data = str(tmp_path)
    for b in range(1, 5):
        write(data, b, b)
    compact_table(folder(data), p(10 ** 6), min_files=2)
    shutil.rmtree(Path(folder(data)) / "_delta_log")  # as the package left folders before the log
    for b in (5,):
        write(data, b, b)  # the first write adopts the folder: the merged file, not its inputs
    assert event_files(folder(data)) == [f"c-{p(10)}-{p(40)}.parquet", f"c-{p(50)}-{p(50)}.parquet"]
    assert len(plain(data)) == 5 and [(k, pos) for k, pos, _ in plain(data)] == ours(data)
    # a writer that stopped between its file and its commit
    orphan = Path(folder(data)) / f"c-{p(60)}-{p(60)}.parquet"
    shutil.copy(Path(folder(data)) / f"c-{p(50)}-{p(50)}.parquet", orphan)
    assert len(plain(data)) == 5 and len(ours(data)) == 5
    merged, removed = compact_table(folder(data), "", grace_seconds=3600)
    assert removed == 0 and orphan.exists()  # young: it may still be committed
    merged, removed = compact_table(folder(data), "", grace_seconds=3600, now=time.time() + 7200)
    assert removed == 5 and not orphan.exists()  # the four inputs (removed at the adoption) and it
    assert len(plain(data)) == 5


def test_columns_apart_only_in_case_keep_a_new_table_plain_and_stop_one_with_a_log(tmp_path):
    """Delta compares column names without case. A table whose columns clash so has no Delta
    log (its files read by listing); a clash arriving in a table that has one stops its event
    log with an error naming both columns, nothing written."""
    from airflow_provider_cdc.core.errors import ConfigurationError

    clash = str(tmp_path / "clash")
    path = Path(log_schema_path(clash, SOURCE, T))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TableSchema(T, (Column("id", "int64"), Column("Þ", "bool"), Column("þ", "bool")), ("id",)).to_json())
    EventLogSink(clash, SOURCE).write(pa.Table.from_pylist([{
        "position": p(10), "table": T.id, "op": "c", "key": encode_key([1]), "before": None,
        "after": encode_row({"id": 1, "Þ": True, "þ": False}), "ts_ms": 1, "watermark": None, "snapshot": False,
        "batch": "c-1"}], schema=EVENT_SCHEMA))
    assert not (Path(folder(clash)) / "_delta_log").exists() and len(ours(clash)) == 1
    assert compact_table(folder(clash), p(10 ** 6), min_files=1) == (0, 0)

    data = str(tmp_path / "later")
    write(data, 1, 5)
    path = Path(log_schema_path(data, SOURCE, T))
    path.write_text(TableSchema(T, (Column("id", "int64"), Column("n", "int32"), Column("N", "int32")), ("id",)).to_json())
    with pytest.raises(ConfigurationError, match="'n' and 'N' differ only in case"):
        EventLogSink(data, SOURCE).write(pa.Table.from_pylist([{
            "position": p(20), "table": T.id, "op": "c", "key": encode_key([2]), "before": None,
            "after": encode_row({"id": 2, "n": 1, "N": 2}), "ts_ms": 2, "watermark": None, "snapshot": False,
            "batch": "c-2"}], schema=EVENT_SCHEMA))
    assert len(plain(data)) == 1 and not (Path(folder(data)) / "c-2.parquet").exists()


def test_a_lost_race_under_the_same_typing_retries_only_the_commit(tmp_path, monkeypatch):
    """The other writer changed nothing about the types: the loser's file, already written, is
    committed as it is (a large chunk file is not written once per lost race)."""
    data = str(tmp_path)
    write(data, 1, 5)
    real = event_log_table.write_commit
    mine = Path(folder(data)) / f"c-{p(30)}-{p(30)}.parquet"
    seen = []

    def hooked(uri, version, actions):
        if not seen:
            seen.append(mine.stat().st_ino)
            monkeypatch.setattr(event_log_table, "write_commit", real)
            write(data, 2, 6)  # the other writer, same types: takes the version
        return real(uri, version, actions)

    monkeypatch.setattr(event_log_table, "write_commit", hooked)
    write(data, 3, 7)
    assert DeltaTable(folder(data)).version() == 2 and [r[2]["n"] for r in plain(data)] == [5, 6, 7]
    assert mine.stat().st_ino == seen[0]  # the same file: not written again


def test_a_re_read_from_before_the_applied_mark_hides_and_deletes_nothing(tmp_path):
    """Issue 57: after a failover capture re-reads from the synchronized slot's older point, a
    segment that starts before what was applied. Its events after the applied mark are the only
    new ones; its event-log file must be named for those, so neither the reader of a folder
    without a log nor compaction takes it for a file that holds the earlier files' events."""
    from airflow_provider_cdc import storage
    from airflow_provider_cdc.pipeline import arrow_engine
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.staged import list_segments, write_segment

    from .staged_scenario import ITEMS, SCHEMAS, WM_TABLE, Stage, item

    st = Stage(tmp_path)
    for i in range(10):
        st.change(ITEMS, "c", [i], item(i, 1))
    staged = changelog_dir(st.data_dir, "src")
    write_segment(st.log[:5], staged, WM_TABLE, SCHEMAS)
    write_segment(st.log[5:], staged, WM_TABLE, SCHEMAS)
    sink = EventLogSink(st.data_dir, "src")
    arrow_engine.apply_changelog(st.data_dir, "src", [sink])
    for i in range(10, 15):
        st.change(ITEMS, "u", [i - 10], item(i - 10, 2))
    # the re-read: from the fourth event (before the applied mark) to the newest; capture then
    # deletes the staged segments inside its range (pipeline/capture.py)
    path = write_segment(st.log[3:], staged, WM_TABLE, SCHEMAS)
    for first, _last, other in list_segments(staged):
        if other != path and first >= st.log[3].position:
            storage.delete(other)
    arrow_engine.apply_changelog(st.data_dir, "src", [sink])

    where = table_dir(st.data_dir, "src", ITEMS)
    held = event_log_table.held_in(where)
    for name in event_files(where):
        first, last = event_log_table._changelog_range(name)
        lo, hi = held(name)
        assert first <= lo and hi <= last, name
    expected = sorted((e.position.encode(), e.key) for e in st.log)

    def seen() -> list:
        t = read_events(st.data_dir, "src", ITEMS)
        return sorted(zip(t["position"].to_pylist(), t["key"].to_pylist(), strict=True))

    assert seen() == expected
    assert event_log_table.superseded(event_files(where)) == {}  # no name claims another file's events
    shutil.rmtree(Path(where) / "_delta_log")  # a folder without a log: its listing, adopted later
    assert seen() == expected
    compact_table(where, "", now=time.time() + 7200)  # adopts the folder; nothing it holds is removed
    compact_table(where, "", now=time.time() + 7200)
    assert seen() == expected


def test_a_name_that_claims_more_than_its_file_holds_hides_nothing(tmp_path):
    """A file already on disk named for more than it holds (written before the naming fix)
    covers no other file; a compaction's output still covers its inputs."""
    for b in (1, 2, 3):
        write(str(tmp_path), b, b)
    where = folder(str(tmp_path))
    names = event_files(where)
    held = event_log_table.held_in(where)
    wide = f"c-{p(5)}-{p(40)}.parquet"  # holds only position 40
    shutil.copy(Path(where) / names[0], Path(where) / wide)
    t = pq.read_table(Path(where) / wide)
    source = t["source"].combine_chunks()
    fields = {f.name: source.field(f.name) for f in source.type}
    fields["position"] = pa.array([p(40)] * len(t))
    pq.write_table(t.set_column(t.schema.get_field_index("source"), "source",
                                pa.StructArray.from_arrays(list(fields.values()), names=list(fields))),
                   Path(where) / wide)
    assert event_log_table.superseded([*names, wide], held) == {}
    assert set(event_log_table.superseded([*names, wide])) == set(names)  # the name alone would hide them
    merged = f"c-{p(10)}-{p(30)}.parquet"
    shutil.copy(Path(where) / names[0], Path(where) / merged)
    t = pa.concat_tables([pq.read_table(Path(where) / n) for n in names])
    pq.write_table(t, Path(where) / merged)
    assert event_log_table.superseded([*names, merged], held) == dict.fromkeys(names, merged)
