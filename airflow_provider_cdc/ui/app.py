"""The CDC page's web app (FastAPI), mounted by the api-server at ``/cdc`` (ui/plugin.py) behind
Airflow's own authentication and authorization: reading needs read access to a source's
snapshot DAG, acting (pause, resume, stop, verify: DAG runs) the right to trigger it, from this
origin; framed only by Airflow's UI (docs/DESIGN.md, "What operators and consumers see").
"""

from __future__ import annotations

import logging
import threading
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

#: sent with every answer: only Airflow's own UI (this origin) may frame the page
SECURITY_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'self'",
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
}


@app.middleware("http")
async def _security_headers(request: Request, call_next):
    response = await call_next(request)
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


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


def _team_of(dag_id: str) -> str | None:
    """The team that owns ``dag_id`` (its bundle's), as Airflow's own routes pass it to the auth
    manager: under multi-team deployments a user of another team is refused. None on an Airflow
    without teams."""
    from airflow.models.dag import DagModel

    get_team_name = getattr(DagModel, "get_team_name", None)  # Airflow 3.1+
    return get_team_name(dag_id) if get_team_name is not None else None


def _may(user: Any, dag_id: str, *, act: bool) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    details = DagDetails(id=dag_id, team_name=_team_of(dag_id))
    if act:
        return get_auth_manager().is_authorized_dag(
            method="POST", access_entity=DagAccessEntity.RUN, details=details, user=user
        )
    return get_auth_manager().is_authorized_dag(method="GET", details=details, user=user)


def _visible(user: Any, source: str | None = None) -> tuple[list[dict], dict[str, bool]]:
    """The sources the user may read, and whether they may act on each: only a source this
    deployment names (its own DAGs; a Variable-only source: never), by the right to trigger its
    snapshot DAG (pause, resume, stop) and its verify DAG (verify)."""
    from ..status import overview

    sources = overview(source, include=lambda _name, dag_id: _may(user, dag_id, act=False))
    return sources, {
        s["source"]: bool(s.get("known")) and _may(user, s["snapshot_dag"], act=True) for s in sources
    }


def _readable_or_403(user: Any, source: str | None = None) -> tuple[list[dict], dict[str, bool]]:
    sources, can_act = _visible(user, source)
    if not sources and not _may(user, "cdc_snapshot", act=False):
        raise HTTPException(403, "reading the CDC page needs read access to the CDC DAGs")
    return sources, can_act


@app.get("/", response_class=HTMLResponse)
async def index(
    request: Request,
    source: str | None = None,
    refresh: int | None = None,
    done: str | None = None,
    table: str | None = None,
) -> HTMLResponse:
    """The page: every source the user may read, or ``?source=NAME`` alone; it reloads itself
    every ``?refresh=N`` seconds (default 60, 0: never). ``?done=ACTION&table=T`` (where an
    action redirects to) shows that action's fixed sentence, for a table the page shows: a
    link cannot put text of its own into Airflow's UI."""
    user = await _user(request)
    sources, can_act = await run_in_threadpool(_readable_or_403, user, source or None)
    return HTMLResponse(
        render(
            sources,
            user=user.get_name(),
            can_act=can_act,
            flash=_flash(sources, done, table),
            only=source or None,
            refresh=refresh_seconds(refresh),
        )
    )


def _flash(sources: list[dict], done: str | None, table: str | None) -> str | None:
    if done not in ACTIONS or not table:
        return None
    if not any(t["table"] == table for s in sources for t in s["tables"]):
        return None
    if done == "verify":
        return (
            f"verify of {table}: a run of the source's verify DAG is queued or running; its result "
            "appears here"
        )
    return f"{done} of {table}: a run of the source's snapshot DAG is queued"


@app.get("/api/status")
async def status_json(request: Request, source: str | None = None) -> JSONResponse:
    user = await _user(request)
    sources, can_act = await run_in_threadpool(_readable_or_403, user, source or None)
    return JSONResponse({"user": user.get_name(), "sources": sources, "can_act": can_act})


def _same_origin(request: Request) -> bool:
    """A browser's form sends Origin (or Referer): it must be this page's. Without either, only
    a script that authenticates with a bearer token (never a cookie a browser adds by itself)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        header = request.headers.get("authorization", "")
        return header[:7].lower() == "bearer " and bool(header[7:].strip())
    return urlsplit(origin).netloc == request.headers.get("host")


@app.post("/action")
async def action(
    request: Request, source: str = Form(...), table: str = Form(...), action: str = Form(...)
) -> Any:
    user = await _user(request)
    if not _same_origin(request):
        raise HTTPException(
            403, "an action must come from the CDC page itself (or a script with a bearer token)"
        )
    if action not in ACTIONS:
        raise HTTPException(400, f"action {action!r}: one of {', '.join(ACTIONS)}")
    sources, can_act = await run_in_threadpool(_visible, user, source)
    src = next((s for s in sources if s["source"] == source), None)
    if src is None or not any(t["table"] == table for t in src["tables"]):
        raise HTTPException(404, f"no table {table!r} of source {source!r} you may read")
    if not src.get("known"):  # named only by a Variable: no DAG, no connection of its own
        raise HTTPException(
            403,
            f"source {source!r} is not named by the sources config or the environment: the CDC "
            "page acts only on those",
        )
    row = next(t for t in src["tables"] if t["table"] == table)
    if row.get("refused"):  # the one scope check (I15)
        raise HTTPException(403, row["refused"])
    dag_id = src["verify_dag"] if action == "verify" else src["snapshot_dag"]
    if not can_act.get(source) or not await run_in_threadpool(_may, user, dag_id, act=True):
        raise HTTPException(403, f"{action} needs the right to trigger DAG {dag_id}")
    if action == "verify":
        msg, run_id = await run_in_threadpool(_trigger_verify, dag_id, table, user.get_name())
    else:
        msg, run_id = await run_in_threadpool(_trigger, dag_id, action, table, user.get_name())
    if "application/json" in request.headers.get("accept", ""):
        return JSONResponse({"ok": True, "message": msg, "dag_id": dag_id, "run_id": run_id})
    return RedirectResponse(
        f"./?source={quote(source, safe='')}&done={action}&table={quote(table, safe='')}", status_code=303
    )


def _trigger(dag_id: str, action: str, table: str, user_name: str) -> tuple[str, str]:
    """The same DAG run the snapshot DAG's trigger form makes: ``{"action": ..., "tables": [...]}``."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound
    from airflow.utils.types import DagRunTriggeredByType

    try:
        run = trigger_dag(
            dag_id,
            triggered_by=DagRunTriggeredByType.UI,
            triggering_user_name=user_name,
            conf={"action": action, "tables": [table]},
        )
    except DagNotFound as exc:
        raise HTTPException(404, f"DAG {dag_id} is not known to Airflow: {exc}") from exc
    return f"{action} of {table}: DAG run {run.run_id} of {dag_id} queued", run.run_id


#: one trigger decision at a time in this api-server (two clicks: one run)
_verify_lock = threading.Lock()


def _trigger_verify(dag_id: str, table: str, user_name: str) -> tuple[str, str]:
    """A run of the source's verify DAG for ``table``, unless one is queued or running already
    (then that one: a click more starts nothing). The run reads the source in a worker, under
    Airflow's limits (the DAG's max_active_runs=1, pools, parallelism), not in the api-server."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.exceptions import DagNotFound
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType

    with _verify_lock:
        with create_session() as session:
            active = (
                session.query(DagRun.run_id, DagRun.conf)
                .filter(DagRun.dag_id == dag_id, DagRun.state.in_([DagRunState.QUEUED, DagRunState.RUNNING]))
                .all()
            )
        same = next(
            (run_id for run_id, conf in active if isinstance(conf, dict) and conf.get("table") == table), None
        )
        if same is not None:
            return f"verify of {table}: DAG run {same} of {dag_id} is already queued or running", same
        try:
            run = trigger_dag(
                dag_id,
                triggered_by=DagRunTriggeredByType.UI,
                triggering_user_name=user_name,
                conf={"table": table},
            )
        except DagNotFound as exc:
            raise HTTPException(
                404,
                f"DAG {dag_id} is not known to Airflow (dags/cdc_verify.py, or cdc_sources.py "
                f"for a source of the sources config, in the DAG folder): {exc}",
            ) from exc
    return f"verify of {table}: DAG run {run.run_id} of {dag_id} queued", run.run_id
