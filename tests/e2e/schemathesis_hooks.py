"""Schemathesis hooks for tests/e2e/test_http_schema.py (loaded through
SCHEMATHESIS_HOOKS): keep generated long-polls short, so a bounded run stays
bounded. Values outside the schema are left alone: they must be refused."""

from __future__ import annotations

from typing import Any

import schemathesis

LONGEST_WAIT_S = 0.2


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    wait = body.get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and LONGEST_WAIT_S < wait <= 55:
        body["wait_s"] = LONGEST_WAIT_S
