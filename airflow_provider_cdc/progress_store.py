"""Snapshot progress for the Airflow glue: the authority in the data directory
(pipeline/progress_store.py: one register a table, compare-and-set), published as one Airflow
Variable per (source, table) for Airflow's UI and ``airflow cdc status``; and each source's
capture lag, one Variable per source (``cdc_lag__{source}``, written by the capture task).

Every change goes through :func:`update` (read, change, compare-and-set, again on a
conflict), whoever makes it: the plan and commit steps, a chunk task that sees its DAG
paused, a failure callback, the CLI. Every decision (may a chunk read on, is a merge's
snapshot stopped, may compaction drop tombstones) reads the authority (:func:`load`). The
Variable is written after each change with what the authority holds then; it is a view
and may trail the authority by a moment (its JSON carries ``"copy": 1``). A progress an
earlier version stored only in the Variable (no such mark) is adopted by the authority at its
first read (version 1); a copy never is, so removing a data directory starts its sources over.

Variable key ``cdc_snapshot__{source}__{schema.table}``, both parts through the one name
encoder (core.schema.encode_path_segment): plain names stay as they are, any other character
is ``~HH``, so a table named ``a'b %s; é`` or ``x/y?z`` gives a key that the Task SDK can put
in its API URL. The key is injective (:func:`variable_key`): a source whose name holds
``__`` or ends in ``_`` has its ``_`` escaped too, and so has a table id's leading ``_``, so
``a__b`` + ``c.d`` and ``a`` + ``b__c.d`` get different keys. Such a source's progress
stored under the older, ambiguous key is still read when it names this source and table.
The value is core.progress.SnapshotProgress JSON (one table per Variable); it names its
source and table, so nothing decodes the key. Inside a task the Task SDK's ``Variable`` is
used (it talks to the API server); outside one (CLI, tests, scripts) the metadata database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from .core.errors import StateError
from .core.progress import SnapshotProgress, Status
from .core.schema import encode_path_segment
from .pipeline.progress_store import Change, ConflictError, RegisterProgressStore, SourceProgress, Versioned

KEY_PREFIX = "cdc_snapshot__"
#: marks a published copy: never adopted as the authority (an earlier version's value lacks it)
COPY_FIELD = "copy"
LAG_PREFIX = "cdc_lag__"
RUNNING, PAUSED, STOPPED, DONE, FAILED = (
    Status.RUNNING,
    Status.PAUSED,
    Status.STOPPED,
    Status.DONE,
    Status.FAILED,
)


def variable_key(source: str, table_id: str) -> str:
    """The key of ``(source, table_id)``, one per pair: the source part never holds ``__`` nor
    ends in ``_`` and the table part never starts with ``_``, so the first ``__`` after the
    prefix is the separator. Names that already met that keep the key they always had."""
    src = encode_path_segment(source, leading_dot_ok=True)
    if "__" in src or src.endswith("_"):
        src = src.replace("_", "~5F")  # "~5F" decodes to "_": still one name per encoding
    table = encode_path_segment(table_id, leading_dot_ok=True)
    if table.startswith("_"):
        table = "~5F" + table[1:]
    return f"{KEY_PREFIX}{src}__{table}"


def legacy_variable_key(source: str, table_id: str) -> str:
    """The key before :func:`variable_key` was injective (shared by ``a__b`` + ``c.d`` and
    ``a`` + ``b__c.d``): read only when its value names ``source`` and ``table_id``."""
    return f"{KEY_PREFIX}{encode_path_segment(source, leading_dot_ok=True)}__{encode_path_segment(table_id, leading_dot_ok=True)}"


def _names(raw: str, source: str, table_id: str) -> bool:
    """Whether a stored progress JSON is that of ``source`` and ``table_id`` alone."""
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return False
    return isinstance(value, dict) and value.get("source") == source and list(value.get("tables") or {}) == [table_id]


def _in_task() -> bool:
    try:
        from airflow.sdk.execution_time import task_runner
    except ImportError:
        return False
    return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None


def _get(key: str) -> str | None:
    if _in_task():
        from airflow.sdk import Variable

        return Variable.get(key, default=None)
    from airflow.models.variable import Variable as DbVariable

    return DbVariable.get(key, default_var=None)


def _set(key: str, value: str) -> None:
    if _in_task():
        from airflow.sdk import Variable

        Variable.set(key, value)
        return
    from airflow.models.variable import Variable as DbVariable

    DbVariable.set(key, value)


def _delete(key: str) -> None:
    if _in_task():
        from airflow.sdk import Variable

        Variable.delete(key)
        return
    from airflow.models.variable import Variable as DbVariable

    DbVariable.delete(key)


def _load(key: str) -> str | None:
    raw = _get(key)
    if raw in (None, ""):
        return None
    return raw if isinstance(raw, str) else json.dumps(raw)


def _legacy(source: str, table_id: str) -> tuple[str, str] | None:
    """(key, value) of this table's progress under the older key, when that differs from
    today's and holds this source's and table's progress (not another pair's of the same key)."""
    key = legacy_variable_key(source, table_id)
    if key == variable_key(source, table_id):
        return None
    raw = _load(key)
    return (key, raw) if raw is not None and _names(raw, source, table_id) else None


def _published(source: str, table_id: str) -> str | None:
    """The Variable's copy (today's key, else the older one when it names this pair)."""
    raw = _load(variable_key(source, table_id))
    if raw is None:
        legacy = _legacy(source, table_id)
        raw = None if legacy is None else legacy[1]
    return raw


class _AdoptingStore(RegisterProgressStore):
    """The register, which adopts at its first read a progress that an earlier version kept
    only in the Variable (written as version 1 unless another reader adopted it first)."""

    def read(self, source: str, table_id: str) -> Versioned:
        current = super().read(source, table_id)
        if current.version:
            return current
        raw = _published(source, table_id)
        if raw is None:
            return current
        if not _names(raw, source, table_id):  # a Variable anyone may write: it must be this pair's (I15)
            raise StateError(f"the Variable {variable_key(source, table_id)} does not hold the snapshot progress of "
                             f"source {source!r} and table {table_id} alone; it is not adopted. Delete or correct it")
        # a value that is not JSON, or whose snapshot id is not one: a StateError / ConfigurationError that says so
        progress = SnapshotProgress.from_json(raw)
        if COPY_FIELD in json.loads(raw):  # a copy outlives its authority (a data dir removed): not adopted
            return current
        try:
            super().write(source, table_id, progress, 0)
        except ConflictError:
            pass
        return super().read(source, table_id)


def store(data_dir: str) -> RegisterProgressStore:
    return _AdoptingStore(data_dir)


def for_source(source: str, data_dir: str) -> SourceProgress:
    """The snapshots of ``source``: the authority in ``data_dir``, each write published."""
    return SourceProgress(store(data_dir), source, published=lambda table_id, p: publish(source, table_id, p))


def read(source: str, table_id: str, data_dir: str) -> Versioned:
    """The authority's progress and version (a Variable-held progress adopted first)."""
    return store(data_dir).read(source, table_id)


def load(source: str, table_id: str, data_dir: str) -> SnapshotProgress | None:
    """The stored progress, or None when this table was never snapshotted."""
    return read(source, table_id, data_dir).progress


def load_raw(source: str, table_id: str, data_dir: str) -> str | None:
    p = load(source, table_id, data_dir)
    return None if p is None else p.to_json()


def update(source: str, table_id: str, data_dir: str, change: Change, *,
           between: Callable[[], None] | None = None) -> SnapshotProgress | None:
    """Apply ``change`` with compare-and-set (pipeline.progress_store.update), then publish
    what it wrote. Returns the progress after the change."""
    return for_source(source, data_dir).update(table_id, change, between=between)


def publish(source: str, table_id: str, progress: SnapshotProgress) -> None:
    """Write ``progress`` to the Variable (a copy under the older key goes: the CLI would list
    it twice). A view for Airflow's UI and the CLI: never read to decide anything, and two
    writers publishing at once may leave it one change behind until the next."""
    value = json.loads(progress.to_json())
    value[COPY_FIELD] = 1
    _set(variable_key(source, table_id), json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    legacy = _legacy(source, table_id)
    if legacy is not None:
        _delete(legacy[0])


def status(source: str, table_id: str, data_dir: str) -> str | None:
    p = load(source, table_id, data_dir)
    return None if p is None else str(p.status)


def request(source: str, table_id: str, action: str, data_dir: str, *,
            between: Callable[[], None] | None = None) -> SnapshotProgress:
    """Pause, resume or stop from outside a DAG run (CLI, tests): running chunk tasks see
    a pause or stop before their next chunk. Invalid transitions raise StateError."""
    from .core.errors import ConfigurationError, StateError

    verbs = ("pause", "resume", "stop")
    if action not in verbs:
        raise ConfigurationError(f"snapshot action {action!r} unknown here; use one of {', '.join(verbs)}")

    def change(p: SnapshotProgress | None) -> SnapshotProgress:
        if p is None:
            raise StateError(f"no snapshot of table {table_id} from source {source!r} to {action}; start one first")
        getattr(p, action)()
        return p

    return update(source, table_id, data_dir, change, between=between)


# --- capture lag -----------------------------------------------------------------------------
def lag_key(source: str) -> str:
    return f"{LAG_PREFIX}{encode_path_segment(source, leading_dot_ok=True)}"


#: the lag history kept with the last reading (for the UI's chart): this long, at most this many
LAG_HISTORY_SECONDS = 24 * 3600
LAG_HISTORY_POINTS = 720


def save_lag(source: str, lag: dict) -> None:
    """The capture's last lag reading of ``source`` (JSON: source, bytes, seconds, holder, risk,
    at, replica) and the readings of the last day before it (``history``: [at, bytes, seconds],
    at most LAG_HISTORY_POINTS, so the Variable stays small however long the pipeline runs).
    Only the source's capture writes it, under its capture lock."""
    key = lag_key(source)
    history: list = []
    try:
        old = json.loads(_get(key) or "{}")
        history = [h for h in old.get("history") or [] if isinstance(h, list) and len(h) == 3]
    except (TypeError, ValueError, AttributeError):
        history = []
    at = float(lag.get("at") or time.time())
    history.append([round(at, 3), int(lag.get("bytes") or 0), float(lag.get("seconds") or 0.0)])
    history = [h for h in history if h[0] >= at - LAG_HISTORY_SECONDS][-LAG_HISTORY_POINTS:]
    _set(key, json.dumps({"source": source, **lag, "history": history}, sort_keys=True))


# --- the last verify of each table ---------------------------------------------------------------
VERIFY_PREFIX = "cdc_verify__"


def verify_key(source: str, table_id: str) -> str:
    return (f"{VERIFY_PREFIX}{encode_path_segment(source, leading_dot_ok=True)}__"
            f"{encode_path_segment(table_id, leading_dot_ok=True)}")


def save_verify(source: str, table_id: str, result: dict) -> None:
    """The last ``airflow cdc verify`` of a table (JSON: ok, counts, repair conf, at), for the UI."""
    _set(verify_key(source, table_id), json.dumps({"source": source, "table": table_id, **result}, sort_keys=True))


def load_verifies(source: str | None = None) -> dict[tuple[str, str], dict]:
    """(source, table id) -> the last verify's result (outside tasks: CLI, UI)."""
    out = {}
    for _key, val in stored_values(VERIFY_PREFIX):
        try:
            doc = json.loads(val)
        except (TypeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("source") and doc.get("table") and source in (None, doc["source"]):
            out[(doc["source"], doc["table"])] = doc
    return out


def stored_values(prefix: str) -> list[tuple[str, str]]:
    """(key, value) of every Variable whose key starts with ``prefix``, from the metadata
    database (outside tasks: CLI, tests); ``_`` in the prefix is literal, not a LIKE wildcard."""
    from airflow.models.variable import Variable
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(Variable).filter(Variable.key.startswith(prefix, autoescape=True)).all()
        return [(r.key, r.val) for r in rows]


def load_lags(source: str | None = None) -> dict[str, dict]:
    """source -> its last lag reading, from the metadata database (outside tasks: CLI, tests)."""
    out = {}
    for _key, val in stored_values(LAG_PREFIX):
        try:
            lag = json.loads(val)
        except (TypeError, json.JSONDecodeError):
            continue
        if isinstance(lag, dict) and lag.get("source") and (source is None or lag["source"] == source):
            out[lag["source"]] = lag
    return dict(sorted(out.items()))
