"""The dashboard's pages and actions (under /ui).

What a key sees and may do follows its ring and queue scopes exactly as the
API: reads need any key and show only queues its scopes cover (a task
outside them does not exist); actions need ring 1 (operator) or stronger.
Each page and action is declared in ``batonq.access.DOORS`` and passes its
gate (``admit``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from batonq import errors, schedules
from batonq.access import Refused, admit, door, visible_schedule, visible_task
from batonq.dashboard import layout
from batonq.dashboard.session import (
    FLASH_COOKIE,
    Session,
    check_csrf,
    check_login_csrf,
    current,
    login_csrf,
    set_flash,
    set_login_csrf,
    sign_in,
    sign_out,
    take_flash,
)
from batonq.models import STATE_FILTERS, Edge, QueueStats, Task, Throughput, task_ref
from batonq.rings import RINGS
from batonq.schemas import QueueSettingsIn, RunOut
from batonq.service.admin import actor
from batonq.service.reads import LINEAGE_LIMIT
from batonq.service.state import client_of, reader_of

__all__ = ["NotSignedIn", "router", "to_login"]

router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).with_name("templates"))

PAGE = 50
SPARK_MINUTES = 15
BULK_LIMIT = 500
DONE = {"retry": "Retried", "cancel": "Cancelled", "hold": "Held", "release": "Released"}
"""The actions on a task, and how a page reports each once done."""
ACTIONS = tuple(DONE)
ALLOWED = {
    "retry": ("dead", "cancelled"),
    "cancel": ("waiting", "held", "pending", "leased"),
    "hold": ("pending",),
    "release": ("held",),
}
WINDOWS = {"1h": 3600.0, "24h": 86400.0, "7d": 604800.0}
SCHEDULE_ACTIONS = {"pause": "Paused", "resume": "Resumed", "run": "Ran", "remove": "Removed"}
"""A schedule's actions, and how the page reports each once done."""
TICKS_SHOWN = 3  # next fire times and last firings per schedule
AUDIT_SHOWN = 10  # a queue's last settings changes
SETTINGS = (
    ("lease_s", "Lease (s)"), ("max_attempts", "Max attempts"),
    ("backoff_base_s", "Backoff base (s)"), ("backoff_max_s", "Backoff max (s)"),
    ("retention_s", "Retention (s)"), ("max_body_bytes", "Max body (bytes)"),
    ("max_leased", "Max leased"), ("group_max_leased", "Max leased per group"),
    ("rate_limit", "Rate limit"), ("group_rate_limit", "Rate limit per group"),
    ("rate_period_s", "Rate period (s)"),
)  # fmt: skip
"""The settings a queue's page edits, in QueueSettingsIn's names, with their labels."""


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m {seconds % 60:.0f}s"
    if seconds < 86400:
        return f"{seconds // 3600:.0f}h {seconds % 3600 // 60:.0f}m"
    return f"{seconds // 86400:.0f}d {seconds % 86400 // 3600:.0f}h"


def _since(moment: datetime | None) -> str:
    return "—" if moment is None else _age((datetime.now(UTC) - moment).total_seconds())


def _until(moment: datetime | None) -> str:
    return "—" if moment is None else _age((moment - datetime.now(UTC)).total_seconds())


def _when(moment: datetime | None) -> str:
    return "—" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def _error_parts(error: Any) -> tuple[str, str]:
    """An error as its message and the rest (a traceback, or ""): the worker
    writes the message, a blank line, then the trace; JSON that is not text
    is shown as JSON."""
    text = error if isinstance(error, str) else _pretty(error)
    message, _, trace = text.partition("\n\n")
    return message, trace


def _scheduled(task: Task, now: datetime) -> bool:
    """Whether a task is pending but not due yet (the lists' ``scheduled``)."""
    return task.state == "pending" and task.run_at > now


templates.env.filters.update(
    age=_age, since=_since, until=_until, when=_when, pretty=_pretty, ref=task_ref, error_parts=_error_parts
)
templates.env.globals.update(RINGS=RINGS, STATES=STATE_FILTERS, ALLOWED=ALLOWED, is_scheduled=_scheduled)


def _page(
    request: Request, session: Session | None, name: str, status: int = 200, **context: Any
) -> Response:
    response = templates.TemplateResponse(
        request, name, {"session": session, **context}, status_code=status
    )
    response.headers["Cache-Control"] = "no-store"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'"
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


def _to_login(request: Request) -> Response:
    if request.headers.get("hx-request"):
        return Response(status_code=204, headers={"HX-Redirect": "/ui/login"})
    return RedirectResponse("/ui/login", status_code=303)


def _text(value: str | None) -> str | None:
    value = (value or "").strip()
    return value or None


class NotSignedIn(Exception):
    """Raised by the ``Reader`` dependency; answered by ``to_login``."""


def _door(request: Request) -> str:
    """The page's or action's name in ``batonq.access.DOORS``."""
    return f"{request.method} {request.scope['route'].path}"


async def _signed_in(request: Request) -> Session:
    session = await current(request)
    if session is None:
        raise NotSignedIn()
    admit(session.access, _door(request))
    return session


async def to_login(request: Request, _: Exception) -> Response:
    """Send a request without a valid session to the sign-in page."""
    return _to_login(request)


Reader = Annotated[Session, Depends(_signed_in)]


# -- signing in ---------------------------------------------------------------


def _login_page(
    request: Request, status: int = 200, error: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    token = login_csrf(request)
    response = _page(request, None, "login.html", status=status, error=error, csrf=token)
    response.headers.update(headers or {})
    set_login_csrf(request, response, token)
    return response


@router.get("/login")
async def login_form(request: Request) -> Response:
    return _login_page(request)


@router.post("/login")
async def login(request: Request) -> Response:
    form = await request.form()
    if not check_login_csrf(request, form.get("csrf")):
        return _login_page(request, 403, "This form is out of date: sign in again.")
    key = form.get("key")
    response = RedirectResponse("/ui", status_code=303)
    try:
        await sign_in(request, key.strip() if isinstance(key, str) else "", response)
    except Refused as error:
        # 200, not 401: the form again, with the reason (a 401 page is a console error);
        # 429 with Retry-After while the address has too many failures
        status = 429 if error.status == 429 else 200
        return _login_page(request, status, error.message, error.headers if status == 429 else None)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    response = RedirectResponse("/ui/login", status_code=303)
    session = await current(request)
    if session is None:  # nothing to end; a form from another site sends no cookie
        return response
    if not await check_csrf(request, session):
        return _page(request, session, "error.html", status=403, message="This form is out of date: reload.")
    await sign_out(request, session, response)
    return response


# -- queues -------------------------------------------------------------------


def _sparks(queues: Sequence[str], counts: Sequence[Throughput]) -> dict[str, list[int]]:
    """Finishes per minute for the last SPARK_MINUTES minutes, oldest first, per queue."""
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    series = {q: [0] * SPARK_MINUTES for q in queues}
    for row in counts:
        back = int((now - row.minute).total_seconds() // 60)
        if row.queue in series and 0 <= back < SPARK_MINUTES:
            series[row.queue][SPARK_MINUTES - 1 - back] = row.done + row.dead
    return series


async def _queue_rows(request: Request, session: Session) -> dict[str, Any]:
    client = reader_of(request)
    search, after = _text(request.query_params.get("q")), _text(request.query_params.get("after"))
    scopes = session.access.queues
    page, total = await asyncio.gather(
        client.queue_page(scopes, search=search, after=after, limit=PAGE + 1),
        client.queue_count(scopes, search=search),
    )
    more = len(page) > PAGE
    shown = [q for q in page[:PAGE] if session.covers(q.queue)]
    names = [q.queue for q in shown]
    sparks = _sparks(names, await client.throughput(names, SPARK_MINUTES)) if names else {}
    return {
        "queues": shown,
        "sparks": sparks,
        "total": total,
        "search": search or "",
        "after": after or "",
        "next_after": shown[-1].queue if more and shown else None,
        "any_paused": any(q.paused for q in shown),
    }


@router.get("")
async def queues_page(request: Request, session: Reader) -> Response:
    return _page(request, session, "queues.html", **await _queue_rows(request, session))


@router.get("/queues/rows")
async def queue_rows(request: Request, session: Reader) -> Response:
    return _page(request, session, "_queue_rows.html", **await _queue_rows(request, session))


# -- a queue's settings -----------------------------------------------------------


async def _settings_page(
    request: Request,
    session: Session,
    queue: str,
    status: int = 200,
    outcome: dict[str, Any] | None = None,
    typed: dict[str, str] | None = None,
) -> Response:
    """The page; ``typed``: what a refused form held, shown again to correct."""
    client = reader_of(request)
    configs, audit = await asyncio.gather(
        client.queue_configs([queue]), client.settings_audit(kind="queue", name=queue, limit=AUDIT_SHOWN)
    )
    if not configs or not session.covers(queue):  # a queue outside the key's scopes does not exist
        return _page(request, session, "error.html", status=404, message=f"queue {queue} not found")
    config = configs[0]
    current_values = {name: getattr(config, name) for name, _ in SETTINGS}
    values = {name: "" if value is None else str(value) for name, value in current_values.items()}
    return _page(
        request, session, "settings.html", status=status, queue=queue, config=config, audit=audit,
        fields=SETTINGS, values=values | (typed or {}), outcome=outcome,
        may_edit=_may(session, "POST /ui/queues/{queue}/settings"),
    )  # fmt: skip


@router.get("/queues/{queue}/settings")
async def settings_page(request: Request, queue: str, session: Reader) -> Response:
    """A queue's settings and limits, and who changed them when."""
    done, _, name = request.cookies.get(FLASH_COOKIE, "").partition(":")
    outcome = {"ok": True, "text": f"{done} {queue}."} if name == queue and done in _CHANGED else None
    response = await _settings_page(request, session, queue, outcome=outcome)
    take_flash(request, response)
    return response


_CHANGED = ("Paused", "Resumed", "Saved")


def _form_value(text: str) -> Any:
    """A form field as the JSON value it spells (``300``, ``1.5``, ``true``),
    else as text, for the API's schema to check as it checks a body."""
    try:
        return json.loads(text)
    except ValueError:
        return text.strip()


@router.post("/queues/{queue}/settings")
async def change_settings(request: Request, queue: str) -> Response:
    """Pause, resume or change a queue's settings, checked as PATCH
    /v1/queues/{queue} checks them; empty fields keep their value."""
    session = await _acting(request)
    if isinstance(session, Response):
        return session
    if not session.covers(queue) or not await client_of(request).queue_configs([queue]):
        return _page(request, session, "error.html", status=404, message=f"queue {queue} not found")
    form = await request.form()
    typed = {name: value.strip() for name, value in form.items() if name != "csrf" and isinstance(value, str)}
    given = {name: _form_value(value) for name, value in typed.items() if value}
    try:
        changes = QueueSettingsIn.model_validate(given)
    except ValidationError as invalid:
        labels = dict(SETTINGS)
        problems = "; ".join(
            f"{labels.get(str(e['loc'][0]), e['loc'][0]) if e['loc'] else 'form'}: {e['msg']}"
            for e in invalid.errors()
        )
        # 200, not 422: the form again, with the reason (an error status is a console error)
        return await _settings_page(request, session, queue, 200, {"ok": False, "text": problems}, typed)
    try:
        await client_of(request).configure_queue(queue, **changes.model_dump(), actor=actor(session.access))
    except errors.BatonqError as error:
        return await _settings_page(request, session, queue, 200, {"ok": False, "text": error.message}, typed)
    done = "Saved" if changes.paused is None else "Paused" if changes.paused else "Resumed"
    response = RedirectResponse(f"/ui/queues/{quote(queue, safe=':')}/settings", status_code=303)
    set_flash(request, response, f"{done}:{queue}")
    return response


# -- tasks --------------------------------------------------------------------


_TASK_REF = re.compile(r"(?:t_)?[0-9]{1,18}")


@router.get("/find")
async def find_page(request: Request, session: Reader) -> Response:
    """A task by its id (``t_5521``: straight to its page) or the tasks with
    that idempotency key, across the key's queues."""
    text = _text(request.query_params.get("q"))
    found: list[Task] = []
    if text is not None:
        if _TASK_REF.fullmatch(text):
            try:
                task = await visible_task(client_of(request), session.access, text)
            except (errors.TaskNotFound, errors.InvalidArgument):
                pass  # perhaps a key that looks like an id
            else:
                return RedirectResponse(f"/ui/tasks/{task_ref(task.id)}", status_code=303)
        keyed = await reader_of(request).tasks_by_key(text, session.access.queues, limit=PAGE)
        found = [t for t in keyed if session.covers(t.queue)]
    return _page(request, session, "find.html", q=text or "", tasks=found)


_FILTERS = ("queue", "state", "key", "worker", "before")
"""A task list's filters, in the page's query string and in its forms."""


async def _tasks_page(
    request: Request, session: Session, filters: dict[str, str | None], outcome: dict[str, Any] | None = None
) -> Response:
    queue, state, key, worker, before = (filters.get(name) for name in _FILTERS)
    found: list[Task] = []
    limits: list[str] = []
    problem = None
    now = datetime.now(UTC)
    if queue is not None:
        if not session.covers(queue):
            problem = f"This key may not see queue {queue!r}."
        else:
            try:
                found = await reader_of(request).find_tasks(
                    queue, state=state, idempotency_key=key, worker=worker, limit=PAGE, before_id=before
                )
                configs = await reader_of(request).queue_configs([queue])
            except errors.BatonqError as error:
                problem = error.message
            else:
                limits = configs[0].limits if configs else []
    return _page(
        request, session, "tasks.html",
        queue=queue or "", state=state or "", key=key or "", worker=worker or "",
        tasks=found, grouped=any(t.group is not None for t in found), limits=limits, problem=problem,
        now=now, scheduled={t.id for t in found if _scheduled(t, now)},
        next_before=task_ref(found[-1].id) if len(found) == PAGE else None,
        live_url=_live_url("/ui/tasks", filters), outcome=outcome, bulk_limit=BULK_LIMIT,
    )  # fmt: skip


def _live_url(path: str, filters: dict[str, str | None]) -> str:
    """Where a live list asks for its next state: its page, with the filters
    it shows (also after an action, whose answer came from another path)."""
    return f"{path}?{urlencode({k: v for k, v in filters.items() if v is not None}, safe=':')}"


def _filters(values: Any) -> dict[str, str | None]:
    """The filters named in ``values`` (query parameters or a form's fields)."""
    return {name: _text(v if isinstance(v := values.get(name), str) else None) for name in _FILTERS}


@router.get("/tasks")
async def tasks_page(request: Request, session: Reader) -> Response:
    return await _tasks_page(request, session, _filters(request.query_params))


def _task_action(request: Request, action: str) -> Callable[[int], Awaitable[Task]]:
    """The client's call for one of ACTIONS."""
    client = client_of(request)
    calls = {"retry": client.retry, "cancel": client.cancel, "hold": client.hold, "release": client.release}
    return calls[action]


@router.post("/tasks/bulk")
async def act_on_many(request: Request) -> Response:
    """Retry, cancel, hold or release the chosen tasks of a list, or every
    task its filters show (up to BULK_LIMIT), each as its own action: one
    that cannot be taken (a task in another state, or not visible) is
    reported and the others go on."""
    session = await _acting(request)
    if isinstance(session, Response):
        return session
    form = await request.form()
    action, filters = form.get("op"), _filters(form)
    if not isinstance(action, str) or action not in ACTIONS:
        return _page(request, session, "error.html", status=404, message=f"No action {action!r}.")
    client = client_of(request)
    chosen: list[str | int] = [v for v in form.getlist("task") if isinstance(v, str)]
    queue = filters["queue"]
    if form.get("all") and queue is not None and session.covers(queue):
        every = await client.find_tasks(
            queue, state=filters["state"], idempotency_key=filters["key"], worker=filters["worker"],
            limit=BULK_LIMIT,
        )  # fmt: skip
        chosen = [t.id for t in every]
    operation = _task_action(request, action)
    acted, refusals = 0, []
    for task_id in chosen[:BULK_LIMIT]:
        try:
            task = await visible_task(client, session.access, str(task_id))
            await operation(task.id)
            acted += 1
        except errors.BatonqError as failure:
            refusals.append(failure.message)
    text = f"{DONE[action]} {acted} task{'s' if acted != 1 else ''}."
    if not chosen:
        text = "No task chosen: tick the tasks to act on, or every task this list shows."
    elif refusals:
        text += f" {len(refusals)} could not be ({refusals[0]})."
    return await _tasks_page(
        request, session, {**filters, "before": None}, {"ok": bool(chosen) and not refusals, "text": text}
    )


def _moment(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _attempts(task: Task) -> list[dict[str, Any]]:
    """Every attempt: the ones that ended unfinished from the task's history
    (errors, each with its worker and start), then the current or last one."""
    rows: list[dict[str, Any]] = []
    for entry in task.errors:
        rows.append({
            "attempt": entry.get("attempt"), "fencing_token": entry.get("fencing_token"),
            "worker": entry.get("worker"), "started": _moment(entry.get("started_at")),
            "ended": _moment(entry.get("at")), "error": entry.get("error"), "outcome": "failed",
        })  # fmt: skip
    failed_tokens = {row["fencing_token"] for row in rows}
    if task.fencing_token is not None and task.fencing_token not in failed_tokens:
        outcome = {"leased": "running", "done": "done", "cancelled": "cancelled"}.get(task.state, "released")
        rows.append({
            "attempt": task.attempts, "fencing_token": task.fencing_token, "worker": task.worker,
            "started": task.claimed_at, "ended": task.finished_at, "error": None, "outcome": outcome,
        })  # fmt: skip
    return rows


async def _task_context(request: Request, session: Session, task: Task) -> dict[str, Any]:
    client = client_of(request)
    late, run, lineage = await asyncio.gather(
        client.set_aside_writes([task.id]), client.run_status(task.root_id),
        client.run_tasks(task.root_id, LINEAGE_LIMIT),  # a long run is not read whole
    )  # fmt: skip
    family = [t for t in lineage if session.covers(t.queue)]
    ids = {t.id for t in family}
    tree = layout.layered([t.id for t in family], [(t.parent_id, t.id) for t in family if t.parent_id in ids])
    return {
        "task": task,
        "attempts": _attempts(task),
        "late_writes": late,
        "run": RunOut.of(run, session.covers),  # where it failed only if the key covers it, as the API
        "tree": tree,
        "family": {t.id: t for t in family},
        "parent_visible": task.parent_id in ids,
        "children": [t for t in family if t.parent_id == task.id],
        "lineage_cut": run.tasks > LINEAGE_LIMIT,
        "now": datetime.now(UTC),
    }


async def _visible(request: Request, session: Session, task_id: str) -> Task | Response:
    try:
        return await visible_task(client_of(request), session.access, task_id)
    except (errors.TaskNotFound, errors.InvalidArgument) as error:
        return _page(request, session, "error.html", status=404, message=error.message)


@router.get("/tasks/{task_id}")
async def task_page(request: Request, task_id: str, session: Reader) -> Response:
    task = await _visible(request, session, task_id)
    if isinstance(task, Response):
        return task
    ref = task_ref(task.id)
    outcome = None
    if request.cookies.get(FLASH_COOKIE) == ref:  # back from a plain form's action
        outcome = {"ok": True, "text": f"{ref} is {task.state} now."}
    context = await _task_context(request, session, task)
    response = _page(request, session, "task.html", outcome=outcome, **context)
    take_flash(request, response)
    return response


async def _acting(request: Request, action: object = None) -> Session | Response:
    """The session of a request that may take ``action`` (the dashboard's
    gate for every action: signed in, ring, CSRF token); else the refusal."""
    session = await current(request)
    if session is None:
        return _page(request, None, "error.html", status=401, message="Sign in first.")
    try:
        admit(session.access, _door(request), action)
    except Refused:
        ring, needed = session.access.ring, door(_door(request)).ring_for(action)
        assert needed is not None
        message = (
            f"Your key is of ring {ring} ({RINGS[ring]}); this needs ring {needed} ({RINGS[needed]}) "
            "or stronger."
        )
        return _page(request, session, "error.html", status=403, message=message)
    if not await check_csrf(request, session):
        return _page(request, session, "error.html", status=403, message="This form is out of date: reload.")
    return session


@router.post("/tasks/{task_id}/{action}")
async def act(request: Request, task_id: str, action: str) -> Response:
    session = await _acting(request)
    if isinstance(session, Response):
        return session
    if action not in ACTIONS:
        return _page(request, session, "error.html", status=404, message=f"No action {action!r}.")
    task = await _visible(request, session, task_id)
    if isinstance(task, Response):
        return task
    client = client_of(request)
    try:
        task = await _task_action(request, action)(task.id)
        outcome = {"ok": True, "text": f"{task_ref(task.id)} is {task.state} now."}
    except errors.BatonqError as error:
        task = await client.task(task.id)
        outcome = {"ok": False, "text": error.message}
    plain = not request.headers.get("hx-request")
    if plain and outcome["ok"]:  # a plain form: show the task, and reloading it acts no more
        response = RedirectResponse(f"/ui/tasks/{task_ref(task.id)}", status_code=303)
        set_flash(request, response, task_ref(task.id))
        return response
    context = await _task_context(request, session, task)
    if plain:
        return _page(request, session, "task.html", outcome=outcome, **context)
    # The summary, and the run's tree swapped in beside it (out of band): the task's state moved in both.
    return _page(request, session, "_task_summary.html", outcome=outcome, lineage_too=True, **context)


# -- dead letters ---------------------------------------------------------------


@router.get("/dead")
async def dead_page(request: Request, session: Reader) -> Response:
    params = request.query_params
    queue, error, before = _text(params.get("queue")), _text(params.get("error")), _text(params.get("before"))
    found: list[Task] = []
    problem = None
    try:
        found = await reader_of(request).dead_tasks(
            session.access.queues, queue=queue, error=error, limit=PAGE, before_id=before
        )
    except errors.BatonqError as failure:
        problem = failure.message
    found = [t for t in found if session.covers(t.queue)]
    return _page(
        request, session, "dead.html", queue=queue or "", error=error or "", tasks=found, problem=problem,
        next_before=task_ref(found[-1].id) if len(found) == PAGE else None,
        bulk_limit=BULK_LIMIT, outcome=None,
        live_url=_live_url("/ui/dead", {"queue": queue, "error": error, "before": before}),
    )  # fmt: skip


@router.post("/dead/retry")
async def retry_dead(request: Request) -> Response:
    """Retry every dead task of the filtered set (up to BULK_LIMIT at a time)."""
    session = await _acting(request)
    if isinstance(session, Response):
        return session
    form = await request.form()
    queue = _text(form.get("queue") if isinstance(form.get("queue"), str) else None)  # type: ignore[arg-type]
    error = _text(form.get("error") if isinstance(form.get("error"), str) else None)  # type: ignore[arg-type]
    client = client_of(request)
    chosen = await client.dead_tasks(session.access.queues, queue=queue, error=error, limit=BULK_LIMIT)
    retried, refusals = 0, []
    for task in chosen:
        if not session.covers(task.queue):
            continue
        try:
            await client.retry(task.id)
            retried += 1
        except errors.BatonqError as failure:  # retried or removed since it was listed
            refusals.append(f"{task_ref(task.id)}: {failure.message}")
    text = f"Retried {retried} dead task{'s' if retried != 1 else ''}; they are pending now."
    if refusals:
        text += f" {len(refusals)} could not be retried ({refusals[0]})."
    if len(chosen) == BULK_LIMIT:
        text += f" At most {BULK_LIMIT} at a time: retry again for the rest."
    remaining = await client.dead_tasks(session.access.queues, queue=queue, error=error, limit=PAGE)
    return _page(
        request, session, "dead.html", queue=queue or "", error=error or "", problem=None,
        tasks=[t for t in remaining if session.covers(t.queue)],
        next_before=None, bulk_limit=BULK_LIMIT, outcome={"ok": not refusals, "text": text},
        live_url=_live_url("/ui/dead", {"queue": queue, "error": error}),
    )  # fmt: skip


# -- schedules ------------------------------------------------------------------


def _may(session: Session, name: str, action: object = None) -> bool:
    """Whether the session's key may pass door ``name`` for ``action`` (to
    show its button)."""
    needed = door(name).ring_for(action)
    return needed is None or session.access.ring <= needed


@router.get("/schedules")
async def schedules_page(request: Request, session: Reader) -> Response:
    """Every schedule of the key's queues: its cron, next fire times, paused
    state and last firings."""
    client = reader_of(request)
    shown = [found for found in await client.schedules() if session.covers(found.queue)]
    firings = await asyncio.gather(*(client.schedule_firings(s.name, limit=TICKS_SHOWN) for s in shown))
    now = datetime.now(UTC)
    upcoming = {
        s.name: [] if s.paused else schedules.upcoming(s.cron, s.tz, s.next_tick, TICKS_SHOWN, now=now)
        for s in shown
    }
    done = request.cookies.get(FLASH_COOKIE, "").partition(":")
    outcome = None
    if done[0] in SCHEDULE_ACTIONS and done[2]:  # back from an action
        outcome = {"ok": True, "text": f"{SCHEDULE_ACTIONS[done[0]]} schedule {done[2]}."}
    response = _page(
        request, session, "schedules.html", schedules=shown, upcoming=upcoming,
        firings={s.name: f for s, f in zip(shown, firings, strict=True)}, outcome=outcome,
        may_remove=_may(session, "POST /ui/schedules/{name}/{action}", "remove"),
    )  # fmt: skip
    take_flash(request, response)
    return response


@router.post("/schedules/{name}/{action}")
async def act_on_schedule(request: Request, name: str, action: str) -> Response:
    """pause, resume, run (enqueue its payload into its queue now, outside
    its ticks) or remove a schedule; audited as the session's key."""
    session = await _acting(request, action)
    if isinstance(session, Response):
        return session
    if action not in SCHEDULE_ACTIONS:
        return _page(request, session, "error.html", status=404, message=f"No action {action!r}.")
    client, who = client_of(request), actor(session.access)
    try:
        schedule = await visible_schedule(client, session.access, name)
        if action == "run":
            await client.enqueue(schedule.queue, schedule.payload)
        elif action == "remove":
            await client.remove_schedule(name, actor=who)
        else:
            change = client.pause_schedule if action == "pause" else client.resume_schedule
            await change(name, actor=who)
    except errors.BatonqError as error:
        return _page(request, session, "error.html", status=404, message=error.message)
    response = RedirectResponse("/ui/schedules", status_code=303)
    set_flash(request, response, f"{action}:{name}")
    return response


# -- graph and workers --------------------------------------------------------


def edge_label(edge: Edge) -> str:
    """What an edge does, in a few words: map, when, fan_out, join."""
    parts = []
    if edge.is_join:
        parts.append("join (partial)" if edge.partial else "join")
    if edge.fan_out:
        parts.append(f"fan_out {edge.fan_out}")
    if edge.map:
        parts.append(f"map {edge.map}")
    if edge.when_pointer:
        if edge.when_present is not None:
            parts.append(f"when {edge.when_pointer} {'present' if edge.when_present else 'absent'}")
        else:
            parts.append(f"when {edge.when_pointer} = {json.dumps(edge.when_equals)}")
    return ", ".join(parts) or "result"


def backlog_level(stats: QueueStats | None) -> str:
    """A node's colour: how many tasks wait to be claimed."""
    backlog = 0 if stats is None else stats.pending + stats.scheduled
    return "none" if backlog == 0 else "some" if backlog < 100 else "many"


@router.get("/graph")
async def graph_page(request: Request, session: Reader) -> Response:
    client = reader_of(request)
    edges = [e for e in await client.edges() if session.covers(e.from_queue) or session.covers(e.to_queue)]
    names = sorted({e.from_queue for e in edges} | {e.to_queue for e in edges})
    visible = [n for n in names if session.covers(n)]
    found = await asyncio.gather(*(client.queues(n) for n in visible))
    stats = {rows[0].queue: rows[0] for rows in found if rows}
    drawing = layout.layered(names, [(e.from_queue, e.to_queue) for e in edges], vertical=False)
    return _page(
        request, session, "graph.html", drawing=drawing, edges=edges, stats=stats,
        labels=[edge_label(e) for e in edges], levels={n: backlog_level(stats.get(n)) for n in names},
    )  # fmt: skip


@router.get("/workers")
async def workers_page(request: Request, session: Reader) -> Response:
    window = request.query_params.get("window", "24h")
    if window not in WINDOWS:
        window = "24h"
    cards = await reader_of(request).worker_scorecards(session.access.queues, since_s=WINDOWS[window])
    return _page(request, session, "workers.html", cards=cards, window=window, windows=list(WINDOWS))
