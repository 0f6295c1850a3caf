"""Signing in to the dashboard with an API key.

The key is held in an HttpOnly, SameSite=Strict cookie scoped to /ui, so
scripts on the page never read it and it never appears in a URL. Every
request checks it again, as the API does with a bearer key, so a revoked key
is signed out at its next click. Actions also need a CSRF token: an HMAC of
the key that the page carries and a forged form cannot know. The sign-in
form, before there is a key, carries a random token that must match a
SameSite=Strict cookie set with the form (a double-submit cookie), so another
site cannot sign a browser in with a key of its choosing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request, Response

from batonq.access import Access, Refused, authenticate
from batonq.rings import OPERATOR
from batonq.service.state import client_of

__all__ = [
    "COOKIE",
    "FLASH_COOKIE",
    "Session",
    "check_login_csrf",
    "csrf_token",
    "current",
    "login_csrf",
    "set_flash",
    "set_login_csrf",
    "sign_in",
    "sign_out",
    "take_flash",
]

COOKIE = "batonq_session"
LOGIN_COOKIE = "batonq_login"
FLASH_COOKIE = "batonq_flash"
CSRF_HEADER = "x-csrf-token"
_CSRF_CONTEXT = b"batonq dashboard csrf v1"


class Session:
    """A signed-in key: what it may see and do, and its CSRF token."""

    def __init__(self, access: Access, key: str) -> None:
        self.access = access
        self.csrf = csrf_token(key)

    @property
    def can_operate(self) -> bool:
        """Whether the key may retry, cancel, hold and release (ring 1 or stronger)."""
        return self.access.ring <= OPERATOR

    def covers(self, queue: str) -> bool:
        return self.access.covers(queue)


def csrf_token(key: str) -> str:
    return hmac.new(key.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


async def current(request: Request) -> Session | None:
    """The request's session, or None when its cookie is missing, unknown or revoked."""
    key = request.cookies.get(COOKIE)
    if not key:
        return None
    try:
        access = await authenticate(client_of(request), f"Bearer {key}")
    except Refused:
        return None
    return Session(access, key)


async def check_csrf(request: Request, session: Session) -> bool:
    """Whether the request carries the session's CSRF token (header or form field)."""
    sent = request.headers.get(CSRF_HEADER)
    if sent is None:
        form = await request.form()
        field = form.get("csrf")
        sent = field if isinstance(field, str) else None
    return sent is not None and hmac.compare_digest(sent, session.csrf)


def _set_cookie(request: Request, response: Response, name: str, value: str, path: str) -> None:
    response.set_cookie(
        name, value, path=path, httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )


def login_csrf(request: Request) -> str:
    """The sign-in form's CSRF token: the browser's, or a new one (see set_login_csrf)."""
    return request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(32)


def set_login_csrf(request: Request, response: Response, token: str) -> None:
    """Set the cookie that the sign-in form's token must match."""
    _set_cookie(request, response, LOGIN_COOKIE, token, "/ui/login")


def check_login_csrf(request: Request, sent: object) -> bool:
    """Whether the sign-in form's field ``sent`` matches the token cookie set with the form."""
    token = request.cookies.get(LOGIN_COOKIE)
    return bool(token) and isinstance(sent, str) and hmac.compare_digest(sent, token or "")


def set_flash(request: Request, response: Response, ref: str) -> None:
    """Mark the task ``ref`` as just acted on, for its page to say so once (see take_flash)."""
    _set_cookie(request, response, FLASH_COOKIE, ref, "/ui")


def take_flash(request: Request, response: Response) -> None:
    """Forget the task just acted on (``request.cookies[FLASH_COOKIE]``) on
    ``response``, once its page said so: a reload does not say it again."""
    if FLASH_COOKIE in request.cookies:
        response.delete_cookie(FLASH_COOKIE, path="/ui", httponly=True, samesite="strict")


async def sign_in(request: Request, key: str, response: Response) -> Access:
    """Check ``key`` and set the session cookie on ``response``; raises
    ``Refused`` (401) for a key that is not valid."""
    access = await authenticate(client_of(request), f"Bearer {key}")
    _set_cookie(request, response, COOKIE, key, "/ui")
    response.delete_cookie(LOGIN_COOKIE, path="/ui/login", httponly=True, samesite="strict")
    return access


def sign_out(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
