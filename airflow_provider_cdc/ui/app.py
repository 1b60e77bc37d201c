"""The CDC page's web app (FastAPI), mounted by the api-server at ``/cdc`` (ui/plugin.py) and
shown inside Airflow's UI. Behind Airflow's own authentication and authorization:

- reading: a signed-in user (Airflow's JWT, the ``_token`` cookie the UI sets or a bearer
  token) sees the sources whose snapshot DAG they may read (``is_authorized_dag`` GET);
- acting: pause, resume and stop trigger the source's snapshot DAG with that action's conf,
  and verify runs ``airflow-cdc verify`` for the table, as a user would; each needs the right
  to trigger that DAG (``is_authorized_dag`` POST on its runs), and the request must come from
  this origin (a form of another site cannot act with the user's cookie).

The page reads :func:`airflow_provider_cdc.status.overview`, what ``airflow cdc status``
reads. ``GET /api/status`` gives the same as JSON.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import FastAPI, Form, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .page import refresh_seconds, render

log = logging.getLogger(__name__)

ACTIONS = ("pause", "resume", "stop", "verify")

app = FastAPI(title="CDC", docs_url=None, redoc_url=None, openapi_url=None)


@app.exception_handler(StarletteHTTPException)
async def _login_redirect(request: Request, exc: StarletteHTTPException):
    """A browser without a session goes to Airflow's login and comes back here."""
    if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(f"/api/v2/auth/login?next={quote(str(request.url), safe='')}")
    return await http_exception_handler(request, exc)


async def _user(request: Request):
    from airflow.api_fastapi.core_api.security import get_user

    bearer = None
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        from fastapi.security import HTTPAuthorizationCredentials

        bearer = HTTPAuthorizationCredentials(scheme="Bearer", credentials=header[7:])
    return await get_user(request, None, bearer)


def _may(user: Any, dag_id: str, *, act: bool) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    details = DagDetails(id=dag_id)
    if act:
        return get_auth_manager().is_authorized_dag(method="POST", access_entity=DagAccessEntity.RUN,
                                                    details=details, user=user)
    return get_auth_manager().is_authorized_dag(method="GET", details=details, user=user)


def _visible(user: Any, source: str | None = None) -> tuple[list[dict], dict[str, bool]]:
    from ..status import overview

    sources = overview(source, include=lambda _name, dag_id: _may(user, dag_id, act=False))
    return sources, {s["source"]: _may(user, s["snapshot_dag"], act=True) for s in sources}


def _readable_or_403(user: Any, source: str | None = None) -> tuple[list[dict], dict[str, bool]]:
    sources, can_act = _visible(user, source)
    if not sources and not _may(user, "cdc_snapshot", act=False):
        raise HTTPException(403, "reading the CDC page needs read access to the CDC DAGs")
    return sources, can_act


@app.get("/", response_class=HTMLResponse)
async def index(request: Request, msg: str | None = None, source: str | None = None,
                refresh: int | None = None) -> HTMLResponse:
    """The page: every source the user may read, or ``?source=NAME`` alone; it reloads itself
    every ``?refresh=N`` seconds (default 60, 0: never)."""
    user = await _user(request)
    sources, can_act = await run_in_threadpool(_readable_or_403, user, source or None)
    return HTMLResponse(render(sources, user=user.get_name(), can_act=can_act, flash=msg, only=source or None,
                               refresh=refresh_seconds(refresh)))


@app.get("/api/status")
async def status_json(request: Request, source: str | None = None) -> JSONResponse:
    user = await _user(request)
    sources, can_act = await run_in_threadpool(_readable_or_403, user, source or None)
    return JSONResponse({"user": user.get_name(), "sources": sources, "can_act": can_act})


def _same_origin(request: Request) -> bool:
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return bool(request.headers.get("authorization"))  # a script with a bearer token, not a browser form
    return urlsplit(origin).netloc == request.headers.get("host")


@app.post("/action")
async def action(request: Request, source: str = Form(...), table: str = Form(...),
                 action: str = Form(...)) -> Any:
    user = await _user(request)
    if not _same_origin(request):
        raise HTTPException(403, "an action must come from the CDC page itself")
    if action not in ACTIONS:
        raise HTTPException(400, f"action {action!r}: one of {', '.join(ACTIONS)}")
    sources, can_act = await run_in_threadpool(_visible, user, source)
    src = next((s for s in sources if s["source"] == source), None)
    if src is None or not any(t["table"] == table for t in src["tables"]):
        raise HTTPException(404, f"no table {table!r} of source {source!r} you may read")
    if not can_act.get(source):
        raise HTTPException(403, f"{action} needs the right to trigger DAG {src['snapshot_dag']}")
    if action == "verify":
        msg = await run_in_threadpool(_start_verify, source, table)
    else:
        msg = await run_in_threadpool(_trigger, src["snapshot_dag"], action, table, user.get_name())
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse({"ok": True, "message": msg})
    return RedirectResponse(f"./?source={quote(source)}&msg={quote(msg)}", status_code=303)


def _trigger(dag_id: str, action: str, table: str, user_name: str) -> str:
    """The same DAG run the snapshot DAG's trigger form makes: ``{"action": ..., "tables": [...]}``."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound
    from airflow.utils.types import DagRunTriggeredByType

    try:
        run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.UI, triggering_user_name=user_name,
                          conf={"action": action, "tables": [table]})
    except DagNotFound as exc:
        raise HTTPException(404, f"DAG {dag_id} is not known to Airflow: {exc}") from exc
    return f"{action} of {table}: DAG run {run.run_id} of {dag_id} queued"


def _start_verify(source: str, table: str) -> str:
    """``airflow-cdc verify`` for the table, in the background; it records its result, which
    the page then shows."""
    from ..settings import load
    from ..status import config_source

    exe = shutil.which("airflow-cdc") or str(Path(sys.executable).with_name("airflow-cdc"))
    logs = Path(os.environ.get("AIRFLOW_HOME", ".")) / "logs" / "cdc_verify"
    logs.mkdir(parents=True, exist_ok=True)
    out = logs / f"{quote(source, safe='')}__{quote(table, safe='')}.log"
    args = [exe, "verify", "--source", source, "--table", table]
    now = load()
    if config_source(source, now) is None:  # (a source of the sources config brings its own connection)
        # the environment's source uses its connection; any other source is named by its connection id
        args += ["--conn-id", now.conn_id if (now.explicit_source or now.conn_id) == source else source]
    with open(out, "ab") as f:
        subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,  # noqa: S603
                         start_new_session=True)
    return f"verify of {table} started; its result appears here when it ends (log: {out})"
