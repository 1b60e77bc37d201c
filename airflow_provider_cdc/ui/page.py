"""The CDC page's HTML, from :func:`airflow_provider_cdc.status.overview`: plain HTML and CSS, no
script and nothing from the network; readable without colour and at laptop width. Every stored
value is untrusted: escaped, a malformed one shown as MALFORMED where it is (I15), errors without
row values and through Airflow's secrets masker.
"""

from __future__ import annotations

import json
import time
from html import escape
from typing import Any
from urllib.parse import quote

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;padding:12px 16px;
color:#1b1f24;background:#fff;max-width:1200px}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:17px;margin:20px 0 6px;border-bottom:1px solid #ccd;padding-bottom:3px}
.meta{color:#555;font-size:12px}.box{border:1px solid #ccd;border-radius:6px;padding:8px 10px;margin:8px 0}
.risk{border:2px solid #a40000;background:#fff3f3}.risk strong{color:#a40000}
.warn{border:2px solid #8a5a00;background:#fff8e6}.warn strong{color:#8a5a00}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;min-width:720px}
th,td{border-bottom:1px solid #e3e3ea;padding:5px 6px;text-align:left;vertical-align:top}
th{font-size:12px;color:#444;background:#f6f7f9}
.state{font-weight:700;text-transform:uppercase;font-size:12px;letter-spacing:.03em}
.state.failed,.state.stopped{color:#a40000}.state.done{color:#1a6b1a}.state.paused{color:#8a5a00}
.bar{display:inline-block;width:140px;height:12px;border:1px solid #667;border-radius:3px;
vertical-align:middle;background:repeating-linear-gradient(45deg,#fff,#fff 3px,#eef 3px,#eef 6px)}
.bar>span{display:block;height:100%;background:#3b5bdb}
.err{color:#a40000;white-space:pre-wrap;font-size:12px}
form{display:inline}button{font:inherit;font-size:12px;padding:2px 8px;margin:1px;border:1px solid #667;
border-radius:4px;background:#f6f7f9;cursor:pointer}button:focus{outline:2px solid #3b5bdb}
svg text{font-size:10px;fill:#333}
.flash{padding:6px 10px;border:1px solid #667;border-radius:6px;background:#f6f7f9}
code{font-size:12px}
"""


def _t(ts: float | None) -> str:
    return "never" if not ts else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def _n(v: Any) -> str:
    return "?" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:,.0f}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s:02d} s" if m else f"{s} s"


def lag_charts(history: list) -> str:
    """The lag in seconds and in bytes over the readings kept (the last day), side by side."""
    if len([h for h in history if isinstance(h, list) and len(h) == 3]) < 2:
        return "<p class='meta'>Not enough lag readings for a chart yet (one per capture run).</p>"
    return (
        "<div style='display:flex;flex-wrap:wrap;gap:12px'><div style='flex:1 1 360px'>"
        f"{lag_chart(history)}</div>"
        f"<div style='flex:1 1 360px'>{lag_chart(history, unit='bytes')}</div></div>"
    )


def lag_chart(history: list, *, unit: str = "s", width: int = 560, height: int = 120) -> str:
    """The capture lag in seconds (``unit`` "s") or bytes over the readings kept, as an inline
    SVG line with its axis figures in text; a table of the readings sits behind it."""
    col = 2 if unit == "s" else 1
    pts = [(float(h[0]), float(h[col])) for h in history if isinstance(h, list) and len(h) == 3]
    if len(pts) < 2:
        return "<p class='meta'>Not enough lag readings for a chart yet (one per capture run).</p>"
    what = "seconds" if unit == "s" else "bytes"
    t0, t1 = pts[0][0], pts[-1][0]
    top = max(max(v for _, v in pts), 1.0)
    span = max(t1 - t0, 1.0)
    left, pad = 44, 14

    def xy(t: float, v: float) -> str:
        return (
            f"{left + (t - t0) / span * (width - left - 6):.1f},"
            f"{pad + (1 - v / top) * (height - 2 * pad):.1f}"
        )

    line = " ".join(xy(t, v) for t, v in pts)
    return (
        f"<svg role='img' aria-label='capture lag in {what} from {_t(t0)} to {_t(t1)}, at most "
        f"{top:,.0f} {unit}' "
        f"width='100%' viewBox='0 0 {width} {height}' preserveAspectRatio='none' style='max-width:{width}px'>"
        f"<line x1='{left}' y1='{pad}' x2='{left}' y2='{height - pad}' stroke='#667'/>"
        f"<line x1='{left}' y1='{height - pad}' x2='{width - 6}' y2='{height - pad}' stroke='#667'/>"
        f"<text x='2' y='{pad + 4}'>{_short(top)} {unit}</text><text x='2' y='{height - pad}'>0 {unit}</text>"
        f"<text x='{left}' y='{height - 2}'>{escape(_t(t0))}</text>"
        f"<text x='{width - 130}' y='{height - 2}'>{escape(_t(t1))}</text>"
        f"<polyline fill='none' stroke='#3b5bdb' stroke-width='2' points='{line}'/></svg>"
    )


def _short(v: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= limit:
            return f"{v / limit:,.1f}{suffix}"
    return f"{v:,.0f}"


def _lag_table(history: list) -> str:
    rows = "".join(
        f"<tr><td>{_t(h[0])}</td><td>{_n(int(h[1]))}</td><td>{h[2]:,.1f}</td></tr>"
        for h in reversed(history[-50:])
    )
    return (
        f"<details><summary>Last {min(len(history), 50)} lag readings</summary><div class='scroll'><table>"
        f"<tr><th>read at</th><th>bytes behind</th><th>seconds behind</th></tr>{rows}</table></div></details>"
    )


def _malformed(why: Any) -> str:
    """A value read back from a Variable that this page cannot use, marked as such (I15)."""
    return (
        f"<div class='err' data-testid='malformed'><strong>MALFORMED</strong> (not used): "
        f"{escape(_error(why))}</div>"
    )


def _error(text: Any) -> str:
    """Error text as it may be shown: no row values, secrets masked (error_text.py)."""
    from ..error_text import safe_error_text

    return safe_error_text(str(text))


def _folded(text: str) -> str:
    """A long standing warning: its first clause shown, the rest one click away."""
    head, sep, rest = text.partition(": while")
    if not sep:
        return escape(text)
    return f"{escape(head)} <details><summary>why, and the fix</summary>{escape(sep[2:] + rest)}</details>"


def _source_block(src: dict) -> str:
    lag = src.get("lag")
    if not lag:
        return "<div class='box'>No capture lag recorded yet (the changelog DAG's capture records it).</div>"
    if lag.get("malformed"):
        return f"<div class='box' data-testid='lag'>{_malformed(lag['malformed'])}</div>"
    failing = lag.get("failing")
    if isinstance(failing, dict):  # shown first: the figures below are the last good reading's
        head = (
            "<div class='box risk' data-testid='capture-failing' role='alert'>"
            f"<strong>Capture FAILING</strong> since {_t(failing.get('since'))} "
            f"({int(failing.get('attempts') or 0)} failed attempt(s), the last {_t(failing.get('at'))}): "
            f"{escape(str(failing.get('error') or '?'))}</div>"
        )
        rest = {k: v for k, v in lag.items() if k != "failing"}
        return head + (_source_block({**src, "lag": rest}) if rest.get("at") else "")
    risk = lag.get("risk")
    # nothing bounds the log the source keeps for this capture (max_slot_wal_keep_size = -1):
    # not a failed run like a risk, a standing warning until a limit is set
    warning = lag.get("warning")
    parts = [
        f"<div class='box{' risk' if risk else ' warn' if warning else ''}' data-testid='lag'>",
        f"<div><strong>Capture lag:</strong> {_n(int(lag.get('bytes') or 0))} bytes, "
        f"{float(lag.get('seconds') or 0):,.0f} s behind the log; read {_t(lag.get('at'))} (last "
        "capture)</div>",
        f"<div><strong>Log held by:</strong> {escape(str(lag.get('holder') or '?'))}</div>",
        "<div><strong>Log retention:</strong> "
        f"{'<strong>AT RISK</strong>: ' + escape(str(risk)) if risk else 'ok'}</div>"
        if risk or not warning
        else "<div data-testid='retention-warning' role='alert'><strong>Log retention: "
        f"UNBOUNDED</strong> (warning): {_folded(str(warning))}</div>",
    ]
    if risk and warning:
        parts.append(
            f"<div data-testid='retention-warning' role='alert'><strong>Log retention: UNBOUNDED</strong> "
            f"(warning): {_folded(str(warning))}</div>"
        )
    replica = lag.get("replica")
    if isinstance(replica, dict):
        s = replica.get("seconds")
        parts.append(
            "<div><strong>Replica:</strong> "
            + (
                "not replicating"
                if s is None
                else f"{_n(int(replica.get('bytes') or 0))} bytes, {s:,.0f} s behind its primary"
            )
            + "</div>"
        )
    for sink, a in sorted((src.get("applied") or {}).items()):
        parts.append(
            f"<div><strong>Applied to {escape(sink)}:</strong> through {escape(str(a.get('position')))}, "
            f"{_t(a.get('at'))}</div>"
        )
    parts.append(_freshness(src.get("freshness")))
    history = lag.get("history") or []
    parts += [lag_charts(history), _lag_table(history) if history else "", "</div>"]
    return "".join(parts)


def _freshness(f: Any) -> str:
    """The mirror's freshness (status.freshness): the source's time it shows, and how old."""
    if not isinstance(f, dict):
        return ""
    age, as_of = f.get("age_s"), f.get("as_of")
    if not isinstance(age, (int, float)) or not isinstance(as_of, (int, float)):
        return "<div data-testid='freshness'><strong>Mirror freshness:</strong> unknown</div>"
    how = (
        "changes are pending; it shows the source's commit of "
        if f.get("pending")
        else "nothing staged is pending; it shows the source as capture last read it, "
    )
    return (
        f"<div data-testid='freshness'><strong>Mirror freshness:</strong> {_duration(age)} behind ({how}"
        f"{_t(as_of)})</div>"
    )


def _progress(snap: dict) -> str:
    frac = snap.get("fraction")
    pct = None if frac is None else round(frac * 100)
    bar = (
        "<span class='bar' role='progressbar' aria-valuemin='0' aria-valuemax='100' "
        f"aria-valuenow='{pct if pct is not None else 0}'><span style='width:{pct or 0}%'></span></span>"
    )
    planned = snap.get("rows_planned")
    rows, chunks = snap.get("rows_read", snap.get("rows")), snap.get("chunks_read", snap.get("chunks"))
    text = [
        f"{pct}% read" if pct is not None else "share read unknown (keys are not numbers)",
        f"chunks {_n(chunks)}",
        f"rows {_n(rows)}" + (f" of ~{_n(planned)}" if planned else ""),
        f"{_n(snap.get('rows_per_second'))} rows/s",
    ]
    if "rows_read" in snap:
        text.append(f"{_n(snap.get('rows'))} rows merged")
    if snap.get("status") == "running":
        text.append(f"time left {_duration(snap.get('seconds_left'))}")
    return f"{bar} <span data-testid='progress-text'>{escape(', '.join(text))}</span>"


def _ranges(snap: dict) -> str:
    ranges = snap.get("ranges_list") or []
    done = snap.get("ranges_done", 0)

    def key(k):
        return "start" if k is None else json.dumps(k)

    items = "".join(
        f"<li>{escape(key(r['start']))} .. {escape('end' if r['end'] is None else key(r['end']))}: "
        f"{'done' if r['done'] else 'not done'}</li>"
        for r in ranges
    )
    return (
        f"<details><summary>key ranges done {done}/{snap.get('ranges', len(ranges))}</summary>"
        f"<ul>{items}</ul></details>"
    )


def _verify(v: dict | None) -> str:
    if not v:
        return "never verified"
    if v.get("malformed"):
        return _malformed(v["malformed"])
    head = (
        f"<span class='state {'done' if v.get('ok') else 'failed'}'>"
        f"{'ok' if v.get('ok') else 'differs'}</span> "
        f"{_t(v.get('at'))}: {_n(v.get('rows_checked'))} rows checked, {_n(v.get('mismatched'))} mismatched "
        f"(missing {_n(v.get('missing'))}, extra {_n(v.get('extra'))}, different {_n(v.get('different'))})"
    )
    if v.get("repair_conf"):
        head += f"<div>repair conf: <code>{escape(json.dumps(v['repair_conf']))}</code></div>"
    if v.get("repair_run"):
        head += f"<div>repair run: {escape(str(v['repair_run']))}</div>"
    return head


def _form(action: str, source: str, table: str, label: str) -> str:
    return (
        "<form method='post' action='action'><input type='hidden' name='source' value='"
        f"{escape(source, True)}'>"
        f"<input type='hidden' name='table' value='{escape(table, True)}'>"
        f"<input type='hidden' name='action' value='{action}'>"
        f"<button type='submit' aria-label='{escape(label, True)}'>{escape(action)}</button></form>"
    )


def _actions(source: str, table: str, status: str | None, can_act: bool) -> str:
    if not can_act:
        return "<span class='meta'>read only</span>"
    which = {"running": ("pause", "stop"), "paused": ("resume", "stop"), "failed": ("resume", "stop")}.get(
        status or "", ()
    )
    buttons = [_form(a, source, table, f"{a} the snapshot of {table}") for a in which]
    buttons.append(_form("verify", source, table, f"verify {table} against the source"))
    return "".join(buttons)


def _table_row(src: dict, row: dict, can_act: bool) -> str:
    """One table's row; a row whose values cannot be shown is shown as malformed, never a failed page."""
    try:
        return _table_row_of(src, row, can_act)
    except Exception as exc:  # noqa: BLE001 - one bad value must not take the page down
        return (
            f"<tr data-table='{escape(str(row.get('table')), True)}'><th scope='row'>"
            f"{escape(str(row.get('table')))}"
            f"</th><td colspan='5'>{_malformed(f'{type(exc).__name__}: {exc}')}</td></tr>"
        )


def _table_row_of(src: dict, row: dict, can_act: bool) -> str:
    if row.get("malformed"):
        raise ValueError(row["malformed"])
    snap = row.get("snapshot") or {}
    status = snap.get("status")
    if status == "malformed":
        state = _malformed(snap.get("error"))
    else:
        state = f"<span class='state {escape(status or '')}'>{escape(status or 'no snapshot')}</span>" + (
            " (DAG paused)" if snap.get("dag_paused") else ""
        )
        if snap.get("error"):
            state += f"<div class='err'>{escape(_error(snap['error']))}</div>"
    if row.get("refused"):  # the one scope check (I15): shown, never acted on
        state += f"<div class='err' data-testid='refused'>refused: {escape(str(row['refused']))}</div>"
        can_act = False
    mirror = row.get("mirror")
    mirror_text = (
        "no mirror"
        if not mirror
        else f"version {_n(mirror.get('version'))}, {_n(mirror.get('stored_rows'))} rows stored"
    )
    verify = row.get("verify") or {}
    if verify.get("mirror_rows") is not None:
        mirror_text += f"; {_n(verify['mirror_rows'])} live rows at the last verify"
    return (
        f"<tr data-table='{escape(row['table'], True)}'><th scope='row'>{escape(row['table'])}</th>"
        f"<td>{state}<div class='meta'>{escape(str(snap.get('snapshot_id') or ''))}</div></td>"
        f"<td>{_progress(snap) if snap and status != 'malformed' else ''}"
        f"{_ranges(snap) if snap.get('ranges_list') else ''}</td>"
        f"<td>{_verify(row.get('verify'))}</td><td>{escape(mirror_text)}</td>"
        f"<td>{_actions(src['source'], row['table'], status, can_act)}</td></tr>"
    )


def _gap_box(gap: dict) -> str:
    """An open failover gap: what may be missing, and the tables still to verify."""
    todo = sorted(set(gap.get("tables") or []) - set(gap.get("verified") or {}))
    return (
        "<div class='box risk' data-testid='open-gap' role='alert'><strong>Open gap</strong> "
        f"({escape(str(gap.get('state') or '?'))}): changes between {escape(str(gap.get('from')))} and "
        f"{escape(str(gap.get('to')))} may be missing ({escape(str(gap.get('reason') or 'a failover'))}). "
        f"Verify with repair: {escape(', '.join(todo) or 'after the next capture')}</div>"
    )


def _index(sources: list[dict]) -> str:
    """One line per source: its worst state, linking to its section alone."""
    items = []
    for src in sources:
        states = sorted({(t.get("snapshot") or {}).get("status") or "no snapshot" for t in src["tables"]})
        lag = src.get("lag") or {}
        risk = " AT RISK" if lag.get("risk") else " LOG RETENTION UNBOUNDED" if lag.get("warning") else ""
        if isinstance(lag.get("failing"), dict):
            risk = " CAPTURE FAILING" + risk
        if src.get("gaps"):
            risk += f" {len(src['gaps'])} OPEN GAP(S)"
        if src.get("failed_run"):
            risk += " SNAPSHOT RUN FAILED"
        items.append(
            f"<li><a href='./?source={quote(src['source'], safe='')}'>{escape(src['source'])}</a>: "
            f"{len(src['tables'])} table(s), {escape(', '.join(states) or 'no tables')}{risk}</li>"
        )
    return f"<nav aria-label='sources'><ul>{''.join(items)}</ul></nav>"


#: seconds between the page's own reloads unless ``?refresh=N`` says otherwise (0: never)
DEFAULT_REFRESH_SECONDS = 60


def refresh_seconds(asked: int | None) -> int:
    """``?refresh=N``: 0 turns reloading off; anything else is kept within 10 s .. 1 h."""
    if asked is None:
        return DEFAULT_REFRESH_SECONDS
    return 0 if asked <= 0 else min(max(asked, 10), 3600)


def _url(only: str | None, refresh: int | None) -> str:
    """The page's own address (relative): one source's or all, with its refresh setting."""
    query = ([f"source={quote(only, safe='')}"] if only else []) + (
        [] if refresh is None or refresh == DEFAULT_REFRESH_SECONDS else [f"refresh={refresh}"]
    )
    return "./" + ("?" + "&".join(query) if query else "")


def render(
    sources: list[dict],
    *,
    user: str,
    can_act: dict[str, bool],
    flash: str | None = None,
    now: float | None = None,
    only: str | None = None,
    refresh: int = DEFAULT_REFRESH_SECONDS,
) -> str:
    """The whole page: one section per source the user may read (``sources``; ``only``: the
    page of that one source), actions where ``can_act[source]``. ``refresh``: the page reloads
    itself every that many seconds (a meta refresh, no script; without the action's message)."""
    again = (
        "reloads itself every "
        + _duration(refresh)
        + f" (<a href='{escape(_url(only, 0), True)}'>stop reloading</a>)"
        if refresh
        else f"reload the page to refresh (<a href='{escape(_url(only, None), True)}'>reload every "
        f"{_duration(DEFAULT_REFRESH_SECONDS)}</a>)"
    )
    body = [
        f"<h1>CDC</h1><div class='meta'>Signed in as {escape(user)}; shown {_t(now or time.time())}; "
        f"{again}. The same state as <code>airflow cdc status</code>.</div>"
    ]
    if flash:
        body.append(f"<p class='flash' role='status'>{escape(flash)}</p>")
    if only:
        body.append("<p><a href='./'>All sources</a></p>")
    elif sources:  # one line per source, also for a single one: its worst state at a glance
        body.append(_index(sources))
    if not sources:
        body.append(
            "<p>No CDC source has recorded anything yet: run a capture (cdc_changelog) or a snapshot "
            "(cdc_snapshot).</p>"
        )
    for src in sources:
        name = src["source"]
        body.append(f"<section aria-label='source {escape(name, True)}'><h2>Source {escape(name)}</h2>")
        if src.get("unknown"):  # named only by Variables: shown, never acted on (I15)
            body.append(
                f"<div class='err' data-testid='unknown-source'><strong>UNKNOWN SOURCE</strong>: "
                f"{escape(str(src['unknown']))}</div>"
            )
        else:
            body.append(
                f"<div class='meta'>snapshot DAG {escape(src.get('snapshot_dag') or '')}, verify DAG "
                f"{escape(src.get('verify_dag') or '')}</div>"
            )
        try:
            run = src.get("failed_run")
            if isinstance(run, dict):
                body.append(
                    "<div class='box risk' data-testid='failed-run' role='alert'><strong>Snapshot run "
                    f"FAILED</strong> {escape(str(run.get('run_id')))} at {_t(run.get('at'))}, before it "
                    f"planned: {escape(str(run.get('error') or '?'))}</div>"
                )
            body.append(_source_block(src))
            body.extend(_gap_box(g) for g in src.get("gaps") or [])
        except Exception as exc:  # noqa: BLE001 - one bad value must not take the page down
            body.append(f"<div class='box'>{_malformed(f'{type(exc).__name__}: {exc}')}</div>")
        if src["tables"]:
            act = can_act.get(name, False) and not src.get("unknown")
            rows = "".join(_table_row(src, r, act) for r in src["tables"])
            body.append(
                "<div class='scroll'><table><tr><th>table</th><th>snapshot</th><th>progress</th>"
                f"<th>last verify</th><th>mirror</th><th>actions</th></tr>{rows}</table></div>"
            )
        body.append("</section>")
    reload = (
        f"<meta http-equiv='refresh' content='{refresh}; url={escape(_url(only, refresh), True)}'>"
        if refresh
        else ""
    )
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'>{reload}"
        f"<title>CDC</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>"
    )
