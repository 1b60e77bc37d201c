"""Chunks that size themselves (issue 45): three PostgreSQL tables whose chunks cost very
different amounts at one fixed row count, each snapshotted by the real chunk loop
(SnapshotController.read_range: watermarks, COPY, staged Parquet, sidecars) once with a fixed
chunk size and once with the adaptive one, on the same data:

* ``uuid``: a UUID key (random order: every chunk reads pages all over the heap);
* ``gap``: an integer key, dense, then a gap 1,000x the dense part's span, then dense again
  (keyset chunks with LIMIT do not see the gap; range planning for parallelism does: the
  rows of the ranges an even split of min..max gives and of the ranges planned from sampled
  keys are printed too);
* ``wide``: an integer key whose rows are 100x wider in the middle third of the key space.

Three modes per table: adaptive; fixed at the adaptive chunks' median row count (the best one
fixed size for that table); fixed at ``--fixed`` rows (10,000: the default of earlier
versions). Per mode: the chunks' durations (min / median / max, max/min and p90/p10) and
staged sizes; for each, how many chunks but the range's last (shorter) one took within 2x of
the target (adaptive: also without its first chunks, which grow from the start size at most
2x a step), and the adaptive chunks outside 2x. Durations are measured around each chunk
(lw -> SELECT -> hw, staging), as read_range measures them to size the next one.

    python -m bench chunking [--rows 1000000] [--wide-rows 300000] [--target-seconds 0.1]
                             [--fixed 10000] [--keep]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import tempfile
import time
import uuid

from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.core.sqlnames import quote_pg
from airflow_provider_cdc.core.throttle import ChunkSizing, Throttle, size_text
from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
from airflow_provider_cdc.pipeline.snapshot import staged_bytes
from airflow_provider_cdc.pipeline.snapshot_conf import parse_snapshot_conf
from airflow_provider_cdc.pipeline.snapshot_controller import SnapshotController
from airflow_provider_cdc.pipeline.snapshot_state import MemoryProgressStore, SourceProgress
from bench.bench_e2e import DEFAULT_PG
from tools import workload as w

NARROW, WIDE = 10, 1000  # characters of the wide table's value column: 100x wider in the middle third
GAP = 1000  # the gap table's gap, in multiples of its dense part's span


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench chunking", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the uuid and gap tables")
    ap.add_argument("--wide-rows", type=int, default=1_000_000, help="rows of the wide table (a third of them wide)")
    ap.add_argument("--target-seconds", type=float, default=0.1, help="the adaptive chunks' duration target")
    ap.add_argument("--target-mb", type=float, default=64.0, help="the adaptive chunks' bytes target")
    ap.add_argument("--fixed", type=int, default=10_000, help="rows of the fixed-size chunks (the old default)")
    ap.add_argument("--tables", default="uuid,gap,wide")
    ap.add_argument("--pg-uri", default=os.environ.get("CDC_TEST_PG_URI", DEFAULT_PG))
    ap.add_argument("--keep", action="store_true", help="keep the tables (and reuse them next time)")
    return ap.parse_known_args(argv)[0]  # ignore options meant for other benchmarks


# --------------------------------------------------------------------------- tables
def _create(uri: str, kind: str, rows: int) -> TableName:
    """The bench table of ``kind`` (kept between runs of the same size with --keep)."""
    t = TableName("public", f"bench_chunking_{kind}_{rows}")
    qt = f"{quote_pg(t.schema)}.{quote_pg(t.name)}"
    conn = w.connect(uri)
    try:
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM pg_class WHERE oid = to_regclass(%s)", (qt,))
        if cur.fetchone()[0]:
            cur.execute(f"SELECT count(*) FROM {qt}")  # noqa: S608 - quoted
            if cur.fetchone()[0] == rows:
                return t
            cur.execute(f"DROP TABLE {qt}")
        half = rows // 2
        if kind == "uuid":
            cur.execute(f"CREATE TABLE {qt} (id uuid PRIMARY KEY, n bigint NOT NULL, v text NOT NULL)")
            cur.execute(f"INSERT INTO {qt} SELECT gen_random_uuid(), i, md5(i::text) || md5((-i)::text) "  # noqa: S608
                        "FROM generate_series(1, %s) i", (rows,))
        elif kind == "gap":  # 1..half, then after a gap of GAP x half, half more
            cur.execute(f"CREATE TABLE {qt} (id bigint PRIMARY KEY, n bigint NOT NULL, v text NOT NULL)")
            cur.execute(f"INSERT INTO {qt} SELECT CASE WHEN i <= %s THEN i ELSE i + %s END, i, "  # noqa: S608
                        "md5(i::text) || md5((-i)::text) FROM generate_series(1, %s) i", (half, GAP * half, rows))
        else:  # rows in the middle third are 100x wider
            cur.execute(f"CREATE TABLE {qt} (id bigint PRIMARY KEY, v text NOT NULL)")
            cur.execute(f"INSERT INTO {qt} SELECT i, left(repeat(md5(i::text), %s), CASE WHEN i > %s AND i <= %s "  # noqa: S608
                        "THEN %s ELSE %s END) FROM generate_series(1, %s) i",
                        (WIDE // 32 + 1, rows // 3, 2 * rows // 3, WIDE, NARROW, rows))
        cur.execute(f"ANALYZE {qt}")
        conn.commit()
    finally:
        conn.close()
    return t


def _drop(uri: str, t: TableName) -> None:
    conn = w.connect(uri)
    try:
        conn.cursor().execute(f"DROP TABLE IF EXISTS {quote_pg(t.schema)}.{quote_pg(t.name)}")
        conn.commit()
    finally:
        conn.close()


def _range_rows(uri: str, t: TableName, parts: int = 4) -> tuple[list[int], list[int]]:
    """Rows per range of an even split of min..max and of the ranges planned from sampled keys."""
    from airflow_provider_cdc.core.planning import SnapshotRequest
    from airflow_provider_cdc.pipeline.snapshot import plan_table_ranges

    qt = f"{quote_pg(t.schema)}.{quote_pg(t.name)}"
    with get_dialect(ConnectionParams.from_uri(uri), source="bench_chunking_plan", tables=[t]) as d:
        lo, hi = d._query(f"SELECT min(id), max(id) FROM {qt}")[0]  # noqa: S608 - quoted
        step = (hi - lo + 1) / parts
        even = [d._query(f"SELECT count(*) FROM {qt} WHERE id >= %s AND id < %s",  # noqa: S608
                         (lo + int(i * step), lo + int((i + 1) * step) if i < parts - 1 else hi + 1))[0][0]
                for i in range(parts)]
        ranges = plan_table_ranges(d, d.describe_table(t), SnapshotRequest((t,), throttle=Throttle(parallelism=parts)))
        planned = []
        for r in ranges:
            conds, args = [], []
            if r.start is not None:
                conds.append("id >= %s")
                args.append(r.start[0])
            if r.end is not None:
                conds.append("id < %s")
                args.append(r.end[0])
            where = f" WHERE {' AND '.join(conds)}" if conds else ""
            planned.append(d._query(f"SELECT count(*) FROM {qt}{where}", tuple(args))[0][0])  # noqa: S608
    return even, planned


# --------------------------------------------------------------------------- the chunk loop
class _Clock:
    """The controller's clock: read once before and once after each chunk (read_range)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def __call__(self) -> float:
        now = time.monotonic()
        self.marks.append(now)
        return now

    def durations(self) -> list[float]:
        return [b - a for a, b in zip(self.marks[::2], self.marks[1::2], strict=True)]


def _snapshot(uri: str, t: TableName, work_dir: str, chunk_size: int | None, sizing: ChunkSizing) -> list[dict]:
    """One whole-table snapshot through SnapshotController.read_range; per chunk its rows,
    seconds and staged bytes."""
    u = uuid.uuid4().hex[:8]
    name = f"bench_chunking_{u}"
    params = ConnectionParams.from_uri(uri)
    options = {"source": name, "tables": [t], "watermark_schema": "cdc", "watermark_table": f"wm_{u}",
               "slot_name": name, "publication_name": name}
    clock = _Clock()
    controller = SnapshotController(source=name, data_dir=os.path.join(work_dir, u),
                                    progress=SourceProgress(MemoryProgressStore(), name),
                                    connect=lambda: get_dialect(params, **options), sinks=(),
                                    chunk_sizing=sizing, clock=clock)
    conf = {"action": "start", "tables": [t.id], **({"chunk_size": chunk_size} if chunk_size else {})}
    try:
        (work,) = controller.apply(parse_snapshot_conf(conf))
        chunks = [ChunkResult.from_dict(c) for c in controller.read_range(work)]
        durations = clock.durations()  # an adaptive range's probe first (read_range times it too)
        probes = durations[: len(durations) - len(chunks)]
        out = [{"rows": c.rows, "seconds": s, "bytes": staged_bytes(c.path), "last": c.exhausted,
                "from": c.after_key[0] if c.after_key else None, "to": c.last_key[0] if c.last_key else None}
               for c, s in zip(chunks, durations[len(probes):], strict=True)]
        if out and probes:
            out[0]["probe"] = sum(probes)
        return out
    finally:
        with get_dialect(params, **options) as d:
            d.drop_slot()
            d.drop_publication()
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
            d.conn.commit()
        shutil.rmtree(os.path.join(work_dir, u), ignore_errors=True)


# --------------------------------------------------------------------------- report
def _spread(seconds: list[float]) -> str:
    if not seconds:
        return "no chunks"
    lo, hi = min(seconds), max(seconds)
    ratio = f"{hi / lo:.1f}x" if lo > 0 else "inf"
    q = statistics.quantiles(seconds, n=10) if len(seconds) > 1 else [lo] * 9
    deciles = f"{q[8] / q[0]:.1f}x" if q[0] > 0 else "inf"
    return (f"min {lo:.3f} / median {statistics.median(seconds):.3f} / max {hi:.3f} s, max/min {ratio}, "
            f"p90/p10 {deciles}")


def _warm_up(chunks: list[dict]) -> int:
    """Leading chunks that grow from the start size at the growth cap (each next one twice as big)."""
    n = 0
    while n + 1 < len(chunks) and chunks[n + 1]["rows"] == 2 * chunks[n]["rows"]:
        n += 1
    return n


def _within(chunks: list[dict], target: float) -> tuple[int, int]:
    body = [c for c in chunks if not c["last"]] or chunks[:1]
    return sum(target / 2 <= c["seconds"] <= 2 * target for c in body), len(body)


def _report(kind: str, rows: int, runs: dict[str, list[dict]], target: float,
            ranges: tuple[list[int], list[int]] | None) -> tuple[list[str], bool]:
    def body(cs: list[dict]) -> list[dict]:
        return [c for c in cs if not c["last"]] or cs

    lines = [f"table {kind} ({rows:,} rows)"]
    if ranges:
        lines.append(f"  ranges for parallelism 4, rows each: even split of min..max {ranges[0]}, "
                     f"planned from sampled keys {ranges[1]}")
    adaptive = runs["adaptive"]
    for label, cs in runs.items():
        sizes = [c["rows"] for c in body(cs)]
        bytes_ = [c["bytes"] for c in body(cs) if c["bytes"] is not None]
        ok, n = _within(cs, target)
        lines.append(f"  {label:<20} {len(cs):>4} chunks of {min(sizes):,}..{max(sizes):,} rows "
                     f"({size_text(min(bytes_))}..{size_text(max(bytes_))}); within 2x of the target {ok}/{n}; "
                     f"durations {_spread([c['seconds'] for c in body(cs)])}")
    if kind == "wide":  # rows per chunk inside the wide third and inside the narrow thirds
        lo, hi = rows // 3, 2 * rows // 3

        def region(cs: list[dict], wide: bool) -> str:
            inside = [c["rows"] for c in body(cs) if c["from"] is not None and c["to"] is not None
                      and (lo <= c["from"] and c["to"] <= hi) == wide and (c["to"] <= lo or c["from"] >= hi or wide)]
            return f"{statistics.median(inside):,.0f}" if inside else "-"

        lines.append("  median rows per chunk, narrow / wide region: " + ", ".join(
            f"{label} {region(cs, False)} / {region(cs, True)}" for label, cs in runs.items()))
    if adaptive and "probe" in adaptive[0]:
        lines.append(f"  adaptive: the probe (two reads) before the first chunk took {adaptive[0]['probe']:.3f} s")
    ok, n = _within(adaptive, target)
    warm = _warm_up(adaptive)
    ok_w, n_w = _within(adaptive[warm:], target)
    lines.append(f"  adaptive within 2x of {target:g} s, all but the last chunk: {ok}/{n} "
                 f"({'all' if ok == n else 'NOT all'}); without its {warm} warm-up chunk(s) growing from the "
                 f"start size: {ok_w}/{n_w} ({'all' if ok_w == n_w else 'NOT all'})")
    outside = [f"#{i + 1} {c['rows']:,} rows {c['seconds']:.3f} s" for i, c in enumerate(adaptive)
               if not c["last"] and not target / 2 <= c["seconds"] <= 2 * target]
    if outside:
        lines.append(f"  adaptive chunks outside 2x: {', '.join(outside[:16])}{' ...' if len(outside) > 16 else ''}")
    return lines, ok_w == n_w


def main(argv: list[str] | None = None) -> int:
    a = _parse(argv)
    logging.getLogger("airflow_provider_cdc").setLevel(logging.WARNING)
    sizing = ChunkSizing(target_seconds=a.target_seconds, target_bytes=int(a.target_mb * 2**20))
    kinds = [k.strip() for k in a.tables.split(",") if k.strip()]
    work_dir = tempfile.mkdtemp(prefix="bench_chunking_")
    out = [f"PostgreSQL {a.pg_uri.rsplit('@', 1)[-1]}; adaptive: target {a.target_seconds:g} s and "
           f"{a.target_mb:g} MB, rows {sizing.min_rows:,}..{sizing.max_rows:,}, start 10,000, at most 2x a step; "
           f"fixed: {a.fixed:,} rows. {os.cpu_count()} CPU(s) shared with other work: load average "
           f"{os.getloadavg()[0]:.2f} at the start", ""]
    all_ok = True
    try:
        for kind in kinds:
            rows = a.wide_rows if kind == "wide" else a.rows
            t0 = time.perf_counter()
            t = _create(a.pg_uri, kind, rows)
            made = time.perf_counter() - t0
            try:
                ranges = _range_rows(a.pg_uri, t) if kind == "gap" else None
                runs = {"adaptive": _snapshot(a.pg_uri, t, work_dir, None, sizing)}
                body = [c["rows"] for c in runs["adaptive"] if not c["last"]] or [a.fixed]
                matched = int(statistics.median(body))
                runs[f"fixed {matched:,} (median)"] = _snapshot(a.pg_uri, t, work_dir, matched, sizing)
                runs[f"fixed {a.fixed:,}"] = _snapshot(a.pg_uri, t, work_dir, a.fixed, sizing)
                lines, ok = _report(kind, rows, runs, a.target_seconds, ranges)
                all_ok &= ok
                lines.append(f"  (table made or found in {made:.1f} s; load average now {os.getloadavg()[0]:.2f})")
                print("\n".join(lines), flush=True)
                out += lines
            finally:
                if not a.keep:
                    _drop(a.pg_uri, t)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print("\nadaptive chunks within 2x of the target after warm-up, every table:", "yes" if all_ok else "NO")
    return 0
