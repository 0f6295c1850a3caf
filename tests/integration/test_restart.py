"""A PostgreSQL restart cuts every pooled connection: the calls after it,
once the server is back, succeed (none of them gets a closed connection).
Each test crashes and restarts a private cluster of its own."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from tests.e2e.live import LiveServer
from tests.private_cluster import PrivateCluster, private_cluster

import batonq

POOL = 4


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    with private_cluster() as started:
        batonq.migrate(started.dsn)
        yield started


def test_client_calls_after_a_restart_succeed(cluster: PrivateCluster) -> None:
    with batonq.connect(cluster.dsn, min_connections=POOL, max_connections=POOL, listen=False) as client:
        client.enqueue("restart:q", 1)
        cluster.restart_immediate()
        # More calls than the pool has connections, each of which the restart closed.
        for i in range(2 * POOL):
            client.enqueue("restart:q", i)
        with client.transaction() as conn:
            client.enqueue("restart:q", "in a transaction", conn=conn)
        assert client.queues("restart:q")[0].pending == 2 * POOL + 2


def test_http_requests_after_a_restart_succeed(cluster: PrivateCluster) -> None:
    server = LiveServer(cluster.dsn)
    try:
        assert server.admin_key
        with server.http(server.admin_key) as http, ThreadPoolExecutor(20) as pool:
            # Twenty at once: the service's pool opens its twenty connections.
            assert {r.status_code for r in pool.map(lambda _: http.get("/v1/queues"), range(20))} == {200}
            cluster.restart_immediate()
            statuses = [http.post("/v1/enqueue", json={"queue": "restart:q", "payload": i}).status_code
                        for i in range(40)]  # fmt: skip
            assert statuses == [200] * 40
    finally:
        server.stop()
