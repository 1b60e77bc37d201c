"""verify --repair: a mirror that lost changes (a staged segment removed before any apply read
it) is found different by verify, which triggers a snapshot of only the key ranges whose
chunks differed; that snapshot, run through the DAG with the triggered conf, makes the mirror
equal to the source again (I9) and reads far fewer rows than the table has. On PostgreSQL
and MariaDB.
"""

from __future__ import annotations

from airflow_provider_cdc.cli import run as cli_run
from airflow_provider_cdc.pipeline.verify import check_event_log, verify_table
from airflow_provider_cdc.sinks.base import read_marker
from airflow_provider_cdc.storage import delete
from airflow_provider_cdc.storage.layout import changelog_dir
from airflow_provider_cdc.storage.staged import list_segments
from tools import workload as w

from .helpers import BOTH_STRATEGIES, ROWS, _json_out, _triggered_conf


@BOTH_STRATEGIES
def test_verify_repair_resnapshots_only_the_ranges_that_differ(pipeline, capsys):
    p = pipeline
    p.snapshot()
    p.catch_up()
    p.assert_equal()
    # lose changes: stage them, then remove the segment before any apply reads it
    params = w._params(p.uri)
    t, amount, ident = w.quote_table(params, p.table), w.quote_ident(params, "amount"), w.quote_ident(params, "id")
    with w.connect(p.uri) as conn, conn.cursor() as cur:
        cur.execute(f"UPDATE {t} SET {amount} = {amount} + 1 WHERE {ident} IN (5, 6, 2900)")
        conn.commit()
    applied = read_marker(p.data_dir, p.source, "mirror")
    p.capture_now()
    # (no marker yet: under watermark strategy "log" an idle source had nothing to apply)
    lost = [path for first, _last, path in list_segments(changelog_dir(p.data_dir, p.source))
            if applied is None or first > applied]
    assert lost, "the capture staged nothing"
    for path in lost:
        delete(path)
    p.catch_up()  # later changes flow on; the lost ones never arrive

    args = ["verify", "--conn-id", p.conn_id, "--source", p.source, "--table", p.table.id, "--data-dir", p.data_dir,
            "--chunk-rows", "500", "--json"]
    assert cli_run(args) == 1
    found = _json_out(capsys.readouterr().out)
    assert (found["different"], found["missing"], found["extra"]) == (3, 0, 0), found
    assert found["repair_ranges"] == [{"start": [1], "end": [501]}, {"start": [2501], "end": None}]
    assert found["repair_run"] is None  # without --repair nothing is triggered

    assert cli_run([*args, "--repair"]) == 1
    out = _json_out(capsys.readouterr().out)
    conf = _triggered_conf("cdc_snapshot", out["repair_run"])
    assert conf == found["repair_conf"] == {
        "action": "start", "tables": [p.table.id], "key_ranges": {p.table.id: found["repair_ranges"]},
        "parallelism": 2}
    p.run("cdc_snapshot", {**conf, "chunk_size": 200})
    progress = p.progress()
    assert progress.status == "done", progress.to_json()
    rows_read = sum(tp.rows for tp in progress.tables.values())
    assert rows_read == 500 + (ROWS - 2500), rows_read  # the two ranges, not the table
    p.catch_up()
    with p.dialect() as d:
        res = verify_table(d, p.data_dir, p.source, p.table, chunk_rows=500)
        pk = d.describe_table(p.table).primary_key
    assert res.ok and res.rows_checked == ROWS, [m.describe() for m in res.examples]
    # the event log lost the three updates for good: its check names exactly the keys whose
    # repair rows differ from the last state it had (the lost updates' effect, now corrected)
    report = check_event_log(p.data_dir, p.source, p.table, primary_key=pk)
    assert sorted(v.split(":")[0] for v in report.violations) == ["key [2900]", "key [5]", "key [6]"], report.violations


def test_a_lost_delete_is_repaired_by_its_ranges_not_the_table(pipeline, capsys):
    """Issue 57: a delete lost in a gap leaves a mirror row the source no longer has. verify
    places it in the key range that holds it, and the snapshot of those ranges removes it (it
    converges inside them): far fewer rows read than the table has, the mirror equal after."""
    p = pipeline
    p.snapshot()
    p.catch_up()
    params = w._params(p.uri)
    t, ident = w.quote_table(params, p.table), w.quote_ident(params, "id")
    with w.connect(p.uri) as conn, conn.cursor() as cur:
        cur.execute(f"DELETE FROM {t} WHERE {ident} IN (7, 1900)")
        conn.commit()
    applied = read_marker(p.data_dir, p.source, "mirror")
    p.capture_now()
    for first, _last, path in list_segments(changelog_dir(p.data_dir, p.source)):
        if applied is None or first > applied:
            delete(path)  # the deletes never reach the mirror
    p.catch_up()
    args = ["verify", "--conn-id", p.conn_id, "--source", p.source, "--table", p.table.id, "--data-dir", p.data_dir,
            "--chunk-rows", "500", "--json"]
    assert cli_run(args) == 1
    found = _json_out(capsys.readouterr().out)
    assert (found["different"], found["missing"], found["extra"]) == (0, 0, 2), found
    assert found["repair_conf"]["key_ranges"] == {p.table.id: found["repair_ranges"]}, found
    p.run("cdc_snapshot", {**found["repair_conf"], "chunk_size": 200})
    progress = p.progress()
    assert progress.status == "done", progress.to_json()
    rows_read = sum(tp.rows for tp in progress.tables.values())
    assert rows_read < ROWS // 2, rows_read  # the ranges that hold 7 and 1900, not the table
    p.catch_up()
    with p.dialect() as d:
        res = verify_table(d, p.data_dir, p.source, p.table, chunk_rows=500)
    assert res.ok and res.extra == 0 and res.rows_checked == ROWS - 2, [m.describe() for m in res.examples]
