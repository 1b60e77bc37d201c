"""Chunks that size themselves (issue 45) on the real PostgreSQL: a table whose rows are 100x
wider in one key range is snapshotted by SnapshotController.read_range with the adaptive
chunk size, its bytes target doing the work (deterministic: the duration target is far away),
paused by a DAG pause inside the wide region and resumed there. The wide region is read in
chunks of far fewer rows whose staged bytes stay near the target, the resumed range goes on
with the size it had (not the default), and the mirror equals the source (verify)."""

# ruff: noqa: S608 - SQL for generated table names, quoted; values bound
from __future__ import annotations

import uuid

import pytest

from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.sqlnames import quote_pg
from airflow_provider_cdc.core.throttle import ChunkSizing
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.arrow_engine import apply_changelog, merge_round
from airflow_provider_cdc.pipeline.capture import stage_changelog
from airflow_provider_cdc.pipeline.snapshot import staged_bytes
from airflow_provider_cdc.pipeline.snapshot_conf import parse_snapshot_conf
from airflow_provider_cdc.pipeline.snapshot_controller import SnapshotController
from airflow_provider_cdc.pipeline.snapshot_state import MemoryProgressStore, SourceProgress
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.pipeline.verify import verify_table
from airflow_provider_cdc.sinks.mirror_readers import read_mirror

NARROW, WIDE = 30, 3000  # characters of the value column: 100x wider in the middle
WIDE_FROM, WIDE_TO, ROWS = 3001, 4500, 7000  # keys 3001..4500 are wide
TARGET = 32 * 1024  # bytes target of a chunk
SIZING = ChunkSizing(target_seconds=3600.0, target_bytes=TARGET, min_rows=1, max_rows=1000)


@pytest.fixture
def source(pg_uri, tmp_path):
    u = uuid.uuid4().hex[:8]
    table = TableName("public", f"adaptive_{u}")
    params = ConnectionParams.from_uri(pg_uri)
    options = {"source": f"adaptive_{u}", "tables": [table], "watermark_schema": "cdc",
               "watermark_table": f"wm_{u}", "slot_name": f"adaptive_{u}", "publication_name": f"adaptive_{u}"}

    def connect():
        return get_dialect(params, **options)

    qt = f"{quote_pg(table.schema)}.{quote_pg(table.name)}"
    with connect() as d:
        d._query(f"CREATE TABLE {qt} (id bigint PRIMARY KEY, v text NOT NULL)")
        d._query(f"INSERT INTO {qt} SELECT i, left(repeat(md5(i::text), 100), CASE WHEN i BETWEEN %s AND %s "
                 f"THEN %s ELSE %s END) FROM generate_series(1, %s) i", (WIDE_FROM, WIDE_TO, WIDE, NARROW, ROWS))
        d.conn.commit()
    try:
        yield table, options["source"], str(tmp_path / u), connect
    finally:
        with connect() as d:
            d.drop_slot()
            d.drop_publication()
            d._query(f"DROP TABLE IF EXISTS {qt}")
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
            d.conn.commit()


def test_wide_rows_get_smaller_chunks_and_the_mirror_equals_the_source(source):
    table, name, data_dir, connect = source
    controller = SnapshotController(source=name, data_dir=data_dir, progress=SourceProgress(MemoryProgressStore(), name),
                                    connect=connect, sinks=("mirror",), chunk_sizing=SIZING)
    (work,) = controller.apply(parse_snapshot_conf({"action": "start", "tables": [table.id]}))
    assert work["chunk_size"] is None  # no chunk_size in the conf: adaptive

    checks = {"n": 0}

    def dag_paused() -> bool:  # the DAG is paused while chunk 60 is read: inside the wide region
        checks["n"] += 1
        return checks["n"] > 61  # once when the gate is made, once before connecting, then before chunks 2, 3, ..

    first = [ChunkResult.from_dict(c) for c in controller.read_range(work, dag_paused=dag_paused)]
    assert len(first) == 60 and not first[-1].exhausted
    assert WIDE_FROM <= first[-1].last_key[0] < WIDE_TO
    assert controller.progress.load(table.id).status == "paused"
    (again,) = controller.apply(parse_snapshot_conf({"action": "resume", "tables": [table.id]}))
    chunks = [ChunkResult.from_dict(c) for c in controller.read_range(again)]
    assert chunks[: len(first)] == first  # the unmerged chunks of before, then the new ones
    resumed = chunks[len(first)]
    assert resumed.after_key == first[-1].last_key  # continues after the last committed chunk
    # ... with the size the range had (a few wide rows), not the default start of 1,000 rows
    assert resumed.rows <= 2 * first[-1].rows < 100

    # the chunks tile the key space in order
    assert sum(c.rows for c in chunks) == ROWS and chunks[-1].exhausted
    for before, after in zip(chunks, chunks[1:], strict=False):
        assert after.after_key == before.last_key
    sizes = [(c.after_key[0] if c.after_key else 0, c.last_key[0], c.rows, staged_bytes(c.path)) for c in chunks]
    narrow = [rows for start, last, rows, _ in sizes[1:-1] if last < WIDE_FROM]  # not the first (start size)
    wide = [rows for start, last, rows, _ in sizes if start >= WIDE_FROM and last <= WIDE_TO]
    assert narrow and wide and max(wide) * 10 < min(narrow), sizes  # fewer rows per chunk where rows are wide
    # the bytes target holds within 2x in the wide region but at its entry: above it the chunk
    # that entered the region sized for narrow rows (a chunk's size is known once it is read)
    # and, when that chunk held few of the wide rows, the one after it (sized from that chunk's
    # average width, still far below a wide row's); every chunk after those two is within 2x
    entry = next(i for i, s in enumerate(sizes) if s[1] >= WIDE_FROM)
    assert sizes[entry][0] < WIDE_FROM and sizes[entry][3] > 2 * TARGET, sizes[entry]
    inside = [b for start, last, rows, b in sizes[entry + 2 :] if last <= WIDE_TO]
    assert inside and all(TARGET / 2 <= b <= 2 * TARGET for b in inside), sizes
    over = [i for i, s in enumerate(sizes) if s[3] > 2 * TARGET]
    assert set(over) <= {entry, entry + 1}, [sizes[i] for i in over]

    with connect() as d:
        stage_changelog(d, data_dir)
        sinks = build_sinks("events,mirror", data_dir=data_dir, source=name, database=None, require_schema=True)
        merge_round(chunks, data_dir=data_dir, source=name, sinks=sinks)
        apply_changelog(data_dir, name, sinks)
        res = verify_table(d, data_dir, name, table, chunk_rows=1000)
    assert res.ok, f"{res.summary()}: {[m.describe() for m in res.examples]}"
    assert read_mirror(data_dir, name, table).num_rows == ROWS == res.rows_checked
