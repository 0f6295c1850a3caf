"""API keys on requests: the one dependency that checks a request's Bearer
key against its route's declaration in ``batonq.access.DOORS``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute, Mount, Route

from batonq.access import Access, admit, authenticate_from, undeclared
from batonq.service.state import client_of

__all__ = ["Key", "check_doors", "door_of", "gated"]


def door_of(method: str, path: str) -> str:
    return f"{method} {path}"


async def gated(request: Request) -> Access:
    """The request's key, admitted by the gate to the route's door."""
    route = request.scope["route"]
    address = request.client.host if request.client else ""
    access = await authenticate_from(
        request.app.state.failed_auth, address, client_of(request), request.headers.get("authorization")
    )
    admit(access, door_of(request.method, route.path))
    return access


Key = Annotated[Access, Depends(gated)]
"""A route's key: declare the route in ``batonq.access.DOORS``."""


def _served(routes: Iterable[BaseRoute], prefix: str = "") -> Iterator[tuple[str, BaseRoute]]:
    """Every route the app serves, with its full path. FastAPI 0.120+ keeps an
    included router as one entry in ``app.routes``; its routes are inside."""
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            inner = getattr(getattr(route, "include_context", None), "prefix", "")
            yield from _served(included.routes, prefix + inner)
        else:
            yield prefix + getattr(route, "path", ""), route


def _doors(path: str, route: BaseRoute) -> list[str]:
    if isinstance(route, Mount):
        return [door_of("GET", path)]
    if isinstance(route, Route | APIRoute):
        return [door_of(m, path) for m in sorted(route.methods or ()) if m != "HEAD"]
    return []


def _checks_key(route: APIRoute) -> bool:
    return any(d.call is gated for d in route.dependant.dependencies)


def check_doors(app: FastAPI) -> None:
    """Refuse to serve an app with a route that has no declaration in
    ``DOORS``, or a keyed /v1 route that does not pass the gate."""
    routes = list(_served(app.routes))
    missing = undeclared(name for path, route in routes for name in _doors(path, route))
    ungated = [
        path
        for path, r in routes
        if isinstance(r, APIRoute) and path.startswith("/v1/") and not _checks_key(r)
    ]
    if missing or ungated:
        raise RuntimeError(f"routes not declared in batonq.access.DOORS, or not gated: {missing + ungated}")
