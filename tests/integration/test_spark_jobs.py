"""The Spark merge and apply jobs on staged inputs: through spark-submit (local[2]) and as
pure functions in one local session.

The constructed scenario stages a changelog with two tables, parallel chunks whose
windows overlap, changes inside and after the windows, orphan watermarks of a failed
attempt, a re-delivered (overlapping) segment and a high watermark id seen twice. The
expected output comes from core.window (merge_window + mirror_apply), the reference the
Spark job must agree with. A second test runs the same on a real MariaDB capture.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_cdc import local_jobs
from airflow_provider_cdc.core.chunk import ChunkResult
from airflow_provider_cdc.core.errors import NotReadyError, WatermarkError
from airflow_provider_cdc.core.events import ChangeEvent, WatermarkEvent
from airflow_provider_cdc.core.position import Position
from airflow_provider_cdc.core.ranges import ChunkRange
from airflow_provider_cdc.core.schema import Column, TableName, TableSchema, encode_key, encode_row
from airflow_provider_cdc.core.staging import changelog_dir, chunk_path, events_dir, schema_path
from airflow_provider_cdc.core.window import WindowChunk, merge_window, mirror_apply, mirror_rows
from airflow_provider_cdc.sinks.arrow_types import mirror_schema, rows_to_table
from airflow_provider_cdc.sinks.mirror_delta import read_mirror, read_mirror_raw
from airflow_provider_cdc.spark import apply_job, merge_job
from airflow_provider_cdc.spark.common import application_path, spark_submit_command
from airflow_provider_cdc.staging_io import CHUNK_SCHEMA, atomic_write_table, read_log_events, write_segment

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

    def __init__(self, root: Path) -> None:
        self.data_dir = str(root)
        self.log: list = []
        self.pos = 100
        self.chunks: list[ChunkResult] = []
        self.chunk_rows: dict[str, list[tuple[str, dict]]] = {}
        for s in (ITEMS_SCHEMA, OTHER_SCHEMA):
            p = Path(schema_path(self.data_dir, SOURCE, s.table))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(s.to_json())

    def _next(self) -> Position:
        self.pos += 7
        return Position(self.pos, 0, self.pos % 3)

    def change(self, table: TableName, op: str, key: list, after: dict | None) -> None:
        self.log.append(ChangeEvent(table.id, op, encode_key(key), self._next(), None, after, ts_ms=self.pos))

    def watermark(self, wid: str, position: Position | None = None) -> None:
        self.log.append(WatermarkEvent(wid, position or self._next(), ts_ms=self.pos))

    def chunk(self, table: TableName, seq: int, lw: str, hw: str, rows: list[dict], pk: str) -> ChunkResult:
        path = chunk_path(self.data_dir, SOURCE, table, "snap1", seq, hw)
        pairs = [(encode_key([r[pk]]), r) for r in rows]
        atomic_write_table(
            pa.table({"key": [k for k, _ in pairs], "after": [encode_row(r) for _, r in pairs]}, schema=CHUNK_SCHEMA), path
        )
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
                              changelog_dir(self.data_dir, SOURCE), WM_TABLE)

    def round_file(self, chunks: list[ChunkResult] | None = None) -> str:
        p = Path(self.data_dir) / f"round-{uuid.uuid4().hex[:6]}.json"
        # nested the way a mapped chunk task returns lists of results
        p.write_text(json.dumps([[c.to_dict() for c in (chunks or self.chunks)]]))
        return str(p)

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


def build_scenario(root: Path) -> Stage:
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
    base = Path(events_dir(data_dir, SOURCE))
    return {str(p.relative_to(base)): pq.read_table(p).to_pylist() for p in sorted(base.rglob("*.parquet"))}


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
    return local_jobs.merge_chunks(chunks, changelog)


def run_local(job: str, st: Stage, round_file: str | None = None, sinks: str = "events,mirror", **kwargs) -> dict:
    """The in-process engine, the way the operators run it (operators/spark_jobs.py)."""
    from airflow_provider_cdc.spark.common import build_sinks

    built = build_sinks(sinks, data_dir=st.data_dir, source=SOURCE, database=None, pg_uri=None, pg_schema=None,
                        require_schema=job == "merge")
    try:
        if job == "merge":
            return local_jobs.merge_round(merge_job.load_chunks(round_file), data_dir=st.data_dir, source=SOURCE,
                                          sinks=built)
        return local_jobs.apply_changelog(st.data_dir, SOURCE, built, **kwargs)
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


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master("local[2]").appName("test_spark_jobs")
    for k, v in SPARK_CONF.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    yield session
    session.stop()


# --- tests ----------------------------------------------------------------------------------
def test_application_paths_point_at_the_job_files():
    assert application_path("merge").endswith("airflow_provider_cdc/spark/merge_job.py")
    assert Path(application_path("apply")).is_file()
    cmd = spark_submit_command("merge", ["--x"], master="spark://h:7077", conf={"a": "b"})
    assert cmd[:5] == ["spark-submit", "--master", "spark://h:7077", "--conf", "a=b"]
    assert cmd[-2:] == [application_path("merge"), "--x"]


@pytest.mark.parametrize("engine", ["spark", "local"])
def test_merge_chunks_agrees_with_core_merge_window(spark, tmp_path, engine):
    st = build_scenario(tmp_path / "fixed dir %20+ü")  # chunk paths Spark spells URL-encoded
    got = merged(engine, spark, st.chunks, changelog_dir(st.data_dir, SOURCE))
    want = st.expected_merge()
    assert spark_tuples(got) == as_tuples(want)
    keys = {(e.table, e.key) for e in want}
    # the window rules this scenario exercises, spelled out
    assert (ITEMS.id, "[3]") not in keys and (ITEMS.id, "[15]") not in keys  # changed in A's window
    assert (ITEMS.id, "[25]") not in keys and (ITEMS.id, "[30]") not in keys  # in B's window
    assert (ITEMS.id, "[12]") in keys  # changed only after the first hwA
    assert (ITEMS.id, "[1]") not in keys and (OTHER.id, '["k2"]') not in keys
    assert (OTHER.id, '["k1"]') in keys and (ITEMS.id, "[10]") in keys  # 10: deleted after hwA


@pytest.mark.parametrize("engine", ["spark", "local"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_merge_chunks_agrees_with_core_on_random_rounds(spark, tmp_path, seed, engine):
    """Random interleavings of many chunks' watermarks and changes (keys reused across
    windows, duplicate watermark ids, orphans, TRUNCATEs): Spark and core give the same events."""
    rnd = random.Random(seed)
    st = Stage(tmp_path / f"r{seed}")
    n_chunks = rnd.randint(3, 7)
    opened: list[int] = []
    pending = list(range(n_chunks))
    closed: set[int] = set()
    while pending or opened:
        r = rnd.random()
        if pending and r < 0.25:
            c = pending.pop(0)
            st.watermark(f"lw{c}")
            opened.append(c)
        elif opened and r < 0.4:
            c = opened.pop(rnd.randrange(len(opened)))
            st.watermark(f"hw{c}")
            closed.add(c)
            if rnd.random() < 0.2:
                st.watermark(f"hw{c}")  # re-delivered id
        elif r < 0.45:
            st.watermark(f"orphan{rnd.randint(0, 99)}")
        elif r < 0.47:  # a TRUNCATE: drops every chunk whose window holds it
            st.log.append(ChangeEvent(ITEMS.id, "t", None, st._next(), None, None, ts_ms=st.pos))
        else:
            k = rnd.randint(1, 10 * n_chunks + 5)
            op = rnd.choice("cud")
            st.change(ITEMS, op, [k], None if op == "d" else item(k, rnd.randint(0, 9)))
    for c in range(n_chunks):
        rows = [item(k, rnd.randint(0, 9)) for k in range(10 * c + 1, 10 * c + 11) if rnd.random() < 0.8]
        st.chunk(ITEMS, c, f"lw{c}", f"hw{c}", rows, "id")
    st.stage_log(cuts=sorted(rnd.sample(range(1, max(2, len(st.log))), k=min(3, len(st.log) - 1))), overlap=2)
    got = merged(engine, spark, st.chunks, changelog_dir(st.data_dir, SOURCE))
    assert spark_tuples(got) == as_tuples(st.expected_merge())


def test_unstaged_high_watermark_fails_naming_the_chunk_and_emits_nothing(spark, tmp_path):
    st = build_scenario(tmp_path / "s")
    late = st.chunk(ITEMS, 9, "lwA", "hw-not-yet", [item(99, 0)], "id")
    with pytest.raises(NotReadyError, match=r"chunk 9 of table public\.items.*hw-not-yet.*sensor should have waited"):
        merge_job.main(["--chunks", st.round_file(), *common_args(st)])
    assert not Path(events_dir(st.data_dir, SOURCE)).exists()  # never emit early, for any chunk
    with pytest.raises(NotReadyError):
        merge_job.locate_windows(spark, [late], changelog_dir(st.data_dir, SOURCE))
    lost_lw = st.chunk(ITEMS, 8, "lw-gone", "hwA", [item(98, 0)], "id")
    with pytest.raises(WatermarkError, match="low watermark 'lw-gone'"):
        merge_job.locate_windows(spark, [lost_lw], changelog_dir(st.data_dir, SOURCE))
    with pytest.raises(NotReadyError, match=r"chunk 9 of table public\.items.*hw-not-yet"):  # the local engine too
        run_local("merge", st, st.round_file([*st.chunks[:3], late]))
    assert not Path(events_dir(st.data_dir, SOURCE)).exists()


def test_local_engine_writes_what_spark_writes(spark, tmp_path):
    """The in-process engine (small rounds, no spark-submit) and the Spark jobs on the same
    inputs: the same event files, byte for byte in content, and the same mirror with
    tombstones and positions; a re-run of the local jobs changes nothing (I3)."""
    x = build_scenario(tmp_path / "spark")
    z = build_scenario(tmp_path / "local")
    # Spark in groups of at most 15 chunk rows (each chunk its own collect), local in one: same output
    merge_job.main(["--chunks", x.round_file(), "--max-batch-rows", "15", *common_args(x)])
    apply_job.main(common_args(x))
    ms = run_local("merge", z, z.round_file())
    ap = run_local("apply", z)
    assert ms["engine"] == "local" and ms["chunks"] == 3 and ms["emitted"] == len(z.expected_merge())
    assert ap["events"] == sum(1 for e in read_log_events(changelog_dir(z.data_dir, SOURCE)) if isinstance(e, ChangeEvent))
    files = event_files(z.data_dir)
    assert files == event_files(x.data_dir)
    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        assert read_mirror_raw(z.data_dir, SOURCE, schema.table).to_pylist() == \
            read_mirror_raw(x.data_dir, SOURCE, schema.table).to_pylist()
        assert mirror_list(z.data_dir, schema) == expected_mirror_list(z, schema)
    before = read_mirror_raw(z.data_dir, SOURCE, ITEMS).to_pylist()
    for m in ("_applied/events.json", "_applied/mirror.json"):
        (Path(z.data_dir) / "output" / SOURCE / m).unlink()
    run_local("merge", z, z.round_file())
    run_local("apply", z)
    assert event_files(z.data_dir) == files
    assert read_mirror_raw(z.data_dir, SOURCE, ITEMS).to_pylist() == before


def test_local_apply_resumes_from_its_marker_and_counts_pending_rows(tmp_path):
    st = build_scenario(tmp_path / "a")
    pending = local_jobs.pending_rows(st.data_dir, SOURCE, ["events", "mirror"])
    staged_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in Path(changelog_dir(st.data_dir, SOURCE)).glob("seg-*"))
    assert pending == staged_rows > 0  # nothing applied yet: every staged row (watermarks, overlaps too)
    first = run_local("apply", st)
    assert local_jobs.pending_rows(st.data_dir, SOURCE, ["events", "mirror"]) == 0
    again = run_local("apply", st)
    assert first["events"] > 0 and again["segments"] == 0 and again["events"] == 0
    st.change(ITEMS, "u", [2], item(2, 9))
    write_segment(st.log[-1:], changelog_dir(st.data_dir, SOURCE), WM_TABLE)
    assert local_jobs.pending_rows(st.data_dir, SOURCE, ["mirror"]) == 1
    more = run_local("apply", st)
    assert more["segments"] == 1 and more["events"] == 1
    assert {r["id"]: r["name"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)}[2] == item(2, 9)["name"]


def test_spark_submit_writers_in_either_order_rerun_and_no_resurrection(spark, tmp_path):
    """apply->merge (through spark-submit) and merge->apply give the same mirror, equal to the
    source; a delete after the high watermark applied before the late chunk stays deleted;
    re-running both jobs writes the same event files and leaves the mirror unchanged."""
    x = build_scenario(tmp_path / "x")  # apply first, then the (late) merge
    y = build_scenario(tmp_path / "y")  # merge first, then apply
    rx = x.round_file()
    applied = submit("apply", common_args(x))
    # without spark.sql.shuffle.partitions the job sizes it: 2 per core of local[2]
    unset = {k: v for k, v in SPARK_CONF.items() if k != "spark.sql.shuffle.partitions"}
    merged = submit("merge", ["--chunks", rx, *common_args(x)], conf=unset)
    assert merged["shuffle_partitions"] == 4
    assert merged["chunks"] == 3 and merged["emitted"] == len(x.expected_merge())
    assert merged["dropped"] == sum(c.rows for c in x.chunks) - merged["emitted"]
    assert applied["events"] == sum(1 for e in read_log_events(changelog_dir(x.data_dir, SOURCE)) if isinstance(e, ChangeEvent))
    # the other order in-process (same code and session settings; a JVM start costs ~10-60 s here)
    merged_y = merge_job.main(["--chunks", y.round_file(), *common_args(y)])
    assert merged_y["shuffle_partitions"] == 3  # set by the session's builder: kept
    apply_job.main(common_args(y))

    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        truth = sorted(canonical_rows(schema, list(x.truth[schema.table.id].values())),
                       key=lambda r: tuple(r[k] for k in schema.primary_key))
        assert mirror_list(x.data_dir, schema) == truth  # I2: mirror == source
        assert mirror_list(x.data_dir, schema) == expected_mirror_list(x, schema)  # == core's mirror semantics
        assert mirror_list(y.data_dir, schema) == mirror_list(x.data_dir, schema)
        raw_x = read_mirror_raw(x.data_dir, SOURCE, schema.table).to_pylist()
        raw_y = read_mirror_raw(y.data_dir, SOURCE, schema.table).to_pylist()
        assert raw_x == raw_y  # tombstones and positions too
    ids = [r["id"] for r in mirror_list(x.data_dir, ITEMS_SCHEMA)]
    assert 10 not in ids and 25 not in ids  # deleted; the chunk row of 10 (at hwA) did not resurrect it
    tomb = {r["id"]: r for r in read_mirror_raw(x.data_dir, SOURCE, ITEMS).to_pylist() if r["__deleted"]}
    assert set(tomb) == {10, 25}

    # same file names and contents in both orders, and again after a re-run of both jobs
    files_x = event_files(x.data_dir)
    assert files_x == event_files(y.data_dir)
    before = read_mirror_raw(x.data_dir, SOURCE, ITEMS).to_pylist()
    for m in ("_applied/events.json", "_applied/mirror.json"):  # force the apply job to redo everything
        (Path(x.data_dir) / "output" / SOURCE / m).unlink()
    merge_job.main(["--chunks", rx, *common_args(x)])  # in-process: same code, no second JVM start
    apply_job.main(common_args(x))
    assert event_files(x.data_dir) == files_x
    assert read_mirror_raw(x.data_dir, SOURCE, ITEMS).to_pylist() == before
    rows = [(f.split("/")[0], r["key"], r["source"]["position"]) for f, rs in files_x.items() for r in rs]
    assert len(rows) == len(set(rows))  # no duplicates by (table, key, position)
    r_files = [f for f in files_x if "/r-" in f]
    assert len(r_files) == 3 and all(rs[0]["source"]["snapshot"] for f, rs in files_x.items() if "/r-" in f)


def test_apply_job_resumes_from_its_marker(spark, tmp_path):
    st = build_scenario(tmp_path / "a")
    first = apply_job.main(common_args(st))
    again = apply_job.main(common_args(st))  # nothing new: reads nothing
    assert first["events"] > 0 and again["segments"] == 0 and again["events"] == 0
    st.change(ITEMS, "u", [2], item(2, 9))
    write_segment(st.log[-1:], changelog_dir(st.data_dir, SOURCE), WM_TABLE)
    more = apply_job.main(common_args(st))
    assert more["segments"] == 1 and more["events"] == 1
    assert {r["id"]: r["name"] for r in mirror_list(st.data_dir, ITEMS_SCHEMA)}[2] == item(2, 9)["name"]


def test_apply_in_batches_of_one_segment_writes_what_one_batch_writes(tmp_path):
    """Batches bounded by staged rows (memory): every segment its own batch, including the
    re-delivered overlap, gives the same event files and mirror as a single batch."""
    one, many = build_scenario(tmp_path / "one"), build_scenario(tmp_path / "many")
    run_local("apply", one)
    n_segments = len(list(Path(changelog_dir(many.data_dir, SOURCE)).glob("seg-*")))
    got = run_local("apply", many, max_batch_rows=1)
    assert n_segments >= 3 and got["batches"] == n_segments
    assert event_files(many.data_dir) == event_files(one.data_dir)
    for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
        assert read_mirror_raw(many.data_dir, SOURCE, schema.table).to_pylist() == \
            read_mirror_raw(one.data_dir, SOURCE, schema.table).to_pylist()


# --- a real capture -----------------------------------------------------------------------------
@pytest.mark.parametrize("dialect_name", ["postgres", "mysql"])
def test_merge_on_a_real_capture(spark, tmp_path, request, unique_name, dialect_name):
    """Chunks read between real watermarks while rows change inside the windows; the
    changelog captured by the dialect (logical slot / binlog) and staged; Spark merge +
    apply agree with core and converge to the source."""
    from airflow_provider_cdc.dialects import ConnectionParams, get_dialect
    from airflow_provider_cdc.snapshot import GapHooks, snapshot_chunk

    uri = request.getfixturevalue("pg_uri" if dialect_name == "postgres" else "mysql_uri")
    table = TableName("public" if dialect_name == "postgres" else "cdc_test", f"spk_{unique_name}")
    source = f"spk_{unique_name}"
    d = get_dialect(ConnectionParams.from_uri(uri), source=source, watermark_schema="cdc",
                    watermark_table=f"wm_{unique_name}", tables=[table])
    data_dir = str(tmp_path)
    q = d.quote_table(table)
    ts_type = "timestamptz" if dialect_name == "postgres" else "DATETIME(6)"
    try:
        d._query(f"CREATE TABLE {q} (id INT PRIMARY KEY, v VARCHAR(20), amount DECIMAL(10,2), at {ts_type})")
        d._query(f"INSERT INTO {q} VALUES " + ",".join(f"({i}, 'v{i}', {i}.25, '2024-01-01 00:00:0{i % 10}')" for i in range(1, 31)))
        d.ensure_watermark_table()
        d.load_offset(data_dir)  # the capture starts here
        schema = d.describe_table(table)
        p = Path(schema_path(data_dir, source, table))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(schema.to_json())
        hooks = GapHooks(
            after_low_watermark=lambda: d._query(f"UPDATE {q} SET v = 'in-window' WHERE id IN (2, 17)"),
            before_high_watermark=lambda: d._query(f"DELETE FROM {q} WHERE id = 4"),
        )
        chunks = [
            snapshot_chunk(d, schema, ChunkRange(None, (16,)), data_dir=data_dir, snapshot_id="s", seq=1,
                           chunk_size=100, gap_hooks=hooks),
            snapshot_chunk(d, schema, ChunkRange((16,), None), data_dir=data_dir, snapshot_id="s", seq=2, chunk_size=100),
        ]
        d._query(f"UPDATE {q} SET v = 'after-hw' WHERE id = 20")
        d._query(f"DELETE FROM {q} WHERE id = 21")
        d._query(f"INSERT INTO {q} VALUES (99, 'new', 1.5, '2024-02-02 00:00:00')")
        d.capture(data_dir)
        truth = [d.row_to_canonical(schema, r) for batch in d.stream_query(f"SELECT * FROM {q} ORDER BY id", []) for r in batch]
    finally:
        try:
            if dialect_name == "postgres":
                d.drop_slot()
                d.drop_publication()
            d._query(f"DROP TABLE IF EXISTS {q}")
            d._query(f"DROP TABLE IF EXISTS {d.quote_table(d.watermark_table)}")
        finally:
            d.close()
    stage_rows = {c.path: [(r["key"], json.loads(r["after"])) for r in pq.read_table(c.path).to_pylist()] for c in chunks}
    staged = list(read_log_events(changelog_dir(data_dir, source)))
    want = merge_window([WindowChunk.from_result(c, stage_rows[c.path]) for c in chunks], staged)
    got = merge_job.merge_chunks(spark, chunks, changelog_dir(data_dir, source))
    assert spark_tuples(got) == as_tuples(want)
    assert spark_tuples(local_jobs.merge_chunks(chunks, changelog_dir(data_dir, source))) == as_tuples(want)
    keys = {e.key for e in want}
    assert "[2]" not in keys and "[4]" not in keys  # changed inside the first chunk's window
    assert "[17]" in keys  # changed before the second chunk's window opened: its read is newer
    args = ["--data-dir", data_dir, "--source", source, "--sinks", "events,mirror"]
    rf = Path(data_dir) / "round.json"
    rf.write_text(json.dumps([c.to_dict() for c in chunks]))
    merge_job.main(["--chunks", str(rf), *args])
    apply_job.main(args)
    mirror = sorted(read_mirror(data_dir, source, table).to_pylist(), key=lambda r: r["id"])
    assert mirror == sorted(canonical_rows(schema, truth), key=lambda r: r["id"])
    assert {4, 21}.isdisjoint(r["id"] for r in mirror) and 99 in {r["id"] for r in mirror}


def test_jobs_write_the_postgres_mirror_like_the_delta_mirror(spark, tmp_path, pg_uri, unique_name):
    """Both jobs through the 'postgres' sink too: same live rows as the Delta mirror and the source."""
    import psycopg2

    from airflow_provider_cdc.sinks.mirror_postgres import MirrorPostgresSink

    st = build_scenario(tmp_path / "pg")
    target = f"mirror_{unique_name}"
    args = ["--data-dir", st.data_dir, "--source", SOURCE, "--sinks", "mirror,postgres", "--pg-uri", pg_uri,
            "--pg-schema", target]
    try:
        apply_job.main(args)
        merge_job.main(["--chunks", st.round_file(), *args])
        sink = MirrorPostgresSink(pg_uri, st.data_dir, SOURCE, target_schema=target)
        try:
            for schema in (ITEMS_SCHEMA, OTHER_SCHEMA):
                pg_rows = sink.read(schema.table)
                delta = read_mirror(st.data_dir, SOURCE, schema.table, with_meta=True).to_pylist()
                assert [(r["__key"], r["__position"]) for r in pg_rows] == [(r["__key"], r["__position"]) for r in delta]
                assert {r["__key"] for r in pg_rows} == {encode_key([k]) for k in st.truth[schema.table.id]}
            by_id = {r["id"]: r for r in sink.read(ITEMS)}
            assert str(by_id[22]["amount"]) == item(22, 5)["amount"] and by_id[22]["name"] == item(22, 5)["name"]
            assert 10 not in by_id and 25 not in by_id
        finally:
            sink.close()
    finally:
        with psycopg2.connect(pg_uri) as conn, conn.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{target}" CASCADE')
        conn.close()


@pytest.mark.parametrize("engine", ["spark", "local"])
def test_a_truncate_inside_a_window_drops_that_chunk_in_both_engines(spark, tmp_path, engine):
    st = Stage(tmp_path / engine)
    st.watermark("lw0")
    st.watermark("lw1")
    st.log.append(ChangeEvent(ITEMS.id, "t", None, st._next(), None, None, ts_ms=st.pos))
    st.watermark("hw0")
    st.watermark("lw2")
    st.watermark("hw1")
    st.watermark("hw2")
    for c in range(3):
        st.chunk(ITEMS, c, f"lw{c}", f"hw{c}", [item(k, 1) for k in range(10 * c + 1, 10 * c + 4)], "id")
    st.stage_log(cuts=[3])
    got = spark_tuples(merged(engine, spark, st.chunks, changelog_dir(st.data_dir, SOURCE)))
    assert got == as_tuples(st.expected_merge())
    assert sorted(t[1] for t in got) == ["[21]", "[22]", "[23]"]  # chunks 0 and 1 held the TRUNCATE
