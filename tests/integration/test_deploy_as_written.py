"""deploy/'s systemd units run as written: their ExecStart with their
Environment, as the least-privilege login roles they name (``batonq_api``
in batonq_service for the service, ``batonq_app`` in batonq_worker for
workers), through PgBouncer (deploy/pgbouncer.ini) with LISTEN straight to
PostgreSQL. Only what names this machine changes: the pooler's and the
server's addresses, the database, the service's port and batonq's path.
docs/deployment.md's commands are the units' own (checked here too)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tests.deployed import DEPLOY, INSTALLED, pgbouncer
from tests.e2e.live import ADMIN_KEY, free_port
from tests.waiting import wait_for
from tests.worker.support import BATONQ, ROOT

import batonq

POOLER_PORT = "6432"  # the units' PgBouncer; any other address is PostgreSQL itself
ROLES = {"batonq_api": "batonq_service", "batonq_app": "batonq_worker"}
APP = "myapp.tasks:app"  # as the worker unit's own comment names it
APPS = ROOT / "tests" / "apps"  # holds myapp/: the units' WorkingDirectory
Rewrite = Callable[[str], str]


def unit(name: str) -> tuple[dict[str, str], list[str], str]:
    """A unit's environment, command and working directory, as systemd reads them."""
    text = (DEPLOY / name).read_text()
    env = dict(
        line.removeprefix("Environment=").split("=", 1)
        for line in text.splitlines()
        if line.startswith("Environment=")
    )
    [command] = [
        line.removeprefix("ExecStart=") for line in text.splitlines() if line.startswith("ExecStart=")
    ]
    workdir = re.search(r"^WorkingDirectory=(.+)$", text, re.M)
    return env, shlex.split(command), workdir.group(1) if workdir else "/"


def roles_sql() -> list[str]:
    """docs/deployment.md's statements that make the units' login roles."""
    doc = (ROOT / "docs" / "deployment.md").read_text()
    [block] = re.findall(r"^```sql\n(.*?)^```", doc, re.DOTALL | re.M)
    statements = [s.strip() for s in block.split(";") if s.strip()]
    assert statements == [f"CREATE ROLE {role} LOGIN IN ROLE {group}" for role, group in ROLES.items()]
    return statements


@pytest.fixture(scope="module")
def bouncer(server_dsn: str) -> Iterator[tuple[str, int]]:
    with pgbouncer(server_dsn) as address:
        yield address


@pytest.fixture
def here(admin_dsn: str, bouncer: tuple[str, int]) -> Rewrite:
    """The units' URLs pointed at this machine: same role, this test's database."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for statement in roles_sql():
            with contextlib.suppress(psycopg.errors.DuplicateObject):
                conn.execute(statement)
    server = conninfo_to_dict(admin_dsn)

    def rewrite(url: str) -> str:
        params = conninfo_to_dict(url)
        if params.get("port") == POOLER_PORT:
            address = {"host": bouncer[0], "port": str(bouncer[1])}
        else:
            address = {"host": str(server.get("host", "")), "port": str(server.get("port", 5432))}
        return make_conninfo(url, dbname=server["dbname"], **address)

    return rewrite


def start(name: str, here: Rewrite, *replace: tuple[str, str]) -> subprocess.Popen[str]:
    env, command, workdir = unit(name)
    assert command[0] == INSTALLED
    return run(env, command, workdir, here, *replace)


def run(
    env: dict[str, str], command: list[str], workdir: str, here: Rewrite, *replace: tuple[str, str]
) -> subprocess.Popen[str]:
    """``command`` (batonq and its arguments) with ``env`` as its only BATONQ_
    settings, its URLs pointed at this machine, from ``workdir``."""
    args = [BATONQ, *command[1:]]
    for old, new in replace:
        args = [new if a == old else a for a in args]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BATONQ_")}
    environment.update({k: here(v) if v.startswith("postgresql://") else v for k, v in env.items()})
    environment["PYTHONUNBUFFERED"] = "1"
    folder = {"/": "/", "/opt/app": APPS, "/app": APPS}[workdir]  # the units', the container's
    return subprocess.Popen(
        args, cwd=folder, env=environment, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def test_the_units_run_as_their_least_privilege_roles(here: Rewrite, admin_dsn: str) -> None:
    """The service starts as batonq_api (it prints the first admin key and
    answers an enqueue); a worker as batonq_app does the tasks; neither
    role may read a batonq table."""
    env, _, _ = unit("batonq.service")
    assert {conninfo_to_dict(v)["user"] for k, v in env.items() if k.endswith("_URL")} == {"batonq_api"}
    port = str(free_port())
    service = start("batonq.service", here, ("8765", port))
    assert service.stdout is not None
    worker = None
    try:
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(iter(service.stdout.readline, "")), daemon=True).start()

        def ready() -> bool:
            assert service.poll() is None, "".join(lines)
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            return False

        wait_for(ready, timeout=90, what="batonq serve as batonq_api")
        found = ADMIN_KEY.search("".join(lines))  # printed on the first start
        assert found, "".join(lines)
        headers = {"Authorization": f"Bearer {found.group(0)}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=10) as http:
            answer = http.post("/v1/enqueue", json=[{"queue": "shop:tasks", "payload": n} for n in range(20)])
            assert answer.status_code == 200, answer.text
            assert http.post("/v1/keys", json={"ring": 2, "queues": ["shop:*"]}).status_code == 201
            worker = start("batonq-worker@.service", here, ("%i", APP))

            def done() -> bool:
                assert worker is not None and worker.poll() is None, stop(worker) if worker else ""
                listed = http.get("/v1/tasks", params={"queue": "shop:tasks", "state": "done", "limit": 100})
                return len(listed.json()["tasks"]) == 20

            wait_for(done, timeout=60, what="the worker unit to do every task")
    finally:
        worker_log = stop(worker) if worker is not None else ""
        service_log = stop(service)
    assert worker is not None and worker.returncode == 0, worker_log
    assert "Traceback" not in service_log, service_log
    for role in ROLES:
        with (
            psycopg.connect(make_conninfo(admin_dsn, user=role)) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("SELECT count(*) FROM batonq.api_keys")


def test_deployment_md_runs_the_units_commands() -> None:
    """The "with a direct connection" block of docs/deployment.md sets what
    each unit sets before running its command (less its tuning flags)."""
    doc = (ROOT / "docs" / "deployment.md").read_text()
    block = doc.split("With a direct connection, as `deploy/batonq.service` and", 1)[1].split("```", 2)[1]
    shown: list[tuple[dict[str, str], list[str]]] = []
    exports: dict[str, str] = {}
    for line in block.splitlines():
        words = line.split("#")[0].split()
        if words[:1] == ["export"]:
            name, value = words[1].split("=", 1)
            exports[name] = value
        elif words[:1] == ["batonq"]:
            shown.append((dict(exports), words))
    assert len(shown) == 2, block
    for name, (exported, words) in zip(("batonq.service", "batonq-worker@.service"), shown, strict=True):
        env, command, _ = unit(name)
        assert exported == env, name
        assert words[1] == command[1], name


def test_the_worker_container_runs_as_written(here: Rewrite, admin_dsn: str) -> None:
    """docs/worker.md's Dockerfile: its ENV and exec-form CMD from its WORKDIR
    (myapp/ there) do the tasks, log JSON lines, and exit 0 on SIGTERM (what
    ``docker stop`` sends)."""
    doc = (ROOT / "docs" / "worker.md").read_text()
    [block] = re.findall(r"^```dockerfile\n(.*?)^```", doc, re.DOTALL | re.M)
    lines = block.splitlines()
    env = dict(line.removeprefix("ENV ").split("=", 1) for line in lines if line.startswith("ENV "))
    [command] = [json.loads(line.removeprefix("CMD ")) for line in lines if line.startswith("CMD ")]
    [workdir] = [line.removeprefix("WORKDIR ") for line in lines if line.startswith("WORKDIR ")]
    assert "STOPSIGNAL SIGTERM" in lines and command[0] == "batonq"
    with batonq.connect(admin_dsn) as client:
        made = [e.task_id for e in client.enqueue_many("shop:tasks", list(range(10)))]
        worker = run(env, command, workdir, here)
        try:
            wait_for(
                lambda: {client.task(t).state for t in made} == {"done"},
                timeout=60, what="the container's worker to do every task",
            )  # fmt: skip
        finally:
            log = stop(worker)
    assert worker.returncode == 0, log
    records = [json.loads(line) for line in log.splitlines() if line.strip()]
    assert records and all(isinstance(r, dict) for r in records), log
