"""Resync after a failover that capture could not follow (I14): record the gap, start capture
anew on the server the source reaches now, and leave the repair to verify, which re-reads only
the key ranges whose rows differ. Costs what changed, not a re-snapshot."""

from __future__ import annotations

import logging
import time
import uuid

from ..core.errors import ConfigurationError, SourceChangedError, StateError
from ..core.events import Op
from ..dialects.base import Dialect
from ..storage.layout import changelog_dir, events_dir
from ..storage.segment_index import staged_through
from ..storage.source_server import read_gaps, read_server, write_gaps
from ..storage.staged import list_segments
from .locks import capture_lock, lock_key

log = logging.getLogger(__name__)


def resync(dialect: Dialect, data_dir: str) -> dict:
    """Start capture anew after :class:`SourceChangedError`; returns the gap recorded.

    Under the capture lock: the reason capture stopped is asked again (a source capture can
    still follow is refused, nothing changes), the gap is recorded from how far the old log was
    staged, a slot of the source's name left on the new server is dropped (it does not continue
    the captured log), and capture starts on the new server. The gap's ``to`` is where the new
    log starts; changes committed before it and after ``from`` may be missing until every
    captured table is verified and repaired (``airflow-cdc verify --repair``)."""
    directory = changelog_dir(data_dir, dialect.source)
    if read_server(directory) is None and not list_segments(directory) and staged_through(directory) is None:
        # before anything touches the server: capture's start would create a slot (and a
        # publication) for a name that was never captured, e.g. a typo, and keep WAL for it
        raise ConfigurationError(
            f"source {dialect.source!r} was never captured into {data_dir} (no staged changelog at "
            f"{directory}), so there is nothing to resync and nothing was created on the server. "
            "Check the source's name (airflow-cdc sources lists them) and --data-dir"
        )
    with capture_lock(dialect.params, lock_key(dialect, data_dir), dialect.source) as acquired:
        if not acquired:
            raise StateError(
                f"source {dialect.source!r}: a capture holds the capture lock; pause the changelog DAG "
                "(or wait for its run to end) and resync again"
            )
        try:
            dialect.load_offset(data_dir)
        except SourceChangedError as exc:
            reason = str(exc)
        else:
            raise StateError(
                f"source {dialect.source!r}: capture can go on from where it stands on this server, so "
                "there is nothing to resync"
            )
        before = read_server(directory)
        through = _check_continues(dialect, directory, before)
        gap = {
            "id": uuid.uuid4().hex,
            "state": "resyncing",
            "reason": reason,
            "from": through[0].encode() if through else None,
            "detected_ms": int(time.time() * 1000),
            "server_before": before,
        }
        gaps = [*read_gaps(directory), gap]
        write_gaps(directory, gaps)
        dialect.drop_slot()  # a slot of this name here did not continue the captured log (none: nothing)
        start = dialect.offset_position(dialect.load_offset(data_dir))
        gap.update(
            state="open",
            to=start.encode() if start is not None else None,
            server_after=read_server(directory),
            tables=[t.id for t in sorted(dialect.scope_tables() or ())],
        )
        write_gaps(directory, gaps, events_dir(data_dir, dialect.source))
        _gap_events(dialect, data_dir, gap)
        log.warning(
            "source %r: resynced: capture starts anew at %s; changes after %s may be missing until every "
            "captured table is verified and repaired",
            dialect.source,
            gap["to"],
            gap["from"],
        )
        return gap


def _check_continues(dialect: Dialect, directory: str, before: dict | None):
    """How far capture staged the old log (``staged_through``), once the server is checked to
    continue it: the same cluster, its log already past that point; StateError saying what to do
    otherwise."""
    server = dialect.server_identity()
    if before is not None and before.get("system_identifier") != server.get("system_identifier"):
        raise StateError(
            f"source {dialect.source!r}: the server is another cluster (system identifier "
            f"{before.get('system_identifier')} before, {server.get('system_identifier')} now), whose log "
            "positions do not continue the captured ones, so the event log and the mirror could not order "
            "its changes after the old ones. Re-snapshot instead: drop the source's staged changelog and "
            "outputs, then start capture and snapshot every captured table"
        )
    through = staged_through(directory)
    now = dialect.current_position()
    if through is not None and now <= through[0]:
        raise StateError(
            f"source {dialect.source!r}: the server's log ends at {now.encode()}, before what capture "
            f"staged from the old one ({through[0].encode()}): positions would collide. Wait until the "
            "server has written more WAL than that (any writes do), then resync again"
        )
    return through


def _gap_events(dialect: Dialect, data_dir: str, gap: dict) -> None:
    """One ``op = "g"`` event per captured table in the event log, at the position where the new
    log starts: consumers reading the log see the gap where it is (no key, no images; the
    reason and both ends are in _gaps.json beside it). Written once per gap (the file is named
    by it, so a retry rewrites it)."""
    import pyarrow as pa

    from ..sinks.base import EVENT_SCHEMA
    from ..sinks.event_log import EventLogSink

    tables = sorted(dialect.scope_tables() or ())
    if not tables or gap.get("to") is None:
        return
    rows = [
        {
            "position": gap["to"],
            "table": t.id,
            "op": Op.GAP.value,
            "ts_ms": gap["detected_ms"],
            "snapshot": False,
            "batch": f"g-{gap['to']}-{gap['id'][:12]}",
        }
        for t in tables
    ]
    EventLogSink(data_dir, dialect.source).write(pa.Table.from_pylist(rows, schema=EVENT_SCHEMA))


def verified_after_gap(dialect: Dialect, data_dir: str, table_id: str) -> list[dict]:
    """A verify found ``table_id`` equal to the source: note it in the open gaps (closing those
    whose tables are all verified since). Under the capture lock; a capture holding it now just
    means the note waits for the next verify. Returns the gaps closed."""
    directory = changelog_dir(data_dir, dialect.source)
    from ..storage.source_server import open_gaps, record_verified

    if not open_gaps(directory):
        return []
    with capture_lock(dialect.params, lock_key(dialect, data_dir), dialect.source) as acquired:
        if not acquired:
            log.warning(
                "source %r: a capture holds the capture lock: the gap is noted as verified for %s at the "
                "next verify",
                dialect.source,
                table_id,
            )
            return []
        return record_verified(
            directory, events_dir(data_dir, dialect.source), table_id, int(time.time() * 1000)
        )
