"""Airflow Assets: each table's event log and mirror. A task that commits one (the snapshot merge,
the changelog apply) emits an Asset event with the position and row counts in its extra, and a
downstream DAG schedules on :func:`mirror_asset` (docs/howto.md). Names
and URIs are built from the source and the table id only, not the data location, which may move.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from airflow.sdk import Asset, AssetAlias

from .core.events import EVENTS, MIRROR  # the kinds: the sinks' names

log = logging.getLogger(__name__)

KINDS = (EVENTS, MIRROR)


def _check(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"an asset kind is one of {KINDS}, got {kind!r}")


def table_asset(source: str, table_id: str, kind: str) -> Asset:
    """The Asset of one table's event log (``events``) or mirror (``mirror``)."""
    _check(kind)
    return Asset(
        name=f"cdc/{source}/{table_id}/{kind}",
        uri=f"x-cdc://{quote(source, safe='')}/{quote(table_id, safe='')}/{kind}",
        group="cdc",
    )


def mirror_asset(source: str, table_id: str) -> Asset:
    """The Asset of a table's mirror: updated when a snapshot round or a changelog batch commits."""
    return table_asset(source, table_id, MIRROR)


def event_log_asset(source: str, table_id: str) -> Asset:
    """The Asset of a table's event log."""
    return table_asset(source, table_id, EVENTS)




def log_asset(source: str, trigger=None) -> Asset:
    """The Asset of a source's log: ``cdc_changelog`` scheduled ``@log`` runs on its events,
    which ``trigger`` (a ``LogActivityTrigger``, run by the triggerer) emits when the source
    wrote something (triggers/log_activity.py)."""
    from airflow.sdk import AssetWatcher

    watchers = [] if trigger is None else [AssetWatcher(name=f"cdc_log_{source}", trigger=trigger)]
    return Asset(
        name=f"cdc/{source}/log",
        uri=f"x-cdc://{quote(source, safe='')}/log",
        group="cdc",
        watchers=watchers,
    )


def table_alias(source: str, kind: str) -> AssetAlias:
    """The alias a writer of ``kind`` for ``source`` emits its tables' Asset events through."""
    _check(kind)
    return AssetAlias(name=f"cdc/{source}/{kind}", group="cdc")


def outlet_aliases(outlets) -> dict[str, AssetAlias]:
    """kind -> the task's alias of that kind (:func:`table_alias`) among ``outlets``."""
    return {a.name.rsplit("/", 1)[-1]: a for a in outlets or () if isinstance(a, AssetAlias)}


def emit_table_events(
    context: Mapping[str, Any],
    outlets: list,
    source: str,
    tables: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> int:
    """Emit ``tables[kind][table_id]`` (the extra of one Asset event) through the task's alias
    of ``kind``; kinds the task has no alias for are skipped. Returns the events emitted."""
    aliases = outlet_aliases(outlets)
    outlet_events = context.get("outlet_events") if context else None
    if outlet_events is None:
        return 0
    n = 0
    for kind, per_table in tables.items():
        alias = aliases.get(kind)
        if alias is None:
            continue
        for table_id, extra in sorted(per_table.items()):
            outlet_events[alias].add(table_asset(source, table_id, kind), extra=dict(extra))
            n += 1
    if n:
        log.info(
            "asset events: %d for source %r (%s)",
            n,
            source,
            ", ".join(f"{k}: {len(v)} table(s)" for k, v in tables.items() if k in aliases),
        )
    return n
