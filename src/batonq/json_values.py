"""JSON values as the engine stores them: their text, size and depth, and
how a stored value loads back."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

__all__ = ["SERVED_DEPTH", "JsonText", "json_depth", "json_size", "json_text", "load_json"]

SERVED_DEPTH = 200
"""Deeper stored JSON loads as its text: serialisers on the way out (pydantic,
orjson) give up past 255 levels, and a reply wraps a few of its own."""


class JsonText(str):
    """JSON text, sent as it is instead of serialised again (the worker
    serialises each result once, to check it is JSON)."""


# One encoder, made once: json.dumps with any non-default option makes a new
# encoder at every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def json_text(value: object) -> str:
    """``value`` as JSON text; TypeError or ValueError if JSON cannot hold it."""
    if value is None:  # what most handlers return: spares the encoder's set-up per job
        return "null"
    return _ENCODER.encode(value)


def json_size(value: object) -> int:
    """The bytes ``value`` takes as JSON text, as the engine measures it."""
    return len(json_text(value).encode())


def json_depth(value: Any) -> int:
    """How many arrays and objects nest in ``value``, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def load_json(data: str | bytes) -> Any:
    """JSON from the database, loaded so that every reader can serve it.

    The engine refuses what could not be served (over 64 levels, numbers of
    1e300 and more); rows stored before it did still load: an integer past
    Python's 4,300-digit limit as a ``Decimal``, a value nested past
    ``SERVED_DEPTH`` (or past Python's recursion limit) as its JSON text.
    """
    text = data.decode() if isinstance(data, bytes) else data
    try:
        value = json.loads(text)
    except RecursionError:
        return text
    except ValueError:  # an integer past int's digit limit
        value = json.loads(text, parse_int=Decimal)
    if text.count("[") + text.count("{") > SERVED_DEPTH and json_depth(value) > SERVED_DEPTH:
        return text
    return value
