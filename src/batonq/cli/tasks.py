"""Looking at tasks (``tasks``, ``task``) and the operator's actions on one
(``retry``, ``cancel``, ``hold``, ``release``)."""

from __future__ import annotations

import json
from collections.abc import Callable

import click

import batonq
from batonq.cli.common import TASK_ID, json_option, open_client
from batonq.cli.output import (
    age_since,
    echo_json,
    first_line,
    format_age,
    jsonable,
    print_table,
    tid,
    truncate,
)
from batonq.limits import MAX_PAGE
from batonq.models import JSON, STATE_FILTERS, SetAsideWrite, Task

__all__ = ["cancel", "hold", "release", "retry", "task", "tasks"]


@click.command()
@click.argument("queue")
@click.option(
    "--state",
    type=click.Choice(STATE_FILTERS),
    help="Only tasks in this state (scheduled: pending, not due yet).",
)
@click.option(
    "--limit", type=int, default=50, metavar="N", show_default=True, help=f"At most this many (1-{MAX_PAGE})."
)
@json_option
@click.pass_context
def tasks(ctx: click.Context, queue: str, state: str | None, limit: int, as_json: bool) -> None:
    """List a queue's newest tasks.

    \b
    Examples:
      batonq tasks shards --state dead
      batonq tasks shards --json | jq -r .id
    """
    with open_client(ctx) as client:
        found = client.tasks(queue, state=state, limit=limit)
    if as_json:
        for item in found:
            echo_json(item)
        return
    # The group column appears when a task shown has a group.
    grouped = any(t.group is not None for t in found)
    rows = [
        [
            tid(t.id),
            t.state,
            f"{t.attempts}/{t.max_attempts}",
            str(t.priority),
            format_age(age_since(t.created_at)),
            *([truncate(t.group, 40)] if grouped else []),
            t.idempotency_key or "",
            truncate(first_line(t.last_error), 60),
        ]
        for t in found
    ]
    print_table(
        ["id", "state", "attempts", "priority", "age", *(["group"] if grouped else []), "key", "last error"],
        rows,
        right=frozenset({"attempts", "priority", "age"}),
    )


def _json_text(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False)


def _details(t: Task) -> list[tuple[str, str]]:
    """The label/value lines of ``batonq task``; empty values are left out."""
    when = t.created_at.isoformat(timespec="seconds")
    lines = [
        ("queue", t.queue),
        ("state", t.state),
        ("attempts", f"{t.attempts}/{t.max_attempts}"),
        ("priority", str(t.priority)),
        ("key", t.idempotency_key or ""),
        ("group", t.group or ""),
        ("created", f"{when} ({format_age(age_since(t.created_at))} ago)"),
        ("run at", t.run_at.isoformat(timespec="seconds")),
        ("parent", tid(t.parent_id) if t.parent_id is not None else ""),
        ("root", tid(t.root_id) if t.root_id != t.id else ""),
        ("worker", t.worker or ""),
        ("stage", t.stage or ""),
        ("fencing token", "" if t.fencing_token is None else str(t.fencing_token)),
        ("lease expires", t.lease_expires_at.isoformat(timespec="seconds") if t.lease_expires_at else ""),
        ("finished", t.finished_at.isoformat(timespec="seconds") if t.finished_at else ""),
        ("last error", t.last_error or ""),
        ("payload", _json_text(t.payload)),
    ]
    if t.state == "done":
        lines.append(("result", _json_text(t.result)))
    return [(label, value) for label, value in lines if value]


@click.command()
@click.argument("task_id", type=TASK_ID)
@json_option
@click.pass_context
def task(ctx: click.Context, task_id: int, as_json: bool) -> None:
    """Show one task: state, lineage, payload, result, every attempt's error
    and the writes refused about it (set aside: late or forged).

    \b
    Example:
      batonq task t_5521
    """
    with open_client(ctx) as client:
        found = client.task(task_id)
        set_aside = client.set_aside_writes([task_id])
    if as_json:
        echo_json({**jsonable(found), "set_aside": [jsonable(w) for w in set_aside]})
        return
    click.echo(f"task {tid(found.id)}")
    for label, value in _details(found):
        click.echo(f"  {label:<14} {value}")
    if found.errors:
        click.echo("  errors")
        for entry in found.errors:
            error = entry.get("error")
            text = error if isinstance(error, str) else _json_text(error)
            click.echo(
                f"    attempt {entry.get('attempt')} (fencing token {entry.get('fencing_token')})"
                f" at {entry.get('at')}: {text}"
            )
    if set_aside:
        click.echo("  set aside")
        for write in set_aside:
            click.echo(f"    {_set_aside_line(write)}")


def _set_aside_line(w: SetAsideWrite) -> str:
    """``complete (fencing token 3) at …: refused, the task was leased; lease held by w_30 (key 7)``."""
    holder = " ".join(
        part for part in (w.worker or "", f"(key {w.key_id})" if w.key_id is not None else "") if part
    )
    held = f"; lease held by {holder}" if holder else ""
    when = w.at.isoformat(timespec="seconds")
    return f"{w.kind} (fencing token {w.fencing_token}) at {when}: refused, the task was {w.state}{held}"


def _operator_command(
    name: str, act: Callable[[batonq.Client, int], Task], summary: str, example: str
) -> click.Command:
    """An operator action on one task: prints the task's new state."""

    @click.command(name=name, help=f"{summary}\n\n\b\nExample:\n  {example}")
    @click.argument("task_id", type=TASK_ID)
    @json_option
    @click.pass_context
    def command(ctx: click.Context, task_id: int, as_json: bool) -> None:
        with open_client(ctx) as client:
            changed = act(client, task_id)
        if as_json:
            echo_json(changed)
        else:
            click.echo(f"{tid(changed.id)} {changed.state}")

    return command


retry = _operator_command(
    "retry", lambda c, t: c.retry(t), "Run a dead or cancelled task again.", "batonq retry t_5521"
)
cancel = _operator_command(
    "cancel", lambda c, t: c.cancel(t), "Cancel an unfinished task.", "batonq cancel t_5521"
)
hold = _operator_command(
    "hold", lambda c, t: c.hold(t), "Keep a pending task back until released.", "batonq hold t_5521"
)
release = _operator_command(
    "release", lambda c, t: c.release(t), "Make a held task claimable.", "batonq release t_5521"
)
