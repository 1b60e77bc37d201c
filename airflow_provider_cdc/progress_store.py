"""Snapshot progress in Airflow Variables: one per (source, table).

Key ``cdc_snapshot__{source}__{schema.table}``; the value is the snapshot progress JSON.
Inside a task the Task SDK's ``Variable`` is used (it talks to the API server); outside
one (CLI, tests, scripts) the metadata database model is used.

Writers: the plan step (start/pause/resume/stop) and the commit step. Chunk tasks only
read it (between chunks, to see pause/stop), so parallel chunk tasks never race on a
read-modify-write; their per-chunk state lives in sidecar files next to the chunks.
"""

from __future__ import annotations

import json
from typing import Any

KEY_PREFIX = "cdc_snapshot__"
#: snapshot states
RUNNING, PAUSED, STOPPED, DONE, FAILED = "running", "paused", "stopped", "done", "failed"


def variable_key(source: str, table_id: str) -> str:
    return f"{KEY_PREFIX}{source}__{table_id}"


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


def load(source: str, table_id: str) -> dict[str, Any] | None:
    """The stored progress dict, or None when this table was never snapshotted."""
    raw = _get(variable_key(source, table_id))
    if raw in (None, ""):
        return None
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def save(source: str, table_id: str, progress: dict[str, Any]) -> None:
    _set(variable_key(source, table_id), json.dumps(progress, sort_keys=True, separators=(",", ":")))


def status(source: str, table_id: str) -> str | None:
    p = load(source, table_id)
    return None if p is None else p.get("status")


def set_status(source: str, table_id: str, new_status: str) -> dict[str, Any]:
    """Pause/stop from outside a DAG run (CLI, tests): the chunk tasks see it before their next chunk."""
    from .core.errors import StateError

    p = load(source, table_id)
    if p is None:
        raise StateError(f"no snapshot of table {table_id} from source {source!r} to {new_status}; start one first")
    p["status"] = new_status
    save(source, table_id, p)
    return p
