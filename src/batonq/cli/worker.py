"""``batonq worker``: run an App's handlers (or one handler function) until
stopped; see docs/worker.md."""

from __future__ import annotations

import gc
import logging
import os
import sys

import click
import psycopg

from batonq.embedded import resolve_dsn
from batonq.limits import MAX_LEASE_S, MIN_LEASE_S
from batonq.worker import Worker, load
from batonq.worker.logs import configure
from batonq.worker.supervisor import Supervisor, die_with_supervisor

__all__ = ["worker"]

EXIT_CODES = """\b
Exit codes:
  0    stopped gracefully: by SIGTERM/SIGINT (running jobs finished within
       --grace, or their leases were given back), --burst, or --max-tasks
       (with --processes, every process did)
  1    an error (e.g. the schema is missing: run batonq migrate)
  2    usage error (a bad option, or a TARGET that does not load)
  5    the database was unreachable at start
  130  a second SIGINT stopped it at once (running jobs' leases given back)
  143  a second SIGTERM stopped it at once"""


def _split(values: tuple[str, ...]) -> list[str]:
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


@click.command(epilog=EXIT_CODES)
@click.argument("target")
@click.option(
    "--queue",
    "handler_queues",
    multiple=True,
    metavar="QUEUE",
    help="With a handler function as TARGET: the queue it serves (repeatable).",
)
@click.option(
    "--queues",
    "subset",
    multiple=True,
    metavar="Q1,Q2",
    help="Serve only these of the App's queues (comma-separated or repeated).",
)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 10000),
    default=10,
    show_default=True,
    help="Jobs at once (also the thread pool size for sync handlers).",
)
@click.option(
    "--lease",
    "lease_s",
    type=click.IntRange(MIN_LEASE_S, MAX_LEASE_S),
    metavar="SECONDS",
    help="Lease per claim; heartbeats renew it every third. Default: the queue's.",
)
@click.option("--max-tasks", type=click.IntRange(min=1), help="Stop (exit 0) after claiming this many.")
@click.option("--burst", is_flag=True, help="Stop (exit 0) when no task is claimable and none is running.")
@click.option(
    "--grace",
    "grace_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="After SIGTERM/SIGINT, how long running jobs may finish.",
)
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(min=0.01),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="When idle, claim again after this long without a wake-up.",
)
@click.option(
    "--processes",
    "-p",
    type=click.IntRange(0, 1024),
    default=1,
    show_default=True,
    help="Worker processes under one supervisor (0: one per core); each runs --concurrency jobs.",
)
@click.option("--name", help="This worker's name on its claims (NAME/i per process). Default: host:pid.")
@click.option(
    "--sweeper/--no-sweeper",
    default=True,
    show_default=True,
    help="Take part in the election of the one process that expires leases of unclaimed queues.",
)
@click.option(
    "--listen/--no-listen",
    default=True,
    show_default=True,
    help="Wake on LISTEN/NOTIFY; --no-listen polls every --wait (behind a transaction pooler "
    "with no $BATONQ_LISTEN_URL).",
)
@click.option(
    "--dsn",
    metavar="URL",
    help="PostgreSQL URL. Default: batonq's --dsn, $BATONQ_DATABASE_URL, else the embedded PostgreSQL.",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)  # fmt: skip
@click.pass_context
def worker(
    ctx: click.Context,
    target: str,
    handler_queues: tuple[str, ...],
    subset: tuple[str, ...],
    concurrency: int,
    lease_s: int | None,
    max_tasks: int | None,
    burst: bool,
    grace_s: float,
    wait_s: float,
    processes: int,
    name: str | None,
    sweeper: bool,
    listen: bool,
    dsn: str | None,
    log_format: str,
    log_level: str,
) -> None:
    """Run the handlers of TARGET: an App (module:app) or a handler function
    (module:function --queue QUEUE).

    \b
    Example:
      batonq worker myapp.tasks:app --concurrency 20
      batonq worker myapp.tasks:ship --queue shop:tasks --burst
    """
    configure(log_level, log_format)
    die_with_supervisor()
    try:
        app = load(target, _split(handler_queues))
        runner = Worker(
            app, dsn=dsn or ctx.find_root().params.get("dsn"), queues=_split(subset) or None,
            concurrency=concurrency, lease_s=lease_s, wait_s=wait_s, grace_s=grace_s,
            max_tasks=max_tasks, burst=burst, name=name, sweeper=sweeper, listen=listen,
        )  # fmt: skip
    except (ImportError, ValueError, TypeError) as error:
        raise click.UsageError(str(error), ctx) from error
    processes = processes or os.cpu_count() or 1
    if processes > 1:
        ctx.exit(_supervise(ctx, processes, runner))
    _tune_gc()
    code = runner.run()
    if runner.abandoned:
        # Sync handlers still running in threads would hold the interpreter
        # open; their leases are already given back.
        logging.shutdown()
        sys.stderr.flush()
        os._exit(code)
    ctx.exit(code)


def _supervise(ctx: click.Context, processes: int, runner: Worker) -> int:
    """Run this command ``processes`` times as children of this process;
    the supervisor alone takes part in the sweeper election."""
    dsn = resolve_dsn(runner.dsn)
    psycopg.connect(dsn).close()  # unreachable: exit 5 now, not a child restarted forever
    fixed = {"processes": ["--processes", "1"], "sweeper": ["--no-sweeper"], "dsn": ["--dsn", dsn]}
    base = [sys.executable, "-m", "batonq", "worker", *_options(ctx, skip=(*fixed, "name"))]
    base += [arg for args in fixed.values() for arg in args]

    def command(index: int) -> list[str]:
        return base + (["--name", f"{runner.name}/{index}"] if runner.name else [])

    return Supervisor(command, processes, dsn=dsn, sweeper=runner.sweeper, grace_s=runner.grace_s).run()


def _options(ctx: click.Context, skip: tuple[str, ...]) -> list[str]:
    """This command's arguments and options as given, as a command line."""
    args: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in skip or value is None or value == ():
            continue
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif isinstance(param, click.Option) and param.is_flag:
            args += [param.opts[0]] if value else param.secondary_opts[:1]
        elif isinstance(param, click.Option):
            for item in value if param.multiple else (value,):
                args += [param.opts[0], str(item)]
    return args


def _tune_gc() -> None:
    """This process is the worker's: what is loaded by now lives as long as
    it does, so it leaves the cyclic collector's scans (freeze), and young
    objects are collected less often. Every job allocates a few dozen
    short-lived objects; with the default threshold (700) the collector ran
    about every 20 jobs and took a quarter of a no-op worker's CPU time."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
