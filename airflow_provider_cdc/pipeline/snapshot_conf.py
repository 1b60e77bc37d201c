"""A snapshot DAG run's conf (a Debezium-style signal: untrusted, anyone who may trigger the
DAG writes it), parsed and checked before anything is written. No Airflow here."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigurationError
from ..core.planning import SnapshotRequest
from ..core.plans import CONF_KEYS
from ..core.schema import TableName
from ..core.scope import CaptureScope
from ..dialects.registry import all_system_catalogs

#: refresh (the default of scheduled runs): start tables that are done, stopped or new,
#: continue running or failed ones, leave paused ones paused
ACTIONS = ("start", "pause", "resume", "stop", "refresh")


# --------------------------------------------------------------------------- conf
__all__ = [
    "ACTIONS",
    "CONF_KEYS",
    "SnapshotConf",
    "check_scope",
    "parse_snapshot_conf",
]  # CONF_KEYS: core/plans.py


@dataclass(frozen=True)
class SnapshotConf:
    """A validated DAG-run conf (a Debezium-style signal): the action plus core's request."""

    action: str
    request: SnapshotRequest
    given: frozenset[str] = frozenset()  # conf keys present (resume keeps stored values for the rest)

    @property
    def tables(self) -> tuple[TableName, ...]:
        return self.request.tables


def parse_snapshot_conf(
    conf: dict | None, default_tables: Sequence[str] | str | None = None, default_action: str = "start"
) -> SnapshotConf:
    """Validate a DAG-run conf. Raises ConfigurationError naming the bad setting; nothing
    has been written when it raises."""
    if conf is not None and not isinstance(conf, dict):
        raise ConfigurationError(f"DAG-run conf must be a JSON object, got {type(conf).__name__}")
    conf = dict(conf or {})
    unknown = sorted(set(conf) - set(CONF_KEYS))
    if unknown:
        raise ConfigurationError(f"unknown conf key(s) {unknown}; known: {', '.join(CONF_KEYS)}")
    action = conf.pop("action", default_action)
    if action not in ACTIONS:
        raise ConfigurationError(f"conf 'action' must be one of {', '.join(ACTIONS)}, got {action!r}")
    if conf.get("delay_seconds", 0) is None:
        del conf["delay_seconds"]  # no pause given: a resume keeps the stored one
    given = frozenset(conf)
    if conf.get("tables") is None:
        tables = default_tables
        if isinstance(tables, str):
            tables = [t.strip() for t in tables.split(",") if t.strip()]
        if not tables:
            raise ConfigurationError(
                "no tables to snapshot: give conf 'tables': ['schema.table', ...] or set the "
                "CDC_TABLES environment variable"
            )
        conf["tables"] = list(tables)
    kr = conf.pop("key_ranges", None)
    if kr is not None:
        if isinstance(kr, list):  # one list of ranges for every table
            tids = conf["tables"] if isinstance(conf["tables"], list) else [conf["tables"]]
            kr = {t: kr for t in tids}
        conf["ranges"] = kr
    return SnapshotConf(action, SnapshotRequest.from_dict(conf), given)


def check_scope(req: SnapshotConf, settings: Any, scope: CaptureScope | None = None) -> None:
    """A conf (untrusted: anyone who may trigger the DAG writes it) may name only tables of the
    capture scope, for every action: the one scope check (core/scope.py, I15) that verify,
    repair, export and the CDC page use too; the dialect adds the grants when a snapshot
    starts. ``scope``: the source's (its connection's catalogs and watermark table); None:
    the settings'. Raises before anything is written."""
    if scope is None:
        scope = CaptureScope.of(
            settings.source,
            settings.tables or None,
            catalogs=all_system_catalogs(),
            all_tables=settings.capture_all_tables,
        )
    scope.check_all(req.tables)
