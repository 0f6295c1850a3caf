"""docs/http.md runs as written: its ```sh blocks, in order, in one bash
session (a block may use a variable an earlier one set), against a live
server with $BATONQ_URL and $KEY (the admin key) set. Every command must
succeed, and every block must print JSON, or, when it says
``# output: event-stream``, an event stream. An error answer is allowed only
where the block names its code in a comment."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.live import LiveServer
from tests.e2e.seeds import TELEON_CLAIM, TELEON_CLAIMED

DOC = Path(__file__).resolve().parents[2] / "docs" / "http.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def sh_blocks(text: str) -> list[str]:
    return [match.group(1) for match in BLOCK.finditer(text)]


def json_documents(text: str) -> list[Any]:
    """Every JSON value printed, one after another (compact or pretty)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            return found
        value, at = decoder.raw_decode(text, at)
        found.append(value)


def script(blocks: list[str], out: Path) -> str:
    lines = [
        "set -uo pipefail",
        f"trap 'echo \"block $BLOCK: $BASH_COMMAND (exit $?)\" >> {out}/errors' ERR",
    ]
    for number, block in enumerate(blocks):
        lines += [f"BLOCK={number}", "{", block, f"}} > {out}/{number}.out 2> {out}/{number}.err"]
    return "\n".join(lines) + "\n"


def test_the_examples_in_http_md_run(serve: Any, admin_dsn: str, tmp_path: Path) -> None:
    assert shutil.which("jq"), "the examples use jq: apt-get install jq"
    blocks = sh_blocks(DOC.read_text())
    assert len(blocks) >= 15, "the curl examples were not found"
    assert "## Three-line session" in DOC.read_text()
    server: LiveServer = serve()
    assert server.admin_key
    env = {
        **os.environ,
        "BATONQ_URL": server.url,
        "KEY": server.admin_key,
        "BATONQ_DATABASE_URL": admin_dsn,  # for `batonq keys create`
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    run = subprocess.run(
        ["bash", "-c", script(blocks, tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    errors = (tmp_path / "errors").read_text() if (tmp_path / "errors").exists() else ""
    assert run.returncode == 0 and not errors, f"{errors}\n{run.stdout}\n{run.stderr}"

    for number, block in enumerate(blocks):
        out = (tmp_path / f"{number}.out").read_text()
        where = f"block {number}:\n{block}\n--- printed:\n{out}\n{(tmp_path / f'{number}.err').read_text()}"
        if "# output: event-stream" in block:
            assert out.startswith(": ready\n"), where
            continue
        documents = json_documents(out)
        assert documents, where
        for document in documents:
            if isinstance(document, dict) and isinstance(document.get("error"), dict):
                code = document["error"]["code"]
                assert re.search(rf"#.*\b{code}\b", block), f"unexpected error {code}: {where}"

    # The one-task exchange, with the very claim body a client of that form sends.
    [number] = [n for n, block in enumerate(blocks) if f"-d '{TELEON_CLAIM}'" in block]
    [claimed] = json_documents((tmp_path / f"{number}.out").read_text())
    expected = json.loads(TELEON_CLAIMED)
    assert list(claimed)[:4] == list(expected)
    for field in ("lease_expires_in_s", "row"):
        assert claimed[field] == expected[field], field
    assert re.fullmatch(r"t_[0-9]+", claimed["task_id"]) and isinstance(claimed["fencing_token"], int)
    [submitted] = json_documents((tmp_path / f"{number + 1}.out").read_text())
    assert submitted == {"task_id": claimed["task_id"], "state": "done", "replayed": False,
                         "fencing_token": claimed["fencing_token"]}  # fmt: skip
