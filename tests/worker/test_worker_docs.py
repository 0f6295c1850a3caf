"""docs/worker.md: its Python blocks run, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "worker.md"


def test_worker_page_examples_run(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATONQ_DATABASE_URL", dsn)
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {"__name__": "worker_docs"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"docs/worker.md:block {number}", "exec"), namespace)
