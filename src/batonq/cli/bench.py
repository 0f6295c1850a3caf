"""``batonq bench``: the core benchmark (``batonq.benchmark``) on the user's server."""

from __future__ import annotations

from pathlib import Path

import click
import psycopg

from batonq.benchmark import SCENARIOS, format_table, run_benchmark, write_report
from batonq.cli.common import Failure, resolved_dsn

__all__ = ["bench"]

SCENARIO_NAMES = tuple(s.name for s in SCENARIOS)
NEEDS = (
    "Give --dsn (or $BATONQ_DATABASE_URL) a role that may create databases and run batonq migrate"
    " in a new one (it may create the roles batonq_reader and batonq_worker), e.g. a superuser."
)


def _scenarios(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """``--only a,b``: the names, checked against the scenarios."""
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIO_NAMES]
    if unknown or not names:
        given = ", ".join(unknown) or repr(value)
        raise click.BadParameter(f"unknown scenario {given}; known: {', '.join(SCENARIO_NAMES)}", ctx, param)
    return names


def _check_createdb(dsn: str) -> str:
    """Fail clearly unless the DSN's role may create databases; returns
    ``user@host:port`` for the progress line."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_user, rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        where = f"{conn.info.host}:{conn.info.port}"
    user, allowed = (row[0], row[1]) if row is not None else ("?", False)
    if not allowed:
        raise Failure(
            "permission_denied",
            f"role {user} may not create databases: batonq bench runs in a scratch database that it "
            f"creates and drops. {NEEDS}",
        )
    return f"{user}@{where}"


@click.command()
@click.option("--quick", is_flag=True, help="A few hundred tasks per scenario, no warm-up, 1 run: seconds.")
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    metavar="N",
    help="Timed runs per scenario (default 3; with --quick 1).",
)
@click.option(
    "--scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="X",
    help="Multiply the tasks per run (not with --quick).",
)
@click.option(
    "--only",
    callback=_scenarios,
    metavar="A,B",
    help="Comma-separated scenario names: " + ", ".join(SCENARIO_NAMES) + ".",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    metavar="DIR",
    help="Directory for the results, core-<timestamp>.json. Default: the current directory.",
)
@click.option("--keep-db", is_flag=True, help="Do not drop the scratch database afterwards.")
@click.pass_context
def bench(
    ctx: click.Context,
    quick: bool,
    runs: int | None,
    scale: float,
    only: list[str] | None,
    out: Path,
    keep_db: bool,
) -> None:
    """Measure batonq's throughput on your server, next to a plain SQL loop.

    Times enqueue (one task per call; batches of 100 and 10,000) and
    claim + complete (batches of 1, 10 and 100; 1, 2 and 4 connections)
    through batonq's client, and the same work done by a hand-written SQL
    loop on a plain table in the same database; prints tasks/s (median,
    min-max) for both and the ratio batonq / baseline. It runs in a scratch
    database that it creates and drops (as a superuser, or a role with
    CREATEDB that may run batonq migrate there); your own
    databases are not touched. The full run takes several minutes and loads
    the server; --quick takes seconds.

    \b
    Example:
      batonq --dsn postgresql://postgres@db/postgres bench --quick
      batonq bench --only claim_complete_b10_c2 --runs 5 --out results/
    """
    dsn = resolved_dsn(ctx)
    where = _check_createdb(dsn)
    total = len(only) if only else len(SCENARIOS)
    click.echo(f"{total} scenarios, {'quick' if quick else 'full'} mode, as {where}", err=True)
    done = 0

    def progress(message: str) -> None:
        nonlocal done
        done += 1
        click.echo(f"[{done}/{total}] {message}", err=True)

    try:
        report = run_benchmark(
            dsn,
            quick=quick,
            runs=runs,
            scale=scale,
            only=only,
            keep_db=keep_db,
            log=progress,
            run_log=lambda message: None,
        )
    except psycopg.errors.InsufficientPrivilege as error:
        # CREATEDB is not all: setting the scratch database up is a batonq migrate.
        reason = str(error).strip().splitlines()[0]
        message = f"setting up the scratch database failed: {reason}. {NEEDS}"
        raise Failure("permission_denied", message) from error
    command = ["batonq", "bench", *(["--quick"] if quick else [])]
    command += [*(["--runs", str(runs)] if runs else []), *(["--scale", str(scale)] if scale != 1 else [])]
    command += [*(["--only", ",".join(only)] if only else []), *(["--keep-db"] if keep_db else [])]
    report["command"] = " ".join(command)
    path = write_report(report, out)
    click.echo(format_table(report))
    click.echo(f"results: {path}")
