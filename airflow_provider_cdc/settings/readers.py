"""How each setting's text becomes its value (settings.Option.read): the readers, each given the
environment and the option, its default used when the variable is unset; a bad value is a
ConfigurationError naming the variable."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..core.errors import ConfigurationError
from ..core.schema import TableName, parse_key_columns, split_table_list

if TYPE_CHECKING:
    from . import Option

#: how an option's text (its default when unset) becomes its value in Settings
Reader = Callable[[Mapping[str, str], "Option"], Any]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def raw_value(env: Mapping[str, str], name: str) -> str:
    return (env.get(name) or "").strip()


def text(env: Mapping[str, str], o: Option) -> str | None:
    return raw_value(env, o.var) or o.default


def whole(what: str, minimum: int = 0) -> Reader:
    """A whole number >= ``minimum`` (``what`` says it in the error); None when unset without a default."""

    def read(env: Mapping[str, str], o: Option) -> int | None:
        raw = raw_value(env, o.var) or o.default
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise ConfigurationError(f"{o.var} must be {what}, got {raw!r}")
        return value

    return read


def seconds(*, zero: bool = False) -> Reader:
    """A number of seconds > 0 (``zero``: >= 0)."""

    def read(env: Mapping[str, str], o: Option) -> float:
        raw = raw_value(env, o.var) or str(o.default)
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not (value >= 0 if zero else value > 0) or value == float("inf"):
            raise ConfigurationError(
                f"{o.var} must be a number of seconds {'>=' if zero else '>'} 0, got {raw!r}"
            )
        return value

    return read


def hours(minimum: float, why: str = "", *, never: bool = False) -> Reader:
    """A number of hours >= ``minimum`` (``why``: the reason for it), or None for ``never``."""

    def read(env: Mapping[str, str], o: Option) -> float | None:
        raw = raw_value(env, o.var) or str(o.default)
        if never and raw.lower() == "never":
            return None
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value >= minimum or value == float("inf"):
            reason = f" ({why})" if why else ""
            alternative = " or 'never'" if never else ""
            raise ConfigurationError(
                f"{o.var} must be a number of hours >= {minimum:g}{reason}{alternative}, got {raw!r}"
            )
        return value

    return read


def flag(env: Mapping[str, str], o: Option) -> bool | None:
    """true or false; None when unset without a default."""
    raw = raw_value(env, o.var).lower() or (o.default or "")
    if not raw:
        return None
    if raw not in _TRUE + _FALSE:
        raise ConfigurationError(f"{o.var} must be true or false, got {raw_value(env, o.var)!r}")
    return raw in _TRUE


def schedule(env: Mapping[str, str], o: Option) -> str | None:
    """Cron or preset; set but empty, ``none`` or ``null``: no schedule."""
    raw = env.get(o.var)
    if raw is None:
        return o.default
    raw = raw.strip()
    return None if raw.lower() in ("", "none", "null") else raw


def table_list(env: Mapping[str, str], o: Option) -> tuple[str, ...]:
    """A list of table names (a comma list or a JSON list), each checked, errors naming the variable."""
    tables = tuple(split_table_list(raw_value(env, o.var), o.var))
    for t in tables:
        try:
            TableName.parse(t)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{o.var}: {exc}") from None
    return tables


def key_columns(env: Mapping[str, str], o: Option) -> dict:
    found = parse_key_columns(raw_value(env, o.var), o.var)
    for t in found:
        try:
            TableName.parse(t)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{o.var}: {exc}") from None
    return found


def sinks(env: Mapping[str, str], o: Option) -> str:
    names = ",".join(sink_names(raw_value(env, o.var) or str(o.default)))
    if not names:
        raise ConfigurationError(f"{o.var} must name at least one sink, e.g. 'events,mirror'")
    return names


def spark_conf(env: Mapping[str, str], o: Option) -> dict:
    raw = raw_value(env, o.var)
    try:
        conf = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ConfigurationError(
            f"{o.var} must be a JSON object of Spark settings, e.g. "
            f'\'{{"spark.executor.memory": "4g"}}\': {exc}'
        ) from None
    if not isinstance(conf, dict):
        raise ConfigurationError(f"{o.var} must be a JSON object of Spark settings, got {raw!r}")
    from ..core.spark_settings import check_spark_conf

    return check_spark_conf(conf)  # tuning only: it reaches spark-submit's --conf


def sink_names(sinks: str) -> list[str]:
    """The names in a comma list of sinks (``CDC_SINKS``, an operator's ``sinks``)."""
    return [n.strip() for n in sinks.split(",") if n.strip()]
