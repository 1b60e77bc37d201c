"""What every sink receives (:class:`TableEvents`: a table's events, typed as staged; or the
canonical-JSON form, typed once by :func:`table_events`), the :class:`Sink` protocol both engines
call (docs/DESIGN.md, "Adding a sink") and the apply job's applied-position markers. Sinks are
idempotent per batch (I3).
"""

from __future__ import annotations

import json
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..core import arrow_types as at
from ..core.errors import ConfigurationError
from ..core.position import Position
from ..core.schema import TableName, TableSchema
from ..storage.layout import schema_path
from ..storage.staged import CHANGELOG_SCHEMA

log = logging.getLogger(__name__)

# the staged changelog columns, plus the snapshot flag and the batch that wrote the event,
# with images as canonical JSON text (the hand-built form; see TableEvents for the typed one)
EVENT_SCHEMA = pa.schema(
    [*CHANGELOG_SCHEMA, pa.field("snapshot", pa.bool_()), pa.field("batch", pa.string())]
)
EVENT_COLUMNS = tuple(EVENT_SCHEMA.names)
#: the columns of TableEvents.events other than the two images
META_EVENT_FIELDS = [f for f in EVENT_SCHEMA if f.name not in ("before", "after")]


def typed_event_schema(image: pa.DataType) -> pa.Schema:
    """EVENT_SCHEMA's columns with ``before`` / ``after`` of type ``image`` (a struct)."""
    return pa.schema([pa.field(f.name, image) if f.name in ("before", "after") else f for f in EVENT_SCHEMA])


def typed_events_table(columns, before, after) -> pa.Table:
    """EVENT_SCHEMA's columns taken by name from ``columns`` (a table or a mapping), with the
    typed ``before`` / ``after`` images instead of theirs: TableEvents.events."""
    images = {"before": before, "after": after}
    return pa.table(
        [images[f.name] if f.name in images else columns[f.name] for f in EVENT_SCHEMA],
        schema=typed_event_schema(after.type),
    )


@dataclass(frozen=True)
class TableEvents:
    """Events of one table with typed images: ``events`` has EVENT_SCHEMA's columns, with
    ``before`` and ``after`` structs of the columns of ``schema`` (the TableSchema they were
    typed with; columns in ``text_columns`` hold canonical text instead)."""

    table: str
    schema: TableSchema | None
    text_columns: tuple[str, ...]
    events: pa.Table

    @property
    def num_rows(self) -> int:
        return self.events.num_rows

    def filter(self, mask) -> TableEvents:
        return replace(self, events=self.events.filter(mask))

    def with_events(self, events: pa.Table) -> TableEvents:
        return replace(self, events=events)

    def canonical(self, column: str, *, keep_nulls: bool = False) -> list[dict | None]:
        """``before`` or ``after`` as canonical row dicts (core/arrow_types.canonical_rows)."""
        return at.canonical_rows(self.events[column], self.schema, self.text_columns, keep_nulls=keep_nulls)


Events = pa.Table | TableEvents | Sequence[TableEvents]


def type_json_events(table: str, events: pa.Table, schema: TableSchema | None) -> TableEvents:
    """Events of one table with canonical-JSON images (EVENT_SCHEMA) -> TableEvents, typed
    with ``schema`` (None: text columns the rows name, :func:`inferred_schema`)."""
    n = events.num_rows
    have = set(events.column_names)  # a hand-built table may leave columns out: they read null
    events = pa.table(
        {f.name: events[f.name] if f.name in have else pa.nulls(n, f.type) for f in EVENT_SCHEMA}
    )
    schema = schema or at.inferred_schema(TableName.parse(table), events)
    before, after, schema, text = at.type_images(schema, events["before"], events["after"])
    return TableEvents(table, schema, tuple(text), typed_events_table(events, before, after))


def table_events(events: Events, schema_of: Callable[[str], TableSchema | None]) -> list[TableEvents]:
    """What a sink was given, a table at a time and typed: TableEvents as they are; the
    canonical-JSON form (EVENT_SCHEMA, any tables) grouped by table and typed with
    ``schema_of(table)``."""
    if isinstance(events, TableEvents):
        return [events] if events.num_rows else []
    if not isinstance(events, pa.Table):
        return [e for e in events if e.num_rows]
    if events.num_rows == 0:
        return []
    if pa.types.is_struct(events.schema.field("after").type):
        raise TypeError("typed events come as TableEvents, which name their schema")
    return [
        type_json_events(t, events.filter(pc.equal(events["table"], t)), schema_of(t))
        for t in pc.unique(events["table"]).to_pylist()
    ]


def join_table_events(parts: Iterable[TableEvents]) -> list[TableEvents]:
    """Parts of events (from several staged files or chunks), one TableEvents per table, in
    first-seen order: images typed at different positions joined under every column's newest
    type (core/arrow_types.unify_schemas); a column whose older values the newest type cannot
    hold is canonical text."""
    by_table: dict[str, list[TableEvents]] = {}
    for p in parts:
        if p.num_rows:
            by_table.setdefault(p.table, []).append(p)
    out = []
    for table, ps in by_table.items():
        if len(ps) == 1:
            out.append(ps[0])
            continue
        schema, text = at.unify_schemas([(p.schema, p.text_columns) for p in ps])
        if schema is None:
            out.append(ps[0].with_events(pa.concat_tables([p.events for p in ps])))
            continue
        while True:
            try:
                tables = [_conformed(p, schema, text) for p in ps]
                break
            except ConfigurationError as exc:
                bad = next(
                    (c for c in schema.column_names if f"column {c!r}" in str(exc) and c not in text), None
                )
                if bad is None:
                    raise
                text = sorted({*text, bad})
        out.append(TableEvents(table, schema, tuple(text), pa.concat_tables(tables)))
    return out


def _conformed(p: TableEvents, schema: TableSchema, text: Sequence[str]) -> pa.Table:
    before = at.conform_images(p.events["before"], p.schema, p.text_columns, schema, text)
    after = at.conform_images(p.events["after"], p.schema, p.text_columns, schema, text)
    return typed_events_table(p.events, before, after)


def to_json_events(parts: Iterable[TableEvents]) -> pa.Table:
    """TableEvents -> the canonical-JSON form (EVENT_SCHEMA, images as canonical JSON text):
    for a sink outside this package and for checks, never the hot path."""
    from ..core.arrow_types import string_array
    from ..core.schema import encode_row

    tables = []
    for p in parts:
        if not p.num_rows:
            continue
        images = {
            c: string_array([None if r is None else encode_row(r) for r in p.canonical(c)])
            for c in ("before", "after")
        }
        tables.append(
            pa.table(
                [images[f.name] if f.name in images else p.events[f.name] for f in EVENT_SCHEMA],
                schema=EVENT_SCHEMA,
            )
        )
    return pa.concat_tables(tables) if tables else EVENT_SCHEMA.empty_table()


#: where an engine that runs a round's units on many workers (Spark) writes a sink (Sink.placement)
DRIVER = "driver"  # the round's events are gathered on the driver and given to write(): any sink
UNITS = "units"  # write() runs on the workers, a unit's events at a time (the sink object is pickled)
BUCKETS = "buckets"  # a table format with key buckets: plan() on the driver, write_bucket() on the
#                      workers, commit() on the driver (sinks/mirror_delta.py)


class Sink(ABC):
    """What both engines call, never knowing the concrete sink (docs/DESIGN.md, Adding a sink).

    ``write(events)`` receives one table's TableEvents, a sequence of them, or the
    canonical-JSON form (EVENT_SCHEMA); it must be idempotent per batch. The in-process
    engine calls only ``write``. The Spark engine reads ``placement`` (DRIVER, UNITS or
    BUCKETS, above) and, for a sink that ``needs_truncates``, first calls
    ``prepare(truncates)`` on the driver with each table's newest TRUNCATE of the round (or
    None), and then hands it only the events past it."""

    name: str
    placement: str = DRIVER
    needs_truncates: bool = False

    @abstractmethod
    def write(self, events: Events) -> None: ...

    def deferred(self) -> frozenset[str]:
        """Tables a BUCKETS sink's ``plan`` left out, whose events the engine hands to
        :meth:`write_deferred` on the driver instead (the mirror's tables without a key)."""
        return frozenset()

    def write_deferred(self, events: Sequence[TableEvents]) -> None:  # noqa: B027 - optional
        """On the driver: the events of the :meth:`deferred` tables, one TableEvents per table."""

    def prepare(self, truncates: Mapping[str, str | None]) -> None:  # noqa: B027 - optional
        """On the driver, before a round's units are written (``needs_truncates`` sinks)."""

    def close(self) -> None:  # noqa: B027 - optional
        pass


def newest_truncate(events: pa.Table) -> str | None:
    """The position of the newest TRUNCATE among one table's events (None: none)."""
    truncates = pc.equal(events["op"], "t")
    return pc.max(events.filter(truncates)["position"]).as_py() if pc.any(truncates).as_py() else None


def past_truncate(part: TableEvents, newest: str | None) -> TableEvents:
    """The events of ``part`` after its table's TRUNCATE at ``newest`` (all of them: None)."""
    return part if newest is None else part.filter(pc.greater(part.events["position"], newest))


class SchemaCache:
    """Table schemas staged by the snapshot planner (storage/layout.py schema_path)."""

    def __init__(self, data_dir: str, source: str) -> None:
        self.data_dir, self.source = data_dir, source
        self._cache: dict[str, TableSchema | None] = {}

    def get(self, table_id: str) -> TableSchema | None:
        if table_id not in self._cache:
            path = schema_path(self.data_dir, self.source, TableName.parse(table_id))
            self._cache[table_id] = (
                TableSchema.from_json(storage.read_text(path)) if storage.exists(path) else None
            )
        return self._cache[table_id]

    def lookup(self, table_id: str, *, require: bool, sink: str) -> TableSchema | None:
        """The staged schema every sink that keeps tables needs: with ``require`` (a merge)
        its absence is an error, else the table is skipped by ``sink`` with a warning."""
        schema = self.require(table_id) if require else self.get(table_id)
        if schema is None:
            log.warning("%s: no staged schema for %s; its events go to the event log only", sink, table_id)
        return schema

    def require(self, table_id: str) -> TableSchema:
        s = self.get(table_id)
        if s is None:
            path = schema_path(self.data_dir, self.source, TableName.parse(table_id))
            raise ConfigurationError(
                f"no staged schema for table {table_id} at {path}: the snapshot planner writes it; "
                "plan the snapshot of this table first"
            )
        return s


def write_to_sinks(sinks: Iterable[Sink], events: Events) -> None:
    """Write one group of events to every sink (the engines' one call per group), the sinks side
    by side: each writes its own outputs and commits them alone (pyarrow's encoding and I/O run
    outside the GIL), and no sink's correctness depends on another having written first (each
    replays a group it did not commit, I3). Returns once every sink has finished; the first
    failure is raised then."""
    sinks = list(sinks)
    if len(sinks) < 2:
        for sink in sinks:
            sink.write(events)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(sinks), thread_name_prefix="sink") as pool:
        done = [pool.submit(sink.write, events) for sink in sinks]
    for d in done:
        d.result()


# --- applied-position markers (apply job) -------------------------------------------------
def marker_path(data_dir: str, source: str, sink_name: str) -> str:
    from ..storage.layout import path_component

    return storage.join(
        data_dir, "output", path_component(source, "source name"), "_applied", f"{sink_name}.json"
    )


def read_marker(data_dir: str, source: str, sink_name: str) -> Position | None:
    """The last staged position this sink has durably applied (None: nothing yet)."""
    p = marker_path(data_dir, source, sink_name)
    if not storage.exists(p):
        return None
    return Position.decode(json.loads(storage.read_text(p))["position"])


def write_marker(
    data_dir: str, source: str, sink_name: str, position: Position, committed_ms: int | None = None
) -> None:
    """Written only after the sink committed: a crash before it replays the batch (idempotent).
    ``committed_ms``: the newest source commit time among the changes applied up to
    ``position`` (status.freshness), when the staged changelog's index knows it."""
    doc = {"position": position.encode(), "readable": str(position), "written_at": time.time()}
    if committed_ms is not None:
        doc["committed_ms"] = int(committed_ms)
    storage.write_text(marker_path(data_dir, source, sink_name), json.dumps(doc))


def staged_past_markers(data_dir: str, source: str, sinks: Sequence[str]) -> bool:
    """Whether a staged segment ends past some sink's applied marker (a sink that applied
    nothing yet counts as behind): the apply has something to do, watermark-only segments
    included (their positions move the markers)."""
    from ..storage.layout import changelog_dir
    from ..storage.staged import list_segments

    segments = list_segments(changelog_dir(data_dir, source))
    if not segments:
        return False
    newest = max(last for _first, last, _path in segments)
    return any(m is None or newest > m for m in (read_marker(data_dir, source, s) for s in sinks))


def applied_everywhere(
    data_dir: str, source: str, position: Position, sinks: Sequence[str] = ("events", "mirror")
) -> bool:
    """Whether every one of ``sinks`` has applied the staged changelog up to ``position``. A
    position past every staged event (a position mark of an idle log) is reached once every
    staged event before it is applied."""
    from ..storage.layout import changelog_dir
    from ..storage.staged import list_segments

    before = [last for first, last, _ in list_segments(changelog_dir(data_dir, source)) if first <= position]
    if not before:  # no staged event up to it: nothing to apply (a sink may not have run yet)
        return True
    need = min(position, max(before))
    marks = [read_marker(data_dir, source, s) for s in sinks]
    return all(m is not None and m >= need for m in marks)
