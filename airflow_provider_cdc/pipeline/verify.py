"""Is the mirror equal to the source? (invariant I2) And is the event log consistent? (I1)

``verify_table`` reads the source in primary-key chunks with the same keyset SQL the
snapshot uses (``Dialect.chunk_query`` / ``stream_query``), canonicalises each row with
the dialect's ``row_to_canonical``, and compares a digest per chunk with the digest of the
mirror rows of the same keys. Mirror rows are typed (core/arrow_types.py); they are
turned back into canonical values here, per logical type, so both sides compare as the
same canonical JSON. Only chunks whose digests differ are drilled into row by row. Keys
the mirror has and no source chunk covered are extra rows. Keys are matched by their
canonical text rather than by range arithmetic in Python, so text keys whose collation
order differs from Python's order still compare correctly.

``check_event_log`` replays the event log of a table per key in position order and
reports what invariant I1 forbids: two different events at one position, a change or a
chunk row after a delete (resurrection), a create of a live key, an update whose
before-image is not the previous after-image, and a chunk row (``r``) whose image is not
the state at its position (a stale overwrite).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..core.arrow_types import RowNormaliser, arrow_canonical
from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.ranges import FULL_RANGE, ChunkRange
from ..core.schema import TableName, TableSchema, encode_key, encode_row
from ..sinks.event_log import read_events as read_event_log

DEFAULT_CHUNK_ROWS = 10_000
EXAMPLES = 10
#: ranges a repair snapshot reads at once (its conf's parallelism, at most)
REPAIR_PARALLELISM = 4


def row_digest(key: str, row: dict[str, Any]) -> bytes:
    return hashlib.blake2b(f"{key}\x00{encode_row(row)}".encode(), digest_size=16).digest()


# --- the compare --------------------------------------------------------------------------
@dataclass
class Mismatch:
    key: str
    kind: str  # missing (in mirror) | extra (in mirror) | different
    columns: tuple[str, ...] = ()  # differing columns for "different"
    source: dict | None = None
    mirror: dict | None = None

    def describe(self) -> str:
        if self.kind == "different":
            diffs = ", ".join(
                f"{c}: source={json.dumps((self.source or {}).get(c))} mirror={json.dumps((self.mirror or {}).get(c))}"
                for c in self.columns
            )
            return f"key {self.key}: different ({diffs})"
        return f"key {self.key}: {'missing from the mirror' if self.kind == 'missing' else 'in the mirror, not in the source'}"


@dataclass
class VerifyResult:
    table: str
    rows_checked: int = 0  # distinct keys compared (source rows + extra mirror rows)
    source_rows: int = 0
    mirror_rows: int = 0
    chunks: int = 0
    mismatched_chunks: int = 0
    missing: int = 0
    extra: int = 0
    different: int = 0
    examples: list[Mismatch] = field(default_factory=list)
    #: the key ranges of the source chunks that differed (start inclusive, end exclusive: the
    #: next chunk's first key), adjacent ones joined; in the database's own key order
    repair_ranges: list[ChunkRange] = field(default_factory=list)

    @property
    def mismatched(self) -> int:
        return self.missing + self.extra + self.different

    @property
    def ok(self) -> bool:
        return self.mismatched == 0

    def summary(self) -> str:
        return f"{self.rows_checked} rows checked, {self.mismatched} mismatched"

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "rows_checked": self.rows_checked,
            "mismatched": self.mismatched,
            "source_rows": self.source_rows,
            "mirror_rows": self.mirror_rows,
            "missing": self.missing,
            "extra": self.extra,
            "different": self.different,
            "chunks": self.chunks,
            "mismatched_chunks": self.mismatched_chunks,
            "examples": [m.describe() for m in self.examples],
            "repair_ranges": [json.loads(r.to_json()) for r in self.repair_ranges],
            "repair_conf": self.repair_conf(),
        }

    def repair_conf(self) -> dict | None:
        """The snapshot conf that repairs what this verify found (None: nothing to repair).

        Missing and different rows: a snapshot of only the key ranges of the chunks that
        differed. Rows the mirror has and the source does not: the whole table, since only a
        whole-table snapshot converges (removes mirror rows no chunk re-emitted, I9); a
        ranged one leaves them."""
        if self.ok:
            return None
        conf: dict[str, Any] = {"action": "start", "tables": [self.table]}
        if not self.extra and self.repair_ranges:
            conf["key_ranges"] = {self.table: [json.loads(r.to_json()) for r in self.repair_ranges]}
            # a run reads `parallelism` ranges at once; more ranges continue in resume runs
            conf["parallelism"] = min(len(self.repair_ranges), REPAIR_PARALLELISM)
        return conf


class MirrorIndex:
    """The mirror's live rows: canonical key -> (row number, digest), rows kept typed in Arrow."""

    def __init__(self, schema: TableSchema, table) -> None:
        from ..core.arrow_types import KEY_COLUMN

        self.schema = schema
        self.table = table
        self.index: dict[str, tuple[int, bytes]] = {}
        if table.num_rows == 0:
            return
        names = [c for c in schema.column_names if c in table.column_names]
        missing_cols = [c for c in schema.column_names if c not in table.column_names]
        if missing_cols:
            raise ConfigurationError(
                f"mirror of {schema.table} lacks column(s) {missing_cols} the source has; the schema changed "
                "since the mirror was written: re-snapshot the table"
            )
        keys = table[KEY_COLUMN].to_pylist() if KEY_COLUMN in table.column_names else None
        logical = {c.name: c.type for c in schema.columns}
        n = 0
        for batch in table.select(names).to_batches(max_chunksize=100_000):
            cols = [arrow_canonical(batch.column(i), logical[c]) for i, c in enumerate(names)]
            for values in zip(*cols, strict=True):
                row = dict(zip(names, values, strict=True))
                key = keys[n] if keys is not None else encode_key(schema.key_values(row))
                self.index[key] = (n, row_digest(key, row))
                n += 1

    def row(self, n: int) -> dict:
        names = [c for c in self.schema.column_names if c in self.table.column_names]
        one = self.table.slice(n, 1).select(names)
        logical = {c.name: c.type for c in self.schema.columns}
        return {c: arrow_canonical(one[c], logical[c])[0] for c in names}


def read_mirror_table(data_dir: str, source: str, table: TableName):
    """Live mirror rows (typed, with ``__key``) through the sinks' read API."""
    from ..sinks.mirror_delta import read_mirror

    return read_mirror(data_dir, source, table, with_meta=True)


def source_chunks(dialect, schema: TableSchema, chunk_rows: int) -> Iterator[list[tuple[str, dict]]]:
    """The source's rows in key order, ``chunk_rows`` at a time, as (canonical key, canonical row)."""
    after: tuple | None = None
    while True:
        sql, params = dialect.chunk_query(schema, FULL_RANGE, after_key=after, limit=chunk_rows)
        chunk: list[tuple[str, dict]] = []
        for batch in dialect.stream_query(sql, params):
            for raw in batch:
                row = dialect.row_to_canonical(schema, raw)
                chunk.append((encode_key(schema.key_values(row)), row))
        if not chunk:
            return
        yield chunk
        if len(chunk) < chunk_rows:
            return
        after = tuple(json.loads(chunk[-1][0]))


def compare(
    schema: TableSchema, chunks: Iterable[list[tuple[str, dict]]], mirror: MirrorIndex, *, examples: int = EXAMPLES
) -> VerifyResult:
    """Chunk digests first; row-by-row only inside chunks whose digests differ."""
    res = VerifyResult(schema.table.id, mirror_rows=len(mirror.index))
    seen: set[str] = set()

    def note(m: Mismatch) -> None:
        if len(res.examples) < examples:
            res.examples.append(m)

    norm = RowNormaliser(schema)
    open_start: tuple | None = None  # the start of a differing chunk whose end is the next chunk's first key
    pending = False

    def close(end: tuple | None) -> None:
        nonlocal pending
        if not pending:
            return
        pending = False
        last = res.repair_ranges[-1] if res.repair_ranges else None
        if last is not None and last.end == open_start:
            res.repair_ranges[-1] = ChunkRange(last.start, end)
        else:
            res.repair_ranges.append(ChunkRange(open_start, end))

    for raw_chunk in chunks:
        chunk = [(key, norm(row)) for key, row in raw_chunk]
        if chunk:
            close(tuple(json.loads(chunk[0][0])))
        res.chunks += 1
        res.source_rows += len(chunk)
        src_digest = hashlib.blake2b(digest_size=16)
        mir_digest = hashlib.blake2b(digest_size=16)
        for key, row in chunk:
            seen.add(key)
            src_digest.update(row_digest(key, row))
            hit = mirror.index.get(key)
            mir_digest.update(hit[1] if hit else b"\x00" * 16)
        if src_digest.digest() == mir_digest.digest():
            continue
        res.mismatched_chunks += 1
        if chunk:
            open_start, pending = tuple(json.loads(chunk[0][0])), True
        for key, row in chunk:  # drill in
            hit = mirror.index.get(key)
            if hit is None:
                res.missing += 1
                note(Mismatch(key, "missing", source=row))
            elif hit[1] != row_digest(key, row):
                res.different += 1
                if len(res.examples) < examples:
                    mrow = mirror.row(hit[0])
                    cols = tuple(c for c in schema.column_names if row.get(c) != mrow.get(c))
                    note(Mismatch(key, "different", cols, row, mrow))
    close(None)
    for key in mirror.index:
        if key not in seen:
            res.extra += 1
            note(Mismatch(key, "extra"))
    res.rows_checked = res.source_rows + res.extra
    return res


def verify_table(
    dialect, data_dir: str, source: str, table: TableName, *, chunk_rows: int = DEFAULT_CHUNK_ROWS, examples: int = EXAMPLES
) -> VerifyResult:
    """Compare the mirror of ``table`` with the source the dialect reads (I2)."""
    schema = dialect.describe_table(table)
    mirror = MirrorIndex(schema, read_mirror_table(data_dir, source, table))
    return compare(schema, source_chunks(dialect, schema, chunk_rows), mirror, examples=examples)


# --- the event log ------------------------------------------------------------------------
@dataclass
class EventLogReport:
    table: str
    events: int = 0  # after de-duplication by (key, position)
    duplicates: int = 0  # identical copies removed (allowed: I3 de-duplicates them)
    keys: int = 0
    violation_count: int = 0
    violations: list[str] = field(default_factory=list)  # the first few, described

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def summary(self) -> str:
        return (
            f"event log of {self.table}: {self.events} events over {self.keys} keys, "
            f"{self.duplicates} duplicate copies, {self.violation_count} violations"
        )


def check_events(
    table_id: str, events: Iterable[dict], *, primary_key: tuple[str, ...] = (), max_violations: int = 20
) -> EventLogReport:
    """Replay events (dicts with op, key, position, before, after; rows as canonical JSON text or
    dicts) per key in position order and report what I1 forbids (see the module docstring)."""
    return check_event_tuples(
        table_id,
        (
            (
                e["key"],
                e["position"].encode() if isinstance(e["position"], Position) else e["position"],
                e["op"],
                e.get("before"),
                e.get("after"),
            )
            for e in events
        ),
        primary_key=primary_key,
        max_violations=max_violations,
    )


def _obj(row: Any) -> dict | None:
    return json.loads(row) if isinstance(row, str) else row


def _same(a: Any, b: Any) -> bool:
    """Equal rows, comparing the canonical JSON text first and parsing only when it differs.
    Images from either side of an ADD or DROP COLUMN are compared on the columns both have
    (a column added later has no value in the earlier image; a dropped one none in the later)."""
    if a == b:
        return True
    if a is None or b is None:
        return False
    x, y = _obj(a), _obj(b)
    if x.keys() == y.keys():
        return x == y
    return all(x[c] == y[c] for c in x.keys() & y.keys())


def check_event_tuples(
    table_id: str,
    events: Iterable[tuple[str, str, str, Any, Any]],
    *,
    primary_key: tuple[str, ...] = (),
    max_violations: int = 20,
) -> EventLogReport:
    """:func:`check_events` on ``(key, encoded position, op, before, after)`` tuples."""
    rep = EventLogReport(table_id)
    per_key: dict[str, list] = {}
    truncates: list[str] = []  # positions of TRUNCATE events (op "t", no key): every key is gone there
    for ev in events:
        if ev[2] == "t":
            truncates.append(ev[1])
            continue
        lst = per_key.get(ev[0])
        if lst is None:
            per_key[ev[0]] = [ev]
        else:
            lst.append(ev)

    def violation(text: str) -> None:
        rep.violation_count += 1
        if len(rep.violations) < max_violations:
            rep.violations.append(text)

    rep.keys = len(per_key)
    truncates = sorted(set(truncates))
    rep.events += len(truncates)
    for key, evs in per_key.items():
        if len(evs) == 1:
            rep.events += 1
            continue
        evs.sort(key=lambda e: e[1])
        prev = None
        for ev in evs:
            _, pos, op, before, after = ev
            if prev is not None and truncates:
                # a TRUNCATE between the previous event and this one deleted the key there
                i = bisect.bisect_left(truncates, pos) - 1
                if i >= 0 and truncates[i] > prev[1]:
                    prev = (key, truncates[i], "d", None, None)
            if prev is not None and prev[1] == pos:
                if prev[2] == op and _same(prev[3], before) and _same(prev[4], after):
                    rep.duplicates += 1
                else:
                    violation(f"key {key}: two different events at position {_readable(pos)}: {prev[2]} and {op}")
                continue
            rep.events += 1
            problem = None
            if prev is not None:
                pop, pafter, ppos = prev[2], prev[4], prev[1]
                live = pop != "d"
                if op == "c" and live:
                    problem = f"create of a live key (previous {pop} at {_readable(ppos)})"
                elif op in ("u", "d", "r") and not live:
                    problem = f"{op} after a delete at {_readable(ppos)}" + (" (resurrected by a chunk row)" if op == "r" else "")
                elif op == "r" and not _same(after, pafter):
                    problem = f"chunk row is not the state at its position (stale; previous {pop} at {_readable(ppos)})"
                elif op in ("u", "d") and before is not None and pafter is not None and not _same(before, pafter):
                    b, pa_ = _obj(before), _obj(pafter)
                    if _full(b, pa_, primary_key):
                        problem = f"before-image differs from the previous after-image ({pop} at {_readable(ppos)})"
            if problem:
                violation(f"key {key}: {op} at {_readable(pos)}: {problem}")
            prev = ev
    return rep


def _full(before: dict, after: dict, primary_key: tuple[str, ...]) -> bool:
    """A before-image is comparable when it has every column (REPLICA IDENTITY FULL / binlog
    FULL); a key-only before-image (PostgreSQL's default identity) is not."""
    return bool(set(before) & (set(after) - set(primary_key))) and (not primary_key or set(before) != set(primary_key))


def _readable(encoded: str) -> str:
    try:
        return str(Position.decode(encoded))
    except ValueError:
        return encoded


def check_event_log(data_dir: str, source: str, table: TableName, *, primary_key: tuple[str, ...] = ()) -> EventLogReport:
    """Read the event log of ``table`` and check it per key (I1); see :func:`check_events`."""
    t = read_event_log(data_dir, source, table)
    cols = [t[c].to_pylist() for c in ("key", "position", "op", "before", "after")]
    return check_event_tuples(table.id, zip(*cols, strict=True), primary_key=primary_key)
