"""docs/cli.md matches the code: its session runs as written, and it documents
every command and exit code.

A ```console block is a session: ``$ batonq ...`` lines run in order on a fresh
database, each followed by its exact output (stdout and stderr), where ``...``
stands for any text within a line. ``# exit code N`` ends a command that must
exit N (default 0). A ```jsonl block whose info string names a file
(```jsonl shards.jsonl) is written to that file first.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from batonq.cli import main
from batonq.cli.common import EXIT_CODES_HELP

PAGE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
EXIT = re.compile(r"\s+# exit code (\d+)$")


def blocks(kind: str) -> list[tuple[str, str]]:
    """(info after the language, body) of each fenced block of ``kind``."""
    text = PAGE.read_text(encoding="utf-8")
    return re.findall(rf"^```{kind}([^\n]*)\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)


def session(body: str) -> list[tuple[list[str], int, list[str]]]:
    """(arguments, exit code, expected output lines) per command."""
    steps: list[tuple[list[str], int, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            command = line[2:]
            code = EXIT.search(command)
            args = shlex.split(EXIT.sub("", command))
            assert args[0] == "batonq", line
            steps.append((args[1:], int(code[1]) if code else 0, []))
        else:
            steps[-1][2].append(line)
    return steps


def matches(expected: str, actual: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, actual) is not None


def test_the_session_runs_as_written(admin_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for info, body in blocks("jsonl"):
        if info.strip():
            (tmp_path / info.strip()).write_text(body, encoding="utf-8")
    sessions = blocks("console")
    assert sessions, "docs/cli.md has no session"
    runner = CliRunner()
    for _, body in sessions:
        for args, code, expected in session(body):
            result = runner.invoke(main, args, env={"BATONQ_DATABASE_URL": admin_dsn}, prog_name="batonq")
            where = f"$ batonq {shlex.join(args)}"
            assert result.exit_code == code, f"{where}\n{result.output}"
            actual = [line.rstrip() for line in result.output.splitlines()]
            assert len(actual) == len(expected), f"{where}\n{result.output}"
            for want, got in zip(expected, actual, strict=True):
                assert matches(want, got), f"{where}\n  expected: {want}\n  got:      {got}"


# The modules whose commands this page documents; other command groups
# (worker, serve, keys, graph) are documented with their own features.
MODULES = {f"batonq.cli.{name}" for name in ("migrate", "enqueue", "leases", "tasks", "queues")}


def commands(group: click.Group, prefix: str = "batonq") -> list[str]:
    found = []
    for name, command in group.commands.items():
        if getattr(command.callback, "__module__", None) not in MODULES:
            continue
        if isinstance(command, click.Group):
            found += commands(command, f"{prefix} {name}")
        else:
            found.append(f"{prefix} {name}")
    return found


def test_every_command_and_exit_code_is_documented() -> None:
    text = PAGE.read_text(encoding="utf-8")
    headings = re.findall(r"^#+ .*$", text, re.MULTILINE)
    documented = {name for heading in headings for name in re.findall(r"`(batonq [a-z -]+?)`", heading)}
    ours = set(commands(main))
    assert len(ours) == 17
    assert ours <= documented, f"not in docs/cli.md: {sorted(ours - documented)}"
    for line in EXIT_CODES_HELP.splitlines()[2:]:
        code, meaning = line.split(None, 1)
        assert f"| {code} | {meaning.split(' (')[0]}" in text
