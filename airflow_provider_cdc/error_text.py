"""Error text that is stored (the progress Variable, the register) or shown (the CDC page,
``/cdc/api/status``, ``airflow cdc status``): without the row values a database error's
details carry (core/scope.py ``drop_row_values``) and through Airflow's secrets masker, so a
password that reached an exception's text is shown as ``***`` (the docs' security page)."""

from __future__ import annotations

from .core.scope import drop_row_values

#: the longest error text kept: a Variable stays small, a page stays readable
MAX_ERROR_CHARS = 2000


def _redact(text: str) -> str:
    """``text`` through Airflow's secrets masker: the Task SDK's (a task's process registers the
    secrets of the connections it read there) and airflow-core's (the api-server, the CLI)."""
    for module in ("airflow.sdk._shared.secrets_masker", "airflow._shared.secrets_masker"):
        try:
            redact = __import__(module, fromlist=["redact"]).redact
        except Exception:  # noqa: BLE001 - that Airflow part is not installed here
            continue
        try:
            text = str(redact(text))
        except Exception:  # noqa: BLE001 - a masker that cannot run leaves the text as it is
            pass
    return text


def safe_error_text(error: BaseException | str | None) -> str:
    """``error`` (an exception: its message) as it may be stored or shown."""
    if error is None:
        return ""
    text = str(error)
    text = _redact(drop_row_values(text))
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
