"""docs/worker.md: its Python blocks run, in order, in one namespace."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

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
