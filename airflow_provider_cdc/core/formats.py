"""The format version of each thing the package persists, and the one place a migration goes.

A :class:`Format` per persisted format names its version field and the version this package
writes. Writers stamp what they write (:meth:`Format.stamp`); readers pass what they read
through :meth:`Format.read`, which returns it at the current version or raises
:class:`FormatError` naming where it was read and what to do. To change a format: raise its
``version`` here and add ``migrations[old] = function`` (a document of version ``old`` in,
one of ``old + 1`` out). docs/DESIGN.md, "Persisted formats".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import StateError


class FormatError(StateError):
    """A persisted document has a format version this package does not read."""


@dataclass(frozen=True)
class Format:
    name: str  # what the document is, for messages
    version: int  # the version this package writes
    remedy: str  # what to do with a document of a version this package cannot read
    key: str = "version"  # the field (or table property) holding the version
    #: version n -> a function turning a document of version n into one of version n + 1
    migrations: Mapping[int, Callable[[dict], dict]] = field(default_factory=dict)

    def stamp(self, doc: Mapping[str, Any]) -> dict:
        """``doc`` with this format's version first (a copy)."""
        return {self.key: self.version, **{k: v for k, v in doc.items() if k != self.key}}

    def found(self, doc: Any) -> int | None:
        """The version ``doc`` says it has (a table property's text read as a number); None: none."""
        raw = doc.get(self.key) if isinstance(doc, Mapping) else None
        if isinstance(raw, str) and raw.isdigit():
            return int(raw)
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else None

    def read(self, doc: Any, where: str) -> dict:
        """``doc`` (read from ``where``: a file, a Variable, a table) at this format's version,
        migrated when it is older and a migration is registered; FormatError otherwise."""
        version = self.found(doc)
        while version != self.version:
            step = self.migrations.get(version) if version is not None else None
            if step is None:
                raise FormatError(self.refusal(doc, where))
            doc = step(dict(doc))
            version = self.found(doc)
        return dict(doc)

    def refusal(self, doc: Any, where: str) -> str:
        version = self.found(doc)
        raw = doc.get(self.key) if isinstance(doc, Mapping) else None
        if version is not None and version > self.version:
            return (
                f"{where}: this {self.name} has format version {version}, written by a newer "
                f"airflow-provider-cdc (this one reads version {self.version}). Upgrade airflow-provider-cdc "
                f"wherever the pipeline runs, or {self.remedy}"
            )
        what = f"format version {raw!r}" if raw is not None else f"no format version ({self.key!r})"
        return (
            f"{where}: this {self.name} has {what}, which this airflow-provider-cdc does not read "
            f"(it reads version {self.version}). {self.remedy[:1].upper()}{self.remedy[1:]}"
        )


#: core/progress.py SnapshotProgress JSON: the snapshot register (control/) and its Variable copy
PROGRESS = Format(
    "snapshot progress",
    2,
    "move the snapshot register (control/ in the data directory) away and start the snapshot again",
)
#: a table's snapshot plan (storage/layout.py plan_path), written at plan, read by every chunk task
PLAN = Format("snapshot plan", 1, "stop the snapshot and start a new one")
#: the staged changelog's index (storage/segment_index.py ``_index.json``), a cache of the segments
SEGMENT_INDEX = Format(
    "staged changelog index", 1, "delete the file: the next capture writes it again from the segments"
)
#: a mirror's Delta table properties (``cdc.*``, sinks/mirror_table.py)
MIRROR = Format(
    "mirror table",
    # 2: superseded rows and tombstones masked by deletion vectors (sinks/delta_buckets.py);
    # a mirror of version 1 is upgraded in place by its next commit, not by a migration here
    2,
    "re-snapshot the table into a new mirror (airflow cdc snapshot start)",
    key="cdc.format_version",
)

ALL = (PROGRESS, PLAN, SEGMENT_INDEX, MIRROR)
