"""Staging retention: staged segments and snapshot folders go once nothing needs them (sinks'
markers, open snapshots, the replay horizon: docs/DESIGN.md, "Staging over time"). Runs under the
capture lock; a table's stored progress comes in as a function, so no Airflow here.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from .. import storage
from ..core.formats import PLAN, FormatError
from ..core.position import Position, marked_position
from ..core.visibility import REPLAYED_BEFORE, ReplayedBefore
from ..sinks.base import read_marker
from ..storage.layout import changelog_dir, staging_dir
from ..storage.segment_index import StagedSegment, find_in_index, refresh_index, write_index

log = logging.getLogger(__name__)

#: the statuses of a snapshot that may still merge chunks (core/progress.Status)
OPEN_STATUSES = frozenset({"running", "paused", "failed"})
#: table id -> (snapshot id, status, seconds since the epoch of its last change) of its
#: stored snapshot progress (None: never snapshotted)
SnapshotLookup = Callable[[str], "tuple[str, str, float | None] | None"]


@dataclass(frozen=True)
class RetentionPolicy:
    horizon_seconds: float
    sinks: tuple[str, ...]
    snapshot_of: SnapshotLookup = field(compare=False, default=lambda _table_id: None)


@dataclass(frozen=True)
class Hold:
    """Keeps every segment whose last position is at or past ``position``, or past ``after``,
    and every segment staged at or after ``since`` (seconds since the epoch)."""

    reason: str
    position: Position | None = None
    after: Position | None = None
    since: float | None = None
    everything: bool = False

    def holds(self, s: StagedSegment) -> bool:
        if self.everything:
            return True
        if self.position is not None and s.last >= self.position:
            return True
        if self.after is not None and s.last > self.after:
            return True
        return self.since is not None and s.info is not None and s.info.staged_at >= self.since


@dataclass(frozen=True)
class PruneResult:
    segments_deleted: int
    bytes_deleted: int
    segments_kept: int
    bytes_kept: int
    snapshots_deleted: int
    held_by: str | None  # why the oldest segment left was kept (None: nothing left)

    def describe(self) -> str:
        return (
            f"staging retention removed {self.segments_deleted} segment(s) ({self.bytes_deleted:,} "
            "bytes) and "
            f"{self.snapshots_deleted} snapshot folder(s); {self.segments_kept} segment(s) "
            f"({self.bytes_kept:,} bytes) kept"
            + (f", the oldest held by {self.held_by}" if self.held_by else "")
        )


def _snapshot_folders(data_dir: str, source: str) -> list[tuple[str, str, str]]:
    """(table folder, snapshot id, snapshot folder) of every snapshot staged for ``source``."""
    root = storage.join(staging_dir(data_dir, source), "chunks")
    out = []
    for t in storage.list_dir(root):
        if t.type != pafs.FileType.Directory:
            continue
        tdir = storage.join(root, t.base_name)
        for s in storage.list_dir(tdir):
            if not s.base_name.startswith("."):
                out.append((t.base_name, s.base_name, storage.join(tdir, s.base_name)))
    return out


class _Unreadable(Exception):
    """A plan or sidecar that exists but cannot be read now: retention keeps everything."""


def _read_json(path: str) -> dict | None:
    """The document at ``path``; None when there is none. Any other failure (a storage
    error, a damaged file) raises _Unreadable: what cannot be read cannot be released."""
    try:
        raw = storage.read_text(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if not storage.exists(path):
            return None
        raise _Unreadable(f"{path}: {exc}") from exc
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise _Unreadable(f"{path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise _Unreadable(f"{path}: not a JSON object")
    return doc


def _newest_mtime(folder: str) -> float | None:
    times = [i.mtime.timestamp() for i in storage.list_dir(folder) if i.mtime is not None]
    return max(times) if times else None


def snapshot_holds(
    data_dir: str,
    source: str,
    snapshot_of: SnapshotLookup,
    segments: Sequence[StagedSegment],
    *,
    now: float,
    horizon: float,
) -> tuple[list[Hold], list[tuple[str, str]]]:
    """The holds of the open snapshots (and of those done within the horizon), and the
    (snapshot id, folder) of the others."""
    try:
        return _snapshot_holds(data_dir, source, snapshot_of, segments, now, horizon)
    except (_Unreadable, FormatError, KeyError, TypeError) as exc:
        return [Hold(f"a snapshot file that cannot be read ({exc}); fix or remove it", everything=True)], []


def _snapshot_holds(
    data_dir: str,
    source: str,
    snapshot_of: SnapshotLookup,
    segments: Sequence[StagedSegment],
    now: float,
    horizon: float,
) -> tuple[list[Hold], list[tuple[str, str]]]:
    holds, closed = [], []
    for _table_dir, sid, folder in _snapshot_folders(data_dir, source):
        plan_file = storage.join(folder, "plan.json")
        plan = _read_json(plan_file)
        if plan is not None:
            plan = PLAN.read(plan, plan_file)
        if plan is None or "table" not in plan:
            # a plan being written, or a folder this version does not know: the horizon decides
            closed.append((sid, folder))
            continue
        table_id = str(plan["table"])
        stored = snapshot_of(table_id)
        status = None if stored is None else str(stored[1])
        changed = None if stored is None or len(stored) < 3 else stored[2]
        # a snapshot done within the horizon: its commit (or a retry of it) still reads its
        # converge watermark to sweep the mirror, after the status was stored
        just_done = status == "done" and changed is not None and changed >= now - horizon
        if stored is None or stored[0] != sid or (status not in OPEN_STATUSES and not just_done):
            closed.append((sid, folder))
            continue
        label = f"the {status} snapshot {sid} of table {table_id}"
        if just_done:
            mark = plan.get("converge_watermark")
            found, _ = _find(segments, [mark] if mark else [])
            if mark in found:
                holds.append(Hold(label + " (its convergence)", position=Position.decode(found[mark][0])))
            continue
        ids = {plan["converge_watermark"]} if plan.get("converge_watermark") else set()
        reach: list[Position] = []  # where a chunk read on a standby reaches back to (core/visibility.py)
        for name in storage.list_names(folder, suffix=".parquet.json"):
            side = _read_json(storage.join(folder, name))
            if side is not None and not side.get("merged"):
                ids.add(side["result"]["low_watermark"])
                seen = side["result"].get("visibility") or ""
                if seen.startswith(REPLAYED_BEFORE):
                    reach.append(ReplayedBefore.parse(seen).window_floor)
        found, unknown = _find(segments, ids)
        if unknown:  # refresh_index describes every segment first; this only guards a misuse
            return [Hold("segments the index does not describe", everything=True)], []
        positions = [Position.decode(hit[0]) for hit in found.values()] + reach
        plan_time = _newest_plan_time(folder)
        # an id not staged yet is later than every staged segment: it holds nothing here
        holds.append(
            Hold(
                label,
                position=min(positions) if positions else None,
                since=plan_time if plan_time is not None else 0.0,
            )
        )
    return holds, closed


def _find(segments: Sequence[StagedSegment], ids: Iterable[str]) -> tuple[dict[str, tuple[str, int]], list]:
    """find_in_index, with position marks (watermark strategy "log") at the position they name."""
    ids = set(ids)
    marks = {i: (p.encode(), ts) for i in ids if (hit := marked_position(i)) is not None for p, ts in [hit]}
    found, unknown = find_in_index(segments, ids - marks.keys())
    return {**found, **marks}, unknown


def _newest_plan_time(folder: str) -> float | None:
    for i in storage.list_dir(folder):
        if i.base_name == "plan.json" and i.mtime is not None:
            return i.mtime.timestamp()
    return None


def staging_holds(
    data_dir: str, source: str, policy: RetentionPolicy, segments: Sequence[StagedSegment], now: float
) -> tuple[list[Hold], list[tuple[str, str]]]:
    holds = [
        Hold(f"the replay horizon ({policy.horizon_seconds / 3600:g} h)", since=now - policy.horizon_seconds)
    ]
    for sink in policy.sinks:
        mark = read_marker(data_dir, source, sink)
        if mark is None:
            holds.append(Hold(f"sink {sink!r}, which has applied nothing yet", everything=True))
        else:
            holds.append(Hold(f"sink {sink!r} (applied up to {mark})", after=mark))
    snap, closed = snapshot_holds(
        data_dir, source, policy.snapshot_of, segments, now=now, horizon=policy.horizon_seconds
    )
    return holds + snap, closed


def prune_staging(
    data_dir: str,
    source: str,
    policy: RetentionPolicy,
    *,
    now: float | None = None,
    before_delete: Callable[[StagedSegment], None] | None = None,
) -> PruneResult:
    """(Under the capture lock.) Remove what nothing holds; the segment index is rewritten
    without the removed segments. ``before_delete``: a test's hook between deciding and deleting."""
    now = time.time() if now is None else now
    changelog = changelog_dir(data_dir, source)
    segments = refresh_index(changelog)
    holds, closed = staging_holds(data_dir, source, policy, segments, now)
    gone: list[StagedSegment] = []
    held_by = None
    for s in segments:  # oldest first; the first held one stops the sweep
        holder = next((h for h in holds if h.holds(s)), None)
        if holder is not None:
            held_by = holder.reason
            break
        gone.append(s)
    for s in gone:
        if before_delete is not None:
            before_delete(s)
        storage.delete(s.path)
    if gone:
        names = {s.name for s in gone}
        write_index(
            changelog, {s.name: s.info for s in segments if s.name not in names and s.info is not None}
        )
    deleted_snapshots = 0
    for sid, folder in closed:
        newest = _newest_mtime(folder)
        if newest is not None and newest < now - policy.horizon_seconds:
            storage.delete_dir(folder)
            deleted_snapshots += 1
            log.info("staging retention: removed the folder of snapshot %s (%s)", sid, folder)
    kept = [s for s in segments if s not in gone]
    result = PruneResult(
        len(gone),
        sum(s.info.bytes for s in gone if s.info),
        len(kept),
        sum(s.info.bytes for s in kept if s.info),
        deleted_snapshots,
        held_by if kept else None,
    )
    log.info("%s", result.describe())
    return result
