"""Reading a mirror's live rows, as verify's mirror side does (``mirror_readers.mirror_batches``):
the deletion-vector scan (each file's unmasked rows) against the resolution the package did before
deletion vectors (the newest position per key, a bucket at a time), side by side in one run on the
same mirror: ``--rows`` rows in compacted buckets, then ``--rounds`` rounds of ``--changes`` random
changes (updates, inserts, deletes), so buckets hold change files and masked rows as a running
pipeline's do. Both reads must give the same rows.

    python -m bench mirror_read [--rows 5000000] [--rounds 3] [--changes 50000]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_cdc.core.arrow_types import KEY_COLUMN
from airflow_provider_cdc.sinks import delta_buckets as db
from airflow_provider_cdc.sinks import mirror_readers, mirror_table
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.storage.layout import mirror_dir

from .bench_apply_cost import SOURCE, T, _events, build


def _read(v: db.MirrorVersion) -> tuple[float, int, pa.Array]:
    """Seconds, rows and a digest of the keys of one pass over the live rows."""
    cols = [n for n in v.schema.names if n not in ("__deleted", "__position")]
    t0 = time.perf_counter()
    n, keys = 0, []
    for batch in mirror_readers.current_batches(v, columns=cols):
        n += batch.num_rows
        keys.append(pc.sum(pc.utf8_length(batch.column(cols.index(KEY_COLUMN)))).as_py() or 0)
    return time.perf_counter() - t0, n, sum(keys)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench mirror_read", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=5_000_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--changes", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    d = tempfile.mkdtemp(prefix="bench-mirror-read-")
    try:
        build(d, args.rows, mirror_table.DEFAULT_BUCKET_ROWS)
        sink = MirrorDeltaSink(d, SOURCE)
        for r in range(args.rounds):
            events, _ = _events(args.rows, args.changes, seed=r + 1)
            shift = 1_000_000 * (r + 1)  # each round newer than the last
            for e in events:
                e["position"] = e["position"][:8] + f"{int(e['position'][8:16], 16) + shift:08x}" + e["position"][16:]
            sink.write(pa.Table.from_pylist(events, schema=EVENT_SCHEMA))
        path = mirror_dir(d, SOURCE, T)
        v = db.read_version(mirror_table._delta(path), path)
        files = sum(len(f) for f in v.files.values())
        masked = sum(i.masked for i in v.info.values())
        print(f"mirror: {args.rows:,} rows, {args.rounds} rounds of {args.changes:,} changes; {files} files, "
              f"{masked:,} rows masked", flush=True)
        old = dataclasses.replace(v, masked=False)  # the resolution rule, as before deletion vectors
        best = {"deletion vectors": [], "resolution (before)": []}
        results = {}
        for _ in range(args.repeat):
            for name, version in (("deletion vectors", v), ("resolution (before)", old)):
                seconds, n, digest = _read(version)
                best[name].append(seconds)
                results[name] = (n, digest)
        for name, times in best.items():
            print(f"  {name:<20} {min(times):6.2f} s (best of {args.repeat}), {results[name][0]:,} live rows")
        ratio = min(best["deletion vectors"]) / min(best["resolution (before)"])
        same = results["deletion vectors"] == results["resolution (before)"]
        print(f"  deletion-vector scan / resolution: {ratio:.2f}x; same rows: {same}")
        return 0 if same else 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
