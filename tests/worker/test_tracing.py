"""Traces with OpenTelemetry: one trace follows a task from the process that
enqueued it, through a worker process, along the queue graph; without a
tracer provider nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.worker.support import BATONQ

import batonq

APPS = Path(__file__).resolve().parents[1] / "apps"


def _spans(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _run(args: list[str], dsn: str, spans: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATONQ_")}
    env |= {"BATONQ_DATABASE_URL": dsn, "BATONQ_TEST_SPANS": str(spans)}
    run = subprocess.run(args, cwd=APPS, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


def test_one_trace_follows_a_task_across_processes_and_along_the_graph(
    admin: batonq.Client, client: batonq.Client, dsn: str, tmp_path: Path
) -> None:
    admin.add_edge("trace:a", "trace:b")
    admin.add_edge("trace:b", "trace:c")
    spans_file = tmp_path / "spans.jsonl"
    _run([sys.executable, "-m", "traced.tasks", "40"], dsn, spans_file)
    _run([BATONQ, "worker", "traced.tasks:app", "--burst", "--no-listen"], dsn, spans_file)

    spans = _spans(spans_file)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    (checkout,) = by_name["checkout"]
    trace_id = checkout["context"]["trace_id"]
    # The enqueue and every run in the checkout's trace; the claims and
    # the batched completions, which serve many traces, link to theirs.
    many = {"claim", "complete_many"}
    batched = [s for s in spans if s["attributes"].get("messaging.operation.name") in many]
    traced = [s for s in spans if s not in batched]
    assert {span["context"]["trace_id"] for span in traced} == {trace_id}, "one trace, every process"

    (send,) = by_name["send trace:a"]
    assert send["kind"] == "SpanKind.PRODUCER" and send["parent_id"] == checkout["context"]["span_id"]
    task_a = send["attributes"]["messaging.message.id"]
    (run_a,) = by_name["process trace:a"]
    (run_b,) = by_name["process trace:b"]
    runs_c = sorted(by_name["process trace:c"], key=lambda s: s["attributes"]["batonq.task.attempt"])
    # The worker's run is the enqueuer's child; each baton's run the child of
    # the run that handed it on; a retry is a second run of the same parent.
    assert run_a["parent_id"] == send["context"]["span_id"]
    assert run_b["parent_id"] == run_a["context"]["span_id"]
    assert [run["parent_id"] for run in runs_c] == [run_b["context"]["span_id"]] * 2
    assert run_a["kind"] == "SpanKind.CONSUMER"
    assert run_a["attributes"] | {"batonq.lease.fencing_token": 0} == {
        "messaging.system": "batonq",
        "messaging.destination.name": "trace:a",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": task_a,
        "batonq.task.attempt": 1,
        "batonq.lease.fencing_token": 0,
        "batonq.outcome": "done",
    }
    assert run_a["attributes"]["batonq.lease.fencing_token"] > 0
    assert [run["attributes"]["batonq.outcome"] for run in runs_c] == ["retry", "done"]
    assert runs_c[0]["status"]["status_code"] == "ERROR"
    assert [event["name"] for event in runs_c[0]["events"]] == ["exception"]
    assert runs_c[1]["status"]["status_code"] == "UNSET"

    # The claims that got a task, and the completions and the fail, as spans.
    receives = [s for s in spans if s["name"].startswith("receive trace:")]
    queues = {s["attributes"]["messaging.destination.name"] for s in receives}
    assert queues == {"trace:a", "trace:b", "trace:c"}
    linked = {link["context"]["span_id"] for s in receives for link in s["links"]}
    assert linked == {send["context"]["span_id"], run_a["context"]["span_id"], run_b["context"]["span_id"]}
    settles = [s for s in spans if s["name"].startswith("settle ")]
    assert sorted({s["attributes"]["messaging.operation.name"] for s in settles}) == ["complete_many", "fail"]
    runs = {run["context"]["span_id"] for run in (run_a, run_b, *runs_c)}
    settled = {link["context"]["span_id"] for s in settles for link in s["links"]}
    assert settled == runs - {runs_c[0]["context"]["span_id"]}, "each completion links to its run"
    (fail,) = [s for s in settles if s["attributes"]["messaging.operation.name"] == "fail"]
    assert fail["parent_id"] == runs_c[0]["context"]["span_id"], "a fail is its run's child"

    (done,) = [t for t in client.run_tasks(int(task_a.removeprefix("t_"))) if t.queue == "trace:c"]
    assert done.state == "done" and done.result == {"n": 42}


def test_without_a_tracer_provider_a_task_runs_and_carries_no_context(dsn: str, sql: Any) -> None:
    """A program that sets up no tracer provider: the client and a worker
    run as before, start no span and store no trace context."""
    script = (
        "from opentelemetry import trace\n"
        "import batonq\n"
        "from batonq import tracing\n"
        "assert not tracing.enabled()\n"
        "app = batonq.App()\n"
        "@app.task('plain')\n"
        "async def plain(job):\n"
        "    assert not trace.get_current_span().get_span_context().is_valid, 'no run span'\n"
        "    return job.payload\n"
        "with batonq.connect(listen=False) as client:\n"
        "    client.enqueue('plain', 1)\n"
        "    client.enqueue_many('plain', [2, 3])\n"
        "batonq.Worker(app, listen=False, burst=True, handle_signals=False).run()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATONQ_", "OTEL_"))}
    env |= {"BATONQ_DATABASE_URL": dsn}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    rows = sql.execute("SELECT state, trace_context FROM batonq.archive WHERE queue = 'plain'").fetchall()
    assert rows == [("done", None)] * 3
