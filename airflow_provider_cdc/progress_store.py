"""Snapshot progress in Airflow Variables: one per (source, table); and each source's capture
lag, one per source (``cdc_lag__{source}``, written by the capture task, read by ``status``).

Key ``cdc_snapshot__{source}__{schema.table}``, both parts through the one name encoder
(core.schema.encode_path_segment): plain names stay as they are, any other character is
``~HH``, so a table named ``a'b %s; é`` or ``x/y?z`` gives a key that the Task SDK can put
in its API URL. The key is injective (:func:`variable_key`): a source whose name holds
``__`` or ends in ``_`` has its ``_`` escaped too, and so has a table id's leading ``_``, so
``a__b`` + ``c.d`` and ``a`` + ``b__c.d`` get different keys. Such a source's progress
stored under the older, ambiguous key is still read when it names this source and table,
and moved to the new key by the next save. The value is core.progress.SnapshotProgress
JSON (one table per Variable); it names its source and table, so nothing decodes the key.
Inside a task the Task SDK's ``Variable`` is used (it talks to the API server); outside
one (CLI, tests, scripts) the metadata database model is used.

Writers: the plan step (start/pause/resume/stop) and the commit step. Chunk tasks only
read it (between chunks, to see pause/stop), so parallel chunk tasks never race on a
read-modify-write; their per-chunk state lives in sidecar files next to the chunks, and
the commit step records merged chunks here (SnapshotProgress.record_chunk is idempotent).
"""

from __future__ import annotations

import json

from .core.progress import SnapshotProgress, Status
from .core.schema import encode_path_segment

KEY_PREFIX = "cdc_snapshot__"
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


def load_raw(source: str, table_id: str) -> str | None:
    raw = _load(variable_key(source, table_id))
    if raw is None:
        legacy = _legacy(source, table_id)
        raw = None if legacy is None else legacy[1]
    return raw


def load(source: str, table_id: str) -> SnapshotProgress | None:
    """The stored progress, or None when this table was never snapshotted."""
    raw = load_raw(source, table_id)
    return None if raw is None else SnapshotProgress.from_json(raw)


def save(source: str, table_id: str, progress: SnapshotProgress) -> None:
    """Under today's key; a copy under the older key goes (the CLI would list it twice)."""
    _set(variable_key(source, table_id), progress.to_json())
    legacy = _legacy(source, table_id)
    if legacy is not None:
        _delete(legacy[0])


def status(source: str, table_id: str) -> str | None:
    p = load(source, table_id)
    return None if p is None else str(p.status)


def request(source: str, table_id: str, action: str) -> SnapshotProgress:
    """Pause, resume or stop from outside a DAG run (CLI, tests): running chunk tasks see
    a pause or stop before their next chunk. Invalid transitions raise StateError."""
    from .core.errors import ConfigurationError, StateError

    p = load(source, table_id)
    if p is None:
        raise StateError(
            f"no snapshot of table {table_id} from source {source!r} to {action}; start one first"
        )
    verbs = {"pause": p.pause, "resume": p.resume, "stop": p.stop}
    if action not in verbs:
        raise ConfigurationError(f"snapshot action {action!r} unknown here; use one of {', '.join(verbs)}")
    verbs[action]()
    save(source, table_id, p)
    return p


# --- capture lag -----------------------------------------------------------------------------
def lag_key(source: str) -> str:
    return f"{LAG_PREFIX}{encode_path_segment(source, leading_dot_ok=True)}"


def save_lag(source: str, lag: dict) -> None:
    """The capture's last lag reading of ``source`` (JSON: source, bytes, seconds, holder, risk, at)."""
    _set(lag_key(source), json.dumps({"source": source, **lag}, sort_keys=True))


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
