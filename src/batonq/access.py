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
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from batonq import models
from batonq.client import AsyncClient
from batonq.errors import TaskNotFound
from batonq.models import Task
from batonq.rings import ADMIN, OBSERVER, OPERATOR, RINGS, WORKER, covers, scope_regex

__all__ = [
    "DEFAULT_NEW_QUEUES_PER_HOUR",
    "Access",
    "FailedAuth",
    "NewQueues",
    "Refused",
    "authenticate",
    "authenticate_from",
    "queue_of",
    "queue_page",
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

    def check_token(self, lease_token: str) -> str:
        """The queue ``lease_token`` names (``queue/task/fence/secret``),
        which the key must cover; 400 for a token that names none."""
        if not lease_token.partition("/")[2]:
            message = "malformed lease token: use the lease_token returned by claim"
            raise Refused(400, "invalid_token", message)
        queue = queue_of(lease_token)
        self.check_queue(queue)
        return queue


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
