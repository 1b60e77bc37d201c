"""Merging a snapshot's committed chunks while its later chunks are still read (docs/DESIGN.md,
"Components": merge while reading): which chunks are committed and not merged, and which of them
are ready. Reads storage only (no Airflow, no Spark).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence

from .. import storage
from ..core.errors import StateError
from ..core.schema import TableName
from ..storage.layout import changelog_dir
from ..storage.staged import staged_watermarks
from . import snapshot as steps

log = logging.getLogger(__name__)


def snapshots_of(work_items: Iterable[dict]) -> list[tuple[str, str]]:
    """(table id, snapshot id) of a plan's work items, in a stable order."""
    return sorted({(w["table"], w["snapshot_id"]) for w in work_items or () if isinstance(w, dict)})


def committed_unmerged(data_dir: str, source: str, work_items: Iterable[dict]) -> list[dict]:
    """ChunkResult dicts of the work items' snapshots that are committed (a sidecar) and not
    merged, in seq order per snapshot."""
    out: list[dict] = []
    for table_id, snapshot_id in snapshots_of(work_items):
        table = TableName.parse(table_id)
        out += [
            s["result"] for s in steps.read_sidecars(data_dir, source, table, snapshot_id) if not s["merged"]
        ]
    return out


def ready(data_dir: str, source: str, chunks: Sequence[dict]) -> tuple[list[dict], int]:
    """The chunks whose high watermark (and low, which precedes it) is staged, and how many
    are not. A chunk is ready on its own: the others' windows do not matter."""
    if not chunks:
        return [], 0
    found = staged_watermarks(changelog_dir(data_dir, source), {c["high_watermark"] for c in chunks})
    done = [c for c in chunks if c["high_watermark"] in found]
    return done, len(chunks) - len(done)


def not_merged(chunks: Sequence) -> list:
    """The chunks (ChunkResult objects or dicts) whose sidecar does not say merged: what a
    round's merge still has to write after an early merge took the rest. A chunk without a
    sidecar stays (the merge's own checks name it)."""
    out = []
    for c in chunks:
        path = c["path"] if isinstance(c, dict) else c.path
        sc = steps.sidecar_path(path)
        try:
            merged = json.loads(storage.read_text(sc)).get("merged", False) if storage.exists(sc) else False
        except (OSError, ValueError):
            merged = False
        if not merged:
            out.append(c)
    return out


def worth_merging(ready_rows: int, min_rows: int) -> bool:
    """An early merge pays a spark-submit's fixed cost: start one only for ``min_rows`` ready
    rows or more (0 disables merging while reading)."""
    return min_rows > 0 and ready_rows >= min_rows


def receipt_path(round_file: str) -> str:
    """Where a merge of ``round_file`` records the chunks it wrote (both engines)."""
    return f"{round_file.removesuffix('.json')}~merged.json"


def write_receipt(round_file: str, chunks: Sequence) -> None:
    """Written by a merge after its sinks committed: the paths of the chunks it merged."""
    paths = sorted(c["path"] if isinstance(c, dict) else c.path for c in chunks)
    storage.write_text(receipt_path(round_file), json.dumps(paths))


def check_receipt(round_file: str, chunks: Sequence[dict]) -> None:
    """Before a merge's chunks are marked merged: its receipt must name exactly them. A merge
    that wrote other chunks (a job handed a stale round file) must never get these marked
    merged: their rows would then never reach the sinks."""
    path = receipt_path(round_file)
    want = sorted(c["path"] for c in chunks)
    got = json.loads(storage.read_text(path)) if storage.exists(path) else None
    if got != want:
        raise StateError(
            f"the merge of {round_file} did not record merging its {len(want)} chunk(s) "
            f"({'no receipt' if got is None else f'its receipt names {len(got)} other chunk(s)'}); "
            "they are left to the round's merge"
        )
