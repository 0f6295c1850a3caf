"""Request bodies as JSON: UTF-8 only, nested at most ``MAX_BODY_DEPTH``
levels, numbers of at most ``MAX_NUMBER_DIGITS`` digits.

Python's ``json.loads`` on bytes guesses UTF-16 and UTF-32 too, gives up
past its recursion limit and refuses integers over 4,300 digits: each
would be reported as a body that is no JSON at all. Here each is refused
as what it is, before a route sees the body.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from batonq.json_values import json_depth
from batonq.limits import MAX_JSON_DEPTH, MAX_LIST_ITEMS, MAX_NUMBER_DIGITS

__all__ = [
    "MAX_BODY_DEPTH",
    "BodyNotJson",
    "JsonRoute",
    "TooManyItems",
    "parse",
]

MAX_BODY_DEPTH = MAX_JSON_DEPTH + 2
"""A body may wrap a payload in a list and an object: deeper than this, the
payload is too deep anyway."""
_LONG_DIGITS = re.compile(f"[0-9]{{{MAX_NUMBER_DIGITS + 1}}}")


class BodyNotJson(HTTPException):
    """400 invalid_json, with what is wrong (FastAPI lets an HTTPException
    raised while it reads the body through as it is)."""

    def __init__(self, reason: str) -> None:
        super().__init__(400, f"the body is not valid JSON: {reason}")


class TooManyItems(HTTPException):
    """413 too_many_items: a list body over ``MAX_LIST_ITEMS``, refused
    before any item of it is looked at."""

    def __init__(self, count: int) -> None:
        super().__init__(413, f"a list of {count} items: send at most {MAX_LIST_ITEMS} per request")


def _checked_number(literal: str) -> str:
    whole = re.split("[.eE]", literal.lstrip("-"), maxsplit=1)[0]
    if len(whole) > MAX_NUMBER_DIGITS:
        raise BodyNotJson(f"a number has more than {MAX_NUMBER_DIGITS} digits")
    return literal


_PLAIN = json.JSONDecoder()
_CHECKED = json.JSONDecoder(
    parse_int=lambda s: int(_checked_number(s)), parse_float=lambda s: float(_checked_number(s))
)


def parse(body: bytes) -> Any:
    """The body's JSON value, or ``BodyNotJson`` saying what is wrong.
    ``json.JSONDecodeError`` (malformed JSON) goes through as it is."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BodyNotJson(f"it is not UTF-8 (byte {error.start} is {body[error.start]:#04x})") from None
    if "\x00" in text:  # UTF-16 and UTF-32 text is full of NULs; JSON outside a string has none
        raise BodyNotJson("it is not UTF-8 (it has NUL bytes: UTF-16 or UTF-32?)")
    # A long run of digits is in a string, or a number too long: only then
    # is each number looked at (in Python, so slower).
    decoder = _CHECKED if _LONG_DIGITS.search(text) else _PLAIN
    try:
        value = decoder.decode(text)
    except RecursionError:
        pass
    else:
        if text.count("[") + text.count("{") <= MAX_BODY_DEPTH or json_depth(value) <= MAX_BODY_DEPTH:
            return value
    raise BodyNotJson(f"it nests deeper than {MAX_BODY_DEPTH} levels")


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            value = parse(await self.body())
            if isinstance(value, list) and len(value) > MAX_LIST_ITEMS:
                raise TooManyItems(len(value))
            self._json = value
        return self._json


class JsonRoute(APIRoute):
    """A route that reads its JSON body with ``parse``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return route
