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


def test_group_length_and_rate_period_are_the_engines(
    admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    assert _check_bounds(sql, "queues", "rate_period_s") == [0, limits.MAX_RATE_PERIOD_S]
    longest = "g" * limits.MAX_GROUP_LENGTH
    assert admin.enqueue(Q, {}, group=longest).created
    assert admin.enqueue_many(Q, [{}], groups=[longest])[0].created
    for group in ("", longest + "g"):
        _refused(lambda group=group: admin.enqueue(Q, {}, group=group))
        _refused(lambda group=group: admin.enqueue_many(Q, [{}, {}], groups=[None, group]))
        _refused(lambda group=group: admin.enqueue(Q, {}, group=group, debounce_key="k", debounce_s=1))


def test_configure_queue_refuses_bad_limits_saying_which(admin: batonq.Client) -> None:
    refusals = [
        ({"max_leased": -1}, "max_leased must be 1 or more, or 0 for no limit (got -1)"),
        ({"group_max_leased": -2}, "group_max_leased must be 1 or more, or 0 for no limit (got -2)"),
        ({"rate_limit": -3}, "rate_limit must be 1 or more, or 0 for no limit (got -3)"),
        ({"group_rate_limit": -4}, "group_rate_limit must be 1 or more, or 0 for no limit (got -4)"),
        ({"rate_period_s": 0}, "rate_period_s must be between 0.001 and 86400 seconds (got 0)"),
        ({"rate_period_s": limits.MIN_RATE_PERIOD_S / 2}, "rate_period_s must be between 0.001 and 86400"),
        ({"rate_period_s": 5e-324}, "rate_period_s must be between 0.001 and 86400"),
        ({"rate_period_s": limits.MAX_RATE_PERIOD_S + 1}, "rate_period_s must be between 0.001 and 86400"),
    ]
    for settings, message in refusals:
        with pytest.raises(batonq.InvalidArgument, match=re.escape(message)):
            admin.configure_queue(Q, **settings)
    config = admin.configure_queue(
        Q, max_leased=3, group_max_leased=1, rate_limit=20, group_rate_limit=5, rate_period_s=0.5
    )
    limits_set = (config.max_leased, config.group_max_leased, config.rate_limit, config.group_rate_limit)
    assert (*limits_set, config.rate_period_s) == (3, 1, 20, 5, 0.5)
    config = admin.configure_queue(Q, lease_s=60)  # None keeps each limit
    limits_set = (config.max_leased, config.group_max_leased, config.rate_limit, config.group_rate_limit)
    assert limits_set == (3, 1, 20, 5)
    config = admin.configure_queue(Q, max_leased=0, group_max_leased=0, rate_limit=0, group_rate_limit=0)
    limits_set = (config.max_leased, config.group_max_leased, config.rate_limit, config.group_rate_limit)
    assert limits_set == (None, None, None, None)
    assert config.rate_period_s == 0.5
