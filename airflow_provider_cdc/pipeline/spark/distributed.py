"""The Spark engine's I/O on the executors: staged files in, event-log and mirror files out.

Nothing proportional to the data passes through the driver:

* :func:`read_files` reads staged Parquet (segments, chunks) on the executors through the
  storage layer (pyarrow.fs: local disk or object storage, no Hadoop S3 jars);
* :func:`write_event_log` writes each batch's event-log file on the executor that holds it
  (one group per (table, batch)), through the same EventLogSink the in-process engine uses;
* :func:`write_mirror` rewrites the mirror's key-hash buckets on the executors
  (sinks/delta_buckets.py: the same apply_rows the in-process engine runs) and returns only
  file metadata, which the driver commits in one Delta commit per table, fenced by the
  merge epoch and serialised with every other writer of the table.

Sinks other than the event log and the Delta mirror (the PostgreSQL mirror) still receive
the events through the driver, in groups.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from ... import storage
from ...core.errors import ConfigurationError
from ...sinks.base import EVENT_SCHEMA, Sink
from ...sinks.event_log import EventLogSink
from ...sinks.mirror_delta import MirrorDeltaSink
from ...storage.staged import CHANGELOG_SCHEMA
from . import common

log = logging.getLogger(__name__)

FILE_COLUMN = "_file"


# --- reading ------------------------------------------------------------------------------------
def read_files(spark, paths: Sequence[str], schema: pa.Schema, *, partitions: int | None = None):
    """A DataFrame of the Parquet files ``paths`` in ``schema`` (a staged file schema of
    storage/staged.py), plus ``_file`` (the path as given), read on the executors through the
    storage layer."""
    from pyspark.sql.pandas.types import from_arrow_schema

    paths = list(paths)
    out = from_arrow_schema(schema.append(pa.field(FILE_COLUMN, pa.string())))
    if not paths:
        return spark.createDataFrame([], out)
    names = schema.names
    env = storage.environment()  # the executors reach the storage the driver reaches

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from airflow_provider_cdc import storage as st

        st.use_environment(env)
        for batch in batches:
            for path in batch.column("path").to_pylist():
                fs, p = st.filesystem(path)
                with fs.open_input_file(p) as fh:
                    for rb in pq.ParquetFile(fh).iter_batches(batch_size=10_000, columns=names):
                        t = pa.Table.from_batches([rb]).select(names).cast(schema)
                        t = t.append_column(FILE_COLUMN, pa.array([path] * t.num_rows, pa.string()))
                        yield from t.to_batches()

    n = partitions or max(1, min(len(paths), spark.sparkContext.defaultParallelism * 2))
    files = spark.createDataFrame([(p,) for p in paths], "path string").repartition(n)
    return files.mapInArrow(read, out)


def read_changelog(spark, segments, *, after=None, upto=None):
    """Staged events with ``after < position <= upto`` without duplicates, plus ``segment``
    (the file name), read on the executors. Only segments that can hold such events are read;
    an event in overlapping segments counts in the first (common.segment_lower_bounds)."""
    from pyspark.sql import functions as F

    bounds = common.segment_lower_bounds(segments)  # over every segment: overlaps are judged globally
    chosen = [s for s in segments if (after is None or s[1] > after) and (upto is None or s[0] <= upto)]
    if not chosen:
        return spark.createDataFrame([], common.CHANGELOG_DDL + ", segment string")
    name = {p: p.rsplit("/", 1)[-1] for _, _, p in chosen}
    bounds_df = spark.createDataFrame([(p, name[p], bounds[name[p]]) for _, _, p in chosen],
                                      f"{FILE_COLUMN} string, segment string, lower string")
    df = read_files(spark, [p for _, _, p in chosen], CHANGELOG_SCHEMA)
    if after is not None:
        df = df.where(F.col("position") > after.encode())
    if upto is not None:
        df = df.where(F.col("position") <= upto.encode())
    return (df.join(F.broadcast(bounds_df), FILE_COLUMN).where(F.col("position") > F.col("lower"))
            .drop("lower", FILE_COLUMN))


# --- writing ------------------------------------------------------------------------------------
def write_sinks(spark, events_df, sinks: Sequence[Sink]) -> dict[str, int]:
    """Write the events of ``events_df`` (EVENT_SCHEMA columns) to every sink, the event log
    and the Delta mirror from the executors. Returns rows per sink and ``events_in``."""
    from pyspark import StorageLevel

    events_df = events_df.select(*EVENT_SCHEMA.names)
    events_df = events_df.persist(StorageLevel.MEMORY_AND_DISK)  # evaluated once for every sink
    try:
        out: dict[str, int] = {"events_in": events_df.count()}
        for sink in sinks:
            if isinstance(sink, EventLogSink):
                out[sink.name] = write_event_log(events_df, sink)
            elif isinstance(sink, MirrorDeltaSink):
                out[sink.name] = write_mirror(spark, events_df, sink)
            else:  # the PostgreSQL mirror: through the driver
                log.warning("sink %s receives the events through the Spark driver", sink.name)
                table = common.to_event_table(events_df.toArrow())
                sink.write(table)
                out[sink.name] = table.num_rows
        return out
    finally:
        events_df.unpersist()


def write_event_log(events_df, sink: EventLogSink) -> int:
    """Each (table, batch) group's file, written by the executor holding the group."""
    data_dir, source, database, fence = sink.data_dir, sink.source, sink.database, sink.fence
    env = storage.environment()

    def write(_key, events):  # no annotations: pyspark 4.2's hint inference fails on them here
        from airflow_provider_cdc import storage as st
        from airflow_provider_cdc.pipeline.spark.common import to_event_table
        from airflow_provider_cdc.sinks.event_log import EventLogSink as Sink_

        st.use_environment(env)
        Sink_(data_dir, source, database, fence=fence).write(to_event_table(events))
        return pa.table({"rows": pa.array([events.num_rows], pa.int64())})

    rows = events_df.groupBy("table", "batch").applyInArrow(write, "rows long").collect()
    return sum(r["rows"] for r in rows)


def write_mirror(spark, events_df, sink: MirrorDeltaSink) -> int:
    """The mirror tables of the events: per table, the buckets its events fall in are
    rewritten on the executors and committed by the driver (retried from the read on a
    commit conflict). Returns the number of events applied."""
    from pyspark.sql import functions as F

    from ...sinks import mirror_delta as md

    # one pass: the tables of the events, and each one's newest TRUNCATE (None: none)
    truncates = {r["table"]: r["t"] for r in events_df.groupBy("table").agg(
        F.max(F.when(F.col("op") == "t", F.col("position"))).alias("t")).collect()}
    applied = 0
    for table_id in sorted(truncates):
        schema = sink.schemas.require(table_id) if sink.require_schema else sink.schemas.get(table_id)
        if schema is None:
            log.warning("mirror: no staged schema for %s; its events go to the event log only", table_id)
            continue
        path = md.mirror_dir(sink.data_dir, sink.source, schema.table)
        stopped = md.schema_stopped(path)
        part = events_df.where(F.col("table") == table_id)
        if stopped:
            log.error("mirror of %s waits for a re-snapshot (%s): its events are not applied to it", table_id, stopped)
            sink.schema_stopped[table_id] = stopped
            continue
        epoch = None if sink.fence is None else sink.fence.epoch(table_id)
        newest_t = truncates[table_id]
        if newest_t is not None:  # a TRUNCATE: older rows go first (the horizon keeps them out)
            md.sweep(path, newest_t, md.mirror_schema(schema), reason=f"TRUNCATE of {table_id}")
            part = part.where(F.col("position") > newest_t)
        error, events = _rewrite_table(spark, part, path, schema, epoch)
        if error is not None:
            if sink.fence is not None or not md.stop_for_schema(path, f"{error}; correct the value at the source"):
                raise ConfigurationError(error)
            sink.schema_stopped[table_id] = error
            continue
        applied += events
    return applied


def _rewrite_table(spark, events_df, path: str, schema, epoch: int | None) -> tuple[str | None, int]:
    """One table's events into its mirror: (the error text when a value cannot be held, the
    number of events applied)."""
    from deltalake.exceptions import CommitFailedError
    from pyspark.sql.pandas.types import from_arrow_schema

    from ...sinks import delta_buckets as db
    from ...sinks import mirror_delta as md
    from ...sinks.arrow_types import mirror_schema

    mschema = mirror_schema(schema)
    schema_json = schema.to_json()
    for attempt in range(md._COMMIT_RETRIES):
        dt = md._open(path) or md._create(path, mschema)[0]
        v = db.read_version(md.add_columns(dt, mschema), path)
        md._check_epoch(path, v.props, epoch)
        job = (v.location, {b: list(f) for b, f in v.files.items()}, v.schema, v.buckets, v.bucketed,
               v.props.get(md.HORIZON_PROPERTY), schema_json, storage.environment())

        ddl = common.spark_event_schema() + ", __b int"
        rows = (events_df.mapInArrow(functools.partial(_with_bucket, v.buckets), ddl)
                .groupBy("__b").applyInArrow(_bucket_writer(job), from_arrow_schema(_RESULT))
                .collect())
        errors = [r["error"] for r in rows if r["error"]]
        adds = [_add_action(r, v.bucketed) for r in rows if r["path"]]
        if errors:
            db.discard(v.location, adds)
            return errors[0], 0
        removed = [p for r in rows for p in json.loads(r["removed"] or "[]")]
        try:
            db.commit(v, adds, removed, operation="upsert")
            log.info("mirror %s: %d bucket(s) rewritten on the executors, committed at version %d", path,
                     len(rows), v.version + 1)
            return None, sum(r["events"] for r in rows)
        except CommitFailedError:
            db.discard(v.location, adds)
            if attempt == md._COMMIT_RETRIES - 1:
                raise
            md._backoff(attempt)
    raise AssertionError("unreachable")


def _add_action(row, bucketed: bool):
    from deltalake.transaction import AddAction

    from ...sinks.delta_buckets import BUCKET_COLUMN

    return AddAction(row["path"], int(row["size"]), {BUCKET_COLUMN: str(row["bucket"])} if bucketed else {},
                     int(time.time() * 1000), True, json.dumps({"numRecords": int(row["rows"])}))


def _with_bucket(buckets, batches):
    from airflow_provider_cdc.sinks.delta_buckets import bucket_of

    for b in batches:
        yield b.append_column("__b", bucket_of(b.column("key"), buckets))


def _bucket_writer(job):
    """A plain function for applyInArrow (pyspark 4.2 cannot inspect a functools.partial)."""

    def write(key, events):
        return _rewrite_bucket(job, key, events)

    return write


def _rewrite_bucket(job, key, events):
    """On an executor: one bucket of one table, rewritten (the in-process engine's code)."""
    from airflow_provider_cdc import storage as st
    from airflow_provider_cdc.core.errors import ConfigurationError as CE
    from airflow_provider_cdc.core.schema import TableSchema
    from airflow_provider_cdc.pipeline.spark.common import to_event_table
    from airflow_provider_cdc.sinks import delta_buckets as db
    from airflow_provider_cdc.sinks.mirror_delta import conform, events_to_mirror_rows, newest_per_key

    location, files, schema, buckets, bucketed, horizon, schema_json, env = job
    st.use_environment(env)
    bucket = int(key[0].as_py())
    out = {"bucket": [bucket], "events": [events.num_rows], "path": [None], "size": [None], "rows": [None],
           "removed": [None], "error": [None]}
    try:
        rows = events_to_mirror_rows(TableSchema.from_json(schema_json), newest_per_key(to_event_table(events)))
    except CE as exc:
        out["error"] = [str(exc)]
        return pa.table(out, schema=_RESULT)
    paths = files.get(bucket, [])
    current = db.read_bucket(location, paths, schema)
    new = db.apply_rows(current, conform(rows, schema), horizon)
    if new is not None:
        out["removed"] = [json.dumps(list(paths))]
        if new.num_rows:
            add = db.write_bucket_file(location, bucket, new, bucketed=bucketed)
            out.update(path=[add.path], size=[add.size], rows=[new.num_rows])
    return pa.table(out, schema=_RESULT)


#: one row per rewritten bucket, the only thing that comes back to the driver
_RESULT = pa.schema([("bucket", pa.int32()), ("events", pa.int64()), ("path", pa.string()), ("size", pa.int64()),
                     ("rows", pa.int64()), ("removed", pa.string()), ("error", pa.string())])

