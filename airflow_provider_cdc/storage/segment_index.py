"""The staged changelog's index (``_index.json``): what readers need of each segment without
opening it. A cache, never the truth, written only under the capture lock (docs/DESIGN.md,
"Staging over time"); a segment rewritten under its name holds the same events, so an entry
never goes stale for its name.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from .. import storage
from ..core.formats import SEGMENT_INDEX
from ..core.position import Position
from .layout import parse_segment_name

log = logging.getLogger(__name__)

INDEX_NAME = "_index.json"
#: how far the staged changelog is complete: every transaction before this position is staged
THROUGH_NAME = "_through.json"


@dataclass(frozen=True)
class SegmentInfo:
    rows: int
    bytes: int
    staged_at: float  # seconds since the epoch (when the index first saw it)
    watermarks: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (encoded position, ts_ms)
    #: the smallest and largest numeric transaction id (PostgreSQL xid) of its events (None: it has
    #: none); core/visibility.py looks segments up by it
    xids: tuple[int, int] | None = None
    #: the newest source commit time (ms) of its events (None: none, or an entry from before it
    #: was recorded): how fresh the outputs are once it is applied (status.freshness)
    max_ts_ms: int | None = None

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "bytes": self.bytes,
            "staged_at": self.staged_at,
            "watermarks": {k: list(v) for k, v in self.watermarks.items()},
            "xids": None if self.xids is None else list(self.xids),
            "max_ts_ms": self.max_ts_ms,
        }

    @classmethod
    def from_json(cls, d: dict) -> SegmentInfo:
        xids = d["xids"]
        return cls(
            int(d["rows"]),
            int(d["bytes"]),
            float(d["staged_at"]),
            {str(k): (str(v[0]), int(v[1] or 0)) for k, v in d["watermarks"].items()},
            None if xids is None else (int(xids[0]), int(xids[1])),
            None if d.get("max_ts_ms") is None else int(d["max_ts_ms"]),
        )


@dataclass(frozen=True)
class StagedSegment:
    first: Position
    last: Position
    path: str
    info: SegmentInfo | None  # None: the index does not name it (yet)

    @property
    def name(self) -> str:
        return storage.basename(self.path)


def index_path(changelog: str) -> str:
    return storage.join(changelog, INDEX_NAME)


def read_index(changelog: str) -> dict[str, SegmentInfo]:
    """name -> SegmentInfo; empty when there is no index or it cannot be read (then every
    segment is opened, as before the index existed)."""
    try:
        raw = storage.read_text(index_path(changelog))
    except OSError:  # FileNotFoundError locally; object stores may say it otherwise
        if not storage.exists(index_path(changelog)):
            return {}
        raise
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        log.warning(
            "the staged changelog's index %s cannot be read (%s): every segment is opened instead",
            index_path(changelog),
            exc,
        )
        return {}
    doc = SEGMENT_INDEX.read(doc, index_path(changelog))
    try:
        return {name: SegmentInfo.from_json(d) for name, d in doc["segments"].items()}
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        log.warning(
            "the staged changelog's index %s cannot be read (%s): every segment is opened instead",
            index_path(changelog),
            exc,
        )
        return {}


def write_index(changelog: str, infos: dict[str, SegmentInfo]) -> None:
    storage.write_text(
        index_path(changelog),
        json.dumps(
            SEGMENT_INDEX.stamp({"segments": {n: i.to_json() for n, i in sorted(infos.items())}}),
            separators=(",", ":"),
        ),
    )


def record_through(changelog: str, position: Position, ts_ms: int) -> None:
    """(Under the capture lock, after a read's segments are staged.) Every transaction of the
    log before ``position`` is staged: position marks up to it are found (staged.py). Never
    moves back."""
    current = staged_through(changelog)
    if current is not None and current[0] >= position:
        return
    storage.write_text(
        storage.join(changelog, THROUGH_NAME),
        json.dumps({"position": position.encode(), "ts_ms": int(ts_ms)}),
    )


def staged_through(changelog: str) -> tuple[Position, int] | None:
    """(position, when recorded in ms) of :func:`record_through`; None before any."""
    path = storage.join(changelog, THROUGH_NAME)
    try:
        doc = json.loads(storage.read_text(path))
    except OSError:
        if not storage.exists(path):
            return None
        raise
    return Position.decode(doc["position"]), int(doc["ts_ms"])


def staged_segments(changelog: str) -> list[StagedSegment]:
    """The segments in ``changelog`` now, in position order, each with what the index says of it."""
    return _listed(changelog, read_index(changelog))


def _listed(changelog: str, index: dict[str, SegmentInfo]) -> list[StagedSegment]:
    out = []
    for info in storage.list_dir(changelog):
        name = info.base_name
        if name.startswith("seg-") and name.endswith(".parquet") and info.type == pafs.FileType.File:
            first, last = parse_segment_name(name)
            out.append(StagedSegment(first, last, storage.join(changelog, name), index.get(name)))
    return sorted(out, key=lambda s: (s.first, s.last, s.path))


def changelog_used(changelog: str) -> bool:
    """Whether a capture ever staged anything here (a segment, or the index that outlives the
    segments retention removed)."""
    return storage.exists(index_path(changelog)) or bool(staged_segments(changelog))


def describe_segment(path: str, *, staged_at: float | None = None) -> SegmentInfo:
    """Open one segment: its row count (footer), size and watermark rows."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    fs, p = storage.filesystem(path)
    size = fs.get_file_info(p).size or 0
    with fs.open_input_file(p) as fh:
        pf = pq.ParquetFile(fh)
        rows = pf.metadata.num_rows
        t = pf.read(columns=["position", "op", "watermark", "ts_ms", "origin"])
    marks = first_writes(t.filter(pc.equal(t["op"], "w")))
    newest = pc.max(t["ts_ms"]).as_py() if t.num_rows else None
    return SegmentInfo(
        rows,
        int(size),
        time.time() if staged_at is None else staged_at,
        marks,
        xid_range(pc.struct_field(t["origin"], "tx")),
        None if newest is None else int(newest),
    )


def xid_range(txs) -> tuple[int, int] | None:
    """(min, max) of the numeric transaction ids among ``txs`` (staged ``origin.tx``); None: none."""
    import pyarrow as pa
    import pyarrow.compute as pc

    digits = txs.filter(pc.fill_null(pc.utf8_is_digit(txs), False))
    if len(digits) == 0:
        return None
    mm = pc.min_max(pc.cast(digits, pa.int64()))
    return int(mm["min"].as_py()), int(mm["max"].as_py())


def first_writes(
    watermark_rows, found: dict[str, tuple[str, int]] | None = None
) -> dict[str, tuple[str, int]]:
    """id -> (encoded position, ts_ms) of the first write of each watermark among ``watermark_rows``
    (a table of position, watermark, ts_ms), added to ``found``."""
    found = {} if found is None else found
    cols = (watermark_rows[c].to_pylist() for c in ("position", "watermark", "ts_ms"))
    for pos, wid, ts in zip(*cols, strict=True):
        if wid is not None and (wid not in found or pos < found[wid][0]):
            found[wid] = (pos, ts or 0)
    return found


def refresh_index(changelog: str) -> list[StagedSegment]:
    """(Under the capture lock.) Describe the segments the index does not name yet, leave out
    the names that are gone, write the index back when it changed; the segments with their infos."""
    index = read_index(changelog)
    segments = [
        s if s.info is not None else StagedSegment(s.first, s.last, s.path, describe_segment(s.path))
        for s in _listed(changelog, index)
    ]
    if set(index) != {s.name for s in segments}:
        write_index(changelog, {s.name: s.info for s in segments})
    return segments


def find_in_index(
    segments: Sequence[StagedSegment], ids: Iterable[str]
) -> tuple[dict[str, tuple[str, int]], list]:
    """The first staged write of each id the index knows of, and the segments it does not
    describe (to open): ``(found, unknown)``."""
    wanted = set(ids)
    found: dict[str, tuple[str, int]] = {}
    unknown = []
    for s in segments:
        if s.info is None:
            unknown.append((s.first, s.last, s.path))
            continue
        for wid in wanted.intersection(s.info.watermarks):
            hit = s.info.watermarks[wid]
            if wid not in found or hit[0] < found[wid][0]:
                found[wid] = hit
    return found, unknown
