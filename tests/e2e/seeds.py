"""Teleon's queue exchange, as its documentation writes it: a client written
from that text sends exactly these bodies."""

from __future__ import annotations

import json

TELEON_CLAIM = """{
  "queue": "aq17_hybrid_search",
  "worker": "w_31",
  "max_tasks": 1
}"""
"""``POST /v1/claim``, as that documentation shows it."""

TELEON_CLAIMED = """{
  "task_id": "t_5521",
  "fencing_token": 1180,
  "lease_expires_in_s": 600,
  "row": {"query": "openapi to mcp server"}
}"""
"""Its response, as that documentation shows it."""

TELEON_SUBMIT = '{"task_id": "t_5521", "fencing_token": 1180, "result": {"hits": ["t_88", "t_91"]}}'
"""``POST /v1/submit``: "a result with its fencing token"."""


def compact(text: str) -> bytes:
    """``text`` as the service writes JSON: no spaces."""
    return json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False).encode()
