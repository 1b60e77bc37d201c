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


def list_progress(source: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """(source, table id, progress dict) of every snapshot Variable, sorted."""
    from .progress_store import KEY_PREFIX, stored_values

    out = []
    for key, val in stored_values(KEY_PREFIX):
        try:
            progress = json.loads(val) if val else {}
        except json.JSONDecodeError:
            progress = {"status": "unreadable", "raw": val}
        # the value names its source and its one table; the key is encoded (progress_store)
        tables = list(progress.get("tables") or {}) if isinstance(progress, dict) else []
        if isinstance(progress, dict) and progress.get("source") and len(tables) == 1:
            src, table_id = str(progress["source"]), tables[0]
        else:
            src, sep, table_id = key[len(KEY_PREFIX) :].partition("__")
            if not sep:
                continue
        if source is not None and src != source:
            continue
        out.append((src, table_id, progress))
    return sorted(out, key=lambda t: (t[0], t[1]))


def read_so_far(data_dir: str, source: str, table_id: str, snapshot_id: str) -> dict[str, Any] | None:
    """What the chunk tasks have read of a snapshot (its plan and its chunks' commit records,
    merged or not): rows, chunks and the share of the planned ranges. The register counts a
    chunk once its round is merged; a range task reads for as long as its range takes, so this
    is where a running snapshot's progress shows first. None when its plan is not readable."""
    from .core.progress import range_fraction
    from .core.ranges import ChunkRange
    from .core.schema import TableName
    from .pipeline.snapshot import range_state, read_plan, read_sidecars

    try:
        table = TableName.parse(table_id)
        plan = read_plan(data_dir, source, table, snapshot_id)
        sidecars = read_sidecars(data_dir, source, table, snapshot_id)
    except Exception:  # noqa: BLE001 - staging moved or pruned: the register's figures alone
        return None
    upper = plan.get("upper_bound")
    rows = chunks = 0
    shares: list[float | None] = []
    for i, raw in enumerate(plan.get("ranges") or []):
        st = range_state(sidecars, i, upper)
        rows, chunks = rows + st.rows, chunks + st.chunks
        rng = ChunkRange.from_json(json.dumps(raw))
        shares.append(1.0 if st.exhausted else 0.0 if st.after_key is None else range_fraction(rng, st.after_key, upper))
    share = None if not shares or None in shares else sum(shares) / len(shares)  # type: ignore[arg-type]
    return {"rows": rows, "chunks": chunks, "fraction": share}


def progress_summary(table_id: str, p: dict[str, Any], *, data_dir: str | None = None) -> dict[str, Any]:
    """The figures a person wants from a stored progress JSON (core.progress.SnapshotProgress);
    a value this version cannot parse is shown by its status alone."""
    from .core.progress import SnapshotProgress

    try:
        sp = SnapshotProgress.from_json(json.dumps(p))
    except Exception:  # noqa: BLE001 - an unknown layout still shows its status
        return {"status": str(p.get("status", "unreadable")), "snapshot_id": p.get("snapshot_id")}
    tp = sp.tables.get(table_id) or next(iter(sp.tables.values()), None)
    out: dict[str, Any] = {"status": str(sp.status), "snapshot_id": sp.snapshot_id, "error": sp.error,
                           "run": sp.owner, "logical_date": sp.logical_date}
    if tp is not None:
        out.update(
            ranges_done=sum(1 for r in tp.ranges if r.done),
            ranges=len(tp.ranges),
            rows=tp.rows,
            chunks=tp.chunks,
            rows_per_second=round(sp.rows_per_second(), 1),
            next_keys=[None if w.after_key is None else list(w.after_key) for w in tp.remaining()],
            ranges_list=[{"start": None if r.range.start is None else list(r.range.start),
                          "end": None if r.range.end is None else list(r.range.end), "done": r.done}
                         for r in tp.ranges],
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


def source_setup(source: str, now=None) -> tuple[str, str]:
    """(snapshot DAG id, data location) of ``source``: its own from the sources config, else the
    environment's (``cdc_snapshot``, CDC_DATA_DIR). ``now``: the settings, loaded once by a caller
    that asks for many sources."""
    from . import settings

    now = now or settings.load()
    entry = config_source(source, now)
    if entry is not None:
        return f"cdc_snapshot__{entry.name}", entry.settings.data_dir
    return "cdc_snapshot", now.data_dir


def applied(data_dir: str, source: str) -> dict[str, dict]:
    """sink -> how far it has applied the staged changelog and when (its marker), for the event
    log and the mirror."""
    from . import storage
    from .sinks.base import marker_path

    out = {}
    for sink in ("events", "mirror"):
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
        return BinlogOffset.from_json(storage.read_text(storage.join(changelog_dir(data_dir, source), OFFSET_FILE)))
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
            raise ConfigurationError(f"{text!r} is a binlog position, but the source is PostgreSQL: give an LSN "
                                     "(SELECT pg_current_wal_lsn())")
        return Position.binlog(name, int(offset), epoch=epoch)
    try:
        lsn = Position.pg(text)
    except ValueError:
        raise ConfigurationError(f"not a position: {text!r} (PostgreSQL: an LSN such as 0/3000148; MariaDB: "
                                 "file:offset such as binlog.000002:1234; or 40 hex digits)") from None
    if binlog_file is not None:
        raise ConfigurationError(f"{text!r} is a PostgreSQL LSN, but the source reads a binlog: give file:offset "
                                 "(SHOW MASTER STATUS)")
    return lsn


def caught_up(data_dir: str, source: str) -> dict | None:
    """How far the outputs (event log and mirror) have every change of ``source``: every
    transaction committed at a position before ``caught_up_to`` is applied. That is where the
    staged changelog is complete (capture records it after each read: under watermark strategy
    "log" too, where no watermark is written that one could wait for), or, earlier, the first
    staged change a sink has not applied yet. None before the first capture recorded it."""
    from .sinks.base import read_marker
    from .storage.layout import changelog_dir
    from .storage.segment_index import staged_through
    from .storage.staged import list_segments

    changelog = changelog_dir(data_dir, source)
    through = staged_through(changelog)
    if through is None:
        return None
    marks = [m for m in (read_marker(data_dir, source, s) for s in ("events", "mirror")) if m is not None]
    applied = min(marks) if marks else None
    pending = [first for first, last, _ in list_segments(changelog) if applied is None or last > applied]
    upto = min([through[0], *pending])
    binlog = binlog_file_of(data_dir, source)
    return {"caught_up_to": native_position(upto, binlog), "position": upto.encode(),
            "staged_through": native_position(through[0], binlog), "staged_at": through[1] / 1000,
            "pending_segments": len(pending)}


def mirror_summary(data_dir: str, source: str, table_id: str) -> dict | None:
    """The mirror's Delta version and the rows its files hold by their statistics (live rows,
    tombstones and superseded versions before compaction); None without a mirror."""
    from .sinks.mirror_delta import _rows, _version

    try:
        v = _version(data_dir, source, table_id)
    except Exception:  # noqa: BLE001 - an unreadable mirror is shown as unknown, not a failed page
        return {"version": None, "stored_rows": None, "error": "unreadable"}
    if v is None:
        return None
    return {"version": v.version, "stored_rows": _rows(v, [p for paths in v.files.values() for p in paths])}


def overview(source: str | None = None, *,
             include: Callable[[str, str], bool] = lambda _source, _dag_id: True) -> list[dict[str, Any]]:
    """Per source (``source`` alone, or every one with something recorded, those ``include(source,
    snapshot DAG id)`` keeps, asked before anything of it is read): its capture lag with its last
    day's history, its snapshot DAG, and per table the snapshot's progress (as ``airflow cdc
    status`` has it, with the share done and the time left), the last verify and the mirror."""
    from . import settings
    from .progress_store import load_lags, load_verifies

    items = list_progress(source)
    lags = load_lags(source)
    verifies = load_verifies(source)
    names = sorted({s for s, _t, _p in items} | set(lags) | {s for s, _t in verifies})
    now = settings.load()
    out = []
    for name in names:
        dag_id, data_dir = source_setup(name, now)
        if not include(name, dag_id):
            continue
        tables = sorted({t for s, t, _p in items if s == name} | {t for s, t in verifies if s == name})
        progress = {t: p for s, t, p in items if s == name}
        rows = []
        for t in tables:
            row: dict[str, Any] = {"table": t}
            if t in progress:
                row["snapshot"] = progress_summary(t, progress[t], data_dir=data_dir)
            row["verify"] = verifies.get((name, t))
            row["mirror"] = mirror_summary(data_dir, name, t)
            rows.append(row)
        out.append({"source": name, "snapshot_dag": dag_id, "lag": lags.get(name), "applied": applied(data_dir, name),
                    "tables": rows})
    return out
