"""The batonq command line: one module per command group, registered below.

A new command is a plain ``click.Command`` in its own module, added with one
``main.add_command(...)`` line. It takes its client with
``batonq.cli.common.open_client(ctx)`` and may raise batonq or database
errors: the group turns them into the documented exit codes.
"""

from __future__ import annotations

import click

from batonq.cli import (
    bench,
    embedded,
    enqueue,
    graph,
    keys,
    leases,
    mcp,
    migrate,
    queues,
    schedules,
    serve,
    tasks,
    worker,
)
from batonq.cli.common import EXIT_CODES_HELP, BatonqGroup, Settings, dsn_option

__all__ = ["main"]


@click.group(
    cls=BatonqGroup, epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]}
)
@dsn_option
@click.version_option(package_name="batonq")
@click.pass_context
def main(ctx: click.Context, dsn: str | None) -> None:
    """batonq: a task queue in PostgreSQL.

    \b
    Example:
      export BATONQ_DATABASE_URL=postgresql://localhost/app
      batonq migrate && batonq enqueue shards '{"shard": 7}' --key shard-07
    """
    ctx.obj = Settings(dsn)


main.add_command(migrate.migrate)
main.add_command(enqueue.enqueue)
main.add_command(leases.claim)
main.add_command(leases.complete)
main.add_command(leases.fail)
main.add_command(leases.heartbeat)
main.add_command(tasks.tasks)
main.add_command(tasks.task)
main.add_command(tasks.retry)
main.add_command(tasks.cancel)
main.add_command(tasks.hold)
main.add_command(tasks.release)
main.add_command(queues.queues)
main.add_command(queues.queue)
main.add_command(queues.audit)
main.add_command(schedules.schedule)
main.add_command(worker.worker)
main.add_command(graph.graph)
main.add_command(serve.serve)
main.add_command(keys.keys)
main.add_command(mcp.mcp)
main.add_command(bench.bench)
main.add_command(embedded.embedded)
