"""Which server the staged changelog was read from (``_server.json``, compared before each
capture reads) and the gaps a failover left (``_gaps.json``, copied beside the event log for
consumers: docs/howto.md); docs/DESIGN.md, "Failover (I14)". Written only under the capture lock.
"""

from __future__ import annotations

import json

from .. import storage

SERVER_NAME = "_server.json"
GAPS_NAME = "_gaps.json"


def read_server(changelog: str) -> dict | None:
    path = storage.join(changelog, SERVER_NAME)
    try:
        return json.loads(storage.read_text(path))
    except OSError:
        if not storage.exists(path):
            return None
        raise


def write_server(changelog: str, server: dict) -> None:
    storage.write_text(storage.join(changelog, SERVER_NAME), json.dumps(server, sort_keys=True))


def read_gaps(changelog: str) -> list[dict]:
    path = storage.join(changelog, GAPS_NAME)
    try:
        return list(json.loads(storage.read_text(path)))
    except OSError:
        if not storage.exists(path):
            return []
        raise


def write_gaps(changelog: str, gaps: list[dict], events_dir: str | None = None) -> None:
    """The gaps, in the changelog folder and (``events_dir``) beside the event log."""
    text = json.dumps(gaps, sort_keys=True, indent=1)
    storage.write_text(storage.join(changelog, GAPS_NAME), text)
    if events_dir is not None:
        storage.write_text(storage.join(events_dir, GAPS_NAME), text)


def resync_pending(changelog: str) -> bool:
    """A resync was started and capture has not started anew yet."""
    return any(g.get("state") == "resyncing" for g in read_gaps(changelog))


def open_gaps(changelog: str) -> list[dict]:
    return [g for g in read_gaps(changelog) if g.get("state") in ("resyncing", "open")]


def record_verified(changelog: str, events_dir: str, table_id: str, at_ms: int) -> list[dict]:
    """(Under the capture lock.) A verify found ``table_id`` equal to the source: every open gap
    notes it, and a gap whose captured tables are all verified since is closed. Returns the gaps
    closed now."""
    gaps = read_gaps(changelog)
    closed, changed = [], False
    for g in gaps:
        if g.get("state") != "open" or table_id not in g.get("tables", [table_id]):
            continue
        g.setdefault("verified", {})[table_id] = at_ms
        changed = True
        if set(g.get("tables", [])) <= set(g["verified"]):
            g["state"] = "closed"
            closed.append(g)
    if changed:
        write_gaps(changelog, gaps, events_dir)
    return closed
