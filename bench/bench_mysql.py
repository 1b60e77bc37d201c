"""MySQL/MariaDB benchmark: our capture and chunk reads against plain baselines, same run.

* capture: ``stage_changelog(MySqlDialect)`` (binlog decode, canonical values, staged Parquet
  segment, offset commit), once with the compiled rows walker (dialects/mysql/rows_walker.py,
  ``rows_decoder="compiled"``) and once with the pure-Python reader (``"python"``), against a
  raw mysql-replication drain of the same binlog range that only touches every row's decoded
  values, and against a C decoder of that range: ``mariadb-binlog --read-from-remote-server
  --start-position --stop-position --verbose`` (every row image decoded; output to a file,
  counted after the timing; the password through MYSQL_PWD, never on the command line);
* chunk read: ``read_chunk()`` (keyset pages, canonical values, Parquet) against one
  plain streaming ``SELECT * ... ORDER BY pk`` of the same rows through an unbuffered cursor.

Each side runs ``--repeat`` times, interleaved, best time kept (the machine is shared);
the ratios (ours / baseline throughput) are printed last. ``--profile``: the costliest
functions of the compiled capture's last run.

    python -m bench mysql [--rows 100000] [--chunk-size 50000] [--repeat 2] [--profile] [--single-row]
    python -m bench.bench_mysql --uri mysql://root@127.0.0.1:53306/cdc_test
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pymysql
import pymysql.cursors

from airflow_provider_cdc.core.ranges import FULL_RANGE
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ChunkRead, ConnectionParams, get_dialect
from airflow_provider_cdc.dialects.mysql import BinlogOffset, MySqlDialect, rows_walker
from airflow_provider_cdc.pipeline.capture import stage_changelog
from bench.profiling import profiled

DEFAULT_URI = "mysql://root@127.0.0.1:53306/cdc_test"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench mysql", description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", default=os.environ.get("CDC_TEST_MYSQL_URI", DEFAULT_URI))
    ap.add_argument("--rows", type=int, default=40_000, help="rows inserted (plus rows/2 updates)")
    ap.add_argument("--chunk-size", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="cProfile the compiled capture's last run")
    ap.add_argument("--single-row", action="store_true",
                    help="one transaction per row change (an OLTP writer's binlog) instead of large ones")
    return ap.parse_args(argv)


def _connect(p: ConnectionParams, **kw) -> pymysql.connections.Connection:
    return pymysql.connect(
        host=p.host,
        port=p.port or 3306,
        user=p.user or "root",
        password=p.password or "",
        charset="utf8mb4",
        autocommit=True,
        **kw,
    )


def _load(cur, table: str, rows: int, single: bool = False) -> None:
    if single:  # a transaction per row change (autocommit): GTID, table map and XID events each
        for i in range(rows):
            cur.execute(
                f"INSERT INTO {table} (id, a, b, c, d, e, f) VALUES (%s, %s, %s, %s, %s, %s, %s)",  # noqa: S608
                (i, i * 7 % 1000, f"name-{i}-😀", i / 3, "2024-01-02 03:04:05.123456", f"{i}.25",
                 bytes([i % 256]) * 8),
            )
        for i in range(rows // 2):
            cur.execute(f"UPDATE {table} SET a = a + 1, b = CONCAT(b, 'u') WHERE id = %s", (i,))  # noqa: S608
        return
    batch = 2000
    for lo in range(0, rows, batch):
        n = min(batch, rows - lo)
        values = []
        for i in range(lo, lo + n):
            values += [
                i,
                i * 7 % 1000,
                f"name-{i}-😀",
                i / 3,
                "2024-01-02 03:04:05.123456",
                f"{i}.25",
                bytes([i % 256]) * 8,
            ]
        cur.execute("BEGIN")
        cur.execute(
            f"INSERT INTO {table} (id, a, b, c, d, e, f) VALUES "  # noqa: S608
            + ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * n),
            values,
        )
        cur.execute("COMMIT")
    step = 1000
    for lo in range(0, rows // 2, step):
        cur.execute(
            f"UPDATE {table} SET a = a + 1, b = CONCAT(b, 'u') WHERE id >= %s AND id < %s",  # noqa: S608
            (lo, min(lo + step, rows // 2)),
        )


def _raw_drain(p: ConnectionParams, start: BinlogOffset, end: BinlogOffset, schema: str, table: str) -> int:
    """The baseline: mysql-replication alone, same range, every row's values decoded."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import RotateEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    stream = BinLogStreamReader(
        connection_settings={
            "host": p.host,
            "port": p.port or 3306,
            "user": p.user or "root",
            "passwd": p.password or "",
        },
        server_id=uuid.uuid4().int % 1_000_000_000 + 2_000_000,
        blocking=False,
        resume_stream=True,
        log_file=start.file,
        log_pos=start.pos,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, RotateEvent],
        only_schemas=[schema],
        only_tables=[table],
        enable_logging=False,
    )
    n = 0
    current = start.file
    try:
        for ev in stream:
            if isinstance(ev, RotateEvent):
                current = ev.next_binlog
                continue
            if BinlogOffset.of(current, ev.packet.log_pos) > end:
                break
            if isinstance(ev, WriteRowsEvent | UpdateRowsEvent | DeleteRowsEvent):
                n += len(ev.rows)  # decodes every value of every row
            if BinlogOffset.of(current, ev.packet.log_pos) == end:
                break
    finally:
        stream.close()
    return n


def c_decoder_binary() -> str | None:
    """The C binlog decoder of the server's client tools (``mariadb-binlog``, or MySQL's
    ``mysqlbinlog``), or None when neither is installed."""
    return shutil.which("mariadb-binlog") or shutil.which("mysqlbinlog")


def binlog_files(cur, start: BinlogOffset, end: BinlogOffset) -> list[str]:
    """The binlog files from ``start``'s to ``end``'s, in order (SHOW BINARY LOGS)."""
    cur.execute("SHOW BINARY LOGS")
    names = [r[0] for r in cur.fetchall()]
    return [f for f in names if start.index <= BinlogOffset.of(f, 4).index <= end.index]


def c_decoder_command(binary: str, p: ConnectionParams, files: list[str], start: BinlogOffset,
                      end: BinlogOffset) -> list[str]:
    """``mariadb-binlog --read-from-remote-server`` of exactly ``start``..``end`` (the
    start position applies to the first file, the stop position to the last), ``--verbose``:
    every row image decoded into its values (pseudo-SQL), the work the capture's decode
    does. No password here: it goes through MYSQL_PWD (:func:`c_decoder_env`)."""
    return [
        binary,
        "--read-from-remote-server",
        f"--host={p.host}",
        f"--port={p.port or 3306}",
        f"--user={p.user or 'root'}",
        f"--start-position={start.pos}",
        f"--stop-position={end.pos}",
        "--verbose",
        *files,
    ]


def c_decoder_env(p: ConnectionParams) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MYSQL_PWD"}
    if p.password:
        env["MYSQL_PWD"] = p.password
    return env


def row_lines(table: TableName) -> re.Pattern[bytes]:
    """The ``--verbose`` lines that start one row change of ``table``."""
    q = re.escape(f"`{table.schema}`.`{table.name}`".encode())
    return re.compile(rb"^### (?:INSERT INTO|UPDATE|DELETE FROM) " + q + rb"$", re.MULTILINE)


def _c_decoder_drain(binary: str, p: ConnectionParams, cur, start: BinlogOffset, end: BinlogOffset,
                     table: TableName, out: Path) -> tuple[int, float]:
    """(row changes of ``table`` decoded, seconds) of the C decoder over the binlog range
    (it decodes every table's rows there, as the capture reads them); its output goes to a
    file, counted after the timing."""
    cmd = c_decoder_command(binary, p, binlog_files(cur, start, end), start, end)
    with out.open("wb") as f:
        t = time.perf_counter()
        proc = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, env=c_decoder_env(p), check=False)
        took = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"{binary} exited {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}")
    rows = len(row_lines(table).findall(out.read_bytes()))
    out.unlink()
    return rows, took


def _plain_select(p: ConnectionParams, table: str, batch: int = 10_000) -> int:
    conn = _connect(p, cursorclass=pymysql.cursors.SSCursor)
    n = 0
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table} ORDER BY id")  # noqa: S608
            while rows := cur.fetchmany(batch):
                n += len(rows)
    finally:
        conn.close()
    return n


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    params = ConnectionParams.from_uri(args.uri)
    u = uuid.uuid4().hex[:8]
    db = params.database or "cdc_test"
    tname = TableName(db, f"bench_{u}")
    qtable = f"`{db}`.`{tname.name}`"
    work = Path(tempfile.mkdtemp(prefix="bench_mysql_"))
    admin = _connect(params)
    cur = admin.cursor()
    compiled = rows_walker.available()
    dialect: MySqlDialect = get_dialect(
        params, source=f"bench_{u}", watermark_table=f"wm_bench_{u}", tables=[tname],
        rows_decoder="compiled" if compiled else "python",
    )
    # the pure-Python reader (the fallback), same range, its own source and staging
    py_dialect: MySqlDialect = get_dialect(
        params, source=f"bench_py_{u}", watermark_table=f"wm_bench_{u}", tables=[tname], rows_decoder="python"
    )
    try:
        cur.execute(
            f"CREATE TABLE {qtable} (id BIGINT PRIMARY KEY, a INT, b VARCHAR(64), c DOUBLE, d DATETIME(6),"
            f" e DECIMAL(14,2), f VARBINARY(16)) ENGINE=InnoDB"
        )
        dialect.ensure_watermark_table()
        print(
            f"bench mysql: {args.rows} inserts + {args.rows // 2} updates into {tname}, {dialect.flavour.name}"
            + (", a transaction each" if args.single_row else "")
        )
        t0 = time.perf_counter()
        start = dialect.binlog_end()
        _load(cur, qtable, args.rows, args.single_row)
        end = dialect.binlog_end()
        print(
            f"  load: {time.perf_counter() - t0:.1f} s; binlog range {start.file}:{start.pos} .. {end.file}:{end.pos}"
        )

        cap_best = py_best = raw_best = chunk_best = sel_best = c_best = float("inf")
        events = py_events = raw_rows = chunk_rows = sel_rows = c_rows = 0
        report = ""
        c_bin = c_decoder_binary()
        if c_bin is None:
            print("  C decoder baseline: neither mariadb-binlog nor mysqlbinlog is installed; skipped")
        if not compiled:
            print("  the compiled rows walker is not built (no compiler at install): both captures are pure Python")
        for r in range(args.repeat):
            t = time.perf_counter()
            raw_rows = _raw_drain(params, start, end, db, tname.name)
            raw_best = min(raw_best, time.perf_counter() - t)

            if c_bin is not None:
                c_rows, took = _c_decoder_drain(c_bin, params, cur, start, end, tname, work / "c-decoder.out")
                c_best = min(c_best, took)

            data = work / f"cap-{r}"
            dialect.commit_offset(start.to_json(), str(data))
            # read exactly the same range: stop at the end recorded after the load
            t = time.perf_counter()
            res, prof = profiled(args.profile and r == args.repeat - 1, stage_changelog, dialect, str(data))
            cap_best = min(cap_best, time.perf_counter() - t)
            report = prof or report
            events = res.events
            if BinlogOffset.from_json(res.end_offset) < end:
                raise SystemExit(f"capture stopped early at {res.end_offset}")

            py_data = work / f"cap-py-{r}"
            py_dialect.commit_offset(start.to_json(), str(py_data))
            t = time.perf_counter()
            py_res = stage_changelog(py_dialect, str(py_data))
            py_best = min(py_best, time.perf_counter() - t)
            py_events = py_res.events

            schema = dialect.describe_table(tname)
            t = time.perf_counter()
            after, chunk_rows, seq = None, 0, 0
            while True:
                path = str(work / f"chunk-{r}-{seq}.parquet")
                out = dialect.read_chunk(ChunkRead(schema, FULL_RANGE, after, args.chunk_size, path))
                chunk_rows += out.rows
                seq += 1
                if out.rows < args.chunk_size:
                    break
                after = out.last_key
            chunk_best = min(chunk_best, time.perf_counter() - t)

            t = time.perf_counter()
            sel_rows = _plain_select(params, qtable)
            sel_best = min(sel_best, time.perf_counter() - t)

        # capture may include a few more transactions of this table written by nobody
        # else; the raw drain counts the same rows events of the same range
        cap_rate, py_rate, raw_rate = events / cap_best, py_events / py_best, raw_rows / raw_best
        chunk_rate, sel_rate = chunk_rows / chunk_best, sel_rows / sel_best
        walker = "compiled rows walker" if compiled else "pure Python, walker not built"
        print(
            f"  capture, {walker} (decode + canonical + Parquet + offset): {events} events in {cap_best:.2f} s"
            f" = {cap_rate:,.0f} ev/s"
        )
        print(
            f"  capture, pure-Python reader (the fallback), same range: {py_events} events in {py_best:.2f} s"
            f" = {py_rate:,.0f} ev/s"
        )
        print(
            f"  raw mysql-replication drain, same range:          {raw_rows} rows in {raw_best:.2f} s = {raw_rate:,.0f} rows/s"
        )
        print(
            f"  chunk read (keyset pages of {args.chunk_size}, Parquet):   {chunk_rows} rows in {chunk_best:.2f} s = {chunk_rate:,.0f} rows/s"
        )
        print(
            f"  plain streaming SELECT, same rows:                {sel_rows} rows in {sel_best:.2f} s = {sel_rate:,.0f} rows/s"
        )
        if c_bin is not None:
            c_rate = c_rows / c_best
            print(
                f"  C decoder ({os.path.basename(c_bin)} --read-from-remote-server --verbose), same range:"
                f" {c_rows} rows in {c_best:.2f} s = {c_rate:,.0f} rows/s"
            )
        if report:
            print(f"  profile of the compiled capture's last run:\n{report}")
        print(f"RATIO capture/raw_drain = {cap_rate / raw_rate:.2f}")
        print(f"RATIO capture/pure_python_capture = {cap_rate / py_rate:.2f}")
        if c_bin is not None:
            print(f"RATIO capture/c_decoder = {cap_rate / c_rate:.2f}  (target >= 0.3)")
            print(f"RATIO pure_python_capture/c_decoder = {py_rate / c_rate:.2f}")
        print(f"RATIO chunk_read/plain_select = {chunk_rate / sel_rate:.2f}")
        return 0
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {qtable}")
        cur.execute(f"DROP TABLE IF EXISTS {dialect.quote_table(dialect.watermark_table)}")
        dialect.close()
        py_dialect.close()
        admin.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
