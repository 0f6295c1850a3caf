"""``batonq graph`` and ``batonq keys``, in-process against real PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from click.testing import CliRunner, Result

import batonq
from batonq.cli import main

Run = Callable[..., Result]


@pytest.fixture
def run(service_dsn: str) -> Run:
    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), env={"BATONQ_DATABASE_URL": service_dsn})

    return invoke


def test_graph_add_show_rm(run: Run, admin: batonq.Client) -> None:
    assert run("graph", "show").output.startswith("no edges")
    added = run("graph", "add", "retrieve", "rank", "--fan-out", "/docs", "--map", "/id")
    assert added.exit_code == 0, added.output
    assert added.output.strip() == "retrieve -> rank  [fan out /docs, map /id]"
    assert run("graph", "add", "rank", "summarise", "--join", "--partial").exit_code == 0
    routed = run(
        "graph", "add", "classify", "spam", "--when", "/label", "--equals", '"spam"', "--priority", "5"
    )
    assert routed.output.strip() == 'classify -> spam  [when /label == "spam", priority 5]'
    shown = run("graph", "show")
    assert shown.output.splitlines() == [
        'classify -> spam  [when /label == "spam", priority 5]',
        "rank -> summarise  [join (partial)]",
        "retrieve -> rank  [fan out /docs, map /id]",
    ]
    as_json = [json.loads(line) for line in run("graph", "show", "--json").output.splitlines()]
    assert as_json[2]["fan_out"] == "/docs" and as_json[1]["is_join"] is True
    assert [e.to_queue for e in admin.edges()] == ["spam", "summarise", "rank"]

    cycle = run("graph", "add", "summarise", "retrieve")
    assert cycle.exit_code == 1
    assert "graph_cycle" in cycle.output and "would close a cycle" in cycle.output

    assert run("graph", "rm", "retrieve", "rank").output.strip() == "removed retrieve -> rank"
    missing = run("graph", "rm", "retrieve", "rank")
    assert missing.exit_code == 1 and "no edge retrieve -> rank" in missing.output
    usage = run("graph", "add", "a", "b", "--equals", "1")
    assert usage.exit_code == 2 and "--equals and --absent need --when" in usage.output


def test_keys_create_list_revoke(run: Run, admin: batonq.Client) -> None:
    made = run("keys", "create", "--ring", "2", "--queues", "shop:*,mail:outbox", "--name", "workers")
    assert made.exit_code == 0, made.output
    key = made.stdout.strip()
    assert re.fullmatch(r"bq_\d+_[0-9a-f]{64}", key)
    [listed] = admin.keys()
    assert (listed.ring, listed.queues, listed.name) == (2, ["shop:*", "mail:outbox"], "workers")
    text = run("keys", "list").output
    assert "ring 2 (worker)" in text and key not in text
    assert run("keys", "revoke", str(listed.id)).output.strip() == f"key {listed.id} revoked"
    assert admin.keys()[0].revoked_at is not None
    assert run("keys", "revoke", "999").exit_code == 1
    assert run("keys", "create", "--ring", "4").exit_code == 2
