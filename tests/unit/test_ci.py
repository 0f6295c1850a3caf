"""CI runs what the README tells a newcomer to run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readmes_test_command() -> None:
    first_block = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.DOTALL)
    assert first_block is not None
    commands = [line for line in first_block[1].splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, commands  # install and serve; install and test
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == commands[1]
