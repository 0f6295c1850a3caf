"""Who is asking, and what they may touch: an API key's ring and queue scopes.

The HTTP API, the MCP server and the dashboard check keys, scopes and lease
tokens here, the same way; each says a refusal in its own form (an HTTP
error body, a tool error, a sign-in page). The dashboard signs in with a key
once, and holds a session (a random token, not the key) after that.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import secrets
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from batonq import models
from batonq.client import AsyncClient
from batonq.errors import KeyNotFound, ScheduleNotFound, TaskNotFound
from batonq.models import ApiKey, Schedule, Task
from batonq.rings import ADMIN, OBSERVER, OPERATOR, RINGS, WORKER, contains, covers, scope_regex

__all__ = [
    "DEFAULT_MAX_STREAMS_PER_KEY",
    "DEFAULT_NEW_QUEUES_PER_HOUR",
    "DOORS",
    "Access",
    "Door",
    "FailedAuth",
    "NewQueues",
    "OpenPerKey",
    "Refused",
    "admit",
    "authenticate",
    "authenticate_from",
    "managed_keys",
    "queue_of",
    "queue_page",
    "visible_key",
    "visible_schedule",
    "visible_task",
]

_KEY = re.compile(r"bq_([0-9]{1,18})_([0-9a-f]{64})")
T = TypeVar("T")
_NO_HASH = bytes(32)


class Refused(Exception):
    """A caller refused: ``status`` as HTTP says it (400, 401, 403, 429),
    a ``code`` and a message; ``headers`` for an HTTP answer."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers


@dataclass(frozen=True, slots=True)
class Access:
    """Who is asking: a key's ring and queue scopes; ``key_id`` is 0 (no
    key's id) for the full access of an MCP server started without a key."""

    ring: int = ADMIN
    queues: tuple[str, ...] = ("*",)
    key_id: int = 0

    @property
    def can_write(self) -> bool:
        """Rings 0-2 may enqueue, claim and submit; ring 3 only reads."""
        return self.ring <= WORKER

    def read_only(self) -> Access:
        return replace(self, ring=max(self.ring, OBSERVER))

    def covers(self, queue: str) -> bool:
        return covers(self.queues, queue)

    def check_queue(self, queue: str) -> None:
        """403 unless the key's scopes cover ``queue`` (whether it exists or not)."""
        if not self.covers(queue):
            raise Refused(403, "forbidden", f"this key may not use queue {queue!r}")

    def check_ring(self, ring: int) -> None:
        """403 unless the key is of ``ring`` or stronger."""
        if self.ring > ring:
            raise Refused(403, "forbidden", f"this needs a key of ring {ring} ({RINGS[ring]}) or stronger")

    def check_edge(self, from_queue: str, to_queue: str) -> None:
        """403 unless the key covers both ends of an edge (to add it or to remove it)."""
        self.check_queue(from_queue)
        self.check_queue(to_queue)

    def check_schedule_name(self, name: str, taken_on: str | None = None) -> None:
        """403 unless the key may add (or replace) schedule ``name``, which
        is ``taken_on`` that queue if it exists: the key's scopes must cover
        the name as they cover a queue's (names are one namespace for all
        keys, so a scoped key keeps to its own part of it, and whether a
        name outside it is taken is never told), and the queue of the
        schedule it replaces."""
        if not self.covers(name) or (taken_on is not None and not self.covers(taken_on)):
            raise Refused(403, "forbidden", f"this key may not name a schedule {name!r}")

    def manages(self, ring: int, queues: Iterable[str]) -> bool:
        """Whether this key may create, list or revoke a key of ``ring`` and
        ``queues``: no stronger than itself (ring number at least its own),
        and every pattern inside its own scopes (``batonq.rings.contains``)."""
        return ring >= self.ring and all(contains(self.queues, pattern) for pattern in queues)

    def check_manages(self, ring: int, queues: Iterable[str]) -> None:
        """403 unless the key may create a key of ``ring`` and ``queues``."""
        queues = list(queues)
        if ring < self.ring:
            raise Refused(403, "forbidden", f"this key may not create a key stronger than ring {self.ring}")
        outside = [q for q in queues if not contains(self.queues, q)]
        if outside:
            raise Refused(403, "forbidden", f"this key may not create a key for queues {', '.join(outside)}")

    def check_token(self, lease_token: str) -> str:
        """The queue ``lease_token`` names (``queue/task/fence/secret``),
        which the key must cover; 400 for a token that names none."""
        if not lease_token.partition("/")[2]:
            message = "malformed lease token: use the lease_token returned by claim"
            raise Refused(400, "invalid_token", message)
        queue = queue_of(lease_token)
        self.check_queue(queue)
        return queue


@dataclass(frozen=True, slots=True)
class Door:
    """What one HTTP route, MCP tool or dashboard action needs: the ring
    (None: no key, a public page), and what it touches, each checked
    against the key's scopes by this module: ``queues`` named in the
    request, ``tasks`` by id (``visible_task``), ``keys`` (``visible_key``,
    ``Access.manages``), ``schedules`` (``visible_schedule``), ``edges``
    (``Access.check_edge``). ``actions`` names the actions that need a
    stronger ring than ``ring``."""

    ring: int | None
    touches: tuple[str, ...] = ()
    actions: tuple[tuple[str, int], ...] = ()

    def ring_for(self, action: object = None) -> int | None:
        return dict(self.actions).get(str(action), self.ring)


_PUBLIC = Door(None)
_ANY_KEY = Door(OBSERVER)

DOORS: dict[str, Door] = {
    # HTTP /v1: work (ring 2)
    "POST /v1/enqueue": Door(WORKER, ("queues", "tasks")),
    "POST /v1/claim": Door(WORKER, ("queues",)),
    "GET /v1/stream": Door(WORKER, ("queues",)),
    "POST /v1/heartbeat": Door(WORKER, ("tasks",)),
    "POST /v1/submit": Door(WORKER, ("tasks",)),
    "POST /v1/fail": Door(WORKER, ("tasks",)),
    "POST /v1/release": Door(WORKER, ("tasks",)),
    # reads (ring 3)
    "GET /v1/queues": Door(OBSERVER, ("queues",)),
    "GET /v1/queues/{queue}/settings": Door(OBSERVER, ("queues",)),
    "GET /v1/tasks": Door(OBSERVER, ("queues",)),
    "GET /v1/tasks/{task_id}": Door(OBSERVER, ("tasks",)),
    "GET /v1/runs/{root_id}": Door(OBSERVER, ("tasks",)),
    "GET /v1/graph": Door(OBSERVER, ("edges",)),
    "GET /v1/schedules": Door(OBSERVER, ("schedules",)),
    # operating (ring 1) and administering (ring 0)
    "POST /v1/tasks/{task_id}/{action}": Door(OPERATOR, ("tasks",)),
    "POST /v1/schedules/{name}/{action}": Door(OPERATOR, ("schedules",)),
    "PATCH /v1/queues/{queue}": Door(ADMIN, ("queues",)),
    "POST /v1/graph/edges": Door(ADMIN, ("edges",)),
    "DELETE /v1/graph/edges/{from_queue}/{to_queue}": Door(ADMIN, ("edges",)),
    "GET /v1/keys": Door(ADMIN, ("keys",)),
    "POST /v1/keys": Door(ADMIN, ("keys",)),
    "DELETE /v1/keys/{key_id}": Door(ADMIN, ("keys",)),
    "POST /v1/schedules": Door(ADMIN, ("schedules", "queues")),
    "DELETE /v1/schedules/{name}": Door(ADMIN, ("schedules",)),
    "GET /v1/audit": Door(ADMIN, ("queues", "schedules")),
    # pages with no key
    "GET /": _PUBLIC,
    "GET /healthz": _PUBLIC,
    "GET /readyz": _PUBLIC,
    "GET /metrics": _PUBLIC,
    "GET /llms.txt": _PUBLIC,
    "GET /.well-known/agent-card.json": _PUBLIC,
    "GET /.well-known/mcp.json": _PUBLIC,
    "GET /.well-known/mcp/server-card.json": _PUBLIC,
    "GET /openapi.json": _PUBLIC,
    "GET /docs": _PUBLIC,
    "GET /docs/static": _PUBLIC,  # Swagger UI's script and style
    # MCP over HTTP: any key reaches the server; each tool is a door of its own
    "GET /mcp": _ANY_KEY,
    "POST /mcp": _ANY_KEY,
    "DELETE /mcp": _ANY_KEY,
    "mcp batonq_enqueue": Door(WORKER, ("queues", "tasks")),
    "mcp batonq_claim": Door(WORKER, ("queues",)),
    "mcp batonq_heartbeat": Door(WORKER, ("tasks",)),
    "mcp batonq_complete": Door(WORKER, ("tasks",)),
    "mcp batonq_fail": Door(WORKER, ("tasks",)),
    "mcp batonq_run": Door(WORKER, ("queues", "tasks")),
    "mcp batonq_tasks": Door(OBSERVER, ("queues",)),
    "mcp batonq_queues": Door(OBSERVER, ("queues", "schedules")),
    "mcp batonq_schedule": Door(
        OPERATOR, ("schedules", "queues"), actions=(("add", ADMIN), ("remove", ADMIN))
    ),
    "mcp tasks/get": Door(OBSERVER, ("tasks",)),
    "mcp tasks/update": Door(OBSERVER, ("tasks",)),
    "mcp tasks/cancel": Door(OPERATOR, ("tasks",)),
    # the dashboard: signing in and out, pages (any key), actions (ring 1)
    "GET /ui/static": _PUBLIC,
    "GET /ui/login": _PUBLIC,
    "POST /ui/login": _PUBLIC,
    "POST /ui/logout": _PUBLIC,
    "GET /ui": Door(OBSERVER, ("queues",)),
    "GET /ui/queues/rows": Door(OBSERVER, ("queues",)),
    "GET /ui/tasks": Door(OBSERVER, ("queues",)),
    "GET /ui/tasks/{task_id}": Door(OBSERVER, ("tasks",)),
    "GET /ui/find": Door(OBSERVER, ("tasks",)),
    "GET /ui/dead": Door(OBSERVER, ("queues",)),
    "GET /ui/graph": Door(OBSERVER, ("edges",)),
    "GET /ui/workers": Door(OBSERVER, ("queues",)),
    "POST /ui/tasks/{task_id}/{action}": Door(OPERATOR, ("tasks",)),
    "POST /ui/dead/retry": Door(OPERATOR, ("queues", "tasks")),
    "POST /ui/tasks/bulk": Door(OPERATOR, ("queues", "tasks")),
    "GET /ui/schedules": Door(OBSERVER, ("schedules",)),
    "GET /ui/queues/{queue}/settings": Door(OBSERVER, ("queues",)),
    "POST /ui/queues/{queue}/settings": Door(ADMIN, ("queues",)),
    "POST /ui/schedules/{name}/{action}": Door(OPERATOR, ("schedules",), actions=(("remove", ADMIN),)),
}
"""Every door into batonq that a key opens, by ``METHOD /path`` (HTTP
routes and dashboard pages, as routed) or ``mcp TOOL`` (MCP tools and
methods). A route or tool without an entry is not served: the HTTP app
and the MCP server refuse to start (``undeclared``)."""


def door(name: str) -> Door:
    """The declaration of door ``name``; a door without one is a bug, and
    nobody may pass it."""
    found = DOORS.get(name)
    if found is None:
        raise LookupError(f"{name} has no declaration in batonq.access.DOORS")
    return found


def undeclared(names: Iterable[str]) -> list[str]:
    """The doors among ``names`` that have no declaration."""
    return sorted(set(names) - set(DOORS))


def admit(access: Access, name: str, action: object = None) -> None:
    """The gate: 403 unless ``access`` may pass door ``name`` (for
    ``action``). What the door touches is then checked on each object with
    this module's ``visible_*`` and ``Access.check_*``."""
    needed = door(name).ring_for(action)
    if needed is not None:
        access.check_ring(needed)


def queue_of(lease_token: str) -> str:
    """The queue a lease token (``queue/task/fence/secret``) names."""
    return lease_token.partition("/")[0]


def _unauthorized(message: str) -> Refused:
    return Refused(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def _key_parts(key: str) -> tuple[int, bytes]:
    """A key's id and the sha256 of its secret; 401 for what is no key."""
    match = _KEY.fullmatch(key.strip())
    if match is None:
        raise _unauthorized("invalid API key")
    return int(match[1]), hashlib.sha256(match[2].encode()).digest()


async def authenticate(client: AsyncClient, header: str | None) -> Access:
    """The access of the key in an ``Authorization: Bearer bq_…`` header; 401 otherwise."""
    scheme, _, key = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise _unauthorized("send an API key: Authorization: Bearer bq_…")
    key_id, presented = _key_parts(key)
    auth = await client.key_for_auth(key_id)
    stored = auth.secret_hash if auth is not None else _NO_HASH
    # Compared in constant time, and compared even for unknown ids.
    if not hmac.compare_digest(presented, stored) or auth is None or auth.revoked:
        raise _unauthorized("invalid or revoked API key")
    return Access(auth.ring, tuple(auth.queues), key_id)


def _token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


async def start_session(client: AsyncClient, key: str) -> tuple[Access, str]:
    """Sign in with ``key``: its access, and the new session's token (random,
    stored only as its sha256, never the key); 401 for a key that is not valid."""
    key_id, secret_hash = _key_parts(key)
    token = secrets.token_urlsafe(32)
    auth = await client.create_session(key_id, secret_hash, _token_hash(token))
    if auth is None:
        raise _unauthorized("invalid or revoked API key")
    return Access(auth.ring, tuple(auth.queues), auth.key_id), token


async def session_access(client: AsyncClient, token: str) -> Access | None:
    """The access of the key behind a live session; None once it expired,
    ended or its key was revoked."""
    auth = await client.session_for_auth(_token_hash(token))
    return None if auth is None else Access(auth.ring, tuple(auth.queues), auth.key_id)


async def end_session(client: AsyncClient, token: str) -> None:
    """Sign out: the session's token signs nobody in any more."""
    await client.end_session(_token_hash(token))


class FailedAuth:
    """Failed authentications per client address, over a sliding window:
    an address with ``limit`` failures in the last ``window_s`` seconds gets
    429 for every request (whatever key it sends) until the oldest leaves the
    window. At most ``addresses`` addresses are tracked, the least recent
    dropped first, so a flood of sources cannot grow memory."""

    def __init__(self, limit: int = 100, window_s: float = 60.0, addresses: int = 10_000) -> None:
        self.limit, self.window_s, self.addresses = limit, window_s, addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        failures = self._failures.get(address, deque())
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        return failures

    def check(self, address: str) -> None:
        """429 if ``address`` is over the limit."""
        now = time.monotonic()
        failures = self._recent(address, now)
        if len(failures) >= self.limit:
            retry_after = max(1, math.ceil(failures[-self.limit] + self.window_s - now))
            raise Refused(429, "too_many_failures",
                          f"too many failed authentications from this address; try again in {retry_after} s",
                          headers={"Retry-After": str(retry_after)})  # fmt: skip

    def failed(self, address: str) -> None:
        failures = self._recent(address, time.monotonic())
        failures.append(time.monotonic())
        self._failures[address] = failures
        self._failures.move_to_end(address)
        while len(self._failures) > self.addresses:
            self._failures.popitem(last=False)

    async def counting(self, address: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` (a key check), refused with 429 while ``address`` is
        over the limit; a refusal it raises counts as a failure. The API's
        keys and the dashboard's sign-ins count here alike."""
        self.check(address)
        try:
            return await attempt()
        except Refused:
            self.failed(address)
            raise


async def authenticate_from(
    failed: FailedAuth, address: str, client: AsyncClient, header: str | None
) -> Access:
    """``authenticate``, under ``failed``'s limit for the client's ``address``."""
    return await failed.counting(address, lambda: authenticate(client, header))


async def queue_page(
    reader: AsyncClient, access: Access, after: str | None, limit: int
) -> tuple[list[models.QueueStats], str | None]:
    """The first ``limit`` queues that ``access`` covers, by name after
    ``after``, and the cursor of the next page (None at the end). Only the
    page's queues are counted (HTTP and MCP)."""
    patterns = None if "*" in access.queues else [scope_regex(p) for p in access.queues]
    shown: list[models.QueueStats] = []
    while True:
        stats = await reader.queues(after=after, limit=limit, patterns=patterns)
        shown += [q for q in stats if access.covers(q.queue)][: limit - len(shown)]
        if len(stats) < limit or len(shown) == limit:
            break
        after = stats[-1].queue
    return shown, shown[-1].queue if len(shown) == limit else None


async def visible_task(client: AsyncClient, access: Access, task_id: int | str) -> Task:
    """The task, if the key covers its queue; otherwise it does not exist:
    the same 404, word for word, as for an id nobody has."""
    ref = models.task_id(task_id)
    try:
        task = await client.task(ref)
    except TaskNotFound:
        task = None
    if task is None or not access.covers(task.queue):
        raise TaskNotFound(f"task t_{ref} not found", task_id=ref)
    return task


async def visible_schedule(client: AsyncClient, access: Access, name: str) -> Schedule:
    """The schedule, if the key covers its queue; otherwise it does not
    exist: the same 404 as for a name nobody has."""
    found = await client.schedule(name)
    if found is not None and access.covers(found.queue):
        return found
    raise ScheduleNotFound(f"schedule {name} does not exist", schedule=name)


async def managed_keys(client: AsyncClient, access: Access) -> list[ApiKey]:
    """The keys ``access`` may see and revoke (``Access.manages``)."""
    return [k for k in await client.keys() if access.manages(k.ring, k.queues)]


async def visible_key(client: AsyncClient, access: Access, key_id: int) -> ApiKey:
    """The key, if ``access`` manages it; otherwise it does not exist: the
    same 404, word for word, as for an id nobody has."""
    for key in await managed_keys(client, access):
        if key.id == key_id:
            return key
    raise KeyNotFound(f"key {key_id} not found", key_id=key_id)


DEFAULT_NEW_QUEUES_PER_HOUR = 100
_HOUR_S = 3600.0


class NewQueues:
    """At most ``per_hour`` new queues per key and hour, in this process, for
    keys weaker than ring 1 (an enqueue creates its queue). Past it: 429 with
    Retry-After. Whether a queue exists is read once it is named, and
    remembered once it does."""

    def __init__(self, client: AsyncClient, per_hour: int) -> None:
        self._client, self.per_hour = client, per_hour
        self._known: set[str] = set()  # queues found to exist
        self._made: dict[int, deque[float]] = {}  # key id -> time.monotonic() of each queue it made

    async def check(self, access: Access, queues: Iterable[str]) -> None:
        """Refuse, or count, the queues among ``queues`` that do not exist
        yet, for ``access`` (the key of an HTTP or MCP request)."""
        if access.ring <= OPERATOR:
            return
        new = set(queues) - self._known
        if not new:
            return
        found = {q.name for q in await self._client.queue_configs(sorted(new))}
        self._known |= found
        new -= found
        if not new:
            return
        now = time.monotonic()
        made = self._made.setdefault(access.key_id, deque())
        while made and made[0] <= now - _HOUR_S:
            made.popleft()
        if len(made) + len(new) > self.per_hour:
            wait_s = math.ceil(made[0] + _HOUR_S - now) if made else math.ceil(_HOUR_S)
            raise Refused(
                429, "too_many_new_queues",
                f"this key may create {self.per_hour} queues an hour, and has made {len(made)}: "
                "use existing queues, or ask an operator to create these",
                headers={"Retry-After": str(wait_s)},
            )  # fmt: skip
        made.extend([now] * len(new))
        self._known |= new


DEFAULT_MAX_STREAMS_PER_KEY = 100
_RETRY_OPEN_S = 5


class OpenPerKey:
    """At most ``limit`` long-lived requests open at once per key, in this
    process, whatever their door: HTTP event streams and long-poll claims,
    MCP claims and runs that wait. One more is refused with 429 and
    Retry-After. One counter per process, shared by /v1 and /mcp."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._open: Counter[int] = Counter()

    def hold(self, key_id: int) -> Callable[[], None]:
        """Count one more open for ``key_id``; call what it returns (once or
        more) when it closes."""
        if self._open[key_id] >= self.limit:
            raise Refused(
                429, "too_many_streams",
                f"this key has {self.limit} streams and long-poll claims open (HTTP and MCP), "
                "the most it may: "
                "close one, or retry later",
                headers={"Retry-After": str(_RETRY_OPEN_S)},
            )  # fmt: skip
        self._open[key_id] += 1
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._open[key_id] -= 1
                if self._open[key_id] <= 0:
                    del self._open[key_id]

        return release
