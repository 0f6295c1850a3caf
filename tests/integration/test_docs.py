"""The Python examples in docs/ run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(encoding="utf-8"), re.DOTALL)


@pytest.mark.parametrize("page", ["graph.md"])
def test_examples_run(page: str, admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATONQ_DATABASE_URL", admin_dsn)
    blocks = python_blocks(page)
    assert blocks, f"{page} has no python example"
    for block in blocks:
        exec(compile(block, f"{page}:example", "exec"), {})
