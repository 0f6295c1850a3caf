from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.mcp_server.support import Service, Target, make_key, running_service


@pytest.fixture
def service(serve_dsn: str, tmp_path: Path) -> Iterator[Service]:
    with running_service(serve_dsn, tmp_path / "serve.log") as running:
        yield running


@pytest.fixture(params=["stdio", "http"])
def target(
    request: pytest.FixtureRequest, dsn: str, admin_dsn: str, serve_dsn: str, tmp_path: Path
) -> Iterator[Target]:
    if request.param == "stdio":
        yield Target("stdio", dsn)
        return
    with running_service(serve_dsn, tmp_path / "serve.log") as running:
        yield Target(
            "http", dsn, running, worker_key=make_key(admin_dsn, 2), observer_key=make_key(admin_dsn, 3)
        )
