"""Window merge throughput: ``merge_window`` on one 100k-row chunk against 10k events
inside its window, against a plain dict copy of the same rows in the same run.

The chunk's rows are canonical key -> after-row dicts (as the merge gets them from a
staged chunk); the window holds updates, deletes and inserts of the chunk's table (about
half of them hit keys in the chunk) and of another table. Each side runs ``--repeat``
times, interleaved, best time kept (the machine is shared).

    python -m bench window [--rows 100000] [--events 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import random
import time

from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import encode_key
from airflow_provider_cdc.core.window import WindowChunk, merge_window, window_drops

TABLE = "public.orders"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench window", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="rows in the chunk")
    ap.add_argument("--events", type=int, default=10_000, help="row events inside the window")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    return ap.parse_known_args(argv)[0]  # ignore options meant for other benchmarks


def build(rows: int, events: int, seed: int) -> tuple[WindowChunk, list, set[str]]:
    rnd = random.Random(seed)
    chunk_rows = {
        encode_key([i]): {"id": i, "customer": f"c{i % 977}", "amount": f"{i % 1000}.25", "ts": "2026-11-21T10:00:00.000000"}
        for i in range(rows)
    }
    log: list = [WatermarkEvent("lw", Position(100, 0, 0))]
    hit: set[str] = set()
    for n in range(events):
        table = TABLE if rnd.random() < 0.9 else "public.other"
        k = encode_key([rnd.randrange(2 * rows)])  # about half inside the chunk's keys
        op = rnd.choice("uuucd")
        after = None if op == "d" else {"id": 0, "customer": "x", "amount": "1.00", "ts": "2026-11-21T10:00:01.000000"}
        log.append(ChangeEvent(table, op, k, Position(101 + n, 0, 0), None, after))
        if table == TABLE and k in chunk_rows:
            hit.add(k)
    log.append(WatermarkEvent("hw", Position(101 + events, 0, 0)))
    return WindowChunk(TABLE, "lw", "hw", chunk_rows, name="bench"), log, hit


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    chunk, log, hit = build(args.rows, args.events, args.seed)
    rows = chunk.rows
    merge_t = step4_t = copy_t = rowcopy_t = float("inf")
    out: list = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = merge_window([chunk], log)
        merge_t = min(merge_t, time.perf_counter() - t0)
        t0 = time.perf_counter()
        window_drops([chunk], log)
        step4_t = min(step4_t, time.perf_counter() - t0)
        t0 = time.perf_counter()
        copied = dict(rows)
        copy_t = min(copy_t, time.perf_counter() - t0)
        t0 = time.perf_counter()
        rowcopied = {k: dict(v) for k, v in rows.items()}
        rowcopy_t = min(rowcopy_t, time.perf_counter() - t0)
        del copied, rowcopied
    if len(out) != args.rows - len(hit):  # the bench must not time a wrong merge
        raise SystemExit(f"merge returned {len(out)} rows, expected {args.rows - len(hit)}")
    n = args.rows
    print(f"chunk rows {n}, window events {args.events} ({len(hit)} chunk keys dropped), best of {args.repeat}")
    print(f"merge_window            {merge_t * 1e3:9.1f} ms  {n / merge_t:12,.0f} rows/s")
    print(f"  of which step 4 (drops) {step4_t * 1e3:7.1f} ms  (the rest is building the r events)")
    print(f"baseline dict(rows)     {copy_t * 1e3:9.1f} ms  {n / copy_t:12,.0f} rows/s")
    print(f"baseline per-row copy   {rowcopy_t * 1e3:9.1f} ms  {n / rowcopy_t:12,.0f} rows/s")
    print(f"ratio merge/dict-copy throughput: {copy_t / merge_t:.3f}  (merge takes {merge_t / copy_t:.1f}x the time)")
    print(f"ratio merge/per-row-copy throughput: {rowcopy_t / merge_t:.3f}  (merge takes {merge_t / rowcopy_t:.1f}x the time)")


if __name__ == "__main__":
    main()
