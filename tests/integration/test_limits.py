"""batonq.limits against the engine: each limit Python restates is read
back from the SQL (its constraints and functions) or found at the edge of
what the engine accepts, so the two cannot drift apart."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

import batonq
from batonq import limits

Q = "limits:q"


def _check_bounds(sql: psycopg.Connection[Any], table: str, column: str) -> list[int]:
    """The numbers in the CHECK constraint on ``batonq.<table>.<column>``."""
    [(definition,)] = sql.execute(
        """SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
           WHERE c.conrelid = %s::regclass AND c.contype = 'c' AND a.attname = %s""",
        (f"batonq.{table}", column),
    ).fetchall()
    return [int(n) for n in re.findall(r"\b[0-9]+\b", definition)]


def test_queue_name_pattern_is_the_engines(sql: psycopg.Connection[Any]) -> None:
    [(definition,)] = sql.execute(
        "SELECT pg_get_functiondef('batonq._valid_queue_name(text)'::regprocedure)"
    ).fetchall()
    assert f"'{limits.QUEUE_NAME_PATTERN}'" in definition
    probes = ["a", "0", "shop:tasks", "a.b_c-d:e", "a" * 128, "a" * 129]
    probes += ["", "-a", "A", "a b", "a\n", "é", "a/b"]
    for name in probes:
        [(valid,)] = sql.execute("SELECT batonq._valid_queue_name(%s)", (name,)).fetchall()
        assert valid == (limits.QUEUE_NAME.fullmatch(name) is not None), name


def test_queue_settings_ranges_are_the_engines(sql: psycopg.Connection[Any]) -> None:
    assert _check_bounds(sql, "queues", "lease_s") == [limits.MIN_LEASE_S, limits.MAX_LEASE_S]
    assert _check_bounds(sql, "queues", "max_attempts") == [1, limits.MAX_ATTEMPTS]
    assert _check_bounds(sql, "queues", "max_body_bytes") == [1, limits.MAX_QUEUE_BODY_BYTES]
    [(default,)] = sql.execute(
        """SELECT column_default FROM information_schema.columns
            WHERE table_schema = 'batonq' AND table_name = 'queues' AND column_name = 'max_body_bytes'"""
    ).fetchall()
    assert int(default) == limits.MAX_BODY_BYTES


def test_json_limits_are_the_engines(sql: psycopg.Connection[Any]) -> None:
    [(depth, digits)] = sql.execute("SELECT batonq._max_json_depth(), batonq._max_number_digits()").fetchall()
    assert (depth, digits) == (limits.MAX_JSON_DEPTH, limits.MAX_NUMBER_DIGITS)


def _refused(call: Any) -> None:
    with pytest.raises(batonq.InvalidArgument):
        call()


def test_claim_and_heartbeat_take_exactly_the_lease_range(admin: batonq.Client) -> None:
    for lease_s in (limits.MIN_LEASE_S - 1, limits.MAX_LEASE_S + 1):
        _refused(lambda lease_s=lease_s: admin.claim(Q, lease_s=lease_s))
    assert admin.claim(Q, lease_s=limits.MIN_LEASE_S) == []
    admin.enqueue(Q, {})
    [lease] = admin.claim(Q, lease_s=limits.MAX_LEASE_S)
    for lease_s in (limits.MIN_LEASE_S - 1, limits.MAX_LEASE_S + 1):
        _refused(lambda lease_s=lease_s: admin.heartbeat(lease.lease_token, lease_s=lease_s))
    assert admin.heartbeat(lease.lease_token, lease_s=limits.MAX_LEASE_S).accepted


def test_enqueue_takes_exactly_the_attempts_and_delay_ranges(admin: batonq.Client) -> None:
    _refused(lambda: admin.enqueue(Q, {}, max_attempts=limits.MAX_ATTEMPTS + 1))
    _refused(lambda: admin.enqueue(Q, {}, delay_s=limits.MAX_DELAY_S + 1))
    assert admin.enqueue(Q, {}, max_attempts=limits.MAX_ATTEMPTS, delay_s=limits.MAX_DELAY_S).created


def test_claims_listings_and_waits_take_exactly_their_sizes(
    admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    _refused(lambda: admin.claim(Q, max_tasks=limits.MAX_CLAIM_TASKS + 1))
    assert admin.claim(Q, max_tasks=limits.MAX_CLAIM_TASKS) == []
    _refused(lambda: admin.tasks(Q, limit=limits.MAX_PAGE + 1))
    assert admin.tasks(Q, limit=limits.MAX_PAGE) == []
    # The client covers a longer wait in parts; the engine's own bound:
    with pytest.raises(psycopg.Error, match="for_s must be above 0 and at most") as refused:
        sql.execute("SELECT batonq.await_work(%s, %s)", (Q, limits.MAX_AWAIT_S + 0.5))
    assert refused.value.sqlstate == "BQ004"
    sql.execute("SELECT batonq.await_work(%s, %s)", (Q, limits.MAX_AWAIT_S))
