"""Soak: many changelog rounds back to back in one warm process, under a background writer.

What grows with a pipeline's age, measured: a PostgreSQL table of ``--rows`` rows (inserted
through the changelog, so the mirror holds every row without a snapshot) takes random
inserts, updates and deletes from ``tools.workload.BackgroundWriter`` while this process runs
``--rounds`` rounds of: write a watermark on the source, capture (``run_capture`` with staging
retention, ``--horizon-seconds``), apply to the event log and the Delta mirror in process
(``arrow_engine.apply_changelog``), the changelog DAG's ``compact_tombstones`` step
(``compact_inactive``, ``compact_event_log``), and a high-watermark sensor's poke for the round's watermark
(``staged_watermarks``). At each report round it prints the round time and the poke time
(means over the last rounds), the staged segments and bytes, the event-log files, the Delta
log (files in ``_delta_log`` and commits since the last checkpoint; these and the event-log
files also as their peak over the last 100 rounds: checkpoints and merges make them sawtooths) and the ratio of each to its value at the
first report; ``--log-retention-seconds`` scales the Delta log's retention to the soak. At the end the writer stops, one more round catches up and
``verify_table`` compares the mirror with the source row for row.

    python -m bench soak [--rounds 200] [--report 20,50,100,200] [--rows 20000] [--tps 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.arrow_engine import apply_changelog
from airflow_provider_cdc.pipeline.capture import run_capture
from airflow_provider_cdc.pipeline.retention import RetentionPolicy
from airflow_provider_cdc.pipeline.spark.common import build_sinks
from airflow_provider_cdc.pipeline.verify import verify_table
from airflow_provider_cdc.sinks.base import read_marker
from airflow_provider_cdc.sinks.event_log import compact_event_log, event_files, table_dir
from airflow_provider_cdc.sinks.mirror_compaction import compact_inactive
from airflow_provider_cdc.storage.layout import changelog_dir, events_dir, mirror_dir, schema_path
from airflow_provider_cdc.storage.segment_index import staged_segments
from airflow_provider_cdc.storage.staged import staged_watermarks
from tools.workload import (
    COLUMNS,
    BackgroundWriter,
    connect,
    create_demo_table,
    drop_table,
    quote_ident,
    quote_table,
)

DEFAULT_URI = "postgresql://postgres@127.0.0.1:55432/cdc_test"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__.split("\n\n")[0])
    ap.add_argument("--uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_URI))
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--report", default=None, help="comma list of rounds to report at (default: 10%%, 25%%, 50%%, 100%%)")
    ap.add_argument("--rows", type=int, default=20_000, help="rows of the table (inserted through the changelog)")
    ap.add_argument("--tps", type=float, default=40.0, help="background writer transactions per second")
    ap.add_argument("--horizon-seconds", type=float, default=30.0, help="staging retention's replay horizon")
    ap.add_argument("--mirror-retention-hours", type=float, default=1.0)
    ap.add_argument("--log-retention-seconds", type=float, default=60.0,
                    help="the mirror's Delta log retention (CDC_MIRROR_LOG_RETENTION_HOURS, here in seconds)")
    return ap.parse_args(argv)


class Handle:
    """What run_capture needs of a source, without Airflow."""

    def __init__(self, uri: str, source: str, table: TableName) -> None:
        self.uri, self.source, self.table = uri, source, table

    def connection_params(self) -> ConnectionParams:
        return ConnectionParams.from_uri(self.uri)

    def get_dialect(self):
        return get_dialect(self.connection_params(), source=self.source, tables=[self.table],
                           watermark_table=f"wm_{self.source}")


def _files(folder: str, suffix: str) -> tuple[int, int]:
    """(files, bytes) below ``folder`` ending in ``suffix``, recursively (local paths)."""
    n = size = 0
    for root, _dirs, names in os.walk(storage.local_path(folder)):
        for name in names:
            if name.endswith(suffix):
                n += 1
                size += os.path.getsize(os.path.join(root, name))
    return n, size


def _delta_log(path: str) -> tuple[int, int]:
    """(files in _delta_log, commits since the newest checkpoint)."""
    import json

    log = Path(storage.local_path(path)) / "_delta_log"
    if not log.exists():
        return 0, 0
    files = [p for p in log.iterdir() if p.is_file()]
    versions = [int(p.name.split(".")[0]) for p in files if p.name.endswith(".json") and p.name[0].isdigit()]
    last_cp = log / "_last_checkpoint"
    cp = json.loads(last_cp.read_text())["version"] if last_cp.exists() else -1
    return len(files), (max(versions) - cp) if versions else 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    report = sorted({int(x) for x in args.report.split(",")}) if args.report else sorted(
        {max(1, args.rounds * f // 100) for f in (10, 25, 50, 100)})
    params = ConnectionParams.from_uri(args.uri)
    u = uuid.uuid4().hex[:8]
    table = TableName("public", f"soak_{u}")
    source = f"soak_{u}"
    data = tempfile.mkdtemp(prefix="bench_soak_")
    handle = Handle(args.uri, source, table)
    policy = RetentionPolicy(args.horizon_seconds, ("events", "mirror"))
    writer = None
    dialect = handle.get_dialect()
    try:
        create_demo_table(params, table, 0)
        run_capture(handle, data, retention=policy)  # the slot, before the rows
        # the table's staged schema, as a snapshot's plan stages it: the mirror's columns
        storage.write_text(schema_path(data, source, table), dialect.describe_table(table).to_json())
        with connect(params) as conn:
            cur = conn.cursor()
            cols = ", ".join(quote_ident(params, c) for c in COLUMNS)
            cur.execute(f"INSERT INTO {quote_table(params, table)} ({cols}) SELECT i, 'customer ' || i, i * 1.5, "  # noqa: S608
                        "now(), i %% 2 = 0, '{\"tier\": 1}'::jsonb, NULL, 'loaded' FROM generate_series(1, %s) i",
                        (args.rows,))
            conn.commit()
        writer = BackgroundWriter(params, table, threads=2, rate=args.tps, seed=7, key_max=args.rows).start()
        print(f"bench soak: {args.rounds} rounds on {table} ({args.rows:,} rows, writer at {args.tps:g} tps), "
              f"staging horizon {args.horizon_seconds:g} s, reports at {report}", flush=True)
        sinks = build_sinks("events,mirror", data_dir=data, source=source, database=None, require_schema=False)
        round_times: list[float] = []
        pokes: list[float] = []
        log_seen: list[tuple[int, int]] = []  # (files, commits since the checkpoint) after each round
        ev_seen: list[tuple[int, int]] = []  # (event-log files, live ones) after each round
        rows_out: list[dict] = []
        first: dict | None = None
        for r in range(1, args.rounds + 1):
            mark = f"soak-{r}-{uuid.uuid4().hex[:6]}"
            dialect.write_watermark(mark)
            t0 = time.perf_counter()
            run_capture(handle, data, retention=policy)
            apply_changelog(data, source, sinks)
            compact_inactive(data, source, lambda _tid: None, retention_hours=args.mirror_retention_hours,
                             log_retention_hours=args.log_retention_seconds / 3600)
            compact_event_log(data, source, read_marker(data, source, "events"),
                              grace_seconds=args.horizon_seconds)
            round_times.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            if mark not in staged_watermarks(changelog_dir(data, source), [mark]):
                print(f"  round {r}: the round's watermark is not staged", flush=True)
                return 1
            pokes.append(time.perf_counter() - t1)
            log_seen.append(_delta_log(mirror_dir(data, source, table)))
            ev_seen.append((_files(events_dir(data, source), ".parquet")[0],
                            len(event_files(table_dir(data, source, table)))))
            if r in report:
                segs = staged_segments(changelog_dir(data, source))
                ev_files, ev_live = ev_seen[-1]
                log_files, since_cp = log_seen[-1]
                window = log_seen[-100:]  # the checkpoint's sawtooth: the most over the last 100 rounds
                row = {
                    "round": r,
                    "round_s": statistics.mean(round_times[-20:]),
                    "poke_ms": 1000 * statistics.mean(pokes[-20:]),
                    "staged": len(segs),
                    "staged_mb": sum(s.info.bytes for s in segs if s.info) / 1e6,
                    "event_files": ev_files,
                    "event_live": ev_live,
                    # merges make the event log a sawtooth too: small files pile up to a run, then go
                    "event_files_peak": max(f for f, _ in ev_seen[-100:]),
                    "event_live_peak": max(n for _, n in ev_seen[-100:]),
                    "delta_log_files": log_files,
                    "delta_log_peak": max(f for f, _ in window),
                    "since_checkpoint": since_cp,
                    "checkpoint_age_peak": max(c for _, c in window),
                }
                first = first or row
                rows_out.append(row)
                print(f"  round {r}: round {row['round_s']:.2f} s, poke {row['poke_ms']:.1f} ms, "
                      f"{row['staged']} staged segments ({row['staged_mb']:.1f} MB), {ev_files} event-log files ({ev_live} live), "
                      f"{log_files} Delta log files (peak {row['delta_log_peak']} over the last 100 rounds), "
                      f"{since_cp} commits since the checkpoint (peak {row['checkpoint_age_peak']})", flush=True)
        stats = writer.stop()
        writer = None
        run_capture(handle, data, retention=policy)
        apply_changelog(data, source, sinks)
        for s in sinks:
            s.close()
        result = verify_table(dialect, data, source, table)
        print(f"  writer: {stats}", flush=True)
        print(f"  verify: {result.summary()}", flush=True)
        keys = ("round_s", "poke_ms", "staged", "staged_mb", "event_files", "event_files_peak", "event_live",
                "event_live_peak", "delta_log_files", "delta_log_peak", "since_checkpoint", "checkpoint_age_peak")
        print("\n| round | " + " | ".join(keys) + " |\n|" + "---|" * (len(keys) + 1))
        for row in rows_out:
            cells = [f"{row[k]:.3g} ({row[k] / first[k]:.2f}x)" if first[k] else f"{row[k]:.3g}" for k in keys]
            print(f"| {row['round']} | " + " | ".join(cells) + " |")
        print(f"RESULT verify_ok={result.ok} mismatched={result.mismatched}")
        return 0 if result.ok else 1
    finally:
        if writer is not None:
            writer.stop()
        try:
            dialect.drop_slot()
            dialect.drop_publication()
        finally:
            dialect.close()
            drop_table(params, table)
            shutil.rmtree(data, ignore_errors=True)
