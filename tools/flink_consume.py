"""Read a Debezium JSON export (``airflow cdc export-debezium --form value``) with Apache Flink,
as a consumer would (README "Consuming the Debezium JSON"), and print the table it rebuilds.

Runs in the PyFlink virtualenv (``scripts/flink_env.sh``), not in the project's: PyFlink pins
py4j, pandas and pyarrow to versions the project's Spark and Airflow do not take. Input: the
export's path and the table's columns (``--columns '[["id", "INT"], ...]'``, Flink SQL types
chosen from each column's Debezium schema node) and its primary key. Output: one JSON line per
row of the final table, in key order (bytes as base64, rows as objects).

The settings are the README's: the filesystem connector with ``format=debezium-json`` and
``debezium-json.schema-include=true``, streaming mode, the primary key declared and
``table.exec.source.cdc-events-duplicate=true``. The changelog Flink emits (+I, -U, +U, -D) is
applied to a dict keyed by the primary key: what any sink would materialise.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import decimal
import json
import sys


def plain(value):
    """A Flink value as JSON (Row -> object, bytes -> base64, decimals and times as text)."""
    from pyflink.common import Row

    if isinstance(value, Row):
        return {k: plain(v) for k, v in value.as_dict().items()}
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (decimal.Decimal, dt.date, dt.time, dt.datetime)):
        return str(value)
    return value


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--export", required=True, help="the export's path (one value document per line)")
    ap.add_argument("--columns", required=True, help='JSON: [["name", "FLINK SQL TYPE"], ...]')
    ap.add_argument("--key", required=True, help="JSON: the primary key's column names")
    args = ap.parse_args(argv)
    columns, key = json.loads(args.columns), json.loads(args.key)

    from pyflink.common import RowKind
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "1")
    conf.set("table.exec.source.cdc-events-duplicate", "true")
    cols = ", ".join(f"{quote(n)} {t}" for n, t in columns)
    pk = ", ".join(quote(k) for k in key)
    env.execute_sql(
        f"CREATE TABLE src ({cols}, PRIMARY KEY ({pk}) NOT ENFORCED) WITH ("
        f"'connector' = 'filesystem', 'path' = 'file://{args.export}', 'format' = 'debezium-json', "
        "'debezium-json.schema-include' = 'true')"
    )
    names = [n for n, _ in columns]
    # nested values come back as JSON text (JSON_STRING): PyFlink's collect() cannot unpickle an
    # array holding a NULL element
    nested = {n for n, t in columns if t.startswith(("ARRAY", "ROW"))}
    select = ", ".join(f"JSON_STRING({quote(n)})" if n in nested else quote(n) for n in names)
    state: dict = {}
    # the column names are quoted identifiers of the export's own schema, nothing is a value
    with env.execute_sql(f"SELECT {select} FROM src").collect() as rows:  # noqa: S608
        for row in rows:
            values = {n: json.loads(row[i]) if n in nested and row[i] is not None else plain(row[i])
                      for i, n in enumerate(names)}
            k = json.dumps([values[c] for c in key])
            if row.get_row_kind() in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                state[k] = values
            else:
                state.pop(k, None)
    for k in sorted(state):
        sys.stdout.write(json.dumps(state[k], sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
