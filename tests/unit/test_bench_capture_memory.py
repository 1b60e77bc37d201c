"""``python -m bench capture_memory`` and the C-decoder baseline of ``bench mysql`` without
databases: options, the report and its target verdicts (a wrong verdict would misreport a
missed target), the decoder's command line (the password never on it). The benchmark's own
run at tiny sizes on the real databases: tests/integration/test_bench_capture_memory.py."""

from __future__ import annotations

from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams
from airflow_provider_cdc.dialects.mysql import BinlogOffset
from bench import bench_capture_memory as b
from bench import bench_mysql as bm

MB = 2**20


def test_parse_defaults_and_flags():
    a = b._parse([])
    assert (a.rows, a.dialects, a.value_bytes, a.value_rows) == ([100_000, 1_000_000, 5_000_000], ["postgres", "mysql"], 64 * MB, 2)
    q = b._parse(["--rows", "500,100,500", "--dialects", "mysql", "--value-mb", "0.5", "--no-values",
                  "--capture-option", "segment_max_events=0", "--capture-option", "capture_decode=rows"])
    assert (q.rows, q.dialects, q.value_bytes, q.no_values) == ([100, 500], ["mysql"], MB // 2, True)
    assert q.options == {"segment_max_events": 0, "capture_decode": "rows"}


def _run(rows: int, peak_mb: float, base_mb: float = 100.0) -> dict:
    return {"rows": rows, "events": rows, "segments": 1, "seconds": 2.0,
            "rss_before": int(base_mb * MB), "peak": int((base_mb + peak_mb) * MB), "reset": True}


def test_verdicts_follow_the_figures():
    flat = {"kind": "postgres", "transactions": [_run(100_000, 80), _run(5_000_000, 300)],
            "values": {"value_bytes": 64 * MB, "rows": 2, "capture": _run(2, 200), "chunk": _run(2, 300)}}
    grows = {"kind": "mysql", "transactions": [_run(100_000, 80), _run(5_000_000, 331)]}
    v = b.verdicts(flat)
    assert [(round(f, 2), ok) for _, _, f, ok in v] == [(220.0, True), (3.12, True), (4.69, False)]
    assert b.verdicts(grows)[0][2:] == (251.0, False)
    assert b.verdicts({"kind": "x", "transactions": [_run(10, 1)]}) == []  # one size: no growth figure
    md = b.render([flat, grows])
    assert "| postgres | 5,000,000-row peak within 250 MB of the 100,000-row peak | 220.0 MB | met |" in md
    assert "| mysql | 5,000,000-row peak within 250 MB of the 100,000-row peak | 251.0 MB | **MISSED** |" in md
    assert "| postgres | 64 MB value through the chunk: peak within 4x the value | 4.69x | **MISSED** |" in md
    assert "| postgres | chunk | 2 | 64 | 300.0 | 4.69 | 2.0 |" in md


def test_c_decoder_command_reads_the_range_with_the_password_in_the_environment():
    p = ConnectionParams.from_uri("mysql://repl:s3cret@db.example:3307/cdc")
    start, end = BinlogOffset.of("mysql-bin.000007", 1234), BinlogOffset.of("mysql-bin.000008", 99)
    cmd = bm.c_decoder_command("/usr/bin/mariadb-binlog", p, ["mysql-bin.000007", "mysql-bin.000008"], start, end)
    assert cmd[:2] == ["/usr/bin/mariadb-binlog", "--read-from-remote-server"]
    assert {"--host=db.example", "--port=3307", "--user=repl", "--start-position=1234", "--stop-position=99",
            "--verbose"} <= set(cmd)
    assert cmd[-2:] == ["mysql-bin.000007", "mysql-bin.000008"]
    assert not any("s3cret" in c for c in cmd)
    assert bm.c_decoder_env(p)["MYSQL_PWD"] == "s3cret"
    assert "MYSQL_PWD" not in bm.c_decoder_env(ConnectionParams.from_uri("mysql://root@h/db"))


def test_c_decoder_rows_are_counted_for_the_table_only():
    out = b"\n".join([
        b"### INSERT INTO `cdc`.`t1`", b"### SET", b"###   @1=1",
        b"### UPDATE `cdc`.`t1`", b"### WHERE", b"### SET",
        b"### DELETE FROM `cdc`.`t1`",
        b"### INSERT INTO `cdc`.`t10`", b"### UPDATE `other`.`t1`",
    ])
    assert len(bm.row_lines(TableName("cdc", "t1")).findall(out)) == 3


def test_binlog_files_of_the_range():
    class Cur:
        def execute(self, sql):
            assert sql == "SHOW BINARY LOGS"

        def fetchall(self):
            return [(f"bin.00000{i}", 100) for i in range(1, 6)]

    start, end = BinlogOffset.of("bin.000002", 4), BinlogOffset.of("bin.000004", 9)
    assert bm.binlog_files(Cur(), start, end) == ["bin.000002", "bin.000003", "bin.000004"]
