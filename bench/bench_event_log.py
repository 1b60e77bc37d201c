"""What the event log's Delta log costs a round: ``--rounds`` writes of one batch of ``--events``
events of one table through ``EventLogSink`` (each a Parquet file and a Delta commit, a checkpoint
every 100 versions), against the same files written without a commit (the event log before its
Delta log: ``atomic_write_table`` of the same envelope), in the same process. Then a compaction
of the applied small files (one commit) and a read of every event through the log.

    python -m bench event_log [--rounds 300] [--events 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA, table_events
from airflow_provider_cdc.sinks.event_log import EventLogSink, compact_table, read_events, table_dir
from airflow_provider_cdc.storage.layout import log_schema_path
from airflow_provider_cdc.storage.staged import atomic_write_table

SOURCE = "bench"
T = TableName("public", "events")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("v", "string"), Column("n", "int32")), ("id",))


def _batch(b: int, events: int) -> pa.Table:
    first, last = Position(1000 * b).encode(), Position(1000 * b + events - 1).encode()
    return pa.Table.from_pylist(
        [
            {"position": Position(1000 * b + i).encode(), "table": T.id, "op": "u", "key": encode_key([i]),
             "before": None, "after": encode_row({"id": i, "v": f"r{b}", "n": b}), "ts_ms": b, "watermark": None,
             "snapshot": False, "batch": f"c-{first}-{last}"}
            for i in range(events)
        ],
        schema=EVENT_SCHEMA,
    )


def _plain_write(sink: EventLogSink, events: pa.Table) -> None:
    """The envelope files as the sink wrote them before the log: no commit."""
    for te in table_events(events, lambda t: sink.schema(TableName.parse(t))):
        folder = table_dir(sink.data_dir, sink.source, TableName.parse(te.table))
        batch = te.events["batch"][0].as_py()
        atomic_write_table(sink.envelope(te), storage.join(folder, f"{batch}.parquet"))


def run(rounds: int, events: int, *, with_log: bool) -> dict:
    d = tempfile.mkdtemp(prefix="bench-event-log-")
    try:
        p = Path(log_schema_path(d, SOURCE, T))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(SCHEMA.to_json())
        sink = EventLogSink(d, SOURCE)
        batches = [_batch(b, events) for b in range(1, rounds + 1)]
        times = []
        for i, t in enumerate(batches, 1):
            t0 = time.perf_counter()
            sink.write(t) if with_log else _plain_write(sink, t)
            times.append(time.perf_counter() - t0)
            if i % 100 == 0:
                print(f"  {'log' if with_log else 'plain'}: {i}/{rounds} writes", flush=True)
        out = {"median_ms": statistics.median(times) * 1000, "p99_ms": sorted(times)[int(0.99 * len(times))] * 1000,
               "total_s": sum(times)}
        if with_log:
            t0 = time.perf_counter()
            merged, _ = compact_table(table_dir(d, SOURCE, T), Position(10**9).encode(), min_files=50)
            out["compaction_s"], out["merged"] = time.perf_counter() - t0, merged
            t0 = time.perf_counter()
            out["read"] = read_events(d, SOURCE, T).num_rows
            out["read_s"] = time.perf_counter() - t0
        return out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench event_log", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--events", type=int, default=10)
    a = ap.parse_args(argv)
    plain = run(a.rounds, a.events, with_log=False)
    logged = run(a.rounds, a.events, with_log=True)
    print(f"without a log: a write {plain['median_ms']:.1f} ms median, {plain['p99_ms']:.1f} ms p99")
    print(f"with the Delta log: a write {logged['median_ms']:.1f} ms median, {logged['p99_ms']:.1f} ms p99 "
          f"(**{logged['total_s'] / plain['total_s']:.2f}x** the writes' total time); compaction of "
          f"{logged['merged']} files in {logged['compaction_s']:.2f} s; {logged['read']} events read through the "
          f"log in {logged['read_s']:.2f} s")
    if logged["read"] != a.rounds * a.events:
        print(f"FAILED: {logged['read']} events read, {a.rounds * a.events} written")
        return 1
    return 0
