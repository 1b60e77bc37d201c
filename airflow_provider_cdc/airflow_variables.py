"""The Airflow Variables the provider publishes, and the glue's door to the snapshot state.

:func:`update`, :func:`request` and :func:`for_source` change a snapshot in its authority
(pipeline/snapshot_state.py, compare-and-set) and publish a copy to the Variable
``cdc_snapshot__{source}__{table}`` (:func:`variable_key`), never read back to decide. Also
each source's capture lag and each table's last verify. Inside a task the Task SDK's
``Variable``, outside one (CLI, tests) the metadata database.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from .core.progress import SnapshotProgress, Status
from .core.schema import encode_path_segment
from .pipeline.snapshot_state import Change, RegisterProgressStore, SourceProgress, Versioned

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
    prefix is the separator."""
    src = encode_path_segment(source, leading_dot_ok=True)
    if "__" in src or src.endswith("_"):
        src = src.replace("_", "~5F")  # "~5F" decodes to "_": still one name per encoding
    table = encode_path_segment(table_id, leading_dot_ok=True)
    if table.startswith("_"):
        table = "~5F" + table[1:]
    return f"{KEY_PREFIX}{src}__{table}"


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


def store(data_dir: str) -> RegisterProgressStore:
    return RegisterProgressStore(data_dir)


def for_source(source: str, data_dir: str) -> SourceProgress:
    """The snapshots of ``source``: the authority in ``data_dir``, each write published."""
    return SourceProgress(store(data_dir), source, published=lambda table_id, p: publish(source, table_id, p))


def read(source: str, table_id: str, data_dir: str) -> Versioned:
    """The authority's progress and version."""
    return store(data_dir).read(source, table_id)


def load(source: str, table_id: str, data_dir: str) -> SnapshotProgress | None:
    """The stored progress, or None when this table was never snapshotted."""
    return read(source, table_id, data_dir).progress


def load_raw(source: str, table_id: str, data_dir: str) -> str | None:
    p = load(source, table_id, data_dir)
    return None if p is None else p.to_json()


def update(
    source: str, table_id: str, data_dir: str, change: Change, *, between: Callable[[], None] | None = None
) -> SnapshotProgress | None:
    """Apply ``change`` with compare-and-set (pipeline.snapshot_state.update), then publish
    what it wrote. Returns the progress after the change."""
    return for_source(source, data_dir).update(table_id, change, between=between)


def publish(source: str, table_id: str, progress: SnapshotProgress) -> None:
    """Write ``progress`` to the Variable. A view for Airflow's UI and the CLI: never read to
    decide anything, and two writers publishing at once may leave it one change behind until
    the next."""
    _set(variable_key(source, table_id), progress.to_json())


def status(source: str, table_id: str, data_dir: str) -> str | None:
    p = load(source, table_id, data_dir)
    return None if p is None else str(p.status)


def request(
    source: str, table_id: str, action: str, data_dir: str, *, between: Callable[[], None] | None = None
) -> SnapshotProgress:
    """Pause, resume or stop from outside a DAG run (CLI, tests): running chunk tasks see
    a pause or stop before their next chunk. Invalid transitions raise StateError."""
    from .core.errors import ConfigurationError, StateError

    verbs = ("pause", "resume", "stop")
    if action not in verbs:
        raise ConfigurationError(f"snapshot action {action!r} unknown here; use one of {', '.join(verbs)}")

    def change(p: SnapshotProgress | None) -> SnapshotProgress:
        if p is None:
            raise StateError(
                f"no snapshot of table {table_id} from source {source!r} to {action}; start one first"
            )
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


def save_capture_failure(source: str, error: str, at: float | None = None) -> None:
    """A capture of ``source`` failed: its lag Variable keeps the last good reading and gains
    ``failing`` ({since, at, attempts, error}), which status and the CDC page show first, so a
    failing capture never reads as "0 s behind". The next successful capture's reading replaces
    it (:func:`save_lag`). ``error`` is safe text (no credentials)."""
    key = lag_key(source)
    try:
        doc = json.loads(_get(key) or "{}")
        if not isinstance(doc, dict):
            doc = {}
    except (TypeError, ValueError):
        doc = {}
    now = float(at or time.time())
    before = doc.get("failing") if isinstance(doc.get("failing"), dict) else {}
    doc["source"] = source
    doc["failing"] = {
        "since": float(before.get("since") or now),
        "at": now,
        "attempts": int(before.get("attempts") or 0) + 1,
        "error": error[:2000],
    }
    _set(key, json.dumps(doc, sort_keys=True))


# --- a snapshot run that failed before it had snapshots to mark failed -------------------------
RUN_FAILED_PREFIX = "cdc_run_failed__"


def run_failed_key(source: str) -> str:
    return f"{RUN_FAILED_PREFIX}{encode_path_segment(source, leading_dot_ok=True)}"


def save_run_failure(source: str, run_id: str, task_id: str, error: str, at: float | None = None) -> None:
    """A snapshot run of ``source`` failed for good before it planned anything (a bad conf, an
    unreachable source at planning): no snapshot's progress can say so, so the source keeps this
    record, which status and the CDC page show until a snapshot run of the source plans again
    (:func:`clear_run_failure`). ``error`` is safe text (no credentials, no row values)."""
    doc = {
        "source": source,
        "run_id": run_id,
        "task_id": task_id,
        "at": float(at or time.time()),
        "error": error[:2000],
    }
    _set(run_failed_key(source), json.dumps(doc, sort_keys=True))


def clear_run_failure(source: str) -> None:
    """A snapshot run of ``source`` planned: the failure before is over (read first: no write
    when there is none)."""
    key = run_failed_key(source)
    if _get(key) is not None:
        _delete(key)


def load_run_failures(source: str | None = None) -> dict[str, dict]:
    """source -> its failed snapshot run (metadata database; CLI, page, tests)."""
    return _by_source(RUN_FAILED_PREFIX, source)


def _by_source(prefix: str, source: str | None) -> dict[str, dict]:
    """source -> the JSON object of each Variable under ``prefix`` that names its source (only
    ``source``'s when given); values that are not such objects are left out."""
    out = {}
    for _key, val in stored_values(prefix):
        try:
            doc = json.loads(val)
        except (TypeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("source"), str) and doc["source"]:
            if source is None or doc["source"] == source:
                out[doc["source"]] = doc
    return dict(sorted(out.items()))


# --- the last verify of each table ---------------------------------------------------------------
VERIFY_PREFIX = "cdc_verify__"


def verify_key(source: str, table_id: str) -> str:
    return (
        f"{VERIFY_PREFIX}{encode_path_segment(source, leading_dot_ok=True)}__"
        f"{encode_path_segment(table_id, leading_dot_ok=True)}"
    )


def save_verify(source: str, table_id: str, result: dict) -> None:
    """The last ``airflow cdc verify`` of a table (JSON: ok, counts, repair conf, at), for the UI."""
    _set(
        verify_key(source, table_id),
        json.dumps({"source": source, "table": table_id, **result}, sort_keys=True),
    )


def load_verifies(source: str | None = None) -> dict[tuple[str, str], dict]:
    """(source, table id) -> the last verify's result (outside tasks: CLI, UI)."""
    out = {}
    for _key, val in stored_values(VERIFY_PREFIX):
        try:
            doc = json.loads(val)
        except (TypeError, json.JSONDecodeError):
            continue
        if (
            isinstance(doc, dict)
            and doc.get("source")
            and doc.get("table")
            and source in (None, doc["source"])
        ):
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
    return _by_source(LAG_PREFIX, source)
