"""Running a script of bench/ the way a person does, for the smoke tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python bench/<script> <args>`` from the repository root; fails the
    test with the script's output when it exits non-zero."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc
