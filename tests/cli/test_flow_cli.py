"""batonq schedule, enqueue --debounce and --group, queue configure's limits,
queues --settings and audit, run in-process with CliRunner against real
PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from tests.cli.test_cli import Run, lines

import batonq
from batonq.cli import main


@pytest.fixture
def run(admin_dsn: str) -> Run:
    def invoke(*args: str) -> Result:
        return CliRunner().invoke(main, list(args), env={"BATONQ_DATABASE_URL": admin_dsn})

    return invoke


COMMANDS = [
    ["schedule", "add"], ["schedule", "list"], ["schedule", "remove"], ["schedule", "pause"],
    ["schedule", "resume"], ["schedule", "firings"], ["audit"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_flow_command_has_help_with_an_example(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0 and "Example" in result.output


def test_schedule_add_list_pause_resume_remove(run: Run, admin: batonq.Client) -> None:
    added = run("schedule", "add", "report", "--cron", "0 7 * * 1-5", "--queue", "reports",
                "--payload", '{"kind": "weekly"}', "--tz", "Europe/Berlin", "--missed", "skip")  # fmt: skip
    assert added.exit_code == 0, added.output
    assert added.stdout.startswith("report: '0 7 * * 1-5' (Europe/Berlin) -> reports, missed ticks skip")
    [shown] = lines(run("schedule", "list", "--json"))
    assert (shown["queue"], shown["payload"], shown["missed"]) == ("reports", {"kind": "weekly"}, "skip")
    assert "paused" in run("schedule", "pause", "report").stdout
    assert admin.schedules()[0].paused
    assert run("schedule", "resume", "report").exit_code == 0
    assert run("schedule", "remove", "report").stdout == "report: removed\n"
    gone = run("schedule", "remove", "report")
    assert (gone.exit_code, gone.stdout) == (1, "report: no such schedule\n")


def test_a_bad_cron_is_an_error(run: Run) -> None:
    result = run("schedule", "add", "x", "--cron", "every day", "--queue", "q")
    assert result.exit_code == 1
    assert "invalid cron expression 'every day'" in result.output


def test_enqueue_debounce_collapses_into_one_task(run: Run) -> None:
    first = run("enqueue", "digest", '{"n": 1}', "--debounce-key", "u7", "--debounce", "60")
    second = run("enqueue", "digest", '{"n": 2}', "--debounce-key", "u7", "--debounce", "60", "--json")
    task = first.stdout.split()[0]
    assert first.stdout == f"{task} created\n"
    reply = json.loads(second.stdout)
    assert (reply["created"], reply["task_id"]) == (False, task)
    assert json.loads(run("task", task, "--json").stdout)["payload"] == {"n": 2}


def test_queue_settings_and_audit(run: Run) -> None:
    assert run("queue", "configure", "shards", "--lease", "90").exit_code == 0
    assert run("queue", "pause", "shards").exit_code == 0
    settings = run("queues", "--settings")
    assert settings.exit_code == 0
    [row] = [line for line in settings.stdout.splitlines() if line.startswith("shards")]
    assert row.split()[:3] == ["shards", "yes", "90"]
    audit = run("audit", "--kind", "queue", "--name", "shards")
    [paused] = [line for line in audit.stdout.splitlines() if "paused False -> True" in line]
    assert "postgres  queue  shards" in paused
    assert "lease_s 300 -> 90" in audit.stdout


def test_queue_limits_are_configured_shown_and_cleared(run: Run) -> None:
    configured = run("queue", "configure", "mail", "--max-leased", "3", "--group-max-leased", "1",
                     "--rate-limit", "20", "--group-rate-limit", "5", "--rate-period", "2")  # fmt: skip
    assert configured.exit_code == 0, configured.output
    limits = "; at most 3 leased, 1 per group, 20 claims per 2 s, 5 claims per 2 s per group"
    assert configured.stdout.rstrip().endswith(limits)
    settings = run("queues", "--settings")
    header, row = (next(line for line in settings.stdout.splitlines() if line.startswith(word))
                   for word in ("queue", "mail"))  # fmt: skip
    assert header.split()[-7:] == ["max", "leased", "group", "max", "rate", "group", "rate"]
    assert row.split()[-4:] == ["3", "1", "20/2s", "5/2s"]

    cleared = run("queue", "configure", "mail", "--max-leased", "none", "--rate-limit", "0",
                  "--group-rate-limit", "none", "--json")  # fmt: skip
    shown = json.loads(cleared.stdout)
    names = ("max_leased", "group_max_leased", "rate_limit", "group_rate_limit")
    assert [shown[name] for name in names] == [None, 1, None, None]
    none_left = run("queue", "configure", "mail", "--group-max-leased", "0")
    assert none_left.stdout.rstrip().endswith(" max body 131072 bytes")  # no limits left
    bad = run("queue", "configure", "mail", "--max-leased", "-1")
    assert bad.exit_code == 2 and "'-1' is not a count from 0" in bad.output
    assert "max_leased 3 -> none" in run("audit", "--kind", "queue", "--name", "mail").stdout


def test_queue_settings_come_a_page_at_a_time(run: Run) -> None:
    for name in ("page:a", "page:b", "page:c"):
        assert run("queue", "configure", name, "--lease", "60").exit_code == 0
    first = run("queues", "--settings", "--after", "page", "--limit", "2")
    assert [line.split()[0] for line in first.stdout.splitlines()[1:]] == ["page:a", "page:b"]
    assert "more queues: batonq queues --settings --after page:b" in first.stderr
    rest = run("queues", "--settings", "--after", "page:b", "--limit", "2", "--json")
    assert [json.loads(line)["name"] for line in rest.stdout.splitlines()] == ["page:c"]


def test_a_group_is_given_at_enqueue_and_shown_on_the_task(run: Run, tmp_path: Path) -> None:
    task = run("enqueue", "exports", '{"n": 1}', "--group", "acme").stdout.split()[0]
    source = tmp_path / "tasks.jsonl"
    source.write_text('{"payload": {"n": 2}, "group": "globex"}\n{"payload": {"n": 3}}\n')
    imported = run("enqueue", "exports", "--from", str(source), "--group", "initech")
    assert imported.stdout == "created 2, already there 0\n", imported.output

    listed = run("tasks", "exports").stdout.splitlines()
    assert listed[0].split()[:7] == ["id", "state", "attempts", "priority", "age", "group", "key"]
    assert sorted(line.split()[5] for line in listed[1:]) == ["acme", "globex", "initech"]
    assert "  group          acme\n" in run("task", task).stdout
    run("enqueue", "lines", '{"n": 1}', "--group", "two\nlines")
    [row] = run("tasks", "lines").stdout.splitlines()[1:]  # one row: the newline is not printed
    assert row.split()[5:7] == ["two", "lines"]
    assert json.loads(run("task", task, "--json").stdout)["group"] == "acme"

    source.write_text('{"payload": {}, "group": 7}\n')
    bad = run("enqueue", "exports", "--from", str(source))
    assert bad.exit_code == 1
    assert 'tasks.jsonl line 1: "group" must be a string of 1-' in bad.output
