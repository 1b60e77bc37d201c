"""The Spark engine's work on the executors: staged files in, event-log and mirror files out.

The driver ships *units* (a chunk window, a staged segment); an executor turns each into its
events with the in-process engine's code and writes the sinks that are written there; the
driver commits. Why it is split this way: docs/DESIGN.md, "Scale" (the Spark engine).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from ... import storage
from ...core import errors
from ...sinks.base import BUCKETS, UNITS, Sink, TableEvents, join_table_events, past_truncate
from . import common

log = logging.getLogger(__name__)

#: a unit's events (a TableEvents per table, typed as staged), computed on an executor from the unit alone
Producer = Callable[[object], list[TableEvents]]

#: per unit and table: the events produced and the newest TRUNCATE among them
UNIT_META = pa.schema([("table", pa.string()), ("events", pa.int64()), ("truncate", pa.string())])
#: what the mirror job's map side ships per (table, bucket): typed mirror rows as Arrow IPC
#: blobs of at most _BLOB_ROWS rows; bucket _COUNT_ROW rows count a unit's events of a table
#: (all of them, and those past its TRUNCATE the mirror applies), _ERROR_ROW ones carry an error
_BLOBS = pa.schema(
    [
        ("table", pa.string()),
        ("bucket", pa.int32()),
        ("slice", pa.int32()),
        ("events", pa.int64()),
        ("applied", pa.int64()),
        ("payload", pa.binary()),
        ("error", pa.string()),
    ]
)
#: units whose rows one executor group takes per bucket (a slice): a group's memory follows a
#: slice of the round (chunks of 50,000 rows: under a million rows), not the round; each
#: slice of a bucket is its own change file (merge-on-read resolves across them)
UNITS_PER_SLICE = 16
_COUNT_ROW, _ERROR_ROW = -2, -1


_BLOB_ROWS = 100_000
#: one row per rewritten bucket (and per count or error group): all the driver gets back
_RESULT = pa.schema(
    [
        ("table", pa.string()),
        ("bucket", pa.int32()),
        ("events", pa.int64()),
        ("applied", pa.int64()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("rows", pa.int64()),
        ("removed", pa.string()),
        ("error", pa.string()),
        ("stats", pa.string()),
        ("file", pa.string()),  # the new file with its deletion vectors (delta_buckets.NewFile JSON)
    ]
)


# --- the units on the executors -----------------------------------------------------------------
def _units_df(spark, n: int):
    """``unit`` ids 0..n-1 in contiguous slices, two per core: no shuffle to spread them."""
    return spark.range(0, n, 1, max(1, min(n, spark.sparkContext.defaultParallelism * 2))).withColumnRenamed(
        "id", "unit"
    )


def _schema(arrow_schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def run(action: Callable[[], object]):
    """Run a Spark action; an error of ours raised on an executor (a replaced chunk file, a
    fenced writer, ...) is raised again on the driver as itself, message and class, instead
    of a Python worker traceback wrapped in a Py4J error."""
    try:
        return action()
    except Exception as exc:  # pyspark's PythonException / Py4JJavaError
        found = re.findall(r"airflow_provider_cdc\.core\.errors\.(\w+): (.*)", str(exc))
        if found:
            name, message = found[-1]
            cls = getattr(errors, name, None)
            if isinstance(cls, type) and issubclass(cls, errors.CdcError):
                raise cls(message) from exc
        raise


def unit_events(spark, units: Sequence, produce: Producer):
    """A DataFrame of every unit's events in the canonical-JSON form (EVENT_SCHEMA columns),
    produced on the executors: for a sink outside this package and for checks; the
    package's sinks take the typed events on the executors."""
    ddl = common.spark_event_schema()
    if not units:
        return spark.createDataFrame([], ddl)
    return _units_df(spark, len(units)).mapInArrow(_on_executors(units, produce, _batches), ddl)


def _batches(events: list[TableEvents]):
    from airflow_provider_cdc.sinks.base import to_json_events

    return to_json_events(events).to_batches()


def _on_executors(
    units: Sequence,
    produce: Producer,
    then: Callable,
    writers: Sequence[Sink] = (),
    *,
    with_unit: bool = False,
):
    """The mapInArrow function of every unit job: on an executor, each unit of the slice is
    produced (``produce``), written to each of ``writers`` (UNITS sinks), and turned into output
    batches by ``then(events)`` (``then(events, unit_index)`` ``with_unit``; a module-level
    function: pickled by reference)."""
    env = storage.executor_settings()  # where the storage is; never who may use it (no secret)
    writers = tuple(writers)

    def run_units(batches):
        from airflow_provider_cdc import storage as st

        st.use_executor_settings(env)
        for b in batches:
            for i in b.column("unit").to_pylist():
                events = produce(units[i])
                for w in writers:
                    w.write(events)
                yield from (then(events, i) if with_unit else then(events))

    return run_units


def unit_meta(events: Sequence[TableEvents]) -> pa.Table:
    """Per table of ``events``: how many, and the newest TRUNCATE (null: none)."""
    tables, counts, truncates = [], [], []
    for te in events:
        if not te.num_rows:
            continue
        ev = te.events
        tables.append(te.table)
        counts.append(te.num_rows)
        truncates.append(pc.max(ev.filter(pc.equal(ev["op"], "t"))["position"]).as_py())
    return pa.table(
        [pa.array(tables, pa.string()), pa.array(counts, pa.int64()), pa.array(truncates, pa.string())],
        schema=UNIT_META,
    )


def _meta_batches(events: Sequence[TableEvents]):
    return unit_meta(events).to_batches()


def log_units(spark, units: Sequence, produce: Producer, writers: Sequence[Sink] = ()) -> dict[str, list]:
    """One map stage: each unit's events produced and written to ``writers`` (UNITS sinks) by
    the executor. Returns table -> [events, newest TRUNCATE or None]."""
    if not units:
        return {}
    write = _on_executors(units, produce, _meta_batches, writers)
    out: dict[str, list] = {}
    for r in run(lambda: _units_df(spark, len(units)).mapInArrow(write, _schema(UNIT_META)).collect()):
        cur = out.setdefault(r["table"], [0, None])
        cur[0] += r["events"]
        if r["truncate"] is not None and (cur[1] is None or r["truncate"] > cur[1]):
            cur[1] = r["truncate"]
    return out


# --- the sinks --------------------------------------------------------------------------------
def write_sinks(
    spark, units: Sequence, produce: Producer, sinks: Sequence[Sink], *, tables: Sequence[str] | None = None
) -> dict[str, int]:
    """Write every unit's events to ``sinks``, each where its ``placement`` says (sinks/base.py
    Sink; the engine knows no concrete sink): BUCKETS sinks (the Delta mirror) by one job per
    sink that shuffles typed rows to their key buckets, UNITS sinks (the event log) on the
    executors as each unit is produced, UNITS sinks that ``needs_truncates`` (the PostgreSQL
    mirror) after their ``prepare`` on the driver, DRIVER sinks with the round's events
    gathered on the driver. ``tables``: the tables the events can be of, when the driver knows
    them and they hold no TRUNCATE (a merge round): the first BUCKETS job then writes the
    UNITS sinks too, in one pass. Otherwise those are written first and count each table's
    events and TRUNCATEs, which the others need before they write. Returns rows per sink
    and ``events_in``."""
    out: dict[str, int] = {}
    pending = [s for s in sinks if s.placement == UNITS and not s.needs_truncates]
    meta: dict[str, list] | None = None

    def first_pass() -> dict[str, list]:
        nonlocal meta, pending
        if meta is None:
            t0 = time.monotonic()
            meta = log_units(spark, units, produce, pending)
            out.setdefault("events_in", sum(n for n, _ in meta.values()))
            for s in pending:
                out[s.name] = out["events_in"]
                log.info(
                    "%s: %d events of %d table(s) from %d unit(s) written on the executors in %.1f s",
                    s.name,
                    out["events_in"],
                    len(meta),
                    len(units),
                    time.monotonic() - t0,
                )
            pending = []
        return meta

    def round_truncates() -> dict[str, str | None]:
        if tables is not None:
            return dict.fromkeys(tables)
        return {t: tr for t, (_n, tr) in first_pass().items()}

    for sink in sinks:
        if sink.placement != BUCKETS:
            continue
        counts = write_mirror(spark, units, produce, sink, round_truncates(), writers=pending)
        for s in pending:
            out[s.name] = counts["events"]
        pending = []
        out.setdefault("events_in", counts["events"])
        out[sink.name] = counts["applied"]
    if pending:
        first_pass()
    for sink in sinks:
        if sink.placement != UNITS or not sink.needs_truncates:
            continue
        truncates = round_truncates()
        sink.prepare(truncates)
        out[sink.name] = write_units(spark, units, produce, sink, truncates)
    for sink in sinks:
        if sink.placement in (UNITS, BUCKETS):
            continue
        log.warning("sink %s receives the events through the Spark driver, as canonical JSON", sink.name)
        table = common.to_event_table(run(lambda: unit_events(spark, units, produce).toArrow()))
        sink.write(table)
        out[sink.name] = table.num_rows
        out.setdefault("events_in", table.num_rows)
    out.setdefault("events_in", 0)
    return out


_UNIT_COUNT = pa.schema([("rows", pa.int64())])


def unit_writer(units: Sequence, produce: Producer, sink: Sink, truncates: dict[str, str | None]) -> Callable:
    """The executor side of :func:`write_units`: each unit's events, without those at or
    before their table's TRUNCATE (the sink's ``prepare`` on the driver applied it), written
    by ``sink``."""

    def write_unit(events: Sequence[TableEvents]):
        events = [past_truncate(te, truncates.get(te.table)) for te in events]
        try:
            sink.write(events)
        finally:
            sink.close()  # a connection per unit: none left open in a reused Python worker
        yield pa.RecordBatch.from_pylist([{"rows": sum(te.num_rows for te in events)}], schema=_UNIT_COUNT)

    return _on_executors(units, produce, write_unit)


postgres_unit_writer = unit_writer


def write_units(
    spark, units: Sequence, produce: Producer, sink: Sink, truncates: dict[str, str | None]
) -> int:
    """A UNITS sink that needs the round's TRUNCATEs (the PostgreSQL mirror, whose upsert keeps a
    row only when newer), written from the executors a unit at a time (module docstring),
    after its ``prepare`` on the driver. Returns the events written."""
    if not units:
        return 0
    write = unit_writer(units, produce, sink, truncates)
    rows = run(lambda: _units_df(spark, len(units)).mapInArrow(write, _schema(_UNIT_COUNT)).collect())
    n = sum(r["rows"] for r in rows)
    log.info("%s: %d events from %d unit(s) written on the executors", sink.name, n, len(units))
    return n


def write_mirror(
    spark,
    units: Sequence,
    produce: Producer,
    sink,
    truncates: dict[str, str | None],
    *,
    writers: Sequence[Sink] = (),
) -> dict[str, int]:
    """A BUCKETS sink (the Delta mirror) of the units' events (``truncates``: table -> its
    newest TRUNCATE among them, or None): the sink plans every table on the driver
    (MirrorDeltaSink.plan: the per-table policy both engines share), one job rewrites the
    buckets every table's events fall in on the executors (and writes ``writers``' files on
    the way); the driver commits each table (a table whose commit conflicts is read and
    rewritten again). Returns the ``events`` produced and the events ``applied`` to it."""
    plan = sink.plan(truncates)
    counts = {"events": 0, "applied": 0}
    deferred = sink.deferred()
    if deferred:  # (tables without a key: their few changes read on the driver, sinks/multiset.py)
        sink.write_deferred(join_table_events(te for u in units for te in produce(u) if te.table in deferred))
    pending = sorted(plan)
    for attempt in sink.commit_attempts(f"mirror commit of {', '.join(pending)}"):
        if not pending and (attempt or not writers):
            break
        t0 = time.monotonic()
        versions, jobs = {}, {}
        for table_id in pending:  # the version each commit is based on, the merge epoch checked
            versions[table_id], jobs[table_id] = sink.open_table(plan[table_id])
        results: dict[str, list] = {t: [] for t in pending}
        applied = dict.fromkeys(pending, 0)
        for r in _rewrite_buckets(spark, units, produce, jobs, writers if attempt == 0 else ()):
            if r["bucket"] != _COUNT_ROW:
                results[r["table"]].append(r)
                continue
            if attempt == 0:
                counts["events"] += r["events"]
            if r["table"] in applied:
                applied[r["table"]] += r["applied"]
        conflicted = []
        for table_id in pending:
            error, conflict = _commit_table(sink, plan[table_id].path, versions[table_id], results[table_id])
            if conflict:
                conflicted.append(table_id)
            elif error is not None:
                sink.stop_table(plan[table_id], error)
            else:
                counts["applied"] += applied[table_id]
        log.info(
            "mirror: %d table(s) rewritten on the executors in %.1f s (%d to retry)",
            len(pending) - len(conflicted),
            time.monotonic() - t0,
            len(conflicted),
        )
        pending = conflicted
        if not pending:
            break
    return counts


def _rewrite_buckets(
    spark, units: Sequence, produce: Producer, jobs: dict, writers: Sequence[Sink] = ()
) -> list:
    """One Spark job over the units. The map side produces each unit's events (writing them to
    ``writers``), turns those of ``jobs``' tables (past each one's TRUNCATE) into
    typed mirror rows and ships them per (table, bucket) as Arrow IPC blobs: the shuffle moves
    a few blobs per unit, not a JVM row per event. Each (table, bucket) is then rewritten on
    an executor. Returns the _RESULT rows, plus one count row (bucket _COUNT_ROW) per unit
    and table."""
    env = storage.executor_settings()
    keyed = _on_executors(units, produce, functools.partial(mirror_blobs, jobs=jobs), writers, with_unit=True)

    def write(key, blobs):  # a plain function: pyspark 4.2 cannot inspect a functools.partial here
        return _rewrite_bucket(jobs, env, key, blobs)

    df = _units_df(spark, len(units)).mapInArrow(keyed, _schema(_BLOBS))
    return run(lambda: df.groupBy("table", "bucket", "slice").applyInArrow(write, _schema(_RESULT)).collect())


def mirror_blobs(events: Sequence[TableEvents], unit: int, jobs: dict):
    """On an executor: one unit's events as _BLOBS batches: a count row per table, then the
    typed mirror rows of each job table per bucket (newest per key) in the unit's slice, or an
    error row when a value cannot be held by its mirror column."""
    from airflow_provider_cdc.core.errors import ConfigurationError as CE
    from airflow_provider_cdc.sinks.base import past_truncate

    def row(table_id, bucket, events=0, applied=0, payload=None, error=None):
        return pa.record_batch(
            [
                pa.array([table_id], pa.string()),
                pa.array([bucket], pa.int32()),
                pa.array([unit // UNITS_PER_SLICE], pa.int32()),
                pa.array([events], pa.int64()),
                pa.array([applied], pa.int64()),
                pa.array([payload], pa.binary()),
                pa.array([error], pa.string()),
            ],
            schema=_BLOBS,
        )

    for part in events:
        table_id = part.table
        produced = part.num_rows
        if not produced:
            continue
        job = jobs.get(table_id)
        if job is not None:  # older than the table's TRUNCATE: swept already
            part = past_truncate(part, job.truncate)
        yield row(table_id, _COUNT_ROW, events=produced, applied=part.num_rows if job is not None else 0)
        if job is None or part.num_rows == 0:
            continue
        try:
            rows = job.rows(part)
        except CE as exc:
            yield row(table_id, _ERROR_ROW, error=str(exc))
            continue
        buckets = job.bucket_of(rows)
        for bucket in pc.unique(buckets).to_pylist():
            sub = rows.filter(pc.equal(buckets, bucket))
            for start in range(0, sub.num_rows, _BLOB_ROWS):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, sub.schema) as w:
                    w.write_table(sub.slice(start, _BLOB_ROWS))
                yield row(table_id, bucket, payload=sink.getvalue().to_pybytes())


def _rewrite_bucket(jobs, env, key, blobs):
    """On an executor: the rows of one bucket of one table, appended as a change file (the
    in-process engine's upsert; memory follows the round's rows, not the bucket), or the sums
    of the count rows, or the first error."""
    from airflow_provider_cdc import storage as st

    st.use_executor_settings(env)
    table_id, bucket = key[0].as_py(), int(key[1].as_py())
    out = {
        "table": [table_id],
        "bucket": [bucket],
        "events": [pc.sum(blobs["events"]).as_py() or 0],
        "applied": [pc.sum(blobs["applied"]).as_py() or 0],
        "path": [None],
        "size": [None],
        "rows": [None],
        "removed": [None],
        "error": [None],
        "stats": [None],
        "file": [None],
    }
    if bucket == _ERROR_ROW:
        out["error"] = [blobs["error"][0].as_py()]
    if bucket < 0:
        return pa.table(out, schema=_RESULT)
    job = jobs[table_id]
    parts = [pa.ipc.open_stream(p.as_buffer()).read_all() for p in blobs["payload"]]  # no copy to bytes
    add = job.write(bucket, pa.concat_tables(parts))  # units of a slice may share keys: resolved
    out["removed"] = ["[]"]
    if add is not None:
        out.update(path=[add.path], size=[add.size], rows=[add.rows], stats=[add.stats], file=[add.to_json()])
    return pa.table(out, schema=_RESULT)


def _commit_table(sink, path: str, v, rows: list) -> tuple[str | None, bool]:
    """Commit one table's rewritten buckets: (the error text of a value the mirror cannot
    hold or None, whether another writer committed first)."""
    from airflow_provider_cdc.sinks.delta_buckets import NewFile

    written = [NewFile.from_json(r["file"]) for r in rows if r["path"]]
    errors_ = [r["error"] for r in rows if r["error"]]
    if errors_:
        sink.discard(v, written)
        return errors_[0], False
    if not written:
        return None, False
    if not sink.commit_table(v, written):
        return None, True
    log.info(
        "mirror %s: %d bucket(s) rewritten on the executors, committed at version %d",
        path,
        len(rows),
        v.version + 1,
    )
    return None, False
