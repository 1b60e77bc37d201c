"""The mirror's own reading and writing of its Delta log: the active ``add`` actions with their
deletion vectors (which deltalake's Python API does not expose), and the commits that carry
deletion vectors (which delta-rs's ``create_write_transaction`` drops): JSON actions written
put-if-absent as the next version, so exactly one writer gets a version, as with delta-rs
(storage.put_if_absent). Checkpoints stay delta-rs's (they keep the vectors).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from deltalake.exceptions import CommitFailedError

from .. import storage

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"


def _log_file(table_uri: str, name: str) -> str:
    return storage.join(table_uri, LOG_DIR, name)


def _plain(value):
    """A checkpoint's map column (a list of pairs in Python) as a dict; other values as they are."""
    if isinstance(value, list) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return dict(value)
    return value


def _clean(action: Mapping) -> dict:
    out = {}
    for k, v in action.items():
        if v is None or k.endswith("_parsed"):
            continue
        out[k] = _plain(v)
    if isinstance(out.get("deletionVector"), Mapping):
        out["deletionVector"] = {k: v for k, v in out["deletionVector"].items() if v is not None}
    return out


@dataclass
class LogState:
    """The active files of one version: path -> its ``add`` action (deletion vector included),
    and the removed files the log still keeps (path -> their ``remove`` actions), for vacuum."""

    version: int
    adds: dict[str, dict] = field(default_factory=dict)
    removes: dict[str, list[dict]] = field(default_factory=dict)
    metadata: dict | None = None  # the newest metaData action (its configuration a dict)
    protocol: dict | None = None

    def apply(self, actions: Iterable[Mapping]) -> None:
        adds, removes = [], []
        for a in actions:
            if "add" in a:
                adds.append(a["add"])
            elif "remove" in a:
                removes.append(a["remove"])
            elif "metaData" in a:
                self.metadata = _clean(a["metaData"])
            elif "protocol" in a:
                self.protocol = _clean(a["protocol"])
        for r in removes:  # a commit's removes first: a remove + add of one path replaces its vector
            r = _clean(r)
            self.adds.pop(r["path"], None)
            self.removes.setdefault(r["path"], []).append(r)
        for a in adds:
            a = _clean(a)
            self.adds[a["path"]] = a


def _checkpoint_before(table_uri: str, version: int) -> tuple[int, list[str]] | None:
    """The newest checkpoint at or before ``version``: (its version, its files)."""
    names = storage.list_names(storage.join(table_uri, LOG_DIR), suffix=".parquet")
    found: dict[int, list[str]] = {}
    for n in names:
        parts = n.split(".")
        if len(parts) >= 3 and parts[1] == "checkpoint" and parts[0].isdigit():
            found.setdefault(int(parts[0]), []).append(n)
    usable = [v for v in found if v <= version]
    if not usable:
        return None
    v = max(usable)
    files = sorted(found[v])
    if len(files) > 1 and not all(len(f.split(".")) == 5 for f in files):
        files = [f for f in files if len(f.split(".")) == 5]  # a multi-part checkpoint
    return v, files


def _read_checkpoint(table_uri: str, files: list[str], state: LogState) -> None:
    for name in files:
        fs, p = storage.filesystem(_log_file(table_uri, name))
        schema = pq.read_schema(p, filesystem=fs)
        cols = [c for c in ("add", "remove", "metaData", "protocol") if c in schema.names]
        t = pq.read_table(p, filesystem=fs, columns=cols)
        for kind in ("metaData", "protocol"):
            if kind in cols:
                found = [_clean(x) for x in t.column(kind).to_pylist() if x]
                if found:
                    setattr(state, "metadata" if kind == "metaData" else "protocol", found[-1])
        if "remove" in cols:
            for r in t.column("remove").to_pylist():
                if r:
                    r = _clean(r)
                    state.removes.setdefault(r["path"], []).append(r)
        if "add" in cols:
            for a in t.column("add").to_pylist():
                if a:
                    a = _clean(a)
                    state.adds[a["path"]] = a


def _read_commit(table_uri: str, version: int) -> list[dict]:
    text = storage.read_text(_log_file(table_uri, f"{version:020d}.json"))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


_cache: dict[str, LogState] = {}
_cache_lock = threading.Lock()


def log_state(table_uri: str, version: int, table_id: str = "") -> LogState:
    """The active files (and kept removes) of the table at ``version``: the newest checkpoint at
    or before it, then the JSON commits after it; the last state read per table is kept, so a
    writer that reads every round replays only the commits since (``table_id``, the Delta
    table's id, tells a table made again at the same place from the one cached)."""
    key = f"{table_id}|{table_uri}"
    with _cache_lock:
        cached = _cache.get(key)
    if cached is not None and cached.version <= version:
        state = LogState(
            cached.version,
            dict(cached.adds),
            {k: list(v) for k, v in cached.removes.items()},
            cached.metadata,
            cached.protocol,
        )
        start = cached.version + 1
    else:
        cp = _checkpoint_before(table_uri, version)
        state = LogState(-1)
        start = 0
        if cp is not None:
            _read_checkpoint(table_uri, cp[1], state)
            start = cp[0] + 1
    try:
        for v in range(start, version + 1):
            state.apply(_read_commit(table_uri, v))
    except FileNotFoundError:  # a commit the log's clean-up removed since: start from a checkpoint
        if cached is None:
            raise
        with _cache_lock:
            _cache.pop(key, None)
        return log_state(table_uri, version, table_id)
    state.version = version
    with _cache_lock:
        _cache[key] = state
    return state


def write_commit(table_uri: str, version: int, actions: list[Mapping]) -> None:
    """Write ``actions`` as commit ``version`` of the table, put-if-absent: CommitFailedError
    when another writer committed that version first (the caller re-reads and tries again,
    as with delta-rs's own conflicts)."""
    body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode("utf-8")
    try:
        storage.put_if_absent(_log_file(table_uri, f"{version:020d}.json"), body)
    except storage.AlreadyExists:
        raise CommitFailedError(f"version {version} of {table_uri} was committed by another writer") from None


_latest: dict[str, int] = {}


def latest_version(table_uri: str) -> int:
    """The table's newest version (-1: no log there). The newest one this process saw is the
    start, checked to be there still (a table removed and made again starts over), then the
    versions after it are probed one by one: a writer that commits every round asks for one or
    two objects, not a listing of the whole log."""
    v = _latest.get(table_uri, -1)
    if v >= 0 and not storage.exists(_log_file(table_uri, f"{v:020d}.json")):
        v = -1  # the table was removed (and maybe made again): nothing cached of it holds
        with _cache_lock:
            for key in [k for k in _cache if k.split("|", 1)[1] == table_uri]:
                del _cache[key]
    if v < 0:
        names = storage.list_names(storage.join(table_uri, LOG_DIR), suffix=".json")
        found = [int(n[:20]) for n in names if len(n) == 25 and n[:20].isdigit()]
        v = max(found, default=-1)
    while storage.exists(_log_file(table_uri, f"{v + 1:020d}.json")):
        v += 1
    if v >= 0:
        _latest[table_uri] = v
    return v


def after_commit(table_uri: str, version: int, props: Mapping[str, str]) -> None:
    """What delta-rs's post-commit hook does after its own commits: a checkpoint every
    ``delta.checkpointInterval`` versions (table property ``props``) and, then, the expired
    log entries removed."""
    from deltalake import DeltaTable

    raw = props.get("delta.checkpointInterval", "100")
    every = int(raw) if raw.isdigit() and int(raw) > 0 else 100
    if version == 0 or version % every:
        return
    try:
        dt = DeltaTable(table_uri, storage_options=storage.delta_storage_options(table_uri), version=version)
        dt.create_checkpoint()
        if props.get("delta.enableExpiredLogCleanup", "true") == "true":
            dt.cleanup_metadata()
    except Exception as exc:  # noqa: BLE001 - an optimisation: the next interval tries again
        log.warning("Delta table %s: checkpoint at version %d postponed (%s)", table_uri, version, exc)
