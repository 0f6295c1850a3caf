"""errors.from_database_error against the errors the engine really raises,
and the client's exceptions for them. Nothing is half-written by a refusal."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from tests.conftest import with_db

import batonq
from batonq.errors import from_database_error

Q = "errors:q"
DEFAULT_LIMIT = 128 * 1024


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain connection as the worker role."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def engine_error(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Exception:
    """Run ``query``, which the engine must refuse; the mapped exception."""
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(query, params)
    mapped = from_database_error(raised.value)
    assert mapped is not raised.value, f"unmapped: {raised.value!r}"
    assert isinstance(mapped, batonq.BatonqError)
    assert mapped.code == type(mapped).code
    return mapped


def hot_count(sql: psycopg.Connection[Any]) -> int:
    row = sql.execute("SELECT (SELECT count(*) FROM batonq.tasks) + (SELECT count(*) FROM batonq.archive)")
    one = row.fetchone()
    assert one is not None
    return int(one[0])


def test_payload_too_large_names_the_sizes(
    conn: psycopg.Connection[Any], admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    body = "x" * DEFAULT_LIMIT  # its JSON text has the two quotes too
    error = engine_error(conn, "SELECT * FROM batonq.enqueue(%s, %s)", (Q, Jsonb(body)))
    assert type(error) is batonq.PayloadTooLarge
    assert error.message == (
        f"payload is {DEFAULT_LIMIT + 2} bytes as compact JSON, over the limit of {DEFAULT_LIMIT} bytes"
    )
    assert error.detail == {"what": "payload", "size": DEFAULT_LIMIT + 2, "limit": DEFAULT_LIMIT}
    # Just under the limit is fine.
    conn.execute("SELECT * FROM batonq.enqueue(%s, %s)", (Q, Jsonb("x" * (DEFAULT_LIMIT - 2))))

    admin.configure_queue(Q, max_body_bytes=100)
    error = engine_error(
        conn, "SELECT * FROM batonq.enqueue_many(%s, %s::jsonb[])", (Q, [Jsonb(1), Jsonb("y" * 200)])
    )
    assert type(error) is batonq.PayloadTooLarge
    assert error.message == "payload 2 is 202 bytes as compact JSON, over the limit of 100 bytes"
    assert error.detail == {"what": "payload 2", "size": 202, "limit": 100}
    assert hot_count(sql) == 1, "the refused batch wrote nothing"


def test_result_and_error_too_large_keep_the_lease(client: batonq.Client, admin: batonq.Client) -> None:
    admin.configure_queue(Q, max_body_bytes=50)
    client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    with pytest.raises(batonq.PayloadTooLarge) as raised:
        client.complete(lease.lease_token, "r" * 60)
    assert raised.value.message == "result is 62 bytes as compact JSON, over the limit of 50 bytes"
    assert isinstance(raised.value.__cause__, psycopg.Error)
    with pytest.raises(batonq.PayloadTooLarge) as raised:
        client.fail(lease.lease_token, "e" * 60)
    assert raised.value.message == "error is 62 bytes as compact JSON, over the limit of 50 bytes"
    assert client.task(lease.task_id).state == "leased"
    assert client.complete(lease.lease_token, "ok").outcome == "accepted"


@pytest.mark.parametrize("name", ["Bad Queue", "", "-starts-with-dash", "x" * 129, "ümlaut"])
def test_invalid_queue_name(conn: psycopg.Connection[Any], sql: psycopg.Connection[Any], name: str) -> None:
    error = engine_error(conn, "SELECT * FROM batonq.enqueue(%s, '1')", (name,))
    assert type(error) is batonq.InvalidQueueName
    assert error.message.startswith(f"invalid queue name '{name}': use 1-128 characters")
    assert error.detail == {"queue": name}
    error = engine_error(conn, "SELECT * FROM batonq.claim(%s)", (name,))
    assert type(error) is batonq.InvalidQueueName
    assert hot_count(sql) == 0
    row = sql.execute("SELECT count(*) FROM batonq.queues").fetchone()
    assert row == (0,)


@pytest.mark.parametrize(
    "token",
    ["garbage", "", f"{Q}/1/1/xyz", f"{Q}/1/1/{'0' * 31}", f"Bad/1/1/{'0' * 32}", f"{Q}/-1/1/{'0' * 32}"],
)
def test_malformed_token(conn: psycopg.Connection[Any], token: str) -> None:
    for query in (
        "SELECT * FROM batonq.complete(%s)",
        "SELECT * FROM batonq.fail(%s)",
        "SELECT * FROM batonq.heartbeat(%s)",
    ):
        error = engine_error(conn, query, (token,))
        assert type(error) is batonq.InvalidToken
        assert error.message == "malformed lease token: use the lease_token returned by claim"


def test_wrong_secret(
    client: batonq.Client, conn: psycopg.Connection[Any], sql: psycopg.Connection[Any]
) -> None:
    client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    forged = lease.lease_token[:-32] + uuid.uuid4().hex
    for query in (
        "SELECT * FROM batonq.complete(%s)",
        "SELECT * FROM batonq.heartbeat(%s)",
        "SELECT * FROM batonq.fail(%s)",
    ):
        error = engine_error(conn, query, (forged,))
        assert type(error) is batonq.InvalidToken
        assert error.message == f"wrong lease token for task {lease.task_id}"
        assert error.detail == {"task_id": lease.task_id}
    with pytest.raises(batonq.InvalidToken):
        client.complete(forged, "stolen")
    task = client.task(lease.task_id)
    assert (task.state, task.fencing_token, task.result) == ("leased", lease.fencing_token, None)
    assert client.complete(lease.lease_token, "mine").outcome == "accepted"
    row = sql.execute("SELECT result FROM batonq.archive WHERE id = %s", (lease.task_id,)).fetchone()
    assert row == ("mine",)


def test_a_write_named_for_another_queue_is_refused(
    client: batonq.Client, conn: psycopg.Connection[Any]
) -> None:
    """The clients' writes name the queue first (a sharded deployment routes
    by it): a token of another queue is refused, and a malformed one says so."""
    client.enqueue(Q, 1)
    [lease] = client.claim(Q)
    for query in (
        "SELECT * FROM batonq.complete_in(%s, %s)",
        "SELECT * FROM batonq.fail_in(%s, %s)",
        "SELECT * FROM batonq.heartbeat_in(%s, %s)",
        "SELECT * FROM batonq.release_lease_in(%s, %s)",
        "SELECT * FROM batonq.complete_many_in(%s, ARRAY[%s])",
    ):
        error = engine_error(conn, query, ("other:q", lease.lease_token))
        assert type(error) is batonq.InvalidToken
        assert error.message == f"lease token of queue {Q}, not other:q"
        malformed = engine_error(conn, query, ("other:q", "garbage"))
        assert malformed.message == "malformed lease token: use the lease_token returned by claim"
    task = client.task(lease.task_id)
    assert (task.state, task.fencing_token) == ("leased", lease.fencing_token)
    assert client.complete(lease.lease_token, "mine").outcome == "accepted"


def test_unknown_task(conn: psycopg.Connection[Any], client: batonq.Client) -> None:
    error = engine_error(conn, "SELECT * FROM batonq.get_task(%s)", (10**12,))
    assert type(error) is batonq.TaskNotFound
    assert error.message == f"task {10**12} not found"
    assert error.detail == {"task_id": 10**12}
    client.enqueue(Q, 1)
    error = engine_error(conn, "SELECT * FROM batonq.complete(%s)", (f"{Q}/777777/1/{'a' * 32}",))
    assert type(error) is batonq.TaskNotFound
    assert error.message == f"task 777777 not found in queue {Q}"
    with pytest.raises(batonq.TaskNotFound):
        client.task("t_999999999")
    error = engine_error(conn, "SELECT * FROM batonq.enqueue(%s, '1', p_parent_id => 424242)", (Q,))
    assert type(error) is batonq.TaskNotFound


@pytest.mark.parametrize("lease_s", [0, -1, 3601])
def test_lease_s_out_of_range(conn: psycopg.Connection[Any], client: batonq.Client, lease_s: int) -> None:
    client.enqueue(Q, 1)
    error = engine_error(conn, "SELECT * FROM batonq.claim(%s, NULL, 1, %s)", (Q, lease_s))
    assert type(error) is batonq.InvalidArgument
    assert error.message == "lease_s must be between 1 and 3600"
    [lease] = client.claim(Q, lease_s=3600)
    error = engine_error(conn, "SELECT * FROM batonq.heartbeat(%s, %s)", (lease.lease_token, lease_s))
    assert type(error) is batonq.InvalidArgument
    assert error.message == "lease_s must be between 1 and 3600"
    with pytest.raises(batonq.InvalidArgument, match="lease_s must be between 1 and 3600"):
        client.claim(Q, lease_s=lease_s)
    assert client.task(lease.task_id).attempts == 1, "refused claims counted no attempt"


def test_other_invalid_arguments(conn: psycopg.Connection[Any], client: batonq.Client) -> None:
    client.enqueue(Q, 1)  # claim checks its arguments once the queue exists
    for query, params, message in [
        ("SELECT * FROM batonq.enqueue(%s, '1', p_delay_s => -1)", (Q,), "delay_s must be between 0"),
        ("SELECT * FROM batonq.enqueue(%s, '1', p_max_attempts => 0)", (Q,), "max_attempts must be between"),
        ("SELECT * FROM batonq.claim(%s, NULL, 0)", (Q,), "max_tasks must be between 1 and 10000"),
        ("SELECT * FROM batonq.list_tasks(%s, 'sleeping')", (Q,), "state must be one of"),
    ]:
        error = engine_error(conn, query, params)
        assert type(error) is batonq.InvalidArgument
        assert error.message.startswith(message)


def test_schema_missing(server_dsn: str) -> None:
    name = f"batonq_e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with psycopg.connect(with_db(server_dsn, name), autocommit=True) as conn:
            with pytest.raises(psycopg.Error) as raised:
                conn.execute("SELECT * FROM batonq.claim('q')")
            mapped = from_database_error(raised.value)
            assert type(mapped) is batonq.SchemaMissing
            assert "run `batonq migrate`" in str(mapped)
        with (
            batonq.connect(with_db(server_dsn, name), listen=False) as client,
            pytest.raises(batonq.SchemaMissing),
        ):
            client.queues()
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_arguments_of_the_wrong_type_are_named_as_such(admin: batonq.Client) -> None:
    """A list is not a group (the database would keep its array text); a
    bool is not a limit (no function takes it: the error says to check the
    types, not only to migrate)."""
    for group in (["a", "b"], 5):
        with pytest.raises(batonq.InvalidArgument, match="group must be a string"):
            admin.enqueue(Q, {}, group=group)  # type: ignore[arg-type]
    with pytest.raises(batonq.InvalidArgument, match="group must be a string"):
        admin.enqueue_many(Q, [{}], groups=[["a"]])  # type: ignore[list-item]
    with pytest.raises(batonq.InvalidArgument, match="keep need debounce_key"):
        admin.enqueue(Q, {}, keep="first")
    with pytest.raises(batonq.SchemaMissing, match="check the arguments' types"):
        admin.configure_queue(Q, max_leased=1.5)  # type: ignore[arg-type]
    assert admin.tasks(Q) == []


def test_other_database_errors_pass_through(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero) as raised:
        conn.execute("SELECT 1 / 0")
    assert from_database_error(raised.value) is raised.value
    with pytest.raises(psycopg.errors.UndefinedTable) as missing:
        conn.execute("SELECT * FROM public.no_such_table")
    assert from_database_error(missing.value) is missing.value, "not batonq's: no SchemaMissing"


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_size_is_measured_as_compact_json(client: batonq.Client, admin: batonq.Client) -> None:
    # PostgreSQL writes jsonb with a space after every ',' and ':'; the limit
    # counts compact JSON, as a client sends it.
    admin.configure_queue(Q, max_body_bytes=1000)
    body = {"k": list(range(270))}
    compact = len(json.dumps(body, separators=(",", ":")))
    assert compact <= 1000 < len(json.dumps(body))
    assert client.enqueue(Q, body).created
    with pytest.raises(batonq.PayloadTooLarge) as raised:
        client.enqueue(Q, {"k": list(range(300)), "s": "a, b: c"})
    size = len(json.dumps({"k": list(range(300)), "s": "a, b: c"}, separators=(",", ":")))
    assert raised.value.detail == {"what": "payload", "size": size, "limit": 1000}


def test_json_too_deep_is_refused_at_every_door(
    conn: psycopg.Connection[Any], client: batonq.Client, admin: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    deep = nested(300)
    error = engine_error(conn, "SELECT * FROM batonq.enqueue(%s, %s)", (Q, Jsonb(deep)))
    assert type(error) is batonq.JsonTooDeep and isinstance(error, batonq.InvalidArgument)
    assert error.message == "payload nests 300 levels deep; the limit is 64"
    assert error.detail == {"what": "payload", "depth": 300, "limit": 64}
    error = engine_error(
        conn, "SELECT * FROM batonq.enqueue_many(%s, %s::jsonb[])", (Q, [Jsonb(1), Jsonb(nested(65))])
    )
    assert error.message == "payload 2 nests 65 levels deep; the limit is 64"
    # An array as deep as the limit, then one more level of it.
    assert client.enqueue(Q, json.loads("[" * 64 + "]" * 64)).created
    with pytest.raises(batonq.JsonTooDeep, match="nests 65 levels"):
        client.enqueue(Q, json.loads("[" * 65 + "]" * 65))
    assert client.enqueue(Q, nested(64)).created

    [lease] = client.claim(Q)
    with pytest.raises(batonq.JsonTooDeep, match=r"^result nests 300 levels deep; the limit is 64$"):
        client.complete(lease.lease_token, deep)
    with pytest.raises(batonq.JsonTooDeep, match=r"^error nests 300 levels deep"):
        client.fail(lease.lease_token, deep)
    with pytest.raises(batonq.JsonTooDeep, match=r"^result 2 nests 300 levels deep"):
        client.complete_many([(lease.lease_token, 1), (lease.lease_token, deep)])
    with pytest.raises(batonq.JsonTooDeep, match=r"^when equals nests 300"):
        admin.add_edge(Q, "errors:next", when="/x", equals=deep)
    assert client.task(lease.task_id).state == "leased", "the refusals kept the lease"
    assert hot_count(sql) == 2


def test_huge_numbers_are_refused_at_every_door(conn: psycopg.Connection[Any], client: batonq.Client) -> None:
    huge = "1" + "0" * 5000  # a number Python's int cannot read back
    error = engine_error(conn, "SELECT * FROM batonq.enqueue(%s, %s::jsonb)", (Q, f"[1, {huge}]"))
    assert type(error) is batonq.NumberTooLarge and isinstance(error, batonq.InvalidArgument)
    assert error.message == (
        "payload holds a number with 5001 digits before the decimal point; the limit is 300"
    )
    assert error.detail == {"what": "payload", "digits": 5001, "limit": 300}
    error = engine_error(conn, "SELECT * FROM batonq.enqueue(%s, %s::jsonb)", (Q, "-1e300"))
    assert error.message.startswith("payload holds a number with 301 digits before the decimal point")
    # Below 1e300 is fine: Python's int and a double hold it. So are digits in a string.
    conn.execute("SELECT * FROM batonq.enqueue(%s, %s::jsonb)", (Q, "[9.99e299, -1e-300, 12.5]"))
    conn.execute("SELECT * FROM batonq.enqueue(%s, %s)", (Q, Jsonb({"id": huge})))
    assert client.tasks(Q)[0].payload == {"id": huge}
    [lease, _] = client.claim(Q, max_tasks=2)
    assert lease.row == [999 * 10**297, -1e-300, 12.5]
    error = engine_error(conn, "SELECT * FROM batonq.complete(%s, %s::jsonb)", (lease.lease_token, huge))
    assert type(error) is batonq.NumberTooLarge
    error = engine_error(conn, "SELECT * FROM batonq.fail(%s, %s::jsonb)", (lease.lease_token, huge))
    assert error.message.startswith("error holds a number with 5001 digits")
    assert client.task(lease.task_id).state == "leased"


def test_rows_stored_before_the_limits_still_load(
    client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    # Rows written behind the engine's back, as an older engine accepted
    # them: a 5,000-digit number and 300 levels of nesting.
    huge = "9" * 5000
    deep = "[" * 300 + "]" * 300
    client.enqueue(Q, 0)
    legacy_text = f'{{"n": {huge}, "deep": {deep}}}'
    sql.execute("UPDATE batonq.tasks SET payload = %s::jsonb WHERE queue = %s", (legacy_text, Q))
    client.enqueue(Q, 1)
    sql.execute(
        "UPDATE batonq.tasks SET payload = %s::jsonb WHERE queue = %s AND payload = '1'",
        ("[" * 2000 + "]" * 2000, Q),
    )
    listed = client.tasks(Q)
    assert len(listed) == 2
    leases = client.claim(Q, max_tasks=2)
    by_id = {lease.task_id: lease.row for lease in leases}
    legacy, deeper = by_id[min(by_id)], by_id[max(by_id)]
    # Too deep to serve: its JSON text; too long for int: a Decimal.
    assert legacy == legacy_text
    assert isinstance(deeper, str) and deeper.startswith("[[[")
    sql.execute("UPDATE batonq.tasks SET payload = %s::jsonb WHERE queue = %s", (f"[{huge}]", Q))
    [again] = [t for t in client.tasks(Q) if t.id == min(by_id)]
    assert again.payload == [Decimal(huge)]


REFUSED_VALUES = [
    ("enqueue", {"payload": {"x": float("nan")}}, batonq.InvalidArgument, "holds NaN"),
    ("enqueue", {"payload": {"x": float("inf")}}, batonq.NumberTooLarge, "infinite number"),
    ("enqueue", {"payload": {"x": "a\x00b"}}, batonq.InvalidArgument, r"NUL character \(\\u0000\)"),
    ("enqueue", {"payload": {}, "group": "a\x00b"}, batonq.InvalidArgument, r"NUL character \(\\x00\)"),
    ("complete", {"result": {"x": float("-inf")}}, batonq.NumberTooLarge, "infinite number"),
    ("configure_queue", {"max_leased": 2**31}, batonq.InvalidArgument, "at most 2147483647"),
    ("configure_queue", {"rate_limit": 2**70}, batonq.InvalidArgument, "at most 2147483647"),
]


@pytest.mark.parametrize(("call", "args", "error", "message"), REFUSED_VALUES)
def test_values_the_database_cannot_take_are_batonq_errors(
    admin: batonq.Client, call: str, args: dict[str, Any], error: type[Exception], message: str
) -> None:
    """NaN and Infinity (which json.dumps writes), a NUL character and an
    int past 32 bits are refused before the engine sees them: a batonq
    error saying what is wrong, not the driver's."""
    with pytest.raises(error, match=message):
        if call == "complete":
            admin.enqueue(Q, {})
            [lease] = admin.claim(Q)
            admin.complete(lease.lease_token, **args)
        elif call == "configure_queue":
            admin.configure_queue(Q, **args)
        else:
            admin.enqueue(Q, **args)


@pytest.mark.parametrize(("call", "args", "error", "message"), REFUSED_VALUES)
async def test_values_the_database_cannot_take_are_batonq_errors_async(
    admin_dsn: str, call: str, args: dict[str, Any], error: type[Exception], message: str
) -> None:
    async with await batonq.connect_async(admin_dsn) as admin:
        with pytest.raises(error, match=message):
            if call == "complete":
                await admin.enqueue(Q, {})
                [lease] = await admin.claim(Q)
                await admin.complete(lease.lease_token, **args)
            elif call == "configure_queue":
                await admin.configure_queue(Q, **args)
            else:
                await admin.enqueue(Q, **args)
