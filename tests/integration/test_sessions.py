"""Dashboard sessions in the engine: started with a key's secret, checked by
their token, ended at sign-out, when the key is revoked, and removed by
retention once expired. The service's role (a member of batonq_service)
reaches the sessions through the engine's functions only; a worker's may not."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from tests.conftest import SERVICE_ROLE

import batonq
from batonq.models import SessionAuth


def _sha(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _parts(key: str) -> tuple[int, bytes]:
    _, key_id, secret = key.split("_")
    return int(key_id), _sha(secret)


def test_a_session_needs_the_keys_secret_and_lives_until_signed_out(
    admin: batonq.Client, service_client: batonq.Client
) -> None:
    key = admin.create_key(3, ["shop:*"], "viewer")
    key_id, secret_hash = _parts(key.key)
    # The service's role starts, checks and ends sessions.
    assert service_client.create_session(key_id, _sha("not the secret"), _sha("t0")) is None
    assert service_client.create_session(key_id + 1, secret_hash, _sha("t0")) is None
    started = service_client.create_session(key_id, secret_hash, _sha("t1"))
    assert started == SessionAuth(key_id, 3, ["shop:*"])
    assert service_client.session_for_auth(_sha("t1")) == started
    assert service_client.session_for_auth(_sha("t0")) is None
    assert service_client.end_session(_sha("t1")) is True
    assert service_client.session_for_auth(_sha("t1")) is None
    assert service_client.end_session(_sha("t1")) is False


def test_revoking_the_key_ends_its_sessions(
    admin: batonq.Client, service_client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    key = admin.create_key(1)
    key_id, secret_hash = _parts(key.key)
    for token in ("a", "b"):
        assert service_client.create_session(key_id, secret_hash, _sha(token)) is not None
    admin.revoke_key(key_id)
    assert [service_client.session_for_auth(_sha(t)) for t in ("a", "b")] == [None, None]
    assert sql.execute("SELECT count(*) FROM batonq.dashboard_sessions").fetchone() == (0,)
    assert service_client.create_session(key_id, secret_hash, _sha("c")) is None  # revoked: no new one


def test_an_expired_session_signs_nobody_in_and_retention_removes_it(
    admin: batonq.Client, service_client: batonq.Client, sql: psycopg.Connection[Any]
) -> None:
    key_id, secret_hash = _parts(admin.create_key(2).key)
    service_client.create_session(key_id, secret_hash, _sha("old"))
    service_client.create_session(key_id, secret_hash, _sha("new"))
    (lifetime,) = sql.execute(
        "SELECT expires_at - created_at FROM batonq.dashboard_sessions WHERE token_hash = %s", [_sha("new")]
    ).fetchone() or (None,)
    assert lifetime is not None and lifetime.total_seconds() == 12 * 3600
    sql.execute("UPDATE batonq.dashboard_sessions SET expires_at = now() - interval '1 second'"
                " WHERE token_hash = %s", [_sha("old")])  # fmt: skip
    assert service_client.session_for_auth(_sha("old")) is None
    assert service_client.maintain()["sessions_deleted"] == 1
    assert service_client.session_for_auth(_sha("new")) is not None
    assert service_client.maintain()["sessions_deleted"] == 0


def test_the_worker_role_cannot_read_or_write_the_sessions_table(dsn: str) -> None:
    """Nor start one (sessions and keys are the service's)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in (
            "SELECT * FROM batonq.dashboard_sessions",
            "DELETE FROM batonq.dashboard_sessions",
            "SELECT * FROM batonq.key_for_auth(1)",  # the keys' hashes stay the service's
            "SELECT batonq.session_for_auth('\\x00')",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)


def test_the_service_role_cannot_touch_a_table(service_client: batonq.Client, dsn: str) -> None:
    """It checks keys through the engine's functions, and reads no table."""
    made = service_client.create_key(2, ["shop:*"], "shop")
    listed = service_client.keys()
    assert [k.id for k in listed] == [made.id]
    with psycopg.connect(make_conninfo(dsn, user=SERVICE_ROLE), autocommit=True) as conn:
        for statement in (
            "SELECT * FROM batonq.api_keys",
            "SELECT * FROM batonq.tasks",
            "CREATE TABLE batonq.mine (x int)",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
