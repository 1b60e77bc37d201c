"""What the commands share: exit codes, the sources the CLI knows and a source's connection."""

from __future__ import annotations

from ..status import list_progress

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2


def open_dialect(conn_id: str, source: str, settings=None):
    """The source dialect from the Airflow connection (CdcSourceHook), with the capture scope
    of ``settings`` (a source of the sources config; None: the environment's)."""
    from ..hooks.cdc_source import CdcSourceHook

    if settings is None:
        return CdcSourceHook(conn_id, source=source).get_dialect(source=source)
    return CdcSourceHook.for_settings(settings, conn_id, source).get_dialect(source=source)


def _config_source(name: str, now):
    from ..status import config_source

    return config_source(name, now)


def _config_source_of_conn(conn_id: str | None, now):
    """The one source of the sources config whose connection is ``conn_id`` (None: not the
    environment's connection, none or several entries use it): ``--conn-id`` alone then means that
    source, with its scope and data location."""
    if not conn_id or conn_id == now.conn_id:
        return None
    from ..sources_config import read_sources, sources_file

    dags_folder = None
    try:
        from airflow.configuration import conf

        dags_folder = conf.get("core", "dags_folder", fallback=None)
    except Exception:  # noqa: BLE001 - outside an Airflow installation: no DAG folder to look in
        pass
    location = sources_file(now, dags_folder)
    if location is None:
        return None
    found = [e for e in read_sources(location) if e.settings.conn_id == conn_id]
    return found[0] if len(found) == 1 else None


def known_sources(now=None) -> list[str]:
    """Every source status can tell of: the sources config's, the environment's, and those with a
    stored snapshot progress or capture lag."""
    from .. import settings
    from ..airflow_variables import load_lags

    names: set[str] = set()
    try:
        now = now or settings.load()
        names.add(now.source)
        from ..sources_config import read_sources, sources_file

        try:
            from airflow.configuration import conf

            dags_folder = conf.get("core", "dags_folder", fallback=None)
        except Exception:  # noqa: BLE001 - outside an Airflow installation
            dags_folder = None
        location = sources_file(now, dags_folder)
        if location is not None:
            names.update(e.name for e in read_sources(location))
    except Exception:  # noqa: BLE001 - settings or a sources config that cannot be read: the stored names
        pass
    names.update(s for s, _t, _p in list_progress(None))
    names.update(load_lags(None))
    return sorted(n for n in names if n and n != "?")


def unknown_source_error(source: str, known: list[str]) -> str | None:
    """Why ``source`` is not one status knows, with the close names (None: it is known)."""
    import difflib

    if source in known:
        return None
    close = difflib.get_close_matches(source, known, n=3, cutoff=0.6) or [
        k for k in known if k.lower() == source.lower()
    ]
    return (
        f"source {source!r} is not known: no sources config entry, setting, snapshot or capture names it"
        + (f"; did you mean {' or '.join(map(repr, close))}?" if close else ".")
        + f" Known sources: {', '.join(known) or 'none yet'}"
    )


def _source_dialect(source: str, now, conn_id: str | None = None):
    cid, st = _source_connection(source, now)
    return open_dialect(conn_id or cid, source, st), st


def _source_connection(source: str, now):
    """(connection id, settings) of ``source``: its entry of the sources config, else the
    environment's when it is the environment's source; any other name is refused."""
    entry = _config_source(source, now)
    if entry is not None:
        return entry.settings.conn_id, entry.settings
    if source != now.source:  # a name only a Variable holds never chooses a connection (I15)
        from ..core.errors import ConfigurationError

        raise ConfigurationError(
            f"source {source!r} is not named by the sources config or the environment "
            "(CDC_SOURCE, CDC_SOURCE_CONN_ID): its server is not read"
        )
    return now.conn_id, now


def short_warning(text: str) -> str:
    """A standing warning as status lines repeat it: its first clause, and where the whole
    of it (what happens, how to fix it) is said once (``airflow-cdc doctor``)."""
    head = str(text).split(": while", 1)[0].split(". ", 1)[0]
    return head if head == str(text) else f"{head} (airflow-cdc doctor says why and how to bound it)"
