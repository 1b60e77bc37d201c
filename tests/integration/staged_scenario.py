"""Staged inputs for the merge and apply engines: a changelog of two tables, parallel chunks
whose windows overlap, changes inside and after the windows, orphan watermarks of a failed
attempt, a re-delivered (overlapping) segment and a high watermark id seen twice; and the
expected outputs from core.window (merge_window + mirror_apply), the reference.

Shared by the engine-conformance suite and the Spark job tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_cdc import storage
from airflow_provider_cdc.core.arrow_types import mirror_schema, rows_to_table
from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.pipeline import arrow_engine
from airflow_provider_cdc.pipeline.spark import merge_job
from airflow_provider_cdc.pipeline.spark.common import spark_submit_command
from airflow_provider_cdc.sinks.mirror_readers import read_mirror
from airflow_provider_cdc.storage.layout import changelog_dir, chunk_path, events_dir, schema_path
from airflow_provider_cdc.storage.staged import ChunkWriter, read_log_events, write_segment

SOURCE = "src"
WM_TABLE = "cdc.watermark"
ITEMS = TableName("public", "items")
OTHER = TableName("shop", "other")
ITEMS_SCHEMA = TableSchema(
    ITEMS,
    (
        Column("id", "int64"),
        Column("name", "string"),
        Column("amount", "decimal(12,2)"),
        Column("at", "timestamptz"),
        Column("blob", "binary"),
        Column("doc", "json"),
    ),
    ("id",),
)
OTHER_SCHEMA = TableSchema(OTHER, (Column("code", "string"), Column("n", "int32")), ("code",))
#: the schemas staging types each table's images with (capture: the log schema; chunks: the staged one)
SCHEMAS = {ITEMS.id: ITEMS_SCHEMA, OTHER.id: OTHER_SCHEMA}
# shuffle partitions 3: not what the jobs would choose on local[2] (2 per core = 4), so a test
# can tell that an explicit setting is kept
SPARK_CONF = {"spark.sql.shuffle.partitions": "3", "spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC"}


# --- building staged inputs ------------------------------------------------------------------
def item(i: int, version: int) -> dict:
    return {
        "id": i,
        "name": f"item {i} v{version} ü",
        "amount": f"{i * 10 + version}.{version:02d}",
        "at": f"2024-0{1 + version % 9}-01T12:00:00.{version:06d}Z",
        "blob": "AAEC/w==",
        "doc": json.dumps({"v": version, "n": [i]}),
    }


class Stage:
    """A staging folder: schemas, changelog segments and chunk files, plus the truth."""

    def __init__(self, root: Path | str) -> None:
        self.data_dir = str(root)  # a local folder or a URI (s3://...)
        self.log: list = []
        self.pos = 100
        self.chunks: list[ChunkResult] = []
        self.chunk_rows: dict[str, list[tuple[str, dict]]] = {}
        for s in (ITEMS_SCHEMA, OTHER_SCHEMA):
            storage.write_text(schema_path(self.data_dir, SOURCE, s.table), s.to_json())

    def _next(self) -> Position:
        self.pos += 7
        return Position(self.pos, 0, self.pos % 3)

    def change(self, table: TableName, op: str, key: list, after: dict | None) -> None:
        pos = self._next()
        # where the source logged it (core/events.py ORIGIN_FIELDS), some fields unknown: carried as staged
        origin = (f"tx{self.pos // 20}", self.pos * 10, None if self.pos % 2 else self.pos - 1, 1,
                  7 if self.pos % 2 else None, "bin.000001")
        self.log.append(ChangeEvent(table.id, op, encode_key(key), pos, None, after, ts_ms=self.pos, origin=origin))

    def watermark(self, wid: str, position: Position | None = None) -> None:
        self.log.append(WatermarkEvent(wid, position or self._next(), ts_ms=self.pos))

    def chunk(self, table: TableName, seq: int, lw: str, hw: str, rows: list[dict], pk: str) -> ChunkResult:
        path = chunk_path(self.data_dir, SOURCE, table, "snap1", seq, hw)
        pairs = [(encode_key([r[pk]]), r) for r in rows]
        with ChunkWriter(SCHEMAS[table.id], path) as writer:  # typed, as a chunk task stages it
            writer.add(pa.array([k for k, _ in pairs], pa.string()), pa.array([encode_row(r) for _, r in pairs], pa.string()))
        res = ChunkResult(SOURCE, table.id, "snap1", seq, lw, hw, path, ChunkRange(), None,
                          (rows[-1][pk],) if rows else None, len(rows), True)
        self.chunks.append(res)
        self.chunk_rows[path] = pairs
        return res

    def stage_log(self, cuts: list[int], overlap: int = 0) -> None:
        """Write the log as segments cut at ``cuts``; the last segment re-delivers ``overlap`` events."""
        bounds = [0, *cuts, len(self.log)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            if b > a:
                write_segment(self.log[max(0, a - (overlap if b == len(self.log) else 0)) : b],
                              changelog_dir(self.data_dir, SOURCE), WM_TABLE, SCHEMAS)

    def round_file(self, chunks: list[ChunkResult] | None = None) -> str:
        p = storage.join(self.data_dir, f"round-{uuid.uuid4().hex[:6]}.json")
        # nested the way a mapped chunk task returns lists of results
        storage.write_text(p, json.dumps([[c.to_dict() for c in (chunks or self.chunks)]]))
        return p

    # the reference: core.window over the staged files
    def expected_merge(self, chunks: list[ChunkResult] | None = None) -> list[ChangeEvent]:
        staged = list(read_log_events(changelog_dir(self.data_dir, SOURCE)))
        wc = [WindowChunk.from_result(c, self.chunk_rows[c.path]) for c in (chunks or self.chunks)]
        return merge_window(wc, staged)

    def expected_mirror(self) -> dict:
        staged = [e for e in read_log_events(changelog_dir(self.data_dir, SOURCE)) if isinstance(e, ChangeEvent)]
        state: dict = {}
        mirror_apply(state, staged)
        mirror_apply(state, self.expected_merge())
        return state


def build_scenario(root: Path | str) -> Stage:
    """Two parallel chunks of items with overlapping windows, one chunk of another table."""
    st = Stage(root)
    state = {i: item(i, 0) for i in range(1, 41)}
    for i in (5, 6):  # before any window: the chunks read the new values
        state[i] = item(i, 1)
        st.change(ITEMS, "u", [i], state[i])
    st.watermark("orphan-lw")  # a failed attempt's watermarks: named by no chunk, ignored
    st.change(ITEMS, "u", [7], item(7, 1))
    state[7] = item(7, 1)
    st.watermark("orphan-hw")
    st.watermark("lwA")
    st.watermark("lwB")
    st.watermark("lwO")
    seen_a = {i: dict(state[i]) for i in range(1, 21)}  # chunk A's SELECT ran here
    for i, op in ((3, "u"), (15, "u"), (25, "d"), (41, "c")):
        if op == "d":
            state.pop(i)
            st.change(ITEMS, "d", [i], None)
        else:
            state[i] = item(i, 2)
            st.change(ITEMS, op, [i], state[i])
    st.change(ITEMS, "u", [1], {**state[1], "name": "same key text, other table"})  # key [1] of items...
    state[1] = {**state[1], "name": "same key text, other table"}
    other = {f"k{j}": {"code": f"k{j}", "n": j} for j in range(1, 6)}
    st.change(OTHER, "u", ["k2"], {"code": "k2", "n": 200})  # inside O's window: k2 dropped from O
    other["k2"] = {"code": "k2", "n": 200}
    st.watermark("hwO")
    st.watermark("hwA")
    seen_b = {i: dict(state[i]) for i in range(21, 41) if i in state}
    seen_b[25] = item(25, 0)  # B read the row before its delete (inside B's window): dropped
    st.change(ITEMS, "u", [30], item(30, 3))  # only inside B's window
    state[30] = item(30, 3)
    st.change(ITEMS, "u", [3], item(3, 4))  # after hwA: newer than the chunk anyway
    state[3] = item(3, 4)
    st.watermark("hwB")
    st.change(ITEMS, "d", [10], None)  # after hwA: the chunk row of 10 must not resurrect it
    state.pop(10)
    st.change(ITEMS, "u", [22], item(22, 5))
    state[22] = item(22, 5)
    st.watermark("hwA")  # the same id again later: the first position counts
    st.change(ITEMS, "u", [12], item(12, 6))  # between the two hwA: must not drop 12 from A
    state[12] = item(12, 6)
    st.chunk(ITEMS, 1, "lwA", "hwA", [seen_a[i] for i in sorted(seen_a)], "id")
    st.chunk(ITEMS, 2, "lwB", "hwB", [seen_b[i] for i in sorted(seen_b)], "id")
    st.chunk(OTHER, 1, "lwO", "hwO", [{"code": f"k{j}", "n": j} for j in range(1, 6)], "code")
    st.stage_log(cuts=[6, 14], overlap=3)
    st.truth = {ITEMS.id: state, OTHER.id: other}  # type: ignore[attr-defined]
    return st


# --- comparing outputs ---------------------------------------------------------------------
def canonical_rows(schema: TableSchema, rows: list[dict]) -> list[dict]:
    """Canonical rows -> the typed rows the mirror returns (through the sink's own decoding)."""
    if not rows:
        return []
    arrays = rows_to_table(schema, rows)
    names = list(schema.column_names)
    return pa.Table.from_arrays(arrays, schema=pa.schema([mirror_schema(schema).field(n) for n in names])).to_pylist()


def mirror_list(data_dir: str, schema: TableSchema) -> list[dict]:
    t = read_mirror(data_dir, SOURCE, schema.table)
    return sorted(t.to_pylist(), key=lambda r: tuple(r[k] for k in schema.primary_key))


def expected_mirror_list(st: Stage, schema: TableSchema) -> list[dict]:
    rows = list(mirror_rows(st.expected_mirror(), schema.table.id).values())
    return sorted(canonical_rows(schema, rows), key=lambda r: tuple(r[k] for k in schema.primary_key))


def event_files(data_dir: str) -> dict[str, list[dict]]:
    """The event log's files through its tables' Delta logs, on any storage: ``table=.../batch``
    -> rows (a batch written again is a new file of the same rows, so it compares equal)."""

    from airflow_provider_cdc import storage
    from airflow_provider_cdc.sinks.event_log import event_files as files_of
    from airflow_provider_cdc.sinks.event_log_table import batch_of

    root = events_dir(data_dir, SOURCE)
    out = {}
    for name in storage.list_names(root, files_only=False):
        if name.startswith("table="):
            folder = storage.join(root, name)
            for f in files_of(folder):
                fs, path = storage.filesystem(storage.join(folder, f))
                out[f"{name}/{batch_of(f)}"] = pq.read_table(path, filesystem=fs).to_pylist()
    return out


def as_tuples(events) -> set:
    return {(e.table, e.key, e.position.encode(), json.dumps(e.after, sort_keys=True), e.watermark, e.ts_ms) for e in events}


def spark_tuples(df) -> set:
    rows = df.to_pylist() if isinstance(df, pa.Table) else [r.asDict() for r in df.collect()]
    return {
        (r["table"], r["key"], r["position"], json.dumps(json.loads(r["after"]), sort_keys=True), r["watermark"], r["ts_ms"])
        for r in rows
    }


def merged(engine: str, spark, chunks, changelog: str):
    """The round's r events from either engine: a Spark DataFrame or an Arrow table."""
    if engine == "spark":
        return merge_job.merge_chunks(spark, chunks, changelog)
    return arrow_engine.merge_chunks(chunks, changelog)


def run_local(job: str, st: Stage, round_file: str | None = None, sinks: str = "events,mirror", **kwargs) -> dict:
    """The in-process engine, the way the operators run it (operators/spark_jobs.py)."""
    from airflow_provider_cdc.pipeline.spark.common import build_sinks

    built = build_sinks(sinks, data_dir=st.data_dir, source=SOURCE, database=None, require_schema=job == "merge")
    try:
        if job == "merge":
            return arrow_engine.merge_round(merge_job.load_chunks(round_file), data_dir=st.data_dir, source=SOURCE,
                                          sinks=built)
        return arrow_engine.apply_changelog(st.data_dir, SOURCE, built, **kwargs)
    finally:
        for b in built:
            b.close()


def submit(job: str, args: list[str], *, master: str = "local[2]", conf: dict | None = None) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    cmd = spark_submit_command(job, args, master=master, conf=SPARK_CONF if conf is None else conf)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    tag = "CDC_MERGE_RESULT " if job == "merge" else "CDC_APPLY_RESULT "
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(tag)]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"spark-submit {job} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(tag):])


def common_args(st: Stage) -> list[str]:
    return ["--data-dir", st.data_dir, "--source", SOURCE, "--sinks", "events,mirror"]


