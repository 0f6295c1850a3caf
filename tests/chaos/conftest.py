"""The fault battery runs on a private PostgreSQL cluster of its own (see
cluster.py): one per test session, a fresh database per scenario."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.chaos.battery import Database
from tests.chaos.cluster import Cluster, private_cluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with private_cluster() as c:
        yield c


@pytest.fixture
def db(cluster: Cluster) -> Database:
    return Database(cluster)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
