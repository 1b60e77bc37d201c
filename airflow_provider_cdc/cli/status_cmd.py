"""``status``: what the source, its capture and its snapshots are doing, and whether the mirror caught up."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

# --- status -------------------------------------------------------------------------------
# what status shows is read by status.py, which the UI page reads too: one source of truth
from ..status import (  # noqa: E402, F401
    binlog_epoch_of,
    binlog_file_of,
    caught_up,
    freshness,
    list_progress,
    native_position,
    parse_position,
    progress_summary,
    snapshot_dag_paused,
)
from .common import (
    EXIT_ERROR,
    EXIT_MISMATCH,
    EXIT_OK,
    _source_connection,
    known_sources,
    open_dialect,
    short_warning,
    unknown_source_error,
)
from .sources import _live_holders


def describe_progress(summary: dict[str, Any]) -> str:
    parts = [summary["status"]]
    if summary.get("dag_paused"):
        # no task of the run is scheduled while the DAG is paused; a chunk task that was
        # running when it was paused has set the status to paused itself
        parts[0] += " (DAG cdc_snapshot is paused: no task runs until it is unpaused)"
    if "ranges" in summary:
        parts.append(f"ranges done {summary['ranges_done']}/{summary['ranges']}")
        parts.append(
            f"{summary['rows']} rows in {summary['chunks']} chunks ({summary['rows_per_second']:.0f} rows/s)"
        )
        if "rows_read" in summary:  # read by the running chunk tasks, not merged yet
            parts.append(f"{summary['rows_read']} rows in {summary['chunks_read']} chunks read")
        if summary["status"] == "running" and summary.get("fraction") is not None:
            left = summary.get("seconds_left")
            parts.append(f"{summary['fraction']:.0%} read" + ("" if left is None else f", ~{left:,} s left"))
        if summary["status"] != "done" and summary["next_keys"]:
            parts.append(
                "continues after "
                + ", ".join("start" if k is None else json.dumps(k) for k in summary["next_keys"])
            )
    if summary.get("snapshot_id"):
        parts.append(f"snapshot {summary['snapshot_id']}")
    if summary.get("run"):
        parts.append(f"run {summary['run']}")
    if summary.get("updated_at"):
        parts.append(f"updated {summary['updated_at']}")
    if summary.get("error"):
        from ..error_text import safe_error_text

        parts.append(f"error: {safe_error_text(summary['error'])}")
    if summary.get("refused"):
        parts.append(f"refused: {summary['refused']}")
    return ", ".join(parts)


def _data_dir_of(source: str) -> str | None:
    """The source's data location (its own in the sources config), for what its chunk tasks
    have read; None when the settings cannot tell."""
    from ..status import source_setup

    try:
        return source_setup(source)[1]
    except Exception:  # noqa: BLE001 - status still shows the register's figures
        return None


def describe_failing(failing: dict[str, Any]) -> str:
    """A failing capture, first: since when, how many attempts, the last error."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(failing.get("since") or 0)) + "Z"
    return (
        f"CAPTURE FAILING since {since} ({int(failing.get('attempts') or 0)} failed attempt(s)): "
        f"{failing.get('error') or '?'}"
    )


def describe_lag(lag: dict[str, Any]) -> str:
    failing = lag.get("failing")
    if isinstance(failing, dict):
        good = "; the last good reading: " + describe_lag({k: v for k, v in lag.items() if k != "failing"})
        return describe_failing(failing) + (good if lag.get("at") else "; no capture has succeeded yet")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(lag.get("at") or 0)) + "Z"
    text = (
        f"capture lag {lag.get('bytes', 0):,} bytes, {lag.get('seconds') or 0:,.0f} s behind the log "
        f"({lag.get('holder')}), read {when}"
    )
    replica = lag.get("replica")
    if isinstance(replica, dict):
        from ..pipeline.capture import describe_replica_lag

        text += f"; {describe_replica_lag(int(replica.get('bytes') or 0), replica.get('seconds'))}"
    return (
        text
        + (f"; AT RISK: {lag['risk']}" if lag.get("risk") else "")
        + (f"; WARNING: {short_warning(lag['warning'])}" if lag.get("warning") else "")
    )


def describe_caught_up(c: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c.get("staged_at") or 0)) + "Z"
    text = (
        f"caught up to {c['caught_up_to']}: every change committed before it is applied (the staged "
        f"changelog reached {c['staged_through']} at {when})"
    )
    if c.get("server_position"):
        behind = c.get("behind_bytes")
        text += f"; the server is at {c['server_position']}" + (
            ", nothing more to apply"
            if c.get("caught_up")
            else f", {behind:,} bytes further"
            if behind is not None
            else ", further on"
        )
    elif c.get("server_error"):
        text += f"; the server's position could not be read: {c['server_error']}"
    f = c.get("freshness")
    if f and f.get("age_s") is not None:
        as_of = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(f["as_of"])) + "Z"
        text += f"; the mirror is {f['age_s']:,.1f} s behind (it shows the source as of {as_of}" + (
            ", changes pending)" if f.get("pending") else ")"
        )
    return text


def _caught_up_of(source: str, data_dir: str | None, live: bool, now) -> dict[str, Any] | None:
    """status.caught_up of ``source`` and, ``live``, its server's position now (None: unknown)."""
    if data_dir is None:
        return None
    try:
        c = caught_up(data_dir, source)
        if c is not None:
            c["freshness"] = freshness(data_dir, source, caught=c)
    except Exception:  # noqa: BLE001 - staging unreadable: status still shows the rest
        return None
    if c is None or not live:
        return c
    from ..core.position import Position

    try:
        conn_id, settings = _source_connection(source, now)
        with open_dialect(conn_id, source, settings) as dialect:
            dialect.bind_data_dir(data_dir)  # MariaDB: the epoch of the server read now
            server = dialect.current_position()
            upto = Position.decode(c["position"])
            behind = dialect.log_bytes_between(upto, server)
        c.update(
            server_position=native_position(server, binlog_file_of(data_dir, source)),
            server_encoded=server.encode(),
            behind_bytes=behind,
            caught_up=upto >= server,
        )
    except Exception as exc:  # noqa: BLE001 - an unreachable source is said on its line, not a failed status
        from ..error_text import safe_error_text

        c["server_error"] = f"{type(exc).__name__}: {safe_error_text(exc)}"
    return c


@dataclass
class _Report:
    """What ``status`` found: each table's snapshot, each source's capture, gaps and runs."""

    items: list
    summaries: dict = field(default_factory=dict)
    data_dirs: dict = field(default_factory=dict)
    lags: dict = field(default_factory=dict)
    failed_runs: dict = field(default_factory=dict)
    sources: list = field(default_factory=list)
    caught: dict = field(default_factory=dict)
    holders: dict = field(default_factory=dict)
    gaps: dict = field(default_factory=dict)


def _summarise(report: _Report, dag_paused: bool) -> None:
    """Each table's progress summary, the capture scope's refusal shown instead of its data."""
    from ..status import _table_refusal, known_source, source_scope

    scopes: dict = {}
    for s, t, p in report.items:
        if s not in report.data_dirs:
            report.data_dirs[s] = _data_dir_of(s)
            try:
                known = known_source(s)
            except Exception:  # noqa: BLE001 - a sources config that cannot be read: no scope known here
                known = None
            scopes[s] = source_scope(known) if known is not None else None
        refused = _table_refusal(scopes[s], t) if scopes[s] is not None else None
        summary = progress_summary(t, p, data_dir=None if refused else report.data_dirs[s])
        if refused:  # the one scope check: shown, nothing of the table read
            summary["refused"] = refused
        summary["dag_paused"] = dag_paused and summary["status"] == "running"
        report.summaries[(s, t)] = summary


def _gather(args: argparse.Namespace) -> _Report:
    from .. import settings
    from ..airflow_variables import load_lags, load_run_failures
    from ..status import _checked_numbers, open_gaps_of

    r = _Report(list_progress(args.source))
    r.failed_runs = load_run_failures(args.source)
    # read back from Variables: a reading of the wrong type is said as such (I15)
    r.lags = {
        s: _checked_numbers(lag, ("bytes", "seconds", "at"), "capture lag reading")
        for s, lag in load_lags(args.source).items()
    }
    _summarise(r, bool(r.items) and snapshot_dag_paused())
    now = settings.load() if args.live else None
    r.sources = sorted(
        {s for s, _t, _p in r.items}
        | set(r.lags)
        | set(r.failed_runs)
        | ({args.source} if args.source else set())
    )
    for s in r.sources:
        if s not in r.data_dirs:
            r.data_dirs[s] = _data_dir_of(s)
        r.caught[s] = _caught_up_of(s, r.data_dirs[s], args.live, now)
    # --live: what the server holds for sources no capture has run for (a snapshot's slot)
    if args.live:  # also the deployment's sources nothing is recorded for yet
        asked = sorted(set(r.sources) | ({args.source} if args.source else set(known_sources(now))))
        r.holders = _live_holders(asked, r.lags, now)
    r.gaps = {s: open_gaps_of(s, r.data_dirs.get(s)) for s in r.sources}  # read once per source
    return r


def _print_json(r: _Report) -> None:
    def capture(s: str) -> dict:
        return {
            "source_lag": r.lags.get(s),
            "source_caught_up": r.caught.get(s),
            "source_gaps": r.gaps.get(s, []),
            "source_log_holder": r.holders.get(s),
            "source_failed_run": r.failed_runs.get(s),
        }

    tables = [
        {"source": s, "table": t, **r.summaries[(s, t)], "progress": p, **capture(s)} for s, t, p in r.items
    ]
    with_tables = {src for src, _t, _p in r.items}
    # a source with no snapshot recorded: its capture and gaps still (table null)
    bare = [
        {"source": s, "table": None, "status": None, **capture(s)} for s in r.sources if s not in with_tables
    ]
    print(json.dumps(tables + bare, indent=2, sort_keys=True))


def _print_text(r: _Report, args: argparse.Namespace) -> None:
    if not r.items:
        print("no snapshots recorded" + (f" for source {args.source!r}" if args.source else ""))
    width = max([len(f"{s}:{t}") for s, t, _ in r.items] + [len(s) for s in [*r.sources, *r.holders]] + [1])
    for s, t, _p in r.items:
        print(f"{f'{s}:{t}':<{width}}  {describe_progress(r.summaries[(s, t)])}")
    for s, lag in r.lags.items():
        print(
            f"{s:<{width}}  {'MALFORMED: ' + lag['malformed'] if lag.get('malformed') else describe_lag(lag)}"
        )
    for s, held in r.holders.items():
        print(f"{s:<{width}}  {held}")
    for s, run in r.failed_runs.items():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(run.get("at") or 0))) + "Z"
        print(
            f"{s:<{width}}  SNAPSHOT RUN FAILED {run.get('run_id')} at {when} before planning: "
            f"{run.get('error')} (fix it, then start the snapshot again)"
        )
    for s in r.sources:
        if r.caught[s] is not None:
            print(f"{s:<{width}}  {describe_caught_up(r.caught[s])}")
    for s in r.sources:
        for gap in r.gaps[s]:
            todo = sorted(set(gap.get("tables", [])) - set(gap.get("verified", {})))
            print(
                f"{s:<{width}}  gap ({gap['state']}): changes between {gap.get('from')} and "
                f"{gap.get('to')} may be "
                f"missing (a failover); verify --repair: {', '.join(todo) or 'after the next capture'}"
            )


def cmd_status(args: argparse.Namespace) -> int:
    if args.source:  # a typo must not read as "nothing recorded" with exit 0
        why = unknown_source_error(args.source, known_sources())
        if why is not None:
            print(f"error: {why}", file=sys.stderr)
            return EXIT_ERROR
    if args.caught_up_to is not None:
        return _status_caught_up_to(args)
    r = _gather(args)
    unhealthy = _unhealthy(r.lags, r.summaries, r.gaps)
    unhealthy += [f"a snapshot run of {s} failed" for s in r.failed_runs]
    code = EXIT_MISMATCH if unhealthy else EXIT_OK
    if args.json:
        _print_json(r)
        return code
    _print_text(r, args)
    if unhealthy:
        print(f"NOT HEALTHY (exit {code}): {'; '.join(unhealthy)}")
    return code


def _unhealthy(lags: dict, summaries: dict, gaps: dict) -> list[str]:
    """What makes ``status`` exit non-zero (so it can gate a DAG or a monitor): a failing
    capture, a failed or malformed snapshot, a malformed reading, an open failover gap."""
    out = [f"capture of {s} failing" for s, lag in lags.items() if isinstance(lag.get("failing"), dict)]
    out += [f"lag reading of {s} malformed" for s, lag in lags.items() if lag.get("malformed")]
    out += [
        f"snapshot of {s}:{t} {sm['status']}"
        for (s, t), sm in summaries.items()
        if sm.get("status") in ("failed", "malformed")
    ]
    out += [f"{len(g)} open gap(s) of {s}" for s, g in gaps.items() if g]
    return out


def _status_caught_up_to(args: argparse.Namespace) -> int:
    """``status --source S --caught-up-to POSITION``: whether every change S committed before
    POSITION is in the event log and the mirror (exit 0) or not yet (1)."""
    from ..core.position import Position

    if not args.source:
        print("error: --caught-up-to needs --source (whose log the position is in)", file=sys.stderr)
        return EXIT_ERROR
    data_dir = _data_dir_of(args.source)
    if data_dir is None:
        print(f"error: the data location of source {args.source!r} is not known (settings)", file=sys.stderr)
        return EXIT_ERROR
    binlog = binlog_file_of(data_dir, args.source)
    target = parse_position(args.caught_up_to, binlog, binlog_epoch_of(data_dir, args.source))
    c = caught_up(data_dir, args.source)
    done = c is not None and Position.decode(c["position"]) >= target
    want = native_position(target, binlog)
    if args.json:
        print(
            json.dumps(
                {
                    "source": args.source,
                    "target": want,
                    "target_encoded": target.encode(),
                    **(c or {}),
                    "caught_up": done,
                },
                indent=2,
                sort_keys=True,
            )
        )
    elif c is None:
        print(f"{args.source}: not yet: no capture has recorded how far the changelog is staged")
    elif done:
        print(
            f"{args.source}: caught up: every change committed before {want} is applied "
            f"(caught up to {c['caught_up_to']})"
        )
    else:
        print(
            f"{args.source}: not yet: caught up to {c['caught_up_to']}, before {want}"
            + (
                f" ({c['pending_segments']} staged segment(s) to apply)"
                if c["pending_segments"]
                else " (the changelog is not captured that far yet)"
            )
        )
    return EXIT_OK if done else EXIT_MISMATCH
