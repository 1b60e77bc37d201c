"""Read a Delta table with an independent reader and print its rows as JSON lines.

Run by the interpreters of scripts/delta_readers_env.sh (never by the project's own: this file
must not import airflow_provider_cdc), for the consumer tests (tests/e2e/test_delta_readers.py):

    python tools/delta_read.py --reader {deltalake,polars,duckdb} --table PATH [--version N] [--columns a,b]

Readers (each must apply the table's deletion vectors itself):
  deltalake  ``DeltaTable(path, version=N).scan(columns=...)`` (delta-rs's DataFusion scan; its
             ``to_pyarrow_table`` / ``to_pandas`` refuse deletion vectors, and ``count()`` counts
             the masked rows too, so neither is used)
  polars     ``pl.read_delta(path, version=N, columns=...)`` (polars' own reader over the log
             deltalake reads)
  duckdb     DuckDB's delta extension (delta-kernel-rs), loaded from the duckdb-ext-delta wheel
             (``INSTALL delta`` would download): ``SELECT ... FROM delta_scan(?)``. The 1.4.4
             extension's ``delta_scan`` takes no version parameter; time travel goes through
             ``ATTACH path AS t (TYPE delta, VERSION N)`` instead (its options are not checked:
             a misspelt one is silently ignored, so keep ``VERSION``).

Values are made JSON-safe: ints, floats, strings, booleans and nulls as they are; decimals as
their text; timestamps as ISO 8601 (UTC when zoned); dates and times ISO; bytes as hex; anything
else ``str()``. Exits 1 with the reader's error on stderr when it refuses the table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import glob
import json
import os
import sys


def _safe(value):
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return (value.astimezone(dt.UTC) if value.tzinfo else value).isoformat()
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return str(value)


def read_deltalake(path: str, version: int | None, columns: list[str] | None):
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(path, version=version)
    return pa.table(table.scan(columns=columns))


def read_polars(path: str, version: int | None, columns: list[str] | None):
    import polars as pl

    return pl.read_delta(path, version=version, columns=columns).to_arrow()


def duckdb_delta_extension() -> str:
    """The delta extension the duckdb-ext-delta wheel installs for this duckdb."""
    import duckdb
    import duckdb_ext  # namespace package of the duckdb-ext-* wheels

    found = []
    for root in duckdb_ext.__path__:
        found += glob.glob(os.path.join(root, "extensions", f"v{duckdb.__version__}", "*", "delta.duckdb_extension"))
    if not found:
        raise RuntimeError(f"no delta.duckdb_extension for duckdb {duckdb.__version__} under {list(duckdb_ext.__path__)}")
    return sorted(found)[0]


def read_duckdb(path: str, version: int | None, columns: list[str] | None):
    import duckdb

    con = duckdb.connect()
    con.execute(f"LOAD '{duckdb_delta_extension()}'")
    cols = "*" if not columns else ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
    if version is None:
        return con.execute(f"SELECT {cols} FROM delta_scan(?)", [path]).fetch_arrow_table()  # noqa: S608
    literal = "'" + path.replace("'", "''") + "'"
    con.execute(f"ATTACH {literal} AS t (TYPE delta, VERSION {int(version)})")
    return con.execute(f"SELECT {cols} FROM t").fetch_arrow_table()  # noqa: S608


READERS = {"deltalake": read_deltalake, "polars": read_polars, "duckdb": read_duckdb}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reader", required=True, choices=sorted(READERS))
    ap.add_argument("--table", required=True, help="the Delta table's directory")
    ap.add_argument("--version", type=int, default=None, help="time travel to this Delta version")
    ap.add_argument("--columns", default=None, help="comma-separated columns to read (default: all)")
    args = ap.parse_args(argv)
    columns = [c for c in args.columns.split(",") if c] if args.columns else None
    try:
        table = READERS[args.reader](args.table, args.version, columns)
        rows = table.to_pylist()
    except Exception as exc:  # noqa: BLE001 - a refusal is the reader's answer: reported, exit 1
        print(f"{args.reader} could not read {args.table}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    out = sys.stdout
    for row in rows:
        out.write(json.dumps(row, default=_safe, ensure_ascii=False, allow_nan=True))
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
