"""The peers' virtualenvs: each peer runs from one of its own (never
batonq's), made with pinned versions when missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PEERS = {
    "pgqueuer": (Path("/tmp/peer-pgqueuer"), ["pgqueuer==1.6.0", "asyncpg"]),
    "procrastinate": (Path("/tmp/peer-procrastinate"), ["procrastinate==3.10.0", "psycopg[binary]"]),
    "pgmq": (Path("/tmp/peer-pgmq"), ["pgmq==1.1.4", "psycopg[binary]"]),
}


def ensure_peers(names: list[str] | None = None) -> dict[str, str]:
    """Make the virtualenvs of ``names`` (default: every peer) that are
    missing; the peers whose virtualenv could not be made, with why."""
    failed = {}
    for name in PEERS if names is None else names:
        venv, packages = PEERS[name]
        if (venv / "bin" / "python").exists():
            continue
        print(f"making {venv} ({', '.join(packages)})", flush=True)
        done = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if done.returncode == 0:
            done = subprocess.run(
                [str(venv / "bin" / "pip"), "install", "--quiet", *packages], capture_output=True, text=True
            )
        if done.returncode != 0:
            failed[name] = (
                f"could not install {', '.join(packages)} into {venv}: {done.stderr.strip()[-500:]}"
            )
            shutil.rmtree(venv, ignore_errors=True)
    return failed
