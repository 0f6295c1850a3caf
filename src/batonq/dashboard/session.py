"""Signing in to the dashboard with an API key.

Signing in starts a server-side session (batonq.access.start_session): the
browser gets a random token in an HttpOnly, SameSite=Strict cookie scoped to
/ui, never the key, so scripts on the page never read either, a copied
cookie is no API key, and signing out (or revoking the key) ends the session
in the database, wherever its cookie went. Every request checks the session
again, so a revoked key is signed out at its next click. A failed sign-in
counts against the address like a bad key on /v1 (one limit for both).

Actions, and signing out, need a CSRF token: an HMAC of the session token
that the page carries and a forged form cannot know. The sign-in form,
before there is a session, carries a random token that must match a
SameSite=Strict cookie set with the form (a double-submit cookie), so
another site cannot sign a browser in with a key of its choosing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request, Response

from batonq.access import Access, end_session, session_access, start_session
from batonq.rings import OPERATOR
from batonq.service.state import address_of, client_of, failed_auth

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
    """A signed-in browser: what its key may see and do, and its CSRF token."""

    def __init__(self, access: Access, token: str) -> None:
        self.access = access
        self.token = token
        self.csrf = csrf_token(token)

    @property
    def can_operate(self) -> bool:
        """Whether the key may retry, cancel, hold and release (ring 1 or stronger)."""
        return self.access.ring <= OPERATOR

    def covers(self, queue: str) -> bool:
        return self.access.covers(queue)


def csrf_token(token: str) -> str:
    """The CSRF token of the session ``token``."""
    return hmac.new(token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


async def current(request: Request) -> Session | None:
    """The request's session, or None when its cookie is missing, or its
    session expired, ended or belongs to a revoked key."""
    token = request.cookies.get(COOKIE)
    if not token:
        return None
    access = await session_access(client_of(request), token)
    return None if access is None else Session(access, token)


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
    """Start a session for ``key`` and set its cookie on ``response``; raises
    ``Refused``: 401 for a key that is not valid, 429 while the client's
    address has too many failed key checks (the API's and these)."""
    client = client_of(request)
    access, token = await failed_auth(request).counting(
        address_of(request), lambda: start_session(client, key)
    )
    _set_cookie(request, response, COOKIE, token, "/ui")
    response.delete_cookie(LOGIN_COOKIE, path="/ui/login", httponly=True, samesite="strict")
    return access


async def sign_out(request: Request, session: Session, response: Response) -> None:
    """End ``session`` (its cookie signs nobody in any more, wherever it
    went) and drop its cookie on ``response``."""
    await end_session(client_of(request), session.token)
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
