"""``batonq graph``: the queue graph's edges."""

from __future__ import annotations

import json
from typing import Any

import click

from batonq.cli.common import JSON_VALUE, json_option, open_client
from batonq.cli.output import echo_json
from batonq.models import MISSING, Edge

__all__ = ["graph"]


@click.group()
def graph() -> None:
    """Edges between queues: a finished task's result becomes the next queue's input."""


@graph.command("add")
@click.argument("from_queue")
@click.argument("to_queue")
@click.option("--map", "map_", metavar="POINTER", help="JSON pointer into the result: the next payload.")
@click.option("--fan-out", metavar="POINTER", help="JSON pointer to an array: one task per element.")
@click.option(
    "--when", metavar="POINTER", help="Route only results with a value here (see --equals, --absent)."
)
@click.option("--equals", type=JSON_VALUE, default=None, metavar="JSON", help="...equal to this JSON value.")
@click.option("--absent", is_flag=True, help="...route when the --when pointer is absent instead.")
@click.option("--join", is_flag=True, help="TO_QUEUE collects a fan-out into FROM_QUEUE.")
@click.option("--partial", is_flag=True, help="With --join: a dead element gives null, not a dead join.")
@click.option("--priority", type=int, help="Priority of the new tasks (default: inherited).")
@click.option(
    "--delay", "delay_s", type=click.FloatRange(0), default=0, help="Seconds before they are claimable."
)
@click.pass_context
def add(ctx: click.Context, from_queue: str, to_queue: str, map_: str | None, fan_out: str | None,
        when: str | None, equals: Any, absent: bool, join: bool, partial: bool,
        priority: int | None, delay_s: float) -> None:  # fmt: skip
    """Add an edge (or replace the one between the same queues).

    \b
    Examples:
      batonq graph add retrieve rank --fan-out /docs
      batonq graph add rank summarise --join
      batonq graph add classify spam --when /label --equals '"spam"'
    """
    if (equals is not None or absent) and when is None:
        raise click.UsageError("--equals and --absent need --when POINTER", ctx)
    with open_client(ctx) as client:
        edge = client.add_edge(
            from_queue, to_queue, map=map_, fan_out=fan_out, when=when,
            equals=MISSING if equals is None else equals,
            present=False if absent else None, join=join, partial=partial,
            priority=priority, delay_s=delay_s,
        )  # fmt: skip
    click.echo(describe(edge))


@graph.command("rm")
@click.argument("from_queue")
@click.argument("to_queue")
@click.pass_context
def rm(ctx: click.Context, from_queue: str, to_queue: str) -> None:
    """Remove an edge: no new batons along it; tasks in flight go on."""
    with open_client(ctx) as client:
        removed = client.remove_edge(from_queue, to_queue)
    if not removed:
        raise click.ClickException(f"no edge {from_queue} -> {to_queue}")
    click.echo(f"removed {from_queue} -> {to_queue}")


@graph.command("show")
@json_option
@click.pass_context
def show(ctx: click.Context, as_json: bool) -> None:
    """Print the graph, one edge per line, grouped by the queue it leaves."""
    with open_client(ctx) as client:
        edges = client.edges()
    if as_json:
        for edge in edges:
            echo_json(edge)
        return
    if not edges:
        click.echo("no edges (add one with: batonq graph add FROM_QUEUE TO_QUEUE)")
    for edge in edges:
        click.echo(describe(edge))


def describe(edge: Edge) -> str:
    """``a -> b  [fan out /docs, map /id]`` for one edge."""
    notes = []
    if edge.when_pointer is not None:
        if edge.when_present is not None:
            notes.append(f"when {edge.when_pointer} {'present' if edge.when_present else 'absent'}")
        else:
            notes.append(f"when {edge.when_pointer} == {json.dumps(edge.when_equals)}")
    if edge.fan_out is not None:
        notes.append(f"fan out {edge.fan_out or '(whole result)'}")
    if edge.map is not None:
        notes.append(f"map {edge.map or '(whole result)'}")
    if edge.is_join:
        notes.append("join" + (" (partial)" if edge.partial else ""))
    if edge.priority is not None:
        notes.append(f"priority {edge.priority}")
    if edge.delay_s:
        notes.append(f"delay {edge.delay_s:g}s")
    arrow = f"{edge.from_queue} -> {edge.to_queue}"
    return f"{arrow}  [{', '.join(notes)}]" if notes else arrow
