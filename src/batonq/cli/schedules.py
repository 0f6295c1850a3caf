"""Cron schedules: ``batonq schedule add|list|remove|pause|resume|firings``."""

from __future__ import annotations

from typing import Any

import click

from batonq.cli.common import JSON_VALUE, json_option, open_client
from batonq.cli.output import echo_json, print_table, tid
from batonq.models import MISSED_TICKS, Schedule

__all__ = ["schedule"]


def _when(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment is not None else ""


def _echo(found: Schedule, as_json: bool) -> None:
    if as_json:
        echo_json(found)
        return
    state = "paused" if found.paused else f"next {_when(found.next_tick) or 'being reckoned'}"
    where = f"'{found.cron}' ({found.tz}) -> {found.queue}"
    click.echo(f"{found.name}: {where}, missed ticks {found.missed}, {state}")


@click.group()
def schedule() -> None:
    """Enqueue a payload on a cron schedule. The ticks are fired by the
    leading sweeper (every `batonq serve` and `batonq worker` runs one).

    \b
    Example:
      batonq schedule add cleanup --cron '*/5 * * * *' --queue maintenance --payload '{"kind": "cleanup"}'
    """


@schedule.command()
@click.argument("name")
@click.option("--cron", required=True, metavar="EXPR", help="Five cron fields, or six with seconds first.")
@click.option("--queue", required=True, metavar="QUEUE", help="The queue each tick enqueues into.")
@click.option("--payload", "payload", type=JSON_VALUE, default="{}", show_default=True, metavar="JSON",
              help="The payload each tick enqueues.")  # fmt: skip
@click.option("--tz", default="UTC", show_default=True, metavar="ZONE", help="IANA time zone of the cron.")
@click.option("--missed", type=click.Choice(MISSED_TICKS), default="fire-once", show_default=True,
              help="Ticks missed while no sweeper ran: one task for them all, or none.")  # fmt: skip
@json_option
@click.pass_context
def add(ctx: click.Context, name: str, cron: str, queue: str, payload: Any, tz: str, missed: str,
        as_json: bool) -> None:  # fmt: skip
    """Add a schedule, or replace the one named NAME.

    \b
    Example:
      batonq schedule add report --cron '0 7 * * 1-5' --queue reports --tz Europe/Berlin
    """
    with open_client(ctx) as client:
        _echo(client.add_schedule(name, cron, queue, payload, tz=tz, missed=missed), as_json)


@schedule.command(name="list")
@json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """Show every schedule, its next tick and its last firing.

    \b
    Example:
      batonq schedule list
    """
    with open_client(ctx) as client:
        found = client.schedules()
    if as_json:
        for item in found:
            echo_json(item)
        return
    rows = [
        [s.name, s.cron, s.tz, s.queue, s.missed, "paused" if s.paused else _when(s.next_tick),
         _when(s.last_tick), tid(s.last_task_id) if s.last_task_id else ""]
        for s in found
    ]  # fmt: skip
    print_table(["schedule", "cron", "tz", "queue", "missed", "next tick", "last tick", "last task"], rows)


@schedule.command()
@click.argument("name")
@click.pass_context
def remove(ctx: click.Context, name: str) -> None:
    """Remove a schedule (its tasks already enqueued stay).

    \b
    Example:
      batonq schedule remove report
    """
    with open_client(ctx) as client:
        removed = client.remove_schedule(name)
    click.echo(f"{name}: removed" if removed else f"{name}: no such schedule")
    if not removed:
        ctx.exit(1)


@schedule.command()
@click.argument("name")
@json_option
@click.pass_context
def pause(ctx: click.Context, name: str, as_json: bool) -> None:
    """Stop firing a schedule's ticks.

    \b
    Example:
      batonq schedule pause report
    """
    with open_client(ctx) as client:
        _echo(client.pause_schedule(name), as_json)


@schedule.command()
@click.argument("name")
@json_option
@click.pass_context
def resume(ctx: click.Context, name: str, as_json: bool) -> None:
    """Fire a paused schedule's ticks again, from the next one (ticks that
    passed while it was paused are not fired).

    \b
    Example:
      batonq schedule resume report
    """
    with open_client(ctx) as client:
        _echo(client.resume_schedule(name), as_json)


@schedule.command()
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 10000), default=20, show_default=True, metavar="N")
@json_option
@click.pass_context
def firings(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
    """Show the ticks a schedule fired (the last week), newest first.

    \b
    Example:
      batonq schedule firings report
    """
    with open_client(ctx) as client:
        found = client.schedule_firings(name, limit=limit)
    if as_json:
        for item in found:
            echo_json(item)
        return
    rows = [[_when(f.tick), tid(f.task_id), "catch-up" if f.catch_up else ""] for f in found]
    print_table(["tick", "task", ""], rows)
