"""Storage that follows the changes: the bytes rounds of small changes write to the Delta mirror,
compaction included, against the bytes of the change files they append, under the package's
compaction rule and, as the baseline in the same run, under folding every changed bucket each
round (the rule before: a bucket under 100,000 rows was folded whenever it changed).

    python -m bench storage                    # 200,000 rows, 60 rounds of 2,000 changed rows
    python -m bench storage --rows 1000000 --rounds 30 --changed 5000

Prints, per rule: the live mirror's bytes, the change files' bytes, what compaction wrote, the
deletion-vector files written, the ratio written (all three) / changed, and the most files a
bucket held."""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time

import pyarrow as pa

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.sinks import deletion_vectors as dvs
from airflow_provider_cdc.sinks import delta_buckets as db
from airflow_provider_cdc.sinks import mirror_compaction, mirror_table
from airflow_provider_cdc.sinks.base import EVENT_SCHEMA
from airflow_provider_cdc.sinks.mirror_delta import MirrorDeltaSink
from airflow_provider_cdc.storage.layout import mirror_dir, schema_path

SOURCE = "bench"
T = TableName("public", "items")
SCHEMA = TableSchema(T, (Column("id", "int64"), Column("v", "string")), ("id",))


def _ev(pos: int, op: str, key: int, value: str) -> dict:
    return {"position": Position(pos).encode(), "table": T.id, "op": op, "key": encode_key([key]), "before": None,
            "after": encode_row({"id": key, "v": value}), "ts_ms": pos, "watermark": None, "snapshot": False,
            "batch": f"b{pos}"}


def _sizes(path: str) -> dict[str, int]:
    return dict(db.read_version(mirror_table._delta(path), path).sizes)


def _vectors(path: str) -> dict[str, int]:
    """The deletion-vector files in the table's folder (sinks/deletion_vectors.py) and their sizes."""
    return {i.base_name: i.size for i in storage.list_dir(path) if i.base_name.startswith(dvs.PREFIX)}


def run(rows: int, rounds: int, changed: int, *, fold_every_change: bool) -> dict:
    share = mirror_compaction.CHANGE_SHARE
    mirror_compaction.CHANGE_SHARE = 0.0 if fold_every_change else share
    d = tempfile.mkdtemp(prefix="bench-storage-")
    try:
        storage.write_text(schema_path(d, SOURCE, T), SCHEMA.to_json())
        path = mirror_dir(d, SOURCE, T)
        sink = MirrorDeltaSink(d, SOURCE)
        sink.write(pa.Table.from_pylist([_ev(1 + i, "c", i, f"value {i} " * 3) for i in range(rows)],
                                        schema=EVENT_SCHEMA))
        mirror_compaction.compact_buckets(path, budget_rows=None, everything=True)
        seen = _sizes(path)
        live = sum(seen.values())
        rng, pos, change_bytes, compaction_bytes = random.Random(7), 10 * rows, 0, 0
        vectors_seen, vector_bytes = _vectors(path), 0
        t0 = time.perf_counter()
        for r in range(rounds):
            events = []
            for k in rng.sample(range(rows), changed):
                pos += 1
                events.append(_ev(pos, "u", k, f"round {r} {k} " * 3))
            sink.write(pa.Table.from_pylist(events, schema=EVENT_SCHEMA))
            now = _sizes(path)
            change_bytes += sum(now[p] for p in set(now) - set(seen))
            mirror_compaction.compact_buckets(path, budget_rows=None)
            seen, now = now, _sizes(path)
            compaction_bytes += sum(now[p] for p in set(now) - set(seen))
            seen = now
            vectors = _vectors(path)  # the masks of superseded rows: written by the round and compaction
            vector_bytes += sum(size for name, size in vectors.items() if name not in vectors_seen)
            vectors_seen = vectors
            if (r + 1) % 10 == 0:
                print(f"  round {r + 1}/{rounds}", flush=True)
        v = db.read_version(mirror_table._delta(path), path)
        return {"live_mb": live / 1e6, "change_mb": change_bytes / 1e6, "compaction_mb": compaction_bytes / 1e6,
                "vector_mb": vector_bytes / 1e6,
                "ratio": (change_bytes + compaction_bytes + vector_bytes) / max(1, change_bytes),
                "max_files": max(len(f) for f in v.files.values()), "seconds": time.perf_counter() - t0}
    finally:
        mirror_compaction.CHANGE_SHARE = share
        shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench storage", description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--changed", type=int, default=2_000, help="rows each round updates")
    p.add_argument("--no-baseline", action="store_true", help="skip the fold-every-change baseline")
    args = p.parse_args(argv)
    rules = [("tiers (this package)", False)] + ([] if args.no_baseline else [("fold every change", True)])
    for name, fold in rules:
        print(f"{name}: {args.rows:,} rows, {args.rounds} rounds of {args.changed:,} changed rows", flush=True)
        got = run(args.rows, args.rounds, args.changed, fold_every_change=fold)
        print(f"{name}: live {got['live_mb']:.2f} MB; change files {got['change_mb']:.2f} MB; compaction "
              f"{got['compaction_mb']:.2f} MB; deletion vectors {got['vector_mb']:.2f} MB; written / changed {got['ratio']:.2f}x; at most {got['max_files']} "
              f"files a bucket; {got['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
