"""/openapi.json matches reality: a bounded schemathesis run against a live
server, as the admin, finds no server error and no response outside the
schema (status codes, bodies, headers), and no schema-valid request refused
as invalid.

Left out: GET /v1/stream (an endless response) and DELETE /v1/keys/{id}
(it would revoke the run's own key); tests/e2e/test_http_stream.py and
test_http_access.py cover them. Long-polls are cut to 0.2 s by
tests/e2e/schemathesis_hooks.py. ``BATONQ_SCHEMATHESIS_SEED`` picks another
seed (default: a fixed one, so a failure reproduces)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.live import LiveServer

ROOT = Path(__file__).resolve().parents[2]
SCHEMATHESIS = Path(sys.executable).with_name("st")
CONFIG = """\
# 400 (a well-formed but wrong lease token or task id, an edge condition
# without a pointer) and 413 (a result over a queue's max_body_bytes, which
# the run itself may lower) are answers about the values, not the schema.
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "403", "404", "409", "413"]
# A list over 1,000 items is refused with 413 before its items are read.
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
"""


def test_schemathesis_finds_nothing(server: LiveServer, tmp_path: Path) -> None:
    assert server.admin_key
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    command = [
        str(SCHEMATHESIS), "--config-file", str(tmp_path / "schemathesis.toml"),
        "run", f"{server.url}/openapi.json",
        "--header", f"Authorization: Bearer {server.admin_key}",
        "--exclude-path", "/v1/stream",
        "--exclude-path-regex", "^/v1/keys/",
        "--max-examples", "20",
        "--workers", "1",  # the worker threads trip a CPython 3.11 ast bug inside hypothesis
        "--seed", os.environ.get("BATONQ_SCHEMATHESIS_SEED", "20261202"),
        "--generation-database", "none",
        "--request-timeout", "10",
        "--no-color",
    ]  # fmt: skip
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-20000:]
    assert "23 selected" in report and "Tested: 23" in report, report[-5000:]
    assert "Server error" not in report
