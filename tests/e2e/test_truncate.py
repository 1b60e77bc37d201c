"""TRUNCATE is an event, and a snapshot converges (I9), through the real DAGs on both databases.

- A TRUNCATE during capture (with inserts after it in the same transaction and in later
  ones) is staged as ``op = "t"``, reaches the event log, and the mirror drops every older
  row: verify at 0 mismatches, the mirror's live rows equal the source's.
- A TRUNCATE while the table's snapshot is running (between two chunks) drops the chunks
  whose window holds it, and the snapshot still converges.
- Drift: rows the source no longer has but the mirror still holds (ghosts written straight
  into the Delta mirror, as lost events or a bug would leave them) are removed by a
  re-snapshot, which is the documented remedy for any drift.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_provider_cdc.core.arrow_types import DELETED_COLUMN, KEY_COLUMN, POSITION_COLUMN
from airflow_provider_cdc.pipeline.verify import read_event_log
from airflow_provider_cdc.sinks.mirror_readers import read_mirror, read_mirror_raw
from airflow_provider_cdc.storage.layout import mirror_dir
from tools import workload as w

from .helpers import BOTH_STRATEGIES, Pipeline, qt, run_sql

pytestmark = pytest.mark.timeout(900)


def insert(p: Pipeline, first: int, count: int) -> str:
    """An INSERT of rows ``first..first+count-1`` copied from the demo table's shape."""
    ids = range(first, first + count)
    if p.scheme == "pg":
        return (f"INSERT INTO {qt(p)} (id, name, amount, updated_at, active) SELECT g, 'after-truncate ' || g, g, "  # noqa: S608
                f"now(), true FROM generate_series({ids.start}, {ids.stop - 1}) g")
    values = ", ".join(f"({i}, 'after-truncate {i}', {i}, NOW(6), 1)" for i in ids)
    return f"INSERT INTO {qt(p)} (id, name, amount, updated_at, active) VALUES {values}"  # noqa: S608




def test_truncate_during_capture_is_an_event_and_the_mirror_follows(pipeline):
    p = pipeline
    p.snapshot()
    p.catch_up()
    run_sql(p, [f"UPDATE {qt(p)} SET name = 'before truncate' WHERE id <= 10",  # noqa: S608
                f"TRUNCATE TABLE {qt(p)}", insert(p, 50_001, 5)], one_transaction=p.scheme == "pg")
    run_sql(p, [insert(p, 60_001, 7), f"DELETE FROM {qt(p)} WHERE id = 60001"])  # noqa: S608
    p.catch_up()
    p.assert_equal()
    assert read_mirror(p.data_dir, p.source, p.table).num_rows == w.count_rows(p.uri, p.table) == 5 + 6
    ops = read_event_log(p.data_dir, p.source, p.table)["op"].to_pylist()
    assert ops.count("t") == 1, "the TRUNCATE reached the event log as one 't' event"


@BOTH_STRATEGIES
def test_truncate_between_chunks_of_a_running_snapshot_converges(pipeline):
    p = pipeline
    fired = p.on_chunk(3, lambda: run_sql(p, [f"TRUNCATE TABLE {qt(p)}", insert(p, 70_001, 40)],
                                          one_transaction=p.scheme == "pg"))
    p.snapshot()
    assert fired["n"] >= 3
    assert p.progress().status == "done"
    p.catch_up()
    p.assert_equal()
    assert read_mirror(p.data_dir, p.source, p.table).num_rows == w.count_rows(p.uri, p.table) == 40


def test_a_resnapshot_removes_rows_the_source_no_longer_has(pipeline):
    """Ghosts: keys the source never had (and a deleted one) written into the mirror with an
    old position, as a lost delete would leave them; verify sees them, a re-snapshot removes them."""
    p = pipeline
    p.snapshot()
    p.catch_up()
    ghosts = read_mirror_raw(p.data_dir, p.source, p.table).slice(0, 3)
    keys = [f"[{900_000 + i}]" for i in range(3)]
    ghosts = ghosts.set_column(ghosts.schema.get_field_index("id"), "id", pa.array([900_000 + i for i in range(3)], ghosts["id"].type))
    ghosts = ghosts.set_column(ghosts.schema.get_field_index(KEY_COLUMN), KEY_COLUMN, pa.array(keys))
    ghosts = ghosts.set_column(ghosts.schema.get_field_index(POSITION_COLUMN), POSITION_COLUMN, pa.array(["0" * 40] * 3))
    ghosts = ghosts.set_column(ghosts.schema.get_field_index(DELETED_COLUMN), DELETED_COLUMN, pa.array([False] * 3))
    # appended straight to the Delta table, each in its key's bucket: the mirror's own writers
    # would refuse rows this old
    from airflow_provider_cdc.sinks.delta_buckets import BUCKET_COLUMN, DEFAULT_BUCKETS, bucket_of

    ghosts = ghosts.append_column(BUCKET_COLUMN, bucket_of(ghosts[KEY_COLUMN], DEFAULT_BUCKETS))
    write_deltalake(mirror_dir(p.data_dir, p.source, p.table), ghosts, mode="append")
    assert read_mirror(p.data_dir, p.source, p.table).num_rows == w.count_rows(p.uri, p.table) + 3

    from airflow_provider_cdc.pipeline.verify import verify_table

    with p.dialect() as d:
        assert not verify_table(d, p.data_dir, p.source, p.table).ok  # the drift is visible
    p.snapshot()  # the documented remedy
    p.catch_up()
    p.assert_equal()
    assert read_mirror(p.data_dir, p.source, p.table).num_rows == w.count_rows(p.uri, p.table)
