"""Every door, every kind of key: each HTTP route in /openapi.json, each MCP
tool the server lists, each dashboard action (POST form), tried with a ring-0
key scoped to other queues, ring 1, 2 and 3 keys, a revoked key and no key.

Whatever a key may not do has no effect in the database (every batonq table
is compared before and after), and what a key may not see answers exactly
as what does not exist (same status, same error once the names are blanked).
A door without a declaration in ``batonq.access.DOORS``, or without a call
here, fails."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import APIRouter
from tests.e2e.live import LiveServer, claim_one, enqueue, new_key
from tests.mcp_server.support import http_session, text
from tests.waiting import wait_for

from batonq.access import DOORS, Door
from batonq.dashboard.views import router as dashboard_router
from batonq.mcp.server import build_server
from batonq.mcp.tools import TOOLS
from batonq.service import create_app
from batonq.service.auth import Key, check_doors

ADMIN, OPERATOR, WORKER, OBSERVER = 0, 1, 2, 3
SCOPED, REVOKED, NO_KEY = "ring 0 scoped to other queues", "revoked", "no key"
KEYS = (SCOPED, "ring 1", "ring 2", "ring 3", REVOKED, NO_KEY)
MISSING_ID = 999999999


@dataclass(frozen=True)
class Target:
    """The objects a call names: the seeded ones, or ones that do not exist."""

    queue: str
    task: str
    token: str
    schedule: str
    key_id: int
    edge: tuple[str, str]
    dead_queue: str

    def names(self) -> list[str]:
        """Longest first, so that a name inside another is blanked after it."""
        shown = [self.token, self.task, str(self.key_id), self.schedule, *self.edge, self.queue]
        shown += [self.dead_queue, self.task.removeprefix("t_"), self.token.partition("/")[0]]
        return sorted(set(shown), key=len, reverse=True)


def blank(answer: str, target: Target) -> str:
    for name in target.names():
        answer = re.sub(rf"\b{re.escape(name)}\b", "<name>", answer)
    return answer


# -- the database, before and after -------------------------------------------

_VOLATILE = {
    "api_keys": ["last_used_at"], "engine": None, "leaders": None, "group_leases": None,
    "group_lease_deltas": None,
}  # fmt: skip
"""Columns that a read may change (a key's last use), tables the sweeper
keeps (its duties' leases, renewed each tick; the groups' lease counts,
which it folds from the hot table, compared whole): left out of the
comparison."""


def snapshot(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    tables = [
        row[0]
        for row in conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'batonq' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
            " ORDER BY 1"
        )
    ]
    parts = []
    for table in tables:
        if table in _VOLATILE and _VOLATILE[table] is None:
            continue
        dropped = "".join(f" - '{column}'" for column in _VOLATILE.get(table) or [])
        parts.append(
            f"'{table}', (SELECT coalesce(jsonb_agg(r ORDER BY r::text), '[]') FROM"
            f" (SELECT to_jsonb(t){dropped} AS r FROM batonq.{table} t) s)"
        )
    row = conn.execute(f"SELECT jsonb_build_object({', '.join(parts)})").fetchone()
    assert row is not None
    found: dict[str, Any] = row[0]
    return found


# -- the seeded world -----------------------------------------------------------


@dataclass
class World:
    server: LiveServer
    conn: psycopg.Connection[Any]
    keys: dict[str, str | None]
    rings: dict[str, int]
    seeded: Target
    missing: Target


@pytest.fixture(scope="module")
def world(shared_server: LiveServer, shared_http: httpx.Client, module_dsn: str) -> Iterator[World]:
    admin = shared_http
    task = enqueue(admin, "own:q", {"n": 1})
    enqueue(admin, "own:lease", {"n": 2})
    token = claim_one(admin, "own:lease", lease_s=3600)["lease_token"]
    dead = enqueue(admin, "own:dead", {"n": 3}, max_attempts=1)
    dead_token = claim_one(admin, "own:dead", lease_s=3600)["lease_token"]
    assert admin.post("/v1/fail", json={"lease_token": dead_token, "requeue": False}).status_code == 200
    assert admin.get(f"/v1/tasks/{dead}").json()["state"] == "dead"
    schedule = {"name": "own:nightly", "cron": "0 0 1 1 *", "queue": "own:q"}
    assert admin.post("/v1/schedules", json=schedule).status_code == 200
    edge = {"from_queue": "own:a", "to_queue": "own:b"}
    assert admin.post("/v1/graph/edges", json=edge).status_code == 200
    target_key, _ = new_key(admin, OBSERVER, ["own:*"])
    keys: dict[str, str | None] = {SCOPED: new_key(admin, ADMIN, ["other:*"])[1], NO_KEY: None}
    for ring in (OPERATOR, WORKER, OBSERVER):
        keys[f"ring {ring}"] = new_key(admin, ring)[1]
    revoked_id, keys[REVOKED] = new_key(admin, ADMIN)
    assert admin.delete(f"/v1/keys/{revoked_id}").status_code == 200
    rings = {SCOPED: ADMIN, "ring 1": OPERATOR, "ring 2": WORKER, "ring 3": OBSERVER}
    seeded = Target("own:q", task, token, "own:nightly", target_key, ("own:a", "own:b"), "own:dead")
    missing = Target(
        "own:nope", f"t_{MISSING_ID}", f"own:nope/{MISSING_ID}/1/{'0' * 32}", "own:no-schedule",
        MISSING_ID, ("own:nope-a", "own:nope-b"), "own:nope-dead",
    )  # fmt: skip
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        # The sweeper plans a new schedule's next tick at its next round:
        # wait for it, or the first snapshot may see it move.
        wait_for(
            lambda: conn.execute("SELECT bool_and(next_tick IS NOT NULL) FROM batonq.schedules").fetchone()
            == (True,),
            timeout=30, what="the schedule's next tick planned",
        )  # fmt: skip
        yield World(shared_server, conn, keys, rings, seeded, missing)


def refused_to(world: World, who: str, door: Door, action: object = None) -> bool:
    """Whether ``who`` may not pass ``door`` at all (its ring, or no valid key)."""
    needed = door.ring_for(action)
    return needed is not None and (who not in world.rings or world.rings[who] > needed)


# -- HTTP -----------------------------------------------------------------------

Request = tuple[str, dict[str, Any]]
"""A call's path and its httpx options (json, params)."""

HTTP: dict[str, Callable[[Target], Request]] = {
    "POST /v1/enqueue": lambda t: (
        "/v1/enqueue", {"json": {"queue": t.queue, "payload": 1, "parent": t.task}}
    ),
    "POST /v1/claim": lambda t: ("/v1/claim", {"json": {"queue": t.queue}}),
    "GET /v1/stream": lambda t: ("/v1/stream", {"params": {"queue": t.queue, "claim": "true"}}),
    "POST /v1/heartbeat": lambda t: ("/v1/heartbeat", {"json": {"lease_token": t.token}}),
    "POST /v1/submit": lambda t: ("/v1/submit", {"json": {"lease_token": t.token, "result": 1}}),
    "POST /v1/fail": lambda t: ("/v1/fail", {"json": {"lease_token": t.token, "error": "x"}}),
    "POST /v1/release": lambda t: ("/v1/release", {"json": {"lease_token": t.token}}),
    "GET /v1/queues": lambda t: ("/v1/queues", {}),
    "GET /v1/queues/{queue}/settings": lambda t: (f"/v1/queues/{t.queue}/settings", {}),
    "GET /v1/tasks": lambda t: ("/v1/tasks", {"params": {"queue": t.queue}}),
    "GET /v1/tasks/{task_id}": lambda t: (f"/v1/tasks/{t.task}", {}),
    "GET /v1/runs/{root_id}": lambda t: (f"/v1/runs/{t.task}", {}),
    "GET /v1/graph": lambda t: ("/v1/graph", {}),
    "GET /v1/schedules": lambda t: ("/v1/schedules", {}),
    "POST /v1/tasks/{task_id}/{action}": lambda t: (f"/v1/tasks/{t.task}/cancel", {}),
    "POST /v1/schedules/{name}/{action}": lambda t: (f"/v1/schedules/{t.schedule}/pause", {}),
    "PATCH /v1/queues/{queue}": lambda t: (f"/v1/queues/{t.queue}", {"json": {"paused": True}}),
    "POST /v1/graph/edges": lambda t: (
        "/v1/graph/edges", {"json": {"from_queue": t.edge[0], "to_queue": t.queue}}
    ),
    "DELETE /v1/graph/edges/{from_queue}/{to_queue}": lambda t: (
        f"/v1/graph/edges/{t.edge[0]}/{t.edge[1]}", {}
    ),
    "GET /v1/keys": lambda t: ("/v1/keys", {}),
    "POST /v1/keys": lambda t: ("/v1/keys", {"json": {"ring": 0, "queues": [t.queue]}}),
    "DELETE /v1/keys/{key_id}": lambda t: (f"/v1/keys/{t.key_id}", {}),
    "POST /v1/schedules": lambda t: (
        "/v1/schedules", {"json": {"name": t.schedule, "cron": "* * * * *", "queue": t.queue}}
    ),
    "DELETE /v1/schedules/{name}": lambda t: (f"/v1/schedules/{t.schedule}", {}),
    "GET /v1/audit": lambda t: ("/v1/audit", {}),
}  # fmt: skip


def _openapi_doors(world: World) -> list[str]:
    spec = httpx.get(f"{world.server.url}/openapi.json").json()
    return sorted(f"{method.upper()} {path}" for path, item in spec["paths"].items() for method in item)


def _call_http(world: World, who: str, door: str, target: Target) -> tuple[httpx.Response, bool]:
    """The answer, and whether the call named anything (a listing names nothing)."""
    path, options = HTTP[door](target)
    method = door.split(" ")[0]
    with world.server.http(world.keys[who]) as http:
        response = http.request(method, path, **options)
    return response, HTTP[door](world.seeded) != HTTP[door](world.missing)


def test_every_http_route_is_declared_and_walked(world: World) -> None:
    doors = _openapi_doors(world)
    assert [d for d in doors if d not in DOORS] == [], "routes without a declaration in batonq.access.DOORS"
    assert [d for d in doors if d not in HTTP] == [], "routes this test does not call: add them to HTTP"
    assert [d for d in HTTP if d not in doors] == [], "calls of routes that are gone"


@pytest.mark.parametrize("who", KEYS)
def test_http_refusals_change_nothing_and_hide_what_exists(world: World, who: str) -> None:
    for door in _openapi_doors(world):
        declared = DOORS[door]
        before = snapshot(world.conn)
        if refused_to(world, who, declared):
            response, _ = _call_http(world, who, door, world.seeded)
            status = 403 if who in world.rings else 401
            assert response.status_code == status, f"{who} {door}: {response.status_code} {response.text}"
            assert response.json()["error"]["code"] == ("forbidden" if status == 403 else "unauthorized")
        elif who == SCOPED:
            response, named = _call_http(world, who, door, world.seeded)
            if named:
                assert response.status_code in (403, 404), f"{who} {door}: {response.text}"
                missing, _ = _call_http(world, who, door, world.missing)
                assert (response.status_code, blank(response.text, world.seeded)) == (
                    missing.status_code,
                    blank(missing.text, world.missing),
                ), f"{door}: a foreign object answers unlike a missing one"
            else:
                assert response.status_code == 200, f"{who} {door}: {response.text}"
                assert "own:" not in response.text, f"{door} shows another tenant's objects"
        else:
            continue
        assert snapshot(world.conn) == before, f"{who} {door} changed the database"


# -- MCP --------------------------------------------------------------------------

MCP: dict[str, Callable[[Target], dict[str, Any]]] = {
    "batonq_enqueue": lambda t: {"queue": t.queue, "payload": 1, "parent": t.task},
    "batonq_claim": lambda t: {"queue": t.queue},
    "batonq_heartbeat": lambda t: {"lease_token": t.token},
    "batonq_complete": lambda t: {"lease_token": t.token, "result": 1},
    "batonq_fail": lambda t: {"lease_token": t.token, "error": "x"},
    "batonq_run": lambda t: {"queue": t.queue, "payload": 1},
    "batonq_tasks": lambda t: {"queue": t.queue},
    "batonq_queues": lambda t: {},
    "batonq_schedule": lambda t: {"action": "remove", "name": t.schedule},
}


def _mcp_blank(answer: str, target: Target) -> str:
    return re.sub(r"\(it covers [^)]*\)", "", blank(answer, target))


@pytest.mark.parametrize("who", KEYS)
async def test_mcp_refusals_change_nothing_and_hide_what_exists(world: World, who: str) -> None:
    url = f"{world.server.url}/mcp"
    if who not in world.rings:  # no valid key: the whole server is closed
        before = snapshot(world.conn)
        headers = {"Authorization": f"Bearer {world.keys[who]}"} if world.keys[who] else {}
        refused = httpx.post(url, headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert snapshot(world.conn) == before
        return
    async with http_session(url, world.keys[SCOPED]) as listing:
        tools = sorted(t.name for t in (await listing.list_tools()).tools)
    assert [t for t in tools if f"mcp {t}" not in DOORS] == [], "tools without a declaration"
    assert [t for t in tools if t not in MCP] == [], "tools this test does not call: add them to MCP"
    async with http_session(url, world.keys[who]) as session:
        for tool in tools:
            arguments = MCP[tool](world.seeded)
            declared = DOORS[f"mcp {tool}"]
            before = snapshot(world.conn)
            if refused_to(world, who, declared, arguments.get("action")):
                result = await session.call_tool(tool, arguments)
                assert result.is_error and "forbidden" in text(result), f"{who} {tool}: {text(result)}"
            elif who == SCOPED:
                result = await session.call_tool(tool, arguments)
                if arguments:
                    assert result.is_error, f"{who} {tool}: {text(result)}"
                    missing = await session.call_tool(tool, MCP[tool](world.missing))
                    assert _mcp_blank(text(result), world.seeded) == _mcp_blank(text(missing), world.missing)
                else:
                    assert not result.is_error and "own:" not in text(result), f"{tool}: {text(result)}"
            else:
                continue
            assert snapshot(world.conn) == before, f"{who} {tool} changed the database"


# -- the dashboard ------------------------------------------------------------------

UiCall = Callable[[Target], Request]
UI: dict[str, tuple[UiCall, ...]] = {
    "POST /ui/tasks/{task_id}/{action}": (
        lambda t: (f"/ui/tasks/{t.task}/cancel", {"twin": "POST /v1/tasks/{task_id}/{action}"}),
    ),
    "POST /ui/dead/retry": (
        lambda t: ("/ui/dead/retry", {"data": {"queue": t.dead_queue},
                                      "twin": "POST /v1/tasks/{task_id}/{action}"}),
    ),
    "POST /ui/tasks/bulk": (
        lambda t: ("/ui/tasks/bulk", {"data": {"op": "cancel", "task": t.task},
                                      "twin": "POST /v1/tasks/{task_id}/{action}"}),
        lambda t: ("/ui/tasks/bulk", {"data": {"op": "cancel", "queue": t.queue, "all": "1"},
                                      "twin": "POST /v1/tasks/{task_id}/{action}"}),
    ),
    "POST /ui/schedules/{name}/{action}": (
        lambda t: (f"/ui/schedules/{t.schedule}/pause", {"twin": "POST /v1/schedules/{name}/{action}"}),
        lambda t: (f"/ui/schedules/{t.schedule}/run", {"twin": "POST /v1/enqueue"}),
        lambda t: (f"/ui/schedules/{t.schedule}/remove",
                   {"action": "remove", "twin": "DELETE /v1/schedules/{name}"}),
    ),
    "POST /ui/queues/{queue}/settings": (
        lambda t: (f"/ui/queues/{t.queue}/settings", {"data": {"paused": "true", "max_leased": "1"},
                                                      "twin": "PATCH /v1/queues/{queue}"}),
    ),
}  # fmt: skip
"""Each dashboard action's calls: ``action`` names one that needs a
stronger ring than its door's (``Door.actions``), ``twin`` the API route
that does the same."""
SIGNING = {"POST /ui/login", "POST /ui/logout"}
"""Public: a form with no key yet, and signing out (which needs no key)."""

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def _signed_in(world: World, who: str) -> httpx.Client:
    """A browser-like client, signed in through the form when the key is valid."""
    browser = httpx.Client(base_url=world.server.url, timeout=30, follow_redirects=True)
    key = world.keys[who]
    if key is None:
        return browser
    form = browser.get("/ui/login").text
    token = _CSRF.search(form)
    assert token, form
    browser.post("/ui/login", data={"key": key, "csrf": token[1]})
    return browser


def _csrf(browser: httpx.Client) -> str:
    """The signed-in page's token; "none" when it is the sign-in form."""
    page = browser.get("/ui")
    found = _CSRF.search(page.text)
    return found[1] if found and not page.url.path.endswith("/login") else "none"


def _post(browser: httpx.Client, call: UiCall, target: Target, csrf: str) -> httpx.Response:
    path, options = call(target)
    data = {**options.get("data", {}), "csrf": csrf}
    return browser.post(path, data=data, follow_redirects=False)


def _page_text(response: httpx.Response, target: Target) -> str:
    """What a page says, its names blanked and the per-session token dropped."""
    found = re.search(r"<main.*?</main>", response.text, re.S)
    return blank(found[0] if found else response.text, target)


def test_every_dashboard_action_is_declared_and_walked() -> None:
    actions = sorted(f"POST {route.path}" for route in dashboard_router.routes
                     if "POST" in getattr(route, "methods", ()))  # fmt: skip
    assert [a for a in actions if a not in DOORS] == [], "dashboard actions without a declaration"
    assert sorted(set(actions) - SIGNING) == sorted(UI), "dashboard actions this test does not call"


def test_no_dashboard_action_needs_a_weaker_ring_than_its_api_twin() -> None:
    """The dashboard is no way around the API's rings: each action needs
    the ring (or a stronger one) of the route that does the same."""
    for door, calls in UI.items():
        for call in calls:
            path, options = call(WORLDLESS)
            needed, twin = DOORS[door].ring_for(options.get("action")), DOORS[options["twin"]].ring
            assert needed is not None and twin is not None, path
            assert needed <= twin, f"{path} needs ring {needed}, its twin {options['twin']} ring {twin}"


WORLDLESS = Target("q", "t_1", "q/1/1/" + "0" * 32, "s", 1, ("a", "b"), "d")


@pytest.mark.parametrize("who", KEYS)
def test_dashboard_refusals_change_nothing_and_hide_what_exists(world: World, who: str) -> None:
    with contextlib.closing(_signed_in(world, who)) as browser:
        csrf = _csrf(browser)
        assert (csrf == "none") == (who not in world.rings), f"{who}: signed in as it should?"
        for door, call in ((door, call) for door, calls in UI.items() for call in calls):
            before = snapshot(world.conn)
            path, options = call(world.seeded)
            if refused_to(world, who, DOORS[door], options.get("action")):
                answer = _post(browser, call, world.seeded, csrf)
                status = 403 if who in world.rings else 401
                assert answer.status_code == status, f"{who} {path}: {answer.status_code}"
            elif who == SCOPED:
                answer = _post(browser, call, world.seeded, csrf)
                missing = _post(browser, call, world.missing, csrf)
                assert (answer.status_code, _page_text(answer, world.seeded)) == (
                    missing.status_code,
                    _page_text(missing, world.missing),
                ), f"{path}: a foreign object answers unlike a missing one"
            else:
                continue
            assert snapshot(world.conn) == before, f"{who} {path} changed the database"


def test_a_door_without_a_declaration_is_not_served(monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app("postgresql://127.0.0.1/unused")

    @app.get("/v1/undeclared")
    async def undeclared(access: Key) -> None: ...

    @app.get("/v1/ungated")
    async def ungated() -> None: ...

    sneaky = APIRouter(prefix="/v1")  # how every /v1 module adds its routes

    @sneaky.post("/sneaky")
    async def in_a_router() -> None: ...

    app.include_router(sneaky)
    monkeypatch.setitem(DOORS, "GET /v1/ungated", Door(OBSERVER))
    with pytest.raises(RuntimeError) as refused:
        check_doors(app)
    for door in ("GET /v1/undeclared", "/v1/ungated", "POST /v1/sneaky"):
        assert door in str(refused.value)
    monkeypatch.setitem(TOOLS, "batonq_undeclared", TOOLS["batonq_queues"])
    with pytest.raises(RuntimeError, match="mcp batonq_undeclared"):
        build_server()
