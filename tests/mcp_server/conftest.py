from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mcp import ClientSession
from tests.mcp_server.support import Service, http_session, make_key, running_service, stdio_session


@dataclass
class Target:
    """Where a test's MCP sessions go: ``stdio`` (one ``batonq mcp`` process
    per session, on the worker role's DSN) or ``http`` (one ``batonq serve``,
    with a ring 2 and a ring 3 key made by ``batonq keys create``)."""

    kind: str
    dsn: str
    service: Service | None = None
    worker_key: str = ""
    observer_key: str = ""

    def session(self, *, read_only: bool = False) -> contextlib.AbstractAsyncContextManager[ClientSession]:
        if self.service is None:
            return stdio_session(self.dsn, *(["--read-only"] if read_only else []))
        return http_session(self.service.url, self.observer_key if read_only else self.worker_key)


@pytest.fixture
def service(admin_dsn: str, tmp_path: Path) -> Iterator[Service]:
    with running_service(admin_dsn, tmp_path / "serve.log") as running:
        yield running


@pytest.fixture(params=["stdio", "http"])
def target(request: pytest.FixtureRequest, dsn: str, admin_dsn: str, tmp_path: Path) -> Iterator[Target]:
    if request.param == "stdio":
        yield Target("stdio", dsn)
        return
    with running_service(admin_dsn, tmp_path / "serve.log") as running:
        yield Target(
            "http", dsn, running, worker_key=make_key(admin_dsn, 2), observer_key=make_key(admin_dsn, 3)
        )
