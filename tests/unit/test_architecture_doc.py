"""docs/architecture.md stays current: every file it names exists, and every
package under src/batonq is in its file map."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
# Where a path on the page may be written from: the repository, src, the
# package, the SQL directory, the tests.
BASES = [
    ROOT,
    ROOT / "src",
    ROOT / "src" / "batonq",
    ROOT / "src" / "batonq" / "sql",
    ROOT / "tests",
    ROOT / "tests" / "integration",
]
PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)*/?")
SUFFIXES = (".py", ".sql", ".md", ".toml", ".ini", ".sh", "/")


def _named_paths(text: str) -> list[str]:
    """Backquoted words that are file or directory paths (`client.py`,
    `src/batonq/sql/`, `scripts/check`): not URLs like `/v1/stream`, nor
    patterns like `NNNN_name.sql`."""
    found = []
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for code in re.findall(r"`([^`\n]+)`", prose):
        for word in code.split():
            if not PATH.fullmatch(word) or word.startswith("/") or "NNNN" in word:
                continue
            under_a_known_root = word.split("/")[0] in {"src", "tests", "docs", "scripts", "bench", "deploy"}
            if word.endswith(SUFFIXES) or under_a_known_root:
                found.append(word)
    return found


def test_every_path_it_names_exists() -> None:
    named = _named_paths(PAGE.read_text(encoding="utf-8"))
    assert "src/batonq/migrate.py" in named and "worker/batching.py" in named
    missing = [p for p in named if not any((base / p).exists() for base in BASES)]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_every_link_it_makes_resolves() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", PAGE.read_text(encoding="utf-8"))
    assert links
    assert [link for link in links if not (PAGE.parent / link).exists()] == []


def test_every_package_is_in_the_file_map() -> None:
    text = PAGE.read_text(encoding="utf-8")
    files = text[text.index("\n## Files\n") :]
    packages = sorted(p.parent for p in (ROOT / "src" / "batonq").glob("*/**/__init__.py"))
    assert packages
    unnamed = [str(p.relative_to(ROOT)) + "/" for p in packages if f"`{p.relative_to(ROOT)}/`" not in files]
    assert not unnamed, f"add these packages to the file map in docs/architecture.md: {unnamed}"
    assert "`src/batonq/__init__.py`" in files
