"""A source transaction held until its end: its rows events in memory up to a bound, then in
gzipped JSON-lines part files; savepoints; an XA transaction's parts persisted until its
XA COMMIT or ROLLBACK. Memory does not grow with the transaction.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Protocol

from ... import storage
from ...core.errors import SourceError
from ...core.events import ChangeEvent, LogEvent, WatermarkEvent
from ...core.position import Position
from .types import unquote

# --------------------------------------------------------------------------- held groups and XA


class GroupReader(Protocol):
    """What a held group asks of the binlog reader holding it (log_reader.MyLogReader)."""

    source: str

    def refuse(self, what: str) -> None:
        """Stop at (or, on_unreadable="skip", pass) changes capture cannot read."""

    def transactional(self, event: LogEvent) -> bool:
        """Whether the event's table rolls back with its transaction."""


#: the folder under the changelog staging folder where prepared XA transactions wait
XA_DIR = "_xa"
_XID_PART = r"\s*(?:X'([0-9A-Fa-f]*)'|'((?:[^']|'')*)')\s*"
_XA_END_RE = re.compile(
    rf"^XA\s+(?:COMMIT|ROLLBACK){_XID_PART}(?:,{_XID_PART}(?:,\s*(\d+)\s*)?)?(?:ONE\s+PHASE\s*)?;?\s*$",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class Xid:
    """An XA transaction id: formatID, gtrid and bqual (what XA RECOVER shows)."""

    format_id: int
    gtrid: bytes
    bqual: bytes

    @property
    def key(self) -> str:
        """A file-name-safe form, the same for every event naming this id."""
        raw = f"{self.format_id}-{self.gtrid.hex()}-{self.bqual.hex()}"
        return raw if len(raw) <= 120 else "h" + hashlib.sha256(raw.encode()).hexdigest()

    def __str__(self) -> str:
        def lit(b: bytes) -> str:
            try:
                t = b.decode("ascii")
                if t.isprintable():
                    return "'" + t.replace("'", "''") + "'"
            except UnicodeDecodeError:
                pass
            return f"X'{b.hex()}'"

        parts = [lit(self.gtrid)]
        if self.bqual or self.format_id != 1:
            parts.append(lit(self.bqual))
        if self.format_id != 1:
            parts.append(str(self.format_id))
        return "XA transaction " + ",".join(parts)

    @classmethod
    def parse(cls, sql: str) -> Xid | None:
        """The id of ``XA COMMIT|ROLLBACK X'..',X'..',n`` (the binlog's form) or quoted text."""
        m = _XA_END_RE.match(sql)
        if m is None:
            return None

        def val(hexa: str | None, text: str | None) -> bytes:
            return (
                bytes.fromhex(hexa) if hexa is not None else (text or "").replace("''", "'").encode("utf-8")
            )

        return cls(int(m.group(5) or 1), val(m.group(1), m.group(2)), val(m.group(3), m.group(4)))


def savepoint_name(sql: str) -> str:
    """``SAVEPOINT `a` `` / ``ROLLBACK TO [SAVEPOINT] `a` `` -> ``a`` (case-insensitive, as the server)."""
    name = re.sub(
        r"^(?:SAVEPOINT|ROLLBACK\s+(?:WORK\s+)?TO(?:\s+SAVEPOINT)?)\s+", "", sql.strip(), flags=re.I
    )
    return unquote(name.strip().rstrip(";").strip()).lower()


def _event_json(e: LogEvent) -> str:
    if isinstance(e, WatermarkEvent):
        return json.dumps(["w", e.id, e.position.encode(), e.ts_ms])
    return json.dumps(
        ["c", e.table, e.op, e.key, e.position.encode(), e.before, e.after, e.ts_ms, e.origin],
        ensure_ascii=False,
    )


def _event_from_json(line: str) -> LogEvent:
    r = json.loads(line)
    if r[0] == "w":
        return WatermarkEvent(r[1], Position.decode(r[2]), r[3])
    return ChangeEvent(
        r[1],
        r[2],
        r[3],
        Position.decode(r[4]),
        r[5],
        r[6],
        r[7],
        origin=None if r[8] is None else tuple(r[8]),
    )


class Scratch:
    """A local folder for the parts of held groups of one read, removed when the read ends."""

    def __init__(self) -> None:
        self.path: str | None = None

    def folder(self, name: str) -> str:
        if self.path is None:
            self.path = tempfile.mkdtemp(prefix="cdc-mysql-held-")
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


class HeldGroup:
    """The events of a binlog group that may not be staged before the group ends: one that may
    still roll back changes (``ROLLBACK``, ``ROLLBACK TO SAVEPOINT``), or an XA transaction
    until its ``XA COMMIT``. In memory up to ``max_events`` events or ``max_bytes`` bytes of
    rows events, then in gzipped JSON-lines part files (I11): local scratch, or for XA a folder
    under the changelog staging folder, written durably before the offset may pass the
    prepare (I6). Rolled-back ranges are kept as event index ranges and applied when the
    events are read back, so they work on parts already on disk."""

    def __init__(
        self,
        reader: GroupReader,
        max_events: int,
        max_bytes: int,
        scratch: Scratch | None,
        start: tuple[int, int] | None,
    ) -> None:
        self.reader, self.max_events, self.max_bytes, self.scratch = reader, max_events, max_bytes, scratch
        self.start = start or (0, 0)  # (file index, offset) of the group's first event: names its folder
        self.events: list[LogEvent] = []
        self.bytes = 0
        self.count = 0  # events added, spilled ones included
        self.parts: list[tuple[str, int]] = []  # part file names in ``dir`` and their rows-event bytes
        self.dir: str | None = None
        self.xa = False
        self.savepoints: dict[str, int] = {}
        self.drops: list[tuple[int, int]] = []  # [start, end) event ranges rolled back to a savepoint

    def _name(self) -> str:
        return f"g-{self.start[0]:08d}-{self.start[1]:012d}"

    def make_xa(self, root: str) -> None:
        """Hold this group as an XA transaction: its parts go to ``root`` (durable)."""
        if self.xa:
            return
        if self.parts:
            raise SourceError(
                f"source {self.reader.source!r}: XA START after {self.count} events of its group"
            )
        self.xa, self.dir = True, storage.join(root, self._name())

    def add(self, events: list[LogEvent], nbytes: int) -> None:
        self.events.extend(events)
        self.count += len(events)
        self.bytes += nbytes
        if len(self.events) >= self.max_events or self.bytes >= self.max_bytes:
            self.spill()

    def spill(self) -> None:
        if not self.events:
            return
        if self.dir is None:
            self.dir = self.scratch.folder(self._name())
        name = f"part-{len(self.parts):06d}.jsonl-gz"  # no ".gz": pyarrow streams would (de)compress by name
        payload = "\n".join(map(_event_json, self.events)).encode("utf-8")
        storage.write_bytes(storage.join(self.dir, name), gzip.compress(payload, compresslevel=1))
        self.parts.append((name, self.bytes))
        self.events, self.bytes = [], 0

    def savepoint(self, name: str) -> None:
        self.savepoints[name] = self.count

    def rollback_to(self, name: str) -> None:
        start = self.savepoints.get(name)
        if start is None:
            self.reader.refuse(
                f"ROLLBACK TO SAVEPOINT {name} without its SAVEPOINT in the same binlog group "
                f"(group at {self._name()})"
            )
            return
        if start < self.count:
            self.drops.append((start, self.count))

    def persist(self, manifest: str, xid: Xid, where: str) -> None:
        """XA PREPARE: every event in part files, then the manifest naming them (I6)."""
        self.spill()
        meta = {
            "xid": str(xid),
            "prepare": where,
            "dir": storage.basename(self.dir) if self.parts else None,
            "parts": self.parts,
            "drops": self.drops,
            "count": self.count,
        }
        storage.write_text(manifest, json.dumps(meta))

    @classmethod
    def load(cls, reader: GroupReader, manifest: str) -> HeldGroup:
        meta = json.loads(storage.read_text(manifest))
        group = cls(reader, 0, 0, None, None)
        group.xa = True
        group.dir = storage.join(storage.parent(manifest), meta["dir"]) if meta.get("dir") else None
        group.parts = [(n, int(b)) for n, b in meta["parts"]]
        group.drops = [(int(a), int(b)) for a, b in meta["drops"]]
        group.count = int(meta["count"])
        return group

    def _chunks(self) -> Iterator[tuple[list[LogEvent], int]]:
        for name, nbytes in self.parts:
            data = gzip.decompress(storage.read_bytes(storage.join(self.dir, name))).decode("utf-8")
            yield [_event_from_json(line) for line in data.split("\n") if line], nbytes
        if self.events:
            yield self.events, self.bytes

    def drain(
        self, *, rollback: bool, at: tuple[int, int] | None = None
    ) -> Iterator[tuple[list[LogEvent], int]]:
        """The events that stand, part by part: all but the transactional tables' changes of
        rolled-back ranges (every change when ``rollback``). ``at``: (file index, offset) of an
        XA COMMIT, which becomes their position, numbered in order."""
        check = rollback or bool(self.drops)
        transactional = self.reader.transactional
        i = n = 0
        for events, nbytes in self._chunks():
            if check:
                kept = []
                for e in events:
                    if not ((rollback or any(a <= i < b for a, b in self.drops)) and transactional(e)):
                        kept.append(e)
                    i += 1
                events = kept
            if at is not None:
                events = [replace(e, position=Position(at[0], at[1], n + j)) for j, e in enumerate(events)]
            n += len(events)
            if events:
                yield events, nbytes

    def discard(self) -> None:
        if self.parts and self.dir is not None:
            storage.delete_dir(self.dir)
        self.events, self.parts = [], []
