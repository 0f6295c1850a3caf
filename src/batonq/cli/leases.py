"""The worker's verbs: ``claim``, then ``heartbeat`` and ``complete`` or
``fail`` with the lease token the claim printed."""

from __future__ import annotations

from typing import Any

import click

from batonq.cli.common import (
    EXIT_NOTHING_CLAIMED,
    JSON_VALUE,
    json_option,
    open_client,
    parse_json,
    usage_error,
)
from batonq.cli.output import echo_json, format_age, tid
from batonq.limits import MAX_LEASE_S, MAX_WAIT_S, MIN_LEASE_S
from batonq.models import Submitted

__all__ = ["claim", "complete", "fail", "heartbeat"]

_LEASE_LOST = "Exit code 4 when the lease is no longer held (another holder, or the task is finished)."


def _echo_submitted(reply: Submitted, as_json: bool) -> None:
    if as_json:
        echo_json(reply)
        return
    text = f"{tid(reply.task_id)} {reply.state}"
    if reply.lease_expires_in_s is not None and reply.state == "leased":
        text += f", lease expires in {format_age(reply.lease_expires_in_s)}"
    click.echo(text + (" (replayed: already accepted)" if reply.replayed else ""))


@click.command(epilog="Exit code 3 when nothing was claimed.")
@click.argument("queue")
@click.option(
    "--max-tasks", type=int, metavar="N", default=1, show_default=True, help="Claim up to this many."
)
@click.option(
    "--lease", "lease_s", type=int, metavar="SECONDS",
    help=f"Lease seconds, {MIN_LEASE_S}-{MAX_LEASE_S} (default: the queue's).",
)
@click.option(
    "--wait", "wait_s", type=float, default=0.0, metavar="SECONDS",
    help=f"Wait this long (max {MAX_WAIT_S:g}) for a task.",
)
@click.option("--worker", metavar="NAME", help="Your name, recorded on the task (default: host:pid).")
@click.pass_context
def claim(
    ctx: click.Context, queue: str, max_tasks: int, lease_s: int | None, wait_s: float, worker: str | None
) -> None:
    """Claim tasks; print each lease as one JSON line.

    Each line has lease_token, task_id, fencing_token, payload, attempt,
    lease_expires_in_s and more. Keep lease_token secret: it completes the task.

    \b
    Example:
      lease=$(batonq claim shards --wait 30)   # exit code 3: nothing came
      token=$(echo "$lease" | jq -r .lease_token)
    """
    with open_client(ctx, listen=wait_s > 0) as client:
        leases = client.claim(queue, max_tasks=max_tasks, lease_s=lease_s, wait_s=wait_s, worker=worker)
    for lease in leases:
        echo_json(lease)
    if not leases:
        click.echo(f"nothing to claim in {queue}", err=True)
        ctx.exit(EXIT_NOTHING_CLAIMED)


@click.command(epilog=_LEASE_LOST)
@click.argument("lease_token")
@click.argument("result_json", type=JSON_VALUE, required=False)
@json_option
@click.pass_context
def complete(ctx: click.Context, lease_token: str, result_json: Any, as_json: bool) -> None:
    """Finish a claimed task with a JSON result (default null; - reads stdin).

    Repeating the same complete changes nothing and reports "replayed".

    \b
    Example:
      batonq complete "$token" '{"passed": 41, "failed": 0}'
    """
    with open_client(ctx) as client:
        reply = client.complete(lease_token, result_json)
    _echo_submitted(reply, as_json)


@click.command(epilog=_LEASE_LOST)
@click.argument("lease_token")
@click.argument("error", required=False)
@click.option("--error-json", is_flag=True, help="ERROR is JSON (default: plain text).")
@click.option("--retry-delay", "retry_delay_s", type=float, metavar="SECONDS", help="Retry after this long.")
@click.option("--no-requeue", is_flag=True, help="Fail for good: the task is dead now.")
@json_option
@click.pass_context
def fail(
    ctx: click.Context,
    lease_token: str,
    error: str | None,
    error_json: bool,
    retry_delay_s: float | None,
    no_requeue: bool,
    as_json: bool,
) -> None:
    """Fail this attempt with ERROR; the task retries (the queue's backoff,
    or --retry-delay) until it is out of attempts, then it is dead.

    \b
    Examples:
      batonq fail "$token" "connection reset" --retry-delay 60
      batonq fail "$token" '{"code": "E42"}' --error-json --no-requeue
    """
    if retry_delay_s is not None and no_requeue:
        usage_error("--retry-delay and --no-requeue exclude each other", ctx)
    body: Any = error
    if error_json and error is not None:
        body = parse_json(error, "ERROR", ctx)
    with open_client(ctx) as client:
        reply = client.fail(lease_token, body, retry_delay_s=retry_delay_s, requeue=not no_requeue)
    _echo_submitted(reply, as_json)


@click.command(epilog=_LEASE_LOST)
@click.argument("lease_token")
@click.option(
    "--lease",
    "lease_s",
    type=int,
    metavar="SECONDS",
    help="Extend to this long from now (default: the claim's).",
)
@click.option("--stage", help="What the holder is doing now, shown in `batonq task`.")
@json_option
@click.pass_context
def heartbeat(
    ctx: click.Context, lease_token: str, lease_s: int | None, stage: str | None, as_json: bool
) -> None:
    """Extend a lease, so a long job keeps its task.

    \b
    Example:
      batonq heartbeat "$token" --lease 600 --stage "shard 3 of 8"
    """
    with open_client(ctx) as client:
        reply = client.heartbeat(lease_token, lease_s=lease_s, stage=stage)
    _echo_submitted(reply, as_json)
