"""The Spark merge and apply jobs on staged inputs: through spark-submit (local[2]) and as
pure functions in one local session.

The staged scenario (staged_scenario.py) and its expected outputs come from core.window;
what both engines must agree on is in test_engine_conformance.py. Here: spark-submit,
resume markers, writers in either order, real captures, the PostgreSQL mirror.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc.core.errors import NotReadyError, WatermarkError
from airflow_provider_cdc.core.events import ChangeEvent
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import TableName, encode_key
from airflow_provider_cdc.core.window import WindowChunk, merge_window
from airflow_provider_cdc.pipeline import arrow_engine as local_jobs
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.spark import apply_job, merge_job
from airflow_provider_cdc.pipeline.spark.common import application_path, spark_submit_command
from airflow_provider_cdc.sinks.mirror_readers import read_mirror, read_mirror_raw
from airflow_provider_cdc.storage.layout import changelog_dir, events_dir, schema_path
from airflow_provider_cdc.storage.staged import (
    read_chunk_rows,
    read_log_events,
    write_segment,
)

from .staged_scenario import (
    ITEMS,
    ITEMS_SCHEMA,
    OTHER_SCHEMA,
    SOURCE,
    SPARK_CONF,
    WM_TABLE,
    as_tuples,
    build_scenario,
    canonical_rows,
    common_args,
    event_files,
    expected_mirror_list,
    item,
    mirror_list,
    run_local,
    spark_tuples,
    submit,
)


# --- tests ----------------------------------------------------------------------------------
def test_application_paths_point_at_the_job_files():
    assert application_path("merge").endswith("airflow_provider_cdc/pipeline/spark/merge_job.py")
    assert Path(application_path("apply")).is_file()
    cmd = spark_submit_command("merge", ["--x"], master="spark://h:7077", conf={"a": "b"})
    assert cmd[:5] == ["spark-submit", "--master", "spark://h:7077", "--conf", "a=b"]
    assert cmd[-2:] == [application_path("merge"), "--x"]


def test_unstaged_high_watermark_fails_naming_the_chunk_and_emits_nothing(spark, tmp_path):
    st = build_scenario(tmp_path / "s")
    late = st.chunk(ITEMS, 9, "lwA", "hw-not-yet", [item(99, 0)], "id")
    with pytest.raises(NotReadyError, match=r"chunk 9 of table public\.items.*hw-not-yet.*sensor should have waited"):
        merge_job.main(["--chunks", st.round_file(), *common_args(st)])
    assert not Path(events_dir(st.data_dir, SOURCE)).exists()  # never emit early, for any chunk
    with pytest.raises(NotReadyError):
        merge_job.locate_windows(spark, [late], changelog_dir(st.data_dir, SOURCE))
    lost_lw = st.chunk(ITEMS, 8, "lw-gone", "hwA", [item(98, 0)], "id")
    with pytest.raises(WatermarkError, match="low watermark 'lw-gone'"):
        merge_job.locate_windows(spark, [lost_lw], changelog_dir(st.data_dir, SOURCE))
    with pytest.raises(NotReadyError, match=r"chunk 9 of table public\.items.*hw-not-yet"):  # the local engine too
        run_local("merge", st, st.round_file([*st.chunks[:3], late]))
    assert not Path(events_dir(st.data_dir, SOURCE)).exists()


def test_local_apply_resumes_from_its_marker_and_counts_pending_rows(tmp_path):
    st = build_scenario(tmp_path / "a")
    pending = local_jobs.pending_rows(st.data_dir, SOURCE, ["events", "mirror"])
    staged_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in Path(changelog_dir(st.data_dir, SOURCE)).glob("seg-*"))
    assert pending == staged_rows > 0  # nothing applied yet: every staged row (watermarks, overlaps too)
    first = run_local("apply", st)
    assert local_jobs.pending_rows(st.data_dir, SOURCE, ["events", "mirror"]) == 0
    again = run_local("apply", st)
    assert first["events"] > 0 and again["segments"] == 0 and again["events"] == 0
    st.change(ITEMS, "u", [2], item(2, 9))
    write_segment(st.log[-1:], changelog_dir(st.data_dir, SOURCE), WM_TABLE)
    assert local_jobs.pending_rows(st.data_dir, SOURCE, ["mirror"]) == 1
    more = run_local("apply", st)
    assert more["segments"] == 1 and more["events"] == 1
    assert {r["id"]: r["name"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)}[2] == item(2, 9)["name"]


def test_spark_submit_writers_in_either_order_rerun_and_no_resurrection(spark, tmp_path):
    """apply->merge (through spark-submit) and merge->apply give the same mirror, equal to the
    source; a delete after the high watermark applied before the late chunk stays deleted;
    re-running both jobs writes the same event files and leaves the mirror unchanged."""
    x = build_scenario(tmp_path / "x")  # apply first, then the (late) merge
    y = build_scenario(tmp_path / "y")  # merge first, then apply
    rx = x.round_file()
    applied = submit("apply", common_args(x))
    # without spark.sql.shuffle.partitions the job sizes it: 2 per core of local[2]
    unset = {k: v for k, v in SPARK_CONF.items() if k != "spark.sql.shuffle.partitions"}
    merged = submit("merge", ["--chunks", rx, *common_args(x)], conf=unset)
    assert merged["shuffle_partitions"] == 4
    assert merged["chunks"] == 3 and merged["emitted"] == len(x.expected_merge())
    assert merged["dropped"] == sum(c.rows for c in x.chunks) - merged["emitted"]
    assert applied["events"] == sum(1 for e in read_log_events(changelog_dir(x.data_dir, SOURCE)) if isinstance(e, ChangeEvent))
    # the other order in-process (same code and session settings; a JVM start costs ~10-60 s here)
    merged_y = merge_job.main(["--chunks", y.round_file(), *common_args(y)])
    assert merged_y["shuffle_partitions"] == 3  # set by the session's builder: kept
    apply_job.main(common_args(y))

    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        truth = sorted(canonical_rows(schema, list(x.truth[schema.table.id].values())),
                       key=lambda r: tuple(r[k] for k in schema.primary_key))
        assert mirror_list(x.data_dir, schema) == truth  # I2: mirror == source
        assert mirror_list(x.data_dir, schema) == expected_mirror_list(x, schema)  # == core's mirror semantics
        assert mirror_list(y.data_dir, schema) == mirror_list(x.data_dir, schema)
        raw_x = read_mirror_raw(x.data_dir, SOURCE, schema.table).to_pylist()
        raw_y = read_mirror_raw(y.data_dir, SOURCE, schema.table).to_pylist()
        assert raw_x == raw_y  # tombstones and positions too
    ids = [r["id"] for r in mirror_list(x.data_dir, ITEMS_SCHEMA)]
    assert 10 not in ids and 25 not in ids  # deleted; the chunk row of 10 (at hwA) did not resurrect it
    tomb = {r["id"]: r for r in read_mirror_raw(x.data_dir, SOURCE, ITEMS).to_pylist() if r["__deleted"]}
    assert set(tomb) == {10, 25}

    # same file names and contents in both orders, and again after a re-run of both jobs
    files_x = event_files(x.data_dir)
    assert files_x == event_files(y.data_dir)
    before = read_mirror_raw(x.data_dir, SOURCE, ITEMS).to_pylist()
    for m in ("_applied/events.json", "_applied/mirror.json"):  # force the apply job to redo everything
        (Path(x.data_dir) / "output" / SOURCE / m).unlink()
    merge_job.main(["--chunks", rx, *common_args(x)])  # in-process: same code, no second JVM start
    apply_job.main(common_args(x))
    assert event_files(x.data_dir) == files_x
    assert read_mirror_raw(x.data_dir, SOURCE, ITEMS).to_pylist() == before
    rows = [(f.split("/")[0], r["key"], r["source"]["position"]) for f, rs in files_x.items() for r in rs]
    assert len(rows) == len(set(rows))  # no duplicates by (table, key, position)
    r_files = [f for f in files_x if "/r-" in f]
    assert len(r_files) == 3 and all(rs[0]["source"]["snapshot"] for f, rs in files_x.items() if "/r-" in f)


def test_apply_job_resumes_from_its_marker(spark, tmp_path):
    st = build_scenario(tmp_path / "a")
    first = apply_job.main(common_args(st))
    again = apply_job.main(common_args(st))  # nothing new: reads nothing
    assert first["events"] > 0 and again["segments"] == 0 and again["events"] == 0
    st.change(ITEMS, "u", [2], item(2, 9))
    write_segment(st.log[-1:], changelog_dir(st.data_dir, SOURCE), WM_TABLE)
    more = apply_job.main(common_args(st))
    assert more["segments"] == 1 and more["events"] == 1
    assert {r["id"]: r["name"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)}[2] == item(2, 9)["name"]


@pytest.mark.parametrize("bound", ["max_batch_rows", "max_batch_bytes"])
def test_apply_in_batches_of_one_segment_writes_what_one_batch_writes(tmp_path, bound):
    """Batches bounded by staged rows or uncompressed staged bytes (memory): every segment its
    own batch, including the re-delivered overlap, gives the same event files and mirror as a
    single batch."""
    one, many = build_scenario(tmp_path / "one"), build_scenario(tmp_path / "many")
    run_local("apply", one)
    n_segments = len(list(Path(changelog_dir(many.data_dir, SOURCE)).glob("seg-*")))
    got = run_local("apply", many, **{bound: 1})
    assert n_segments >= 3 and got["batches"] == n_segments
    assert event_files(many.data_dir) == event_files(one.data_dir)
    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        assert read_mirror_raw(many.data_dir, SOURCE, schema.table).to_pylist() == \
            read_mirror_raw(one.data_dir, SOURCE, schema.table).to_pylist()


def test_apply_batches_join_segments_up_to_their_uncompressed_bytes(tmp_path):
    """A batch takes whole segments while their uncompressed bytes (Parquet footers) fit its
    bound: narrow events share a batch (one commit per table) instead of one batch per segment."""
    from airflow_provider_cdc.pipeline.arrow_engine import _batches_of, _segment_size
    from airflow_provider_cdc.storage.staged import list_segments

    st = build_scenario(tmp_path / "a")
    segments = list_segments(changelog_dir(st.data_dir, SOURCE))
    sizes = [_segment_size(path) for _, _, path in segments]
    assert len(segments) >= 3 and all(rows > 0 and size > 0 for rows, size in sizes)
    two = sizes[0][1] + sizes[1][1]
    batches = _batches_of(segments, 64, 10**9, two)
    assert [len(b) for b in batches][0] == 2 and sum(len(b) for b in batches) == len(segments)
    assert len(_batches_of(segments, 64, 10**9, 10**12)) == 1
    assert len(_batches_of(segments, 64, 10**9, two - 1)) > len(batches)  # the first two no longer fit


# --- a real capture -----------------------------------------------------------------------------
@pytest.mark.parametrize("dialect_name", ["postgres", "mysql"])
def test_merge_on_a_real_capture(spark, tmp_path, request, unique_name, dialect_name):
    """Chunks read between real watermarks while rows change inside the windows; the
    changelog captured by the dialect (logical slot / binlog) and staged; Spark merge +
    apply agree with core and converge to the source."""
    from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
    from airflow_provider_cdc.pipeline.snapshot import GapHooks, snapshot_chunk

    uri = request.getfixturevalue("pg_uri" if dialect_name == "postgres" else "mysql_uri")
    table = TableName("public" if dialect_name == "postgres" else "cdc_test", f"spk_{unique_name}")
    source = f"spk_{unique_name}"
    d = get_dialect(ConnectionParams.from_uri(uri), source=source, watermark_schema="cdc",
                    watermark_table=f"wm_{unique_name}", tables=[table])
    data_dir = str(tmp_path)
    q = d.quote_table(table)
    ts_type = "timestamptz" if dialect_name == "postgres" else "DATETIME(6)"
    try:
        d._query(f"CREATE TABLE {q} (id INT PRIMARY KEY, v VARCHAR(20), amount DECIMAL(10,2), at {ts_type})")
        d._query(f"INSERT INTO {q} VALUES " + ",".join(f"({i}, 'v{i}', {i}.25, '2024-01-01 00:00:0{i % 10}')" for i in range(1, 31)))
        d.ensure_watermark_table()
        d.load_offset(data_dir)  # the capture starts here
        schema = d.describe_table(table)
        p = Path(schema_path(data_dir, source, table))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(schema.to_json())
        hooks = GapHooks(
            after_low_watermark=lambda: d._query(f"UPDATE {q} SET v = 'in-window' WHERE id IN (2, 17)"),
            before_high_watermark=lambda: d._query(f"DELETE FROM {q} WHERE id = 4"),
        )
        chunks = [
            snapshot_chunk(d, schema, ChunkRange(None, (16,)), data_dir=data_dir, snapshot_id="s", seq=1,
                           limit=100, gap_hooks=hooks),
            snapshot_chunk(d, schema, ChunkRange((16,), None), data_dir=data_dir, snapshot_id="s", seq=2, limit=100),
        ]
        d._query(f"UPDATE {q} SET v = 'after-hw' WHERE id = 20")
        d._query(f"DELETE FROM {q} WHERE id = 21")
        d._query(f"INSERT INTO {q} VALUES (99, 'new', 1.5, '2024-02-02 00:00:00')")
        stage_changelog(d, data_dir)
        truth = [d.row_to_canonical(schema, r) for batch in d.stream_query(f"SELECT * FROM {q} ORDER BY id", []) for r in batch]
    finally:
        try:
            if dialect_name == "postgres":
                d.drop_slot()
                d.drop_publication()
            d._query(f"DROP TABLE IF EXISTS {q}")
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
        finally:
            d.close()
    stage_rows = {c.path: read_chunk_rows(c.path, c.table) for c in chunks}
    staged = list(read_log_events(changelog_dir(data_dir, source)))
    want = merge_window([WindowChunk.from_result(c, stage_rows[c.path]) for c in chunks], staged)
    got = merge_job.merge_chunks(spark, chunks, changelog_dir(data_dir, source))
    assert spark_tuples(got) == as_tuples(want)
    assert spark_tuples(local_jobs.merge_chunks(chunks, changelog_dir(data_dir, source))) == as_tuples(want)
    keys = {e.key for e in want}
    assert "[2]" not in keys and "[4]" not in keys  # changed inside the first chunk's window
    assert "[17]" in keys  # changed before the second chunk's window opened: its read is newer
    args = ["--data-dir", data_dir, "--source", source, "--sinks", "events,mirror"]
    rf = Path(data_dir) / "round.json"
    rf.write_text(json.dumps([c.to_dict() for c in chunks]))
    merge_job.main(["--chunks", str(rf), *args])
    apply_job.main(args)
    mirror = sorted(read_mirror(data_dir, source, table).to_pylist(), key=lambda r: r["id"])
    assert mirror == sorted(canonical_rows(schema, truth), key=lambda r: r["id"])
    assert {4, 21}.isdisjoint(r["id"] for r in mirror) and 99 in {r["id"] for r in mirror}


def test_jobs_write_the_postgres_mirror_like_the_delta_mirror(spark, tmp_path, pg_uri, unique_name):
    """Both jobs through the 'postgres' sink too: same live rows as the Delta mirror and the source."""
    import psycopg2

    from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink

    st = build_scenario(tmp_path / "pg")
    target = f"mirror_{unique_name}"
    args = ["--data-dir", st.data_dir, "--source", SOURCE, "--sinks", "mirror,postgres", "--pg-uri", pg_uri,
            "--pg-schema", target]
    try:
        apply_job.main(args)
        merge_job.main(["--chunks", st.round_file(), *args])
        sink = MirrorPostgresSink(pg_uri, st.data_dir, SOURCE, target_schema=target)
        try:
            for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
                pg_rows = sink.read(schema.table)
                delta = read_mirror(st.data_dir, SOURCE, schema.table, with_meta=True).to_pylist()
                assert [(r["__key"], r["__position"]) for r in pg_rows] == [(r["__key"], r["__position"]) for r in delta]
                assert {r["__key"] for r in pg_rows} == {encode_key([k]) for k in st.truth[schema.table.id]}
            by_id = {r["id"]: r for r in sink.read(ITEMS)}
            assert str(by_id[22]["amount"]) == item(22, 5)["amount"] and by_id[22]["name"] == item(22, 5)["name"]
            assert 10 not in by_id and 25 not in by_id
        finally:
            sink.close()
    finally:
        with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
        conn.close()




def test_postgres_mirror_units_in_any_order_never_bring_back_truncated_rows(tmp_path, pg_uri, unique_name):
    """The executors write the PostgreSQL mirror a unit at a time, in whatever order Spark runs
    them. Forced here: the unit holding a TRUNCATE (and an insert after it) runs before the
    older unit whose inserts the TRUNCATE removed. The driver's delete first and the executors'
    filter keep those rows out."""
    import psycopg2

    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.core.schema import Column, TableSchema, encode_row
    from airflow_provider_cdc.pipeline.spark.distributed import postgres_unit_writer
    from airflow_provider_cdc.sinks.base import EVENT_SCHEMA, table_events
    from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink

    table = TableName("public", f"tr_{unique_name}")
    schema = TableSchema(table, (Column("id", "int64"), Column("v", "string")), ("id",))
    data = str(tmp_path)
    path = Path(schema_path(data, SOURCE, table))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schema.to_json())

    def ev(pos, op, k):
        row = None if op in ("t", "d") else {"id": k, "v": f"v{pos}"}
        return {"position": Position(pos).encode(), "table": table.id, "op": op,
                "key": None if op == "t" else encode_key([k]), "before": None,
                "after": None if row is None else encode_row(row), "ts_ms": pos, "watermark": None,
                "snapshot": False, "batch": f"c-{pos}"}

    units = [[ev(1, "c", 1), ev(2, "c", 2)], [ev(3, "t", None), ev(4, "c", 3)]]
    target = f"mirror_{unique_name}"
    sink = MirrorPostgresSink(pg_uri, data, SOURCE, target_schema=target)
    truncates = {table.id: Position(3).encode()}
    try:
        sink.write(pa.Table.from_pylist([ev(0, "c", 9)], schema=EVENT_SCHEMA))  # a row from before
        sink.truncate_before(table.id, truncates[table.id])  # the driver's part
        produce = lambda u: table_events(pa.Table.from_pylist(u, schema=EVENT_SCHEMA), sink.schemas.get)  # noqa: E731
        write = postgres_unit_writer(units, produce, sink, truncates)
        counts = [b.to_pylist() for b in write([pa.record_batch({"unit": [1, 0]})])]  # newest unit first
        assert counts == [[{"rows": 1}], [{"rows": 0}]]
        assert sorted((r["id"], r["__deleted"]) for r in sink.read(table)) == [(3, False)]
    finally:
        sink.close()
        with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
        conn.close()


def test_postgres_mirror_tables_are_created_one_writer_at_a_time(tmp_path, pg_uri, unique_name):
    """Executors create the same target schema and table at once; CREATE ... IF NOT EXISTS is
    not safe against that. Forced: while another session holds the creation lock and creates
    the schema, a writer's ensure_table waits, then finds the schema and goes on."""
    import threading

    import psycopg2

    from airflow_provider_cdc.core.schema import Column, TableSchema
    from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink

    target = f"mirror_{unique_name}"
    schema = TableSchema(TableName("public", f"cr_{unique_name}"), (Column("id", "int64"),), ("id",))
    holder = psycopg2.connect(pg_uri)
    sink = MirrorPostgresSink(pg_uri, str(tmp_path), SOURCE, target_schema=target)
    errors: list[BaseException] = []
    try:
        cur = holder.cursor()  # a transaction: the lock is held until the commit
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"cdc-mirror:{target}",))
        cur.execute(f'CREATE SCHEMA "{target}"')

        def writer():
            try:
                sink.ensure_table(schema)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        t = threading.Thread(target=writer)
        t.start()
        t.join(2.0)
        assert t.is_alive(), "ensure_table must wait for the creation lock"
        holder.commit()  # schema created, lock released
        t.join(30)
        assert not t.is_alive() and not errors, errors
        assert sink.read(schema.table) == []
    finally:
        holder.rollback()
        sink.close()
        with holder.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
        holder.commit()
        holder.close()
