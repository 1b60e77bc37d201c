"""What ``airflow cdc status`` and the CDC page in Airflow's UI show, read from the one place
each fact lives: snapshot progress (the progress register's published Variables), capture lag
and its recent history (capture's lag Variable), the last verify of each table (verify's
Variable), the mirror's Delta version and stored rows. Nothing here writes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

#: the status of a stored value this version cannot use: shown as such, never read further
MALFORMED = "malformed"


def _decoded(segment: str) -> str:
    from .core.schema import decode_path_segment

    try:
        return decode_path_segment(segment) or segment
    except Exception:  # noqa: BLE001 - a key no encoder wrote: shown as it is
        return segment


def _malformed(key: str, why: str) -> dict[str, Any]:
    return {"status": MALFORMED, "malformed": f"Variable {key}: {why}", "key": key}


def list_progress(source: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(source, table id, progress dict) of every snapshot Variable, sorted. A Variable anyone
    may write is untrusted (I15): a value that is not a progress of one table of a valid source
    name comes as a ``malformed`` progress (its reason, its key), under the source its key
    names (``?`` when that is no source name either), and is never used as a path."""
    from .airflow_variables import KEY_PREFIX, stored_values
    from .core.errors import ConfigurationError
    from .core.scope import check_source_name

    out = []
    for key, val in stored_values(KEY_PREFIX):
        enc_src, sep, enc_table = key[len(KEY_PREFIX) :].partition("__")
        key_src, key_table = _decoded(enc_src) if sep else "?", _decoded(enc_table) if sep else key
        try:
            progress = json.loads(val) if val else {}
        except json.JSONDecodeError:
            progress = None
        tables = progress.get("tables") if isinstance(progress, dict) else None
        if not isinstance(tables, dict):
            src, table_id, progress = (
                key_src,
                key_table,
                _malformed(key, "not a snapshot progress (a JSON object with its tables)"),
            )
        elif len(tables) != 1:
            src, table_id, progress = (
                key_src,
                key_table,
                _malformed(key, f"names {len(tables)} tables, not one"),
            )
        else:
            src, table_id = progress.get("source", key_src), next(iter(tables))
        try:
            check_source_name(src, f"Variable {key}")
        except ConfigurationError as exc:
            src, progress = key_src, _malformed(key, str(exc))
        try:
            check_source_name(src)
        except ConfigurationError:
            src = "?"
        if source is not None and src != source:
            continue
        out.append((src, str(table_id), progress))
    return sorted(out, key=lambda t: (t[0], t[1]))


def read_so_far(data_dir: str, source: str, table_id: str, snapshot_id: str) -> dict[str, Any] | None:
    """What the chunk tasks have read of a snapshot (its plan and its chunks' commit records,
    merged or not): rows, chunks and the share of the planned ranges. The register counts a
    chunk once its round is merged; a range task reads for as long as its range takes, so this
    is where a running snapshot's progress shows first. None when its plan is not readable."""
    from .core.progress import range_fraction
    from .core.schema import TableName
    from .pipeline.snapshot import load_plan, range_state, read_sidecars

    try:
        table = TableName.parse(table_id)
        plan = load_plan(data_dir, source, table, snapshot_id)
        sidecars = read_sidecars(data_dir, source, table, snapshot_id)
    except Exception:  # noqa: BLE001 - staging moved or pruned: the register's figures alone
        return None
    upper = plan.upper_bound
    rows = chunks = 0
    shares: list[float | None] = []
    for i, rng in enumerate(plan.ranges):
        st = range_state(sidecars, i, upper)
        rows, chunks = rows + st.rows, chunks + st.chunks
        shares.append(
            1.0 if st.exhausted else 0.0 if st.after_key is None else range_fraction(rng, st.after_key, upper)
        )
    share = None if not shares or None in shares else sum(shares) / len(shares)  # type: ignore[arg-type]
    return {"rows": rows, "chunks": chunks, "fraction": share}


def progress_summary(table_id: str, p: dict[str, Any], *, data_dir: str | None = None) -> dict[str, Any]:
    """The figures a person wants from a stored progress JSON (core.progress.SnapshotProgress);
    a value this version cannot parse is shown by its status alone."""
    from .core.progress import SnapshotProgress

    if not isinstance(p, dict) or p.get("status") == MALFORMED:
        return {
            "status": MALFORMED,
            "error": (p or {}).get("malformed") if isinstance(p, dict) else "not an object",
        }
    try:
        sp = SnapshotProgress.from_json(json.dumps(p))
    except Exception as exc:  # noqa: BLE001 - shown as malformed, with why; never a failed page
        return {"status": MALFORMED, "error": f"{type(exc).__name__}: {exc}"[:500]}
    tp = sp.tables.get(table_id) or next(iter(sp.tables.values()), None)
    out: dict[str, Any] = {
        "status": str(sp.status),
        "snapshot_id": sp.snapshot_id,
        "error": sp.error,
        "run": sp.owner,
        "logical_date": sp.logical_date,
    }
    if tp is not None:
        out.update(
            ranges_done=sum(1 for r in tp.ranges if r.done),
            ranges=len(tp.ranges),
            rows=tp.rows,
            chunks=tp.chunks,
            rows_per_second=round(sp.rows_per_second(), 1),
            next_keys=[None if w.after_key is None else list(w.after_key) for w in tp.remaining()],
            ranges_list=[
                {
                    "start": None if r.range.start is None else list(r.range.start),
                    "end": None if r.range.end is None else list(r.range.end),
                    "done": r.done,
                }
                for r in tp.ranges
            ],
        )
        frac = 1.0 if str(sp.status) == "done" else tp.fraction_done()
        rows, rps = tp.rows, sp.rows_per_second()
        read = None
        if data_dir is not None and str(sp.status) in ("running", "paused", "failed"):
            read = read_so_far(data_dir, sp.source, table_id, sp.snapshot_id)
        if read is not None and read["rows"] > rows:  # read, not merged yet
            out.update(rows_read=read["rows"], chunks_read=read["chunks"])
            rows, frac = read["rows"], read["fraction"] if read["fraction"] is not None else frac
            active = sp.active_for()
            rps = rows / active if active > 0 else 0.0
            out["rows_per_second"] = round(rps, 1)
        out["fraction"] = None if frac is None else round(frac, 4)
        if frac and rows:
            out["rows_planned"] = max(rows, round(rows / frac))
            left = out["rows_planned"] - rows
            out["seconds_left"] = round(left / rps) if rps > 0 and str(sp.status) == "running" else None
    if sp.updated_at:
        out["updated_at"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sp.updated_at)) + "Z"
    return out


def snapshot_dag_paused(dag_id: str = "cdc_snapshot") -> bool:
    """Whether the snapshot DAG is paused in Airflow (False when it is not known there)."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        paused = session.query(DagModel.is_paused).filter(DagModel.dag_id == dag_id).scalar()
    return bool(paused)


def config_source(name: str, now):
    """Source ``name`` of the sources config (sources_config.py: CDC_SOURCES_FILE, or
    cdc_sources.yaml in Airflow's DAG folder), or None."""
    from .sources_config import find_source

    dags_folder = None
    try:
        from airflow.configuration import conf

        dags_folder = conf.get("core", "dags_folder", fallback=None)
    except Exception:  # noqa: BLE001 - outside an Airflow installation: no DAG folder to look in
        pass
    return find_source(name, now, dags_folder)


def known_source(source: str, now=None):
    """The settings of ``source`` when this deployment names it: its entry of the sources config,
    or the environment's source (CDC_SOURCE, else CDC_SOURCE_CONN_ID). None for any other name,
    e.g. one only a Variable holds (I15: nothing acts on it, no path is made of it)."""
    from . import settings
    from .core.errors import ConfigurationError
    from .core.scope import check_source_name

    now = now or settings.load()
    try:
        check_source_name(source)
    except ConfigurationError:
        return None
    entry = config_source(source, now)
    if entry is not None:
        return entry.settings
    return now if source == now.source else None


def source_dags(source: str, now=None) -> dict[str, str] | None:
    """The DAG ids of a known source (:func:`known_source`): ``snapshot`` and ``verify``;
    None for a source this deployment does not name."""
    from . import settings

    now = now or settings.load()
    known = known_source(source, now)
    if known is None:
        return None
    if known is now:
        return {"snapshot": "cdc_snapshot", "verify": "cdc_verify"}
    return {"snapshot": f"cdc_snapshot__{source}", "verify": f"cdc_verify__{source}"}


def source_scope(settings_of_source):
    """The capture scope of a source's settings (core/scope.py, the one check, I15)."""
    from .core.scope import CaptureScope
    from .dialects.registry import all_system_catalogs

    s = settings_of_source
    return CaptureScope.of(
        s.source, s.tables or None, catalogs=all_system_catalogs(), all_tables=s.capture_all_tables
    )


def source_setup(source: str, now=None) -> tuple[str, str | None]:
    """(snapshot DAG id, data location) of ``source``: its own from the sources config, else the
    environment's (``cdc_snapshot``, CDC_DATA_DIR) when it is the environment's source; a name
    this deployment does not know has no data location (None): no path is made of it. ``now``:
    the settings, loaded once by a caller that asks for many sources."""
    from . import settings

    now = now or settings.load()
    known = known_source(source, now)
    dags = source_dags(source, now) if known is not None else None
    if known is None or dags is None:
        return "cdc_snapshot", None
    return dags["snapshot"], known.data_dir


def applied(data_dir: str, source: str) -> dict[str, dict]:
    """sink -> how far it has applied the staged changelog and when (its marker), for the event
    log and the mirror."""
    from . import storage
    from .sinks.base import marker_path
    from .sinks.registry import location_sinks

    out = {}
    for sink in location_sinks():
        try:
            doc = json.loads(storage.read_text(marker_path(data_dir, source, sink)))
        except (OSError, ValueError):
            continue
        out[sink] = {"position": doc.get("readable") or doc.get("position"), "at": doc.get("written_at")}
    return out


def _binlog_offset_of(data_dir: str, source: str):
    from . import storage
    from .core.errors import CdcError
    from .dialects.mysql.offsets import OFFSET_FILE, BinlogOffset
    from .storage.layout import changelog_dir

    try:
        return BinlogOffset.from_json(
            storage.read_text(storage.join(changelog_dir(data_dir, source), OFFSET_FILE))
        )
    except (OSError, CdcError):
        return None


def binlog_file_of(data_dir: str, source: str) -> str | None:
    """A MariaDB/MySQL source's binlog file of its committed capture offset (its binlog's name);
    None for any other source, or before its first capture."""
    offset = _binlog_offset_of(data_dir, source)
    return None if offset is None else offset.file


def binlog_epoch_of(data_dir: str, source: str) -> int:
    """The epoch of the server a MariaDB/MySQL source's capture reads now (0 before a failover):
    a ``file:offset`` given on the command line is in that server's binlog."""
    offset = _binlog_offset_of(data_dir, source)
    return 0 if offset is None else offset.epoch


def native_position(position, binlog_file: str | None = None) -> str:
    """A position as the server writes it: a PostgreSQL LSN (``0/3000148``), or with
    ``binlog_file`` (any file of the source's binlog) MariaDB's ``file:offset``."""
    from .core.position import binlog_epoch, int_to_lsn

    if binlog_file is None:
        return int_to_lsn(position.major)
    base, _, digits = binlog_file.rpartition(".")
    index = binlog_epoch(position.major)[1]  # (the epoch above it counts failovers capture followed)
    return f"{base}.{index:0{len(digits)}d}:{position.minor}"


def parse_position(text: str, binlog_file: str | None = None, epoch: int = 0):
    """A position given on the command line: PostgreSQL's LSN (``SELECT pg_current_wal_lsn()``),
    MariaDB's ``file:offset`` (``SHOW MASTER STATUS``'s File and Position), or an encoded
    position (40 hex digits, as ``--json`` prints). ``binlog_file``: the source is MariaDB/MySQL
    (None: PostgreSQL); a form of the other database is refused. ``epoch``: of the server capture
    reads now (binlog_epoch_of), whose binlog a ``file:offset`` is in."""
    from .core.errors import ConfigurationError
    from .core.position import ENCODED_LENGTH, Position

    text = text.strip()
    if len(text) == ENCODED_LENGTH and all(c in "0123456789abcdef" for c in text):
        return Position.decode(text)
    name, colon, offset = text.rpartition(":")
    if colon and offset.isdigit() and "." in name:
        if binlog_file is None:
            raise ConfigurationError(
                f"{text!r} is a binlog position, but the source is PostgreSQL: give an LSN "
                "(SELECT pg_current_wal_lsn())"
            )
        return Position.binlog(name, int(offset), epoch=epoch)
    try:
        lsn = Position.pg(text)
    except ValueError:
        raise ConfigurationError(
            f"not a position: {text!r} (PostgreSQL: an LSN such as 0/3000148; MariaDB: "
            "file:offset such as binlog.000002:1234; or 40 hex digits)"
        ) from None
    if binlog_file is not None:
        raise ConfigurationError(
            f"{text!r} is a PostgreSQL LSN, but the source reads a binlog: give file:offset "
            "(SHOW MASTER STATUS)"
        )
    return lsn


def caught_up(data_dir: str, source: str) -> dict | None:
    """How far the outputs (event log and mirror) have every change of ``source``: every
    transaction committed at a position before ``caught_up_to`` is applied. That is where the
    staged changelog is complete (capture records it after each read: under watermark strategy
    "log" too, where no watermark is written that one could wait for), or, earlier, the first
    staged change a sink has not applied yet. None before the first capture recorded it."""
    from .sinks.base import read_marker
    from .sinks.registry import location_sinks
    from .storage.layout import changelog_dir
    from .storage.segment_index import staged_through
    from .storage.staged import list_segments

    changelog = changelog_dir(data_dir, source)
    through = staged_through(changelog)
    if through is None:
        return None
    marks = [m for m in (read_marker(data_dir, source, s) for s in location_sinks()) if m is not None]
    applied = min(marks) if marks else None
    pending = [first for first, last, _ in list_segments(changelog) if applied is None or last > applied]
    upto = min([through[0], *pending])
    binlog = binlog_file_of(data_dir, source)
    return {
        "caught_up_to": native_position(upto, binlog),
        "position": upto.encode(),
        "staged_through": native_position(through[0], binlog),
        "staged_at": through[1] / 1000,
        "pending_segments": len(pending),
    }


def freshness(data_dir: str, source: str, now: float | None = None, caught: Any = ...) -> dict | None:
    """How fresh the mirror of ``source`` is (every table of a source is applied together, so
    this holds for each): ``visible_commit_at``, the source commit time (s) of the newest
    change it shows (its marker's; None when the staged changelog's index did not know it);
    ``pending``, whether staged changes are still to apply; ``as_of``, the time of the
    source's state the mirror shows: that commit time while changes are pending, else when
    capture last read the log to its end; ``age_s``, how long ago that was. None before the
    mirror applied anything. ``caught``: :func:`caught_up` of the source when the caller read
    it already (it lists the staged changelog)."""
    from . import storage
    from .sinks.base import marker_path

    path = marker_path(data_dir, source, "mirror")
    if not storage.exists(path):
        return None
    doc = json.loads(storage.read_text(path))
    committed = doc.get("committed_ms")
    visible = None if not isinstance(committed, int) else committed / 1000
    c = caught_up(data_dir, source) if caught is ... else caught
    pending = bool(c and c["pending_segments"])
    as_of = visible if pending or c is None else c["staged_at"]
    now = time.time() if now is None else now
    return {
        "visible_commit_at": visible,
        "pending": pending,
        "as_of": as_of,
        "age_s": None if as_of is None else max(0.0, now - as_of),
    }


def mirror_summary(data_dir: str, source: str, table_id: str) -> dict | None:
    """The mirror's Delta version and the rows its files hold by their statistics (live rows,
    tombstones and superseded versions before compaction); None without a mirror."""
    from .sinks.mirror_table import _rows, _version

    try:
        v = _version(data_dir, source, table_id)
    except Exception:  # noqa: BLE001 - an unreadable mirror is shown as unknown, not a failed page
        return {"version": None, "stored_rows": None, "error": "unreadable"}
    if v is None:
        return None
    return {"version": v.version, "stored_rows": _rows(v, [p for paths in v.files.values() for p in paths])}


#: the numbers of a lag reading and of a verify's record (read back from Variables: untrusted)
_LAG_NUMBERS = ("bytes", "seconds", "at")
_VERIFY_NUMBERS = (
    "rows_checked",
    "mismatched",
    "source_rows",
    "mirror_rows",
    "missing",
    "extra",
    "different",
    "at",
    "event_violations",
)


def _checked_numbers(doc: Any, names: tuple[str, ...], what: str) -> dict[str, Any]:
    """``doc`` when each of ``names`` it holds is a number (or null); else a ``malformed``
    record saying which value is not (shown as such, never a failed page)."""
    if not isinstance(doc, dict):
        return {"malformed": f"the {what} is not a JSON object"}
    bad = [
        n
        for n in names
        if doc.get(n) is not None and (isinstance(doc[n], bool) or not isinstance(doc[n], int | float))
    ]
    history = doc.get("history")
    if history is not None and not (
        isinstance(history, list)
        and all(
            isinstance(h, list) and len(h) == 3 and all(isinstance(x, int | float) for x in h)
            for h in history
        )
    ):
        bad.append("history")
    if bad:
        return {"malformed": f"the {what} has values of the wrong type: {', '.join(bad)}"}
    return doc


def _table_refusal(scope, table_id: str) -> str | None:
    """Why the scope refuses ``table_id`` (the one check, I15), or None."""
    from .core.errors import ConfigurationError
    from .core.schema import TableName

    try:
        return scope.refusal(TableName.parse(table_id))
    except ConfigurationError as exc:
        return str(exc)


def overview(
    source: str | None = None, *, include: Callable[[str, str], bool] = lambda _source, _dag_id: True
) -> list[dict[str, Any]]:
    """Per source (``source`` alone, or every one with something recorded, those ``include(source,
    snapshot DAG id)`` keeps, asked before anything of it is read): its capture lag with its last
    day's history, its snapshot and verify DAGs, and per table the snapshot's progress (as
    ``airflow cdc status`` has it, with the share done and the time left), the last verify and
    the mirror.

    Everything comes from Variables anyone with that right may write (I15): a source neither
    the sources config nor the environment names is shown ``unknown`` (its rights are those of
    the environment's ``cdc_snapshot``; no file of it is read, nothing acts on it); a table
    outside its source's scope is shown ``refused`` with the scope's message; a value of the
    wrong type is shown ``malformed``, per item."""
    from . import settings
    from .airflow_variables import load_lags, load_run_failures, load_verifies

    now = settings.load()
    items = list_progress(source)
    lags = load_lags(source)
    verifies = load_verifies(source)
    failed_runs = load_run_failures(source)
    names = sorted({s for s, _t, _p in items} | set(lags) | {s for s, _t in verifies} | set(failed_runs))
    out = []
    for name in names:
        try:
            known = known_source(name, now)
        except Exception as exc:  # noqa: BLE001 - a sources config that cannot be read: said on the source
            known, why = None, f"the sources config could not be read: {type(exc).__name__}: {exc}"
        else:
            why = (
                f"source {name!r} is named only by Variables: neither the sources config nor the environment "
                "(CDC_SOURCE, CDC_SOURCE_CONN_ID) names it, so no file of it is read and nothing acts on it"
            )
        dags = source_dags(name, now) if known is not None else None
        if not include(name, dags["snapshot"] if dags else "cdc_snapshot"):
            continue
        scope = source_scope(known) if known is not None else None
        data_dir = known.data_dir if known is not None else None
        tables = sorted({t for s, t, _p in items if s == name} | {t for s, t in verifies if s == name})
        progress = {t: p for s, t, p in items if s == name}
        rows = [
            _table_row(name, t, scope, data_dir, progress.get(t), verifies.get((name, t))) for t in tables
        ]
        lag = lags.get(name)
        entry: dict[str, Any] = {
            "source": name,
            "known": known is not None,
            "snapshot_dag": dags["snapshot"] if dags else None,
            "verify_dag": dags["verify"] if dags else None,
            "lag": None if lag is None else _checked_numbers(lag, _LAG_NUMBERS, "capture lag reading"),
            "applied": {},
            "tables": rows,
            "failed_run": failed_runs.get(name),
        }
        if known is None:
            entry["unknown"] = why
        elif data_dir is not None:
            try:
                entry["applied"] = applied(data_dir, name)
                entry["freshness"] = freshness(data_dir, name)
            except Exception as exc:  # noqa: BLE001 - an unreadable marker is shown as such
                entry["applied"] = {"?": {"position": f"unreadable: {type(exc).__name__}", "at": None}}
            entry["gaps"] = open_gaps_of(name, data_dir)
        out.append(entry)
    return out


def _table_row(source: str, t: str, scope, data_dir: str | None, progress, verify) -> dict[str, Any]:
    """A table's row of :func:`overview`: refused (outside the scope), its snapshot, last verify and
    mirror; ``malformed`` when a value it reads has the wrong type."""
    row: dict[str, Any] = {"table": t}
    try:
        refused = _table_refusal(scope, t) if scope is not None else None
        if refused:
            row["refused"] = refused
        reads = data_dir if not refused else None
        if progress is not None:
            row["snapshot"] = progress_summary(t, progress, data_dir=reads)
        row["verify"] = None if verify is None else _checked_numbers(verify, _VERIFY_NUMBERS, "verify record")
        row["mirror"] = mirror_summary(reads, source, t) if reads is not None else None
    except Exception as exc:  # noqa: BLE001 - one bad value is shown as such, never a failed page
        row = {"table": t, "malformed": f"{type(exc).__name__}: {exc}"[:500]}
    return row


def open_gaps_of(source: str, data_dir: str | None) -> list[dict]:
    """The failover gaps of ``source`` not closed yet (storage/source_server.py): changes between
    their two positions may be missing until each table is verified (docs: operations, 'Failover')."""
    if data_dir is None:
        return []
    from .storage.layout import changelog_dir
    from .storage.source_server import open_gaps

    try:
        return open_gaps(changelog_dir(data_dir, source))
    except Exception:  # noqa: BLE001 - staging unreadable: the rest is still shown
        return []
