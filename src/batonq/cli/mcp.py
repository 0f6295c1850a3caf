"""``batonq mcp``: the MCP server over stdio, for a local agent."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import click

from batonq.cli.common import Failure, resolved_dsn

__all__ = ["mcp"]


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send whatever writes to fd 1 meanwhile (an embedded PostgreSQL
    starting, say) to stderr: stdout is the MCP channel."""
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@click.command()
@click.option(
    "--read-only", is_flag=True, help="Expose only the reading tools (batonq_tasks, batonq_queues)."
)
@click.option(
    "--key",
    envvar="BATONQ_KEY",
    metavar="KEY",
    help="Act with an API key's ring and queue scopes (a ring 3 key is read-only). Default: $BATONQ_KEY, "
    "else full access to the database.",
)
@click.pass_context
def mcp(ctx: click.Context, read_only: bool, key: str | None) -> None:
    """Serve batonq to an AI agent over MCP on stdin/stdout.

    Tools: batonq_enqueue, batonq_claim, batonq_heartbeat, batonq_complete,
    batonq_fail, batonq_run, batonq_tasks, batonq_queues; a guide resource
    (batonq://guide) and a prompt (work_through_queue). For agents on other machines,
    `batonq serve` serves the same at /mcp over streamable HTTP.

    \b
    Example:
      claude mcp add batonq --env BATONQ_DATABASE_URL=postgresql://localhost/app -- batonq mcp
    """
    import anyio

    from batonq.mcp import serve_stdio

    with _stdout_to_stderr():
        dsn = resolved_dsn(ctx)
    try:
        anyio.run(lambda: serve_stdio(dsn, read_only=read_only, key=key))
    except PermissionError as error:
        raise Failure("unauthorized", str(error)) from None
