"""Fixtures for the end-to-end HTTP tests: real ``batonq serve`` processes on
loopback, on a fresh database, driven with httpx."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from tests.conftest import scratch_database, through_pooler
from tests.e2e.live import LiveServer

KEEPALIVE_S = 1.0
"""The servers' keep-alive interval on idle streams (the default is 15 s)."""

Serve = Callable[..., LiveServer]


@pytest.fixture
def serve(serve_dsn: str) -> Iterator[Serve]:
    """Start ``batonq serve`` processes on this test's database (through
    PgBouncer with BATONQ_TEST_PGBOUNCER=1):
    ``serve("--max-body-bytes", "4096")``; all are stopped at teardown."""
    started: list[LiveServer] = []

    def start(*args: str) -> LiveServer:
        server = LiveServer(serve_dsn, "--keepalive", str(KEEPALIVE_S), *args)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(serve: Serve) -> LiveServer:
    return serve()


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    """A keep-alive client with the admin key the server printed on first start."""
    assert server.admin_key, f"no admin key on stderr:\n{server.log}"
    with server.http(server.admin_key) as client:
        yield client


@pytest.fixture(scope="module")
def module_dsn(server_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database shared by one module's tests."""
    with scratch_database(server_dsn, "batonq_e2e", template_db) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def shared_server(module_dsn: str, pooler: tuple[str, int] | None) -> Iterator[LiveServer]:
    """One server for a module whose tests keep to queues of their own."""
    server = LiveServer(
        through_pooler(module_dsn, pooler), "--keepalive", str(KEEPALIVE_S), listen_dsn=module_dsn
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shared_http(shared_server: LiveServer) -> Iterator[httpx.Client]:
    assert shared_server.admin_key
    with shared_server.http(shared_server.admin_key) as client:
        yield client
