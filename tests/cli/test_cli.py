"""The batonq command line, run in-process with CliRunner against real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from tests.conftest import age, scratch_database

import batonq
from batonq.cli import main
from batonq.migrate import migrations

Run = Callable[..., Result]
Q = "shards"


@pytest.fixture
def run(service_dsn: str) -> Run:
    """``run("enqueue", Q, "{}")``: the CLI on the test database, via the env var."""

    def invoke(*args: str, input: str | None = None) -> Result:
        return CliRunner().invoke(main, list(args), input=input, env={"BATONQ_DATABASE_URL": service_dsn})

    return invoke


@pytest.fixture
def empty_dsn(server_dsn: str) -> Iterator[str]:
    """A database without the batonq schema."""
    with scratch_database(server_dsn, "batonq_e") as dsn:
        yield dsn


def lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def claim_one(run: Run, *extra: str) -> dict[str, Any]:
    result = run("claim", Q, *extra)
    assert result.exit_code == 0, result.output
    [lease] = lines(result)
    return lease


COMMANDS = [
    ["migrate"], ["enqueue"], ["claim"], ["complete"], ["fail"], ["heartbeat"], ["tasks"], ["task"],
    ["retry"], ["cancel"], ["hold"], ["release"], ["queues"], ["queue", "configure"], ["queue", "pause"],
    ["queue", "resume"],
]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_an_example(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output


def test_main_help_lists_exit_codes() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    codes = ("0  ok", "1  error", "2  usage error", "3  claim: nothing", "4  complete/fail", "5  database")
    for line in codes:
        assert line in result.output
    assert set(main.commands) >= {c[0] for c in COMMANDS}


def test_migrate_check_print_sql_and_apply(empty_dsn: str, admin_dsn: str) -> None:
    runner = CliRunner()
    check = runner.invoke(main, ["--dsn", empty_dsn, "migrate", "--check"])
    assert check.exit_code == 1
    assert check.stdout.startswith(f"{len(migrations())} pending: 0001_schema")

    printed = runner.invoke(main, ["migrate", "--print-sql"])
    assert printed.exit_code == 0
    assert printed.stdout.startswith("-- batonq schema") and printed.stdout.rstrip().endswith("COMMIT;")
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(printed.stdout.encode())  # as psql -f would
    assert runner.invoke(main, ["--dsn", empty_dsn, "migrate", "--check"]).stdout == "up to date\n"
    assert runner.invoke(main, ["--dsn", empty_dsn, "migrate"]).stdout == "up to date\n"

    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("UPDATE batonq.engine SET sha256 = 'an older engine'")
    stale = runner.invoke(main, ["--dsn", empty_dsn, "migrate", "--check"])
    assert (stale.exit_code, stale.stdout) == (1, "engine out of date: run batonq migrate\n")
    assert runner.invoke(main, ["--dsn", empty_dsn, "migrate"]).stdout == "applied the engine\n"
    assert runner.invoke(main, ["--dsn", empty_dsn, "migrate", "--check"]).exit_code == 0


def test_migrate_applies_pending(empty_dsn: str) -> None:
    result = CliRunner().invoke(main, ["migrate"], env={"BATONQ_DATABASE_URL": empty_dsn})
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "applied 0001_schema"
    again = CliRunner().invoke(main, ["--dsn", empty_dsn, "migrate", "--check"])
    assert (again.exit_code, again.stdout) == (0, "up to date\n")


def test_missing_schema_is_an_error(empty_dsn: str) -> None:
    result = CliRunner().invoke(main, ["--dsn", empty_dsn, "queues"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: schema_missing:")


def test_enqueue_options(run: Run, admin: batonq.Client) -> None:
    first = run("enqueue", Q, '{"n": 1}', "--key", "k1")
    assert first.exit_code == 0
    task_id = first.stdout.split()[0]
    assert first.stdout == f"{task_id} created\n"
    assert run("enqueue", Q, '{"n": 1}', "--key", "k1").stdout == f"{task_id} already there\n"

    reply = json.loads(run("enqueue", Q, "[2]", "--priority", "7", "--delay", "60", "--max-attempts", "5",
                           "--parent", task_id.removeprefix("t_"), "--json").stdout)  # fmt: skip
    assert reply["created"] is True and reply["state"] == "pending" and reply["task_id"].startswith("t_")
    child = admin.task(reply["task_id"])
    assert (child.priority, child.max_attempts, child.payload) == (7, 5, [2])
    assert child.parent_id == int(task_id[2:])
    assert child.run_at > admin.task(task_id).run_at

    held = run("enqueue", Q, '"x"', "--held")
    assert admin.task(held.stdout.split()[0]).state == "held"


def test_claim_prints_leases_and_exits_3_when_empty(run: Run) -> None:
    empty = run("claim", Q)
    assert (empty.exit_code, empty.stdout) == (3, "")
    assert "nothing to claim" in empty.stderr

    for n in range(3):
        run("enqueue", Q, json.dumps({"n": n}))
    result = run("claim", Q, "--max-tasks", "2", "--lease", "60", "--worker", "w1")
    assert result.exit_code == 0
    leases = lines(result)
    assert [lease["row"] for lease in leases] == [{"n": 0}, {"n": 1}]
    for lease in leases:
        assert lease["task_id"].startswith("t_") and lease["lease_token"]
        assert lease["attempt"] == 1 and lease["fencing_token"] > 0
        assert 0 < lease["lease_expires_in_s"] <= 60
    waited = run("claim", Q, "--wait", "0.2")
    assert waited.exit_code == 0 and lines(waited)[0]["row"] == {"n": 2}


def test_complete_heartbeat_and_lease_lost(run: Run, admin: batonq.Client) -> None:
    run("enqueue", Q, "{}")
    lease = claim_one(run)
    token = lease["lease_token"]

    beat = run("heartbeat", token, "--lease", "120", "--stage", "halfway")
    assert beat.exit_code == 0 and beat.stdout.startswith(f"{lease['task_id']} leased, lease expires in")
    assert admin.task(lease["task_id"]).stage == "halfway"

    done = run("complete", token, '{"passed": 41}')
    assert (done.exit_code, done.stdout) == (0, f"{lease['task_id']} done\n")
    again = run("complete", token, '{"passed": 41}', "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["outcome"] == "replayed"
    assert admin.task(lease["task_id"]).result == {"passed": 41}

    refused = run("heartbeat", token)
    assert refused.exit_code == 4
    assert refused.stderr == f"error: lease_lost: lease no longer held: task {lease['task_id']} is done\n"


def test_an_expired_and_reclaimed_lease_is_lost(run: Run, sql: psycopg.Connection[Any]) -> None:
    run("enqueue", Q, "{}")
    old = claim_one(run, "--lease", "1")
    age(sql, 5)
    new = claim_one(run)
    assert new["task_id"] == old["task_id"] and new["fencing_token"] > old["fencing_token"]
    refused = run("complete", old["lease_token"], "{}")
    assert refused.exit_code == 4
    assert refused.stderr.startswith(f"error: lease_lost: lease no longer held: task {old['task_id']} is")
    assert "leased under fencing token" in refused.stderr
    assert run("complete", new["lease_token"]).exit_code == 0
    finished = run("fail", old["lease_token"], "too late")  # TaskFinished
    assert finished.exit_code == 4 and "is done" in finished.stderr


def test_fail_retry_delay_no_requeue_and_error_json(run: Run, admin: batonq.Client) -> None:
    run("enqueue", Q, "{}")
    run("enqueue", Q, "{}")
    first, second = (claim_one(run) for _ in range(2))

    retried = run("fail", first["lease_token"], "connection reset", "--retry-delay", "60")
    assert (retried.exit_code, retried.stdout) == (0, f"{first['task_id']} pending\n")
    assert admin.task(first["task_id"]).last_error == "connection reset"

    dead = run("fail", second["lease_token"], '{"code": "E42"}', "--error-json", "--no-requeue")
    assert (dead.exit_code, dead.stdout) == (0, f"{second['task_id']} dead\n")
    assert admin.task(second["task_id"]).errors[0]["error"] == {"code": "E42"}


def test_usage_errors_exit_2(run: Run) -> None:
    bad_payload = run("enqueue", Q, "{nope")
    assert bad_payload.exit_code == 2
    assert "PAYLOAD_JSON is not valid JSON: Expecting property name" in bad_payload.stderr
    bad_result = run("complete", "some-token", "[1,")
    assert bad_result.exit_code == 2 and "RESULT_JSON is not valid JSON:" in bad_result.stderr
    bad_error = run("fail", "some-token", "{", "--error-json")
    assert bad_error.exit_code == 2 and "ERROR is not valid JSON:" in bad_error.stderr
    assert run("fail", "tok", "--retry-delay", "1", "--no-requeue").exit_code == 2
    assert run("enqueue", Q).exit_code == 2
    assert (
        "--batch, --no-keys only apply with --from"
        in run("enqueue", Q, "{}", "--batch", "5", "--no-keys").stderr
    )
    assert run("enqueue", Q, "{}", "--from", "-", "--no-keys", input="").exit_code == 2
    bad_id = run("task", "x_5")
    assert bad_id.exit_code == 2 and "task id must look like t_5521" in bad_id.stderr
    assert run("tasks", Q, "--state", "sleeping").exit_code == 2
    assert run("nonsense").exit_code == 2


def test_batonq_errors_exit_1(run: Run) -> None:
    missing = run("task", "t_987654")
    assert (missing.exit_code, missing.stderr) == (1, "error: task_not_found: task 987654 not found\n")
    assert run("tasks", "Not A Queue").stderr.startswith("error: invalid_queue_name:")
    assert run("claim", Q, "--wait", "100").stderr.startswith("error: invalid_argument:")
    task_id = run("enqueue", Q, "{}").stdout.split()[0]
    wrong = run("retry", task_id)
    assert wrong.exit_code == 1 and wrong.stderr.startswith("error: invalid_state:")


def test_unreachable_database_exits_5() -> None:
    result = CliRunner().invoke(main, ["--dsn", "postgresql://postgres@127.0.0.1:1/none", "queues"])
    assert result.exit_code == 5
    assert result.stderr.startswith("error: database_unreachable:")


def test_tasks_and_task(run: Run) -> None:
    run("enqueue", Q, '{"n": 1}', "--key", "first")
    lease = claim_one(run)
    run("fail", lease["lease_token"], "boom [bold]not markup[/bold]", "--retry-delay", "0")
    lease = claim_one(run)
    run("complete", lease["lease_token"], '{"ok": true}')
    run("enqueue", Q, '{"n": 2}')

    table = run("tasks", Q)
    assert table.exit_code == 0
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["id", "state", "attempts", "priority", "age", "key", "last", "error"]
    assert rows[0].split()[1] == "pending"
    assert rows[1].split()[:4] == [lease["task_id"], "done", "2/3", "0"]
    assert rows[1].rstrip().endswith("boom [bold]not markup[/bold]")

    done = lines(run("tasks", Q, "--state", "done", "--json"))
    assert [t["id"] for t in done] == [lease["task_id"]]
    assert done[0]["result"] == {"ok": True}

    details = run("task", lease["task_id"].removeprefix("t_"))
    assert details.exit_code == 0
    text = details.stdout
    assert text.startswith(f"task {lease['task_id']}\n")
    expected = [
        "state          done",
        "attempts       2/3",
        "key            first",
        'result         {"ok": true}',
    ]
    expected += ["errors", "attempt 1 (fencing token", ": boom [bold]not markup[/bold]"]
    for part in expected:
        assert part in text
    assert json.loads(run("task", lease["task_id"], "--json").stdout)["errors"][0]["attempt"] == 1


def test_operator_actions(run: Run) -> None:
    task_id = run("enqueue", Q, "{}").stdout.split()[0]
    assert run("hold", task_id).stdout == f"{task_id} held\n"
    assert run("release", task_id).stdout == f"{task_id} pending\n"
    assert run("cancel", task_id).stdout == f"{task_id} cancelled\n"
    retried = run("retry", task_id, "--json")
    assert retried.exit_code == 0 and json.loads(retried.stdout)["state"] == "pending"


def test_queues_and_queue_settings(run: Run) -> None:
    run("enqueue", Q, "{}")
    run("enqueue", Q, "{}", "--delay", "600")
    run("enqueue", "other", "{}", "--held")
    configured = run("queue", "configure", Q, "--lease", "900", "--max-attempts", "5", "--json")
    assert configured.exit_code == 0
    assert json.loads(configured.stdout) | {"created_at": None} == json.loads(configured.stdout) | {
        "name": Q, "lease_s": 900, "max_attempts": 5, "paused": False, "created_at": None,
    }  # fmt: skip
    assert run("queue", "pause", Q).stdout.startswith(f"{Q}: paused, lease 900s, max attempts 5")

    table = run("queues").stdout.splitlines()
    assert table[0].split() == ["queue", "paused", "pending", "scheduled", "leased", "held", "waiting",
                                "done", "dead", "cancelled", "oldest", "pending"]  # fmt: skip
    assert table[1].split()[:4] == ["other", "0", "0", "0"]
    assert table[2].split()[:5] == [Q, "yes", "1", "1", "0"]
    assert run("claim", Q).exit_code == 3  # paused

    assert run("queue", "resume", Q).stdout.startswith(f"{Q}: running")
    stats = {s["queue"]: s for s in lines(run("queues", "--json"))}
    assert stats[Q]["pending"] == 1 and stats[Q]["scheduled"] == 1 and stats["other"]["held"] == 1

    # A page at a time: a full page says how to see the next.
    first = run("queues", "--limit", "1", "--json")
    assert [s["queue"] for s in lines(first)] == ["other"]
    assert first.stderr == "more queues: batonq queues --after other\n"
    last = run("queues", "--after", "other", "--limit", "1")
    assert [line.split()[0] for line in last.stdout.splitlines()[1:]] == [Q]
    assert last.stderr == "more queues: batonq queues --after " + Q + "\n"
    assert run("queues", "--after", Q).stdout.splitlines()[1:] == []


def write(path: Path, *rows: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_import_is_resumable(run: Run, admin: batonq.Client, tmp_path: Path) -> None:
    source = write(tmp_path / "tasks.jsonl", {"payload": {"n": 1}}, {"payload": 2, "priority": 9}, "",
                   {"payload": 3, "key": "mine", "delay_s": 0}, {"payload": 4})  # fmt: skip
    first = run("enqueue", Q, "--from", str(source), "--batch", "2")
    assert (first.exit_code, first.stdout) == (0, "created 4, already there 0\n")
    again = run("enqueue", Q, "--from", str(source), "--json")
    assert json.loads(again.stdout) == {"created": 0, "existing": 4}

    keys = {t.idempotency_key: t for t in admin.tasks(Q)}
    assert set(keys) == {"tasks.jsonl:1", "tasks.jsonl:2", "mine", "tasks.jsonl:5"}
    assert keys["tasks.jsonl:2"].priority == 9

    unkeyed = run("enqueue", Q, "--from", str(source), "--no-keys")
    assert unkeyed.stdout == "created 3, already there 1\n"  # only "mine" has a key of its own


def test_jsonl_bad_line_names_it_and_loses_nothing(run: Run, admin: batonq.Client, tmp_path: Path) -> None:
    rows: list[Any] = [{"payload": n} for n in range(1, 6)]
    source = write(tmp_path / "big.jsonl", *rows, '{"payload": 6,', {"payload": 7})
    failed = run("enqueue", Q, "--from", str(source), "--batch", "2")
    assert failed.exit_code == 1
    assert failed.stderr.startswith("error: invalid_line: big.jsonl line 6: not valid JSON:")
    assert "Lines up to 4 were enqueued (created 4, already there 0)" in failed.stderr
    assert len(admin.tasks(Q)) == 4  # the batch holding line 6 (lines 5-6) wrote nothing

    write(source, *rows, {"payload": 6}, {"payload": 7})
    fixed = run("enqueue", Q, "--from", str(source), "--batch", "2")
    assert fixed.stdout == "created 3, already there 4\n"
    assert sorted(t.payload for t in admin.tasks(Q)) == list(range(1, 8))


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("[1]", 'expected an object like {"payload": ...}'),
        ('{"key": "k"}', 'missing "payload"'),
        ('{"payload": 1, "delay": 5}', "unknown field 'delay'"),
        ('{"payload": 1, "priority": "high"}', '"priority" must be an integer'),
        ('{"payload": 1, "key": 5}', '"key" must be a non-empty string or null'),
        ('{"payload": 1, "delay_s": "soon"}', '"delay_s" must be a number of seconds'),
    ],
)
def test_jsonl_invalid_lines(run: Run, tmp_path: Path, row: str, reason: str) -> None:
    source = write(tmp_path / "t.jsonl", {"payload": 0}, row)
    result = run("enqueue", Q, "--from", str(source))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: invalid_line: t.jsonl line 2: {reason}")
    assert "Nothing was enqueued." in result.stderr


def test_jsonl_engine_refusal_names_the_line(run: Run, tmp_path: Path) -> None:
    run("queue", "configure", Q, "--max-body-bytes", "20")
    source = write(tmp_path / "t.jsonl", {"payload": 1}, {"payload": "x" * 40}, {"payload": 3})
    result = run("enqueue", Q, "--from", str(source))
    assert result.exit_code == 1
    assert result.stderr.startswith("error: payload_too_large: t.jsonl line 2: payload 2 is 42 bytes")


def test_jsonl_from_stdin_needs_a_key_prefix(run: Run, admin: batonq.Client) -> None:
    text = '{"payload": 1}\n{"payload": 2}\n'
    refused = run("enqueue", Q, "--from", "-", input=text)
    assert refused.exit_code == 2 and "--key-prefix" in refused.stderr
    for _ in range(2):
        ok = run("enqueue", Q, "--from", "-", "--key-prefix", "batch-7", input=text)
    assert ok.stdout == "created 0, already there 2\n"
    assert {t.idempotency_key for t in admin.tasks(Q)} == {"batch-7:1", "batch-7:2"}


def test_json_from_stdin_and_dsn_option(admin_dsn: str) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--dsn", admin_dsn, "enqueue", Q, "-"], input='{"from": "stdin"}')
    assert result.exit_code == 0
    lease = json.loads(runner.invoke(main, ["--dsn", admin_dsn, "claim", Q]).stdout)
    assert lease["row"] == {"from": "stdin"}


def test_a_refused_statement_is_an_error_not_unreachable(dsn: str) -> None:
    """The worker role may not change queue settings: exit 1, not 5."""
    result = CliRunner().invoke(main, ["--dsn", dsn, "queue", "configure", Q, "--lease", "60"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: database_error: permission denied")
