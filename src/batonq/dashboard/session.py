"""Signing in to the dashboard with an API key.

The key is held in an HttpOnly, SameSite=Strict cookie scoped to /ui, so
scripts on the page never read it and it never appears in a URL. Every
request checks it again, as the API does with a bearer key, so a revoked key
is signed out at its next click. Actions also need a CSRF token: an HMAC of
the key that the page carries and a forged form cannot know.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request, Response

from batonq.rings import OPERATOR
from batonq.service.auth import Principal, authenticate
from batonq.service.problems import ApiError
from batonq.service.state import client_of

__all__ = ["COOKIE", "Session", "csrf_token", "current", "sign_in", "sign_out"]

COOKIE = "batonq_session"
CSRF_HEADER = "x-csrf-token"
_CSRF_CONTEXT = b"batonq dashboard csrf v1"


class Session:
    """A signed-in key: what it may see and do, and its CSRF token."""

    def __init__(self, principal: Principal, key: str) -> None:
        self.principal = principal
        self.csrf = csrf_token(key)

    @property
    def can_operate(self) -> bool:
        """Whether the key may retry, cancel, hold and release (ring 1 or stronger)."""
        return self.principal.ring <= OPERATOR

    def covers(self, queue: str) -> bool:
        return self.principal.covers(queue)


def csrf_token(key: str) -> str:
    return hmac.new(key.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


async def current(request: Request) -> Session | None:
    """The request's session, or None when its cookie is missing, unknown or revoked."""
    key = request.cookies.get(COOKIE)
    if not key:
        return None
    try:
        principal = await authenticate(client_of(request), f"Bearer {key}")
    except ApiError:
        return None
    return Session(principal, key)


async def check_csrf(request: Request, session: Session) -> bool:
    """Whether the request carries the session's CSRF token (header or form field)."""
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.form()
        field = form.get("csrf")
        sent = field if isinstance(field, str) else None
    return sent is not None and hmac.compare_digest(sent, session.csrf)


async def sign_in(request: Request, key: str, response: Response) -> Principal:
    """Check ``key`` and set the session cookie on ``response``; raises
    ApiError (401) for a key that is not valid."""
    principal = await authenticate(client_of(request), f"Bearer {key}")
    response.set_cookie(
        COOKIE, key, path="/ui", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return principal


def sign_out(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
