"""docs/worker.md: its Python blocks run, in order, in one namespace; its
``batonq worker`` commands run as written."""

from __future__ import annotations

import inspect
import itertools
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from tests.worker.support import BATONQ

import batonq

PAGE = Path(__file__).resolve().parents[2] / "docs" / "worker.md"


def test_worker_page_examples_run(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATONQ_DATABASE_URL", dsn)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": "worker_docs"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/worker.md:block {number}", "exec"), namespace)


def test_the_options_named_for_enqueue_child_are_client_enqueue_arguments() -> None:
    page = PAGE.read_text(encoding="utf-8")
    named = re.search(r"options as `Client\.enqueue`: (.*?)\.\.\.", page, re.DOTALL)
    assert named is not None
    options = re.findall(r"`(\w+)`", named.group(1))
    assert options and set(options) <= set(inspect.signature(batonq.Client.enqueue).parameters)
    assert set(options) <= set(inspect.signature(batonq.AsyncClient.enqueue).parameters)


APPS = Path(__file__).resolve().parents[1] / "apps"  # myapp.tasks, as the docs name it


def _shell_commands(page: str, program: str) -> list[list[str]]:
    """Every line of the page's untagged code blocks that runs ``program``
    on myapp.tasks (the quickstart's own line runs in test_examples_run)."""
    blocks = [body for tag, body in re.findall(r"^```(\w*)\n(.*?)^```", page, re.DOTALL | re.M) if not tag]
    lines = [line.split("#")[0] for block in blocks for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith(program + " ") and "myapp.tasks:" in line]


def test_every_worker_command_on_the_page_runs_as_written(dsn: str) -> None:
    """Each ``batonq worker`` line, from a folder holding myapp/, with a task
    in each of its queues and ``--burst`` added so it ends: it does the
    tasks and exits 0."""
    commands = _shell_commands(PAGE.read_text(encoding="utf-8"), "batonq worker")
    assert len(commands) >= 6, commands
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATONQ_")} | {"BATONQ_DATABASE_URL": dsn}
    with batonq.connect(dsn) as client:
        for command in commands:
            options = dict(itertools.pairwise(command))
            queues = options.get("--queues", options.get("--queue", "shop:tasks,shop:emails")).split(",")
            made = [client.enqueue(queue, "x").task_id for queue in queues]
            run = subprocess.run(
                [BATONQ, *command[1:], "--burst"],
                cwd=APPS,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, f"{shlex.join(command)}: {run.stderr}"
            assert {client.task(task).state for task in made} == {"done"}, shlex.join(command)
