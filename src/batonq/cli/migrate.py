"""``batonq migrate``: bring the database's batonq schema up to date."""

from __future__ import annotations

import click

from batonq.cli.common import EXIT_ERROR, resolved_dsn
from batonq.migrate import Migration, pending, script
from batonq.migrate import migrate as apply_migrations

__all__ = ["migrate"]


@click.command()
@click.option("--check", is_flag=True, help="Apply nothing; exit 1 if migrations are pending.")
@click.option(
    "--print-sql",
    is_flag=True,
    help="Print every migration and the engine as one transaction for psql, and touch no database.",
)
@click.pass_context
def migrate(ctx: click.Context, check: bool, print_sql: bool) -> None:
    """Apply the pending migrations and the engine (safe from several places at once).

    \b
    Examples:
      batonq migrate
      batonq migrate --check || echo "run batonq migrate"
      batonq migrate --print-sql | psql "$DATABASE_URL"
    """
    if print_sql:
        click.echo(script(), nl=False)
        return
    dsn = resolved_dsn(ctx)
    if check:
        todo = pending(dsn)
        if todo:
            click.echo(f"{len(todo)} pending: " + ", ".join(_name(m) for m in todo))
            ctx.exit(EXIT_ERROR)
        click.echo("up to date")
        return
    applied = apply_migrations(dsn)
    if not applied:
        click.echo("up to date")
    for migration in applied:
        click.echo(f"applied {_name(migration)}")


def _name(migration: Migration) -> str:
    return f"{migration.version:04d}_{migration.name}"

