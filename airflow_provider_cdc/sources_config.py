"""The sources config: many sources, each with its own settings, from one YAML or JSON file, which
``dags/cdc_sources.py`` turns into a snapshot and a changelog DAG per source (docs/howto.md).

An entry's keys are the settings of settings.py without ``CDC_``, in lower case (``KEYS``),
checked by the same code at parse time. The config is code, trusted like the DAG folder, with
guards as defence in depth (docs/DESIGN.md, "Security"). No Airflow import.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .core.errors import ConfigurationError
from .core.throttle import Throttle
from .settings import OPTIONS, Settings, load

#: entry key -> the environment variable it stands for (settings.OPTIONS: those a source may set)
KEYS: dict[str, str] = {o.entry: o.var for o in OPTIONS if o.per_source}
#: entry keys that are not settings
EXTRA_KEYS = ("throttle",)
#: a source name: it becomes part of DAG ids (letters, digits, '_', '-', '.') and of paths
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
#: what starts a Jinja expression, statement or comment
_JINJA = ("{{", "{%", "{#")
#: conn_id -> (dialect name, server as host:port/database, the CDC options of the connection's
#: extra), None when unknown
ConnectionOptions = Callable[[str], "tuple[str, str, Mapping[str, Any]] | None"]


@dataclass(frozen=True)
class SourceEntry:
    """One source of the config: its name, the ``CDC_*`` values it sets (on top of the
    environment), and the settings they give with the environment at parse time."""

    name: str
    overrides: dict[str, str]
    settings: Settings
    throttle: dict[str, Any]


def _env_value(value: Any, where: str) -> str:
    """A config value as the text of its environment variable."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    raise ConfigurationError(f"{where}: a {type(value).__name__} is not a setting value")


def refuse_templates(value: Any, where: str) -> None:
    """A ConfigurationError when ``value`` (or a string inside it) holds Jinja syntax: the
    operators render their fields, and a config value must stay data (``{{ var.value.x }}``
    or ``{{ conn.x.password }}`` would otherwise become a secret in a path, a log or a query)."""
    if isinstance(value, str):
        if any(mark in value for mark in _JINJA):
            raise ConfigurationError(
                f"{where}: holds Jinja template syntax ({', '.join(m for m in _JINJA if m in value)}); the "
                "sources config is data and is never rendered as a template: write the value itself (a "
                "secret "
                "belongs in an Airflow connection, named by its id)"
            )
    elif isinstance(value, Mapping):
        for k, v in value.items():
            refuse_templates(k, where)
            refuse_templates(v, f"{where}, {k!r}" if isinstance(k, str) else where)
    elif isinstance(value, list | tuple):
        for v in value:
            refuse_templates(v, where)


def parse_sources(
    doc: Any,
    origin: str = "the sources config",
    env: Mapping[str, str] | None = None,
    connections: ConnectionOptions | None = None,
) -> list[SourceEntry]:
    """The sources of a parsed config document, each checked (``ConfigurationError``
    naming ``origin``, the source and the key). ``connections`` reads a connection's dialect
    options, so names given in connection extras are checked for collisions too (e.g.
    dag_builders.connection_options; None: only the names derived from source names)."""
    if not isinstance(doc, Mapping):
        raise ConfigurationError(
            f"{origin}: must be a mapping with a 'sources' key, got {type(doc).__name__}"
        )
    unknown = sorted(set(doc) - {"defaults", "sources"})
    if unknown:
        raise ConfigurationError(f"{origin}: unknown top-level key(s) {unknown}; known: defaults, sources")
    defaults = doc.get("defaults") or {}
    sources = doc.get("sources")
    if not isinstance(defaults, Mapping):
        raise ConfigurationError(
            f"{origin}: 'defaults' must be a mapping of settings, got {type(defaults).__name__}"
        )
    if not isinstance(sources, Mapping) or not sources:
        raise ConfigurationError(
            f"{origin}: 'sources' must be a non-empty mapping of source name -> settings"
        )
    out = []
    seen: dict[str, str] = {}
    for name, entry in sources.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigurationError(
                f"{origin}: source name {name!r} must be 1-100 letters, digits, '_', '-' or '.', "
                "starting with a "
                "letter or digit (it becomes part of DAG ids)"
            )
        if name.lower() in seen:
            raise ConfigurationError(
                f"{origin}: sources {seen[name.lower()]!r} and {name!r} differ only in case"
            )
        seen[name.lower()] = name
        if not isinstance(entry, Mapping):
            raise ConfigurationError(
                f"{origin}: source {name!r} must be a mapping of settings, got {type(entry).__name__}"
            )
        out.append(_entry(name, {**defaults, **entry}, origin, env))
    _refuse_shared_names(out, origin, connections)
    return out


def _owned_names(entry: SourceEntry, connections: ConnectionOptions | None) -> list[tuple[str, tuple, str]]:
    """(what, identity, connection-extra option naming it) of everything a capture of ``entry``
    owns alone: its staging folder, and (when its connection can be read) what its database's
    profile says a capture owns there (a slot and a publication, a server_id)."""
    s = entry.settings
    owned = [("staging folder", (s.data_dir.rstrip("/"), s.source.casefold()), "")]
    known = connections(s.conn_id) if connections is not None else None
    if known is None:
        return owned
    from .dialects.profile import SERVER
    from .dialects.registry import get_profile

    dialect, server, options = known
    cluster = server.partition("/")[0]  # the server's host:port; ``server`` adds the database
    for obj in get_profile(dialect).owned_objects(s.source, options):
        owned.append((obj.what, (cluster if obj.per == SERVER else server, obj.identity), obj.option))
    return owned


def _refuse_shared_names(
    entries: list[SourceEntry], origin: str, connections: ConnectionOptions | None
) -> None:
    """Two sources sharing a slot would each confirm it past the other's changes (lost
    changes); sharing a staging folder (its offset and segments) or a server_id (the server
    drops one of two readers with one id) is as bad: refused at parse time, naming both."""
    claims: dict[tuple[str, tuple], str] = {}
    for entry in entries:
        for what, identity, option in _owned_names(entry, connections):
            other = claims.setdefault((what, identity), entry.name)
            if other == entry.name:
                continue
            if what == "staging folder":
                raise ConfigurationError(
                    f"{origin}: sources {other!r} and {entry.name!r} would share the staging folder "
                    f"{identity[0]}/staging/{entry.name}: rename one of them"
                )
            raise ConfigurationError(
                f"{origin}: sources {other!r} and {entry.name!r} would share the {what} {identity[1]!r} on "
                f"{identity[0]}: give each source a connection whose extra sets a {option!r} of its "
                "own (or none: "
                "each source then gets one derived from its name)"
            )


def _entry(name: str, values: Mapping[str, Any], origin: str, env: Mapping[str, str] | None) -> SourceEntry:
    where = f"{origin}, source {name!r}"
    unknown = sorted(set(values) - set(KEYS) - set(EXTRA_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown key(s) {unknown}; known: {', '.join([*KEYS, *EXTRA_KEYS])}"
        )
    for key, value in values.items():
        refuse_templates(value, f"{where}, key {key!r}")
    overrides = {"CDC_SOURCE": name}
    for key, var in KEYS.items():
        if key in values:
            value = values[key]
            if key == "sinks" and isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
                value = ",".join(value)  # CDC_SINKS is a comma list
            overrides[var] = _env_value(value, f"{where}, key {key!r}")
    try:
        settings = load(env, overrides)
    except ConfigurationError as exc:
        # the variable the message is about: the first one it names
        msg = str(exc)
        key = min((k for k, v in KEYS.items() if v in msg), key=lambda k: msg.find(KEYS[k]), default=None)
        raise ConfigurationError(f"{where}{f', key {key!r}' if key else ''}: {exc}") from None
    throttle = values.get("throttle") or {}
    try:
        Throttle().merge(throttle)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}, key 'throttle': {exc}") from None
    return SourceEntry(name, overrides, settings, dict(throttle))


def read_sources(
    location: str, env: Mapping[str, str] | None = None, connections: ConnectionOptions | None = None
) -> list[SourceEntry]:
    """The sources of the config file at ``location`` (a path or URI; YAML, of which JSON
    is a subset); ``connections``: see :func:`parse_sources`."""
    import yaml

    text = _read_text(location)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"sources config {location}: not valid YAML or JSON: {exc}") from None
    return parse_sources(doc, f"sources config {location}", env, connections)


def _read_text(location: str) -> str:
    """The config's text: a local file read directly (cdc_sources.py reads it at every parse,
    and storage imports pyarrow), a URI through storage."""
    if "://" not in location or location.lower().startswith("file://"):
        from urllib.parse import urlsplit

        with open(urlsplit(location).path if "://" in location else location, encoding="utf-8") as f:
            return f.read()
    from . import storage

    return storage.read_text(location)


def sources_file(settings: Settings, dags_folder: str | None = None) -> str | None:
    """Where the sources config is: ``CDC_SOURCES_FILE`` (or ``[cdc] sources_file``), else
    ``cdc_sources.yaml`` in ``dags_folder`` when it exists there; None: no config."""
    if settings.sources_file:
        return settings.sources_file
    if dags_folder:
        from . import storage

        candidate = storage.join(dags_folder, "cdc_sources.yaml")
        if storage.exists(candidate):
            return candidate
    return None


def find_source(name: str, settings: Settings, dags_folder: str | None = None) -> SourceEntry | None:
    """Source ``name`` of the sources config (None: no config, or no such source in it)."""
    location = sources_file(settings, dags_folder)
    if location is None:
        return None
    return next((e for e in read_sources(location) if e.name == name), None)
