"""Queues: ``batonq queues`` (depth per state, or settings), ``batonq queue
configure|pause|resume``, and ``batonq audit`` (who changed which setting)."""

from __future__ import annotations

from typing import Any

import click

from batonq.cli.common import LIMIT, json_option, open_client
from batonq.cli.output import echo_json, format_age, print_table
from batonq.limits import MAX_LEASE_S, MAX_PAGE, MAX_RATE_PERIOD_S, MIN_LEASE_S, MIN_RATE_PERIOD_S
from batonq.models import QueueConfig, QueueStats

__all__ = ["audit", "queue", "queues"]

_COUNTS = ("pending", "scheduled", "leased", "held", "waiting", "done", "dead", "cancelled")


PAGE = MAX_PAGE
"""The most queues one ``batonq queues`` shows (and counts)."""


@click.command()
@click.option("--after", metavar="QUEUE", help="Start after this queue name (the next page).")
@click.option("--limit", type=click.IntRange(1, PAGE), default=PAGE, show_default=True, help="At most.")
@click.option("--settings", is_flag=True, help="Show each queue's settings instead of its counts.")
@json_option
@click.pass_context
def queues(ctx: click.Context, after: str | None, limit: int, settings: bool, as_json: bool) -> None:
    """Show the queues by name: tasks per state and the oldest pending task's
    age (or, with --settings, their settings).

    pending counts tasks claimable now; scheduled, those whose delay or retry
    time is still ahead. A full page ends by saying how to see the next.

    \b
    Examples:
      batonq queues
      batonq queues --after shop:orders
      batonq queues --settings
    """
    with open_client(ctx) as client:
        if settings:
            configs = [c for c in client.queue_configs() if after is None or c.name > after][:limit]
            names = [c.name for c in configs]
        else:
            stats = client.queues(after=after, limit=limit)
            names = [s.queue for s in stats]
    if as_json:
        for item in configs if settings else stats:
            echo_json(item)
    elif settings:
        _print_settings(configs)
    else:
        _print_queues(stats)
    if len(names) == limit:
        more = " --settings" if settings else ""
        click.echo(f"more queues: batonq queues{more} --after {names[-1]}", err=True)


def _print_queues(stats: list[QueueStats]) -> None:
    rows = [
        [
            s.queue,
            "yes" if s.paused else "",
            *(str(getattr(s, name)) for name in _COUNTS),
            format_age(s.oldest_pending_age_s),
        ]
        for s in stats
    ]
    print_table(
        ["queue", "paused", *_COUNTS, "oldest pending"], rows, right=frozenset([*_COUNTS, "oldest pending"])
    )


def _print_settings(configs: list[QueueConfig]) -> None:
    columns = ["queue", "paused", "lease s", "max attempts", "backoff s", "retention s", "max body bytes",
               "max leased", "group max", "rate", "group rate"]
    rows = [
        [c.name, "yes" if c.paused else "", str(c.lease_s), str(c.max_attempts),
         f"{c.backoff_base_s:g}..{c.backoff_max_s:g}", str(c.retention_s), str(c.max_body_bytes),
         _limit(c.max_leased), _limit(c.group_max_leased), _rate(c.rate_limit, c),
         _rate(c.group_rate_limit, c)]
        for c in configs
    ]  # fmt: skip
    print_table(columns, rows, right=frozenset(columns[2:]))


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _rate(limit: int | None, config: QueueConfig) -> str:
    """``20/1s``: claims per the queue's rate period; ``-`` for none."""
    return "-" if limit is None else f"{limit}/{config.rate_period_s:g}s"


def _echo_config(config: QueueConfig, as_json: bool) -> None:
    if as_json:
        echo_json(config)
        return
    limits = f"; at most {', '.join(config.limits)}" if config.limits else ""
    click.echo(
        f"{config.name}: {'paused' if config.paused else 'running'}, lease {config.lease_s}s,"
        f" max attempts {config.max_attempts}, backoff {config.backoff_base_s:g}s..{config.backoff_max_s:g}s,"
        f" retention {config.retention_s}s, max body {config.max_body_bytes} bytes{limits}"
    )


@click.group()
def queue() -> None:
    """Change a queue's settings, or pause and resume it.

    \b
    Example:
      batonq queue pause shards
    """


@queue.command()
@click.argument("name")
@click.option(
    "--lease", "lease_s", type=int, metavar="SECONDS",
    help=f"Default lease seconds for claims ({MIN_LEASE_S}-{MAX_LEASE_S}).",
)
@click.option("--max-attempts", type=int, metavar="N", help="Attempts before a task is dead.")
@click.option(
    "--backoff-base",
    "backoff_base_s",
    type=float,
    metavar="SECONDS",
    help="First retry delay, seconds; doubles.",
)
@click.option(
    "--backoff-max", "backoff_max_s", type=float, metavar="SECONDS", help="Longest retry delay, seconds."
)
@click.option(
    "--retention", "retention_s", type=int, metavar="SECONDS", help="Keep finished tasks this many seconds."
)
@click.option(
    "--max-body-bytes", type=int, metavar="BYTES", help="Largest payload, result or error, in bytes."
)
@click.option(
    "--max-leased", type=LIMIT, metavar="N",
    help="At most N tasks of the queue leased at once, by all workers (0 or none: no limit).",
)  # fmt: skip
@click.option(
    "--group-max-leased", type=LIMIT, metavar="M",
    help="At most M leased tasks per group (see enqueue --group; 0 or none: no limit).",
)  # fmt: skip
@click.option(
    "--rate-limit", type=LIMIT, metavar="N", help="At most N claims per --rate-period (0 or none: no limit)."
)
@click.option(
    "--group-rate-limit", type=LIMIT, metavar="N",
    help="At most N claims per --rate-period for each group (0 or none: no limit).",
)  # fmt: skip
@click.option(
    "--rate-period", "rate_period_s", type=click.FloatRange(MIN_RATE_PERIOD_S, MAX_RATE_PERIOD_S),
    metavar="SECONDS",
    help="The rate limits' period (default 1).",
)  # fmt: skip
@json_option
@click.pass_context
def configure(
    ctx: click.Context,
    name: str,
    lease_s: int | None,
    max_attempts: int | None,
    backoff_base_s: float | None,
    backoff_max_s: float | None,
    retention_s: int | None,
    max_body_bytes: int | None,
    max_leased: int | None,
    group_max_leased: int | None,
    rate_limit: int | None,
    group_rate_limit: int | None,
    rate_period_s: float | None,
    as_json: bool,
) -> None:
    """Create a queue or change its settings; print them. Unset options keep
    their value.

    The limits hold across every worker and machine: the claim itself
    skips a full group (or one out of rate) for the next eligible task, and
    claims nothing while the queue is at --max-leased or out of rate.

    \b
    Examples:
      batonq queue configure shards --lease 900 --max-attempts 5
      batonq queue configure mail --max-leased 10 --group-max-leased 1
      batonq queue configure api --rate-limit 20 --rate-period 1
      batonq queue configure api --group-rate-limit 5
      batonq queue configure api --rate-limit none
    """
    with open_client(ctx) as client:
        config = client.configure_queue(
            name, lease_s=lease_s, max_attempts=max_attempts, backoff_base_s=backoff_base_s,
            backoff_max_s=backoff_max_s, retention_s=retention_s, max_body_bytes=max_body_bytes,
            max_leased=max_leased, group_max_leased=group_max_leased, rate_limit=rate_limit,
            group_rate_limit=group_rate_limit, rate_period_s=rate_period_s,
        )  # fmt: skip
    _echo_config(config, as_json)


@queue.command()
@click.argument("name")
@json_option
@click.pass_context
def pause(ctx: click.Context, name: str, as_json: bool) -> None:
    """Stop handing out the queue's tasks (enqueue still works).

    \b
    Example:
      batonq queue pause shards
    """
    with open_client(ctx) as client:
        _echo_config(client.pause(name), as_json)


@queue.command()
@click.argument("name")
@json_option
@click.pass_context
def resume(ctx: click.Context, name: str, as_json: bool) -> None:
    """Hand out the queue's tasks again.

    \b
    Example:
      batonq queue resume shards
    """
    with open_client(ctx) as client:
        _echo_config(client.resume(name), as_json)


@click.command()
@click.option("--kind", type=click.Choice(["queue", "schedule"]), help="Only queues, or only schedules.")
@click.option("--name", metavar="NAME", help="Only this queue's or schedule's changes.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True, metavar="N")
@json_option
@click.pass_context
def audit(ctx: click.Context, kind: str | None, name: str | None, limit: int, as_json: bool) -> None:
    """Show who changed queue settings and schedules, and when, newest first.

    \b
    Example:
      batonq audit --kind schedule
    """
    with open_client(ctx) as client:
        entries = client.settings_audit(kind=kind, name=name, limit=limit)
    if as_json:
        for entry in entries:
            echo_json(entry)
        return
    rows = [
        [e.at.strftime("%Y-%m-%d %H:%M:%S UTC"), e.actor, e.kind, e.name, _change(e.before, e.after)]
        for e in entries
    ]
    print_table(["at", "who", "kind", "name", "change"], rows)


def _change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    if before is None:
        return "created"
    if after is None:
        return "removed"
    return ", ".join(
        f"{k} {_setting(before.get(k))} -> {_setting(v)}" for k, v in after.items() if before.get(k) != v
    )


def _setting(value: Any) -> str:
    """A setting's value in a change: ``none`` for a limit removed."""
    return "none" if value is None else str(value)
