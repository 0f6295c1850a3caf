"""``batonq embedded``: the private PostgreSQL batonq runs without a database URL."""

from __future__ import annotations

import click

from batonq import embedded as server

__all__ = ["embedded"]


@click.group()
def embedded() -> None:
    """The embedded PostgreSQL under $BATONQ_HOME.

    It starts with the first batonq process that needs it and stops with the
    last; after a process was killed, `stop` ends it by hand.
    """


@embedded.command()
def status() -> None:
    """Say whether the embedded server runs, with its data folder and URL (exit 1 if it does not run)."""
    now = server.status()
    if now.pid is None:
        click.echo(f"not running (data: {now.pgdata})")
        raise click.exceptions.Exit(1)
    click.echo(f"running, pid {now.pid} (data: {now.pgdata})\n{now.dsn}")


@embedded.command()
def stop() -> None:
    """Stop the embedded server; batonq processes using it lose their connections."""
    now = server.status()
    if server.stop():
        click.echo(f"stopped (pid {now.pid}, data: {now.pgdata})")
    else:
        click.echo(f"not running (data: {now.pgdata})")
