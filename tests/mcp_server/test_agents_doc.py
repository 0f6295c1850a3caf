"""docs/agents.md as written: its config snippets start a server the SDK's
client can use, and its workflow — every ```json batonq_* call, in order,
answered as the ```json reply after it — runs on a fresh database, over stdio
and over HTTP.

In a reply, a key present must match (``...`` in a string stands for any
text) and keys left out are not checked. In a call, a string with ``...``
is the actual value of that key in the latest reply that matches it (the
lease token the claim returned).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from tests.mcp_server.support import BATONQ, CreatedTask, call, running_service, task_request, tasks_client

PAGE = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
BLOCK = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def blocks() -> list[tuple[str, str, str]]:
    """(language, info after it, body) of every fenced block."""
    return [
        (lang, info.strip(), body) for lang, info, body in BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    ]


def block(lang: str, info: str) -> str:
    [body] = [b for lg, i, b in blocks() if lg == lang and i == info]
    return body


def console_lines() -> list[list[str]]:
    return [
        shlex.split(line) for lang, _, body in blocks() if lang == "console" for line in body.splitlines()
    ]


def steps() -> list[tuple[str, dict[str, Any], Any]]:
    """(tool, arguments, expected reply) of each call of the workflow, in order."""
    found = [
        (info, json.loads(body))
        for lang, info, body in blocks()
        if lang == "json" and info.startswith(("batonq_", "reply"))
    ]
    calls = found[0::2]
    replies = found[1::2]
    assert all(tool.startswith("batonq_") for tool, _ in calls) and all(
        info == "reply" for info, _ in replies
    )
    return [(tool, args, reply) for (tool, args), (_, reply) in zip(calls, replies, strict=True)]


def matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and matches(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    if isinstance(expected, str) and "..." in expected:
        pattern = ".*".join(re.escape(part) for part in expected.split("..."))
        return isinstance(actual, str) and re.fullmatch(pattern, actual) is not None
    if isinstance(expected, bool) or expected is None:
        return actual is expected
    return not isinstance(actual, bool) and bool(expected == actual)


def find(key: str, pattern: str, value: Any) -> Any:
    """The first value under ``key`` in ``value`` that matches ``pattern``."""
    if isinstance(value, dict):
        if key in value and matches(pattern, value[key]):
            return value[key]
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            hit = find(key, pattern, item)
            if hit is not None:
                return hit
    return None


async def run_workflow(session: ClientSession) -> int:
    replies: list[Any] = []
    for tool, arguments, expected in steps():
        for key, value in arguments.items():
            if isinstance(value, str) and "..." in value:
                hits = [hit for r in reversed(replies) if (hit := find(key, value, r)) is not None]
                assert hits, f"{tool}: nothing earlier matches {key}={value!r}"
                arguments[key] = hits[0]
        reply = await call(session, tool, **arguments)
        assert matches(expected, reply), f"{tool} {arguments}:\n  documented {expected}\n  actual     {reply}"
        replies.append(reply)
    return len(replies)


def test_the_documented_workflow_has_every_step() -> None:
    tools = [tool for tool, _, _ in steps()]
    assert tools[:3] == ["batonq_enqueue"] * 3
    assert {"batonq_claim", "batonq_heartbeat", "batonq_complete", "batonq_fail", "batonq_tasks"} <= set(
        tools
    )


def test_the_config_snippets_agree() -> None:
    stdio = json.loads(block("json", ".mcp.json"))["mcpServers"]["batonq"]
    http = json.loads(block("json", ".mcp.json (HTTP)"))["mcpServers"]["batonq"]
    codex = tomllib.loads(block("toml", "config.toml"))["mcp_servers"]["batonq"]
    codex_http = tomllib.loads(block("toml", "config.toml (HTTP)"))["mcp_servers"]["batonq"]
    assert (codex["command"], codex["args"], codex["env"]) == (stdio["command"], stdio["args"], stdio["env"])
    assert codex_http == {"url": http["url"], "bearer_token_env_var": "BATONQ_KEY"}
    assert http["type"] == "http" and http["url"].endswith("/mcp")
    assert http["headers"] == {"Authorization": "Bearer ${BATONQ_KEY}"}
    claude = [line for line in console_lines() if line[:3] == ["claude", "mcp", "add"]]
    local, remote = claude
    assert local[local.index("--") + 1 :] == [stdio["command"], *stdio["args"]]
    assert local[local.index("--env") + 1] == "BATONQ_DATABASE_URL=" + stdio["env"]["BATONQ_DATABASE_URL"]
    assert remote[3:] == [
        "--transport",
        "http",
        "batonq",
        http["url"],
        "--header",
        "Authorization: Bearer $BATONQ_KEY",
    ]


async def test_the_workflow_over_stdio_as_configured(dsn: str) -> None:
    server = json.loads(block("json", ".mcp.json"))["mcpServers"]["batonq"]
    params = StdioServerParameters(
        command=BATONQ if server["command"] == "batonq" else server["command"],
        args=server["args"],
        env={**server["env"], "BATONQ_DATABASE_URL": dsn},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        assert await run_workflow(session) == len(steps())


async def test_the_workflow_over_http_as_configured(admin_dsn: str, tmp_path: Path) -> None:
    [create] = [line for line in console_lines() if line[:3] == ["batonq", "keys", "create"]]
    server = json.loads(block("json", ".mcp.json (HTTP)"))["mcpServers"]["batonq"]
    with running_service(admin_dsn, tmp_path / "serve.log") as service:
        made = subprocess.run(
            [BATONQ, "--dsn", admin_dsn, *create[1:]], capture_output=True, text=True, check=True, timeout=60
        )
        key = made.stdout.strip()
        url = re.sub(r"^http://[^/]+", service.base, server["url"])
        headers = {name: value.replace("${BATONQ_KEY}", key) for name, value in server["headers"].items()}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert await run_workflow(session) == len(steps())


async def test_the_mcp_tasks_example(admin_dsn: str) -> None:
    """The MCP tasks section: batonq_run answered with a task, completed by a
    worker, read back with tasks/get, as the page shows them."""
    arguments = json.loads(block("json", "tools/call batonq_run"))
    created_doc, completed_doc = [
        json.loads(body) for lang, info, body in blocks() if (lang, info) == ("json", "task")
    ]
    get = json.loads(block("json", "tasks/get"))
    params = StdioServerParameters(command=BATONQ, args=["--dsn", admin_dsn, "mcp"])
    async with tasks_client(params) as client:
        created = await client.session.call_tool("batonq_run", arguments, allow_claimed=True)
        assert isinstance(created, CreatedTask)
        shown = created.model_dump(by_alias=True, mode="json")
        assert matches(created_doc, shown), f"documented {created_doc}\n  actual     {shown}"
        task = (await call(client.session, "batonq_claim", queue=arguments["queue"]))["task"]
        await call(
            client.session,
            "batonq_complete",
            lease_token=task["lease_token"],
            result={"passed": 212, "failed": 0},
        )
        got = await task_request(client.session, "tasks/get", get["taskId"])
        assert matches(completed_doc, got), f"documented {completed_doc}\n  actual     {got}"


def test_batonq_mcp_reads_the_documented_key_variable() -> None:
    help_text = subprocess.run([BATONQ, "mcp", "--help"], capture_output=True, text=True, check=True).stdout
    assert "$BATONQ_KEY" in help_text
