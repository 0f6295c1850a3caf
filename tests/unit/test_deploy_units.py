"""The systemd units in deploy/ are ones systemd accepts: ``systemd-analyze
verify`` reports nothing, with batonq's path set to this installation's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.deployed import DEPLOY, INSTALLED


@pytest.mark.parametrize(("unit", "as_name"), [
    ("batonq.service", "batonq.service"),
    ("batonq-worker@.service", "batonq-worker@myapp.service"),  # a ":" in the path confuses verify
])  # fmt: skip
def test_systemd_accepts_the_unit(unit: str, as_name: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine")
    text = (DEPLOY / unit).read_text()
    assert INSTALLED in text
    batonq = Path(sys.executable).with_name("batonq")
    (tmp_path / as_name).write_text(text.replace(INSTALLED, str(batonq)))
    checked = subprocess.run(
        [analyze, "verify", f"./{as_name}"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")
