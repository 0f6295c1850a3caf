"""A key's queue patterns as PostgreSQL regular expressions match exactly the
queue names ``covers`` matches."""

from __future__ import annotations

from typing import Any

import psycopg

from batonq.rings import covers, scope_regex

NAMES = [
    "shop:orders", "shop:mail", "shop", "shopx", "mail:outbox", "a.b", "axb", "a_b", "q1", "q22",
]  # fmt: skip
PATTERNS = [
    "*", "shop:*", "shop", "shop?", "a.b", "a?b", "*:*", "q?", "q[12]", "q[!1]*", "[]]", "x[y", "s*p:m*l",
    "[a-z]*", "(", "a|b", "^shop", "shop$", "\\", "+*",
]  # fmt: skip


def test_patterns_match_in_postgresql_what_covers_matches(sql: psycopg.Connection[Any]) -> None:
    for pattern in PATTERNS:
        regex = scope_regex(pattern)
        row = sql.execute(
            "SELECT coalesce(array_agg(n ORDER BY n), '{}') FROM unnest(%s::text[]) n WHERE n ~ %s",
            (NAMES, regex),
        ).fetchone()
        assert row is not None
        in_sql = set(row[0])
        in_python = {name for name in NAMES if covers([pattern], name)}
        assert in_sql == in_python, (pattern, regex)
