"""``batonq serve``: the HTTP service."""

from __future__ import annotations

import json
import logging
import logging.config
import os
import signal
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import click
import psycopg

from batonq.cli.common import Failure, open_client, resolved_dsn
from batonq.worker.logs import json_log_config

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["app_from_env", "serve"]

# How `--workers N` hands the service's settings to its N processes.
_ENV_APP = "BATONQ_SERVE_APP"
# Seconds a --workers process may take to answer uvicorn's health check.
_HEALTHCHECK_S = 60
_log = logging.getLogger("batonq.serve")
_NOT_SERVICE = (
    "batonq serve checks API keys and runs operator actions: connect as a role in batonq_service"
    " (CREATE ROLE batonq_api LOGIN IN ROLE batonq_service) or as the schema's owner"
    " (a role in batonq_worker is for workers)"
)


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--max-body-bytes",
    default=8 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024),
    help="Refuse larger request bodies with 413.",
)
@click.option(
    "--keepalive",
    "keepalive_s",
    default=15.0,
    show_default=True,
    type=click.FloatRange(0.1, 300),
    help="Seconds between keep-alive comments on an idle /v1/stream.",
)
@click.option(
    "--max-streams-per-key",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Streams and long-poll claims one key may hold open at once (per process); more get 429.",
)
@click.option(
    "--new-queues-per-key",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Queues a key below ring 1 may create (by enqueueing) per hour, per process; more get 429.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Service processes on the one port, each with its own pool and LISTEN connection.",
)
@click.option(
    "--max-connections",
    default=20,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Database connections per process (the pool's bound; LISTEN and the sweeper take one each more).",
)
@click.option(
    "--read-url",
    envvar="BATONQ_READ_URL",
    default=None,
    help="A streaming replica for listings, counts and the dashboard's pages (they may lag the primary); "
    "writes, claims, waits and key checks stay on --dsn. Default: $BATONQ_READ_URL, else none.",
)
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))  # fmt: skip
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object per line (time, level, logger, message; a request's method, path, "
              "status and client).")  # fmt: skip
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    max_body_bytes: int,
    keepalive_s: float,
    max_streams_per_key: int,
    new_queues_per_key: int,
    workers: int,
    max_connections: int,
    read_url: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the HTTP API (/v1) and the dashboard (/ui), with a sweeper, on the
    embedded database by default.

    On its first start (no API key yet) it prints an admin key, once.
    Run several against one database to scale out (or --workers N).
    Behind PgBouncer, set $BATONQ_LISTEN_URL to PostgreSQL itself.
    With a streaming replica, --read-url takes the read-only pages off the primary.

    \b
    Example:
      batonq serve --port 8765
      curl -H "Authorization: Bearer $KEY" localhost:8765/v1/queues
    """
    import uvicorn

    from batonq.server import create_server

    dsn = resolved_dsn(ctx)
    # uvicorn ends by raising the SIGTERM it caught; as an exception (not the
    # default handler's sudden death) it lets the embedded server stop with us.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    # Listening, as the service does: a setup that cannot listen fails here.
    with open_client(ctx, listen=True) as client:
        try:
            first = client.create_first_key()
        except psycopg.errors.InsufficientPrivilege as error:
            raise Failure("permission_denied", _NOT_SERVICE) from error
    shown = f"[{host}]" if ":" in host else host
    dashboard = f"http://{shown}:{port}/ui"
    # uvicorn's own text logs, or JSON lines from every logger it and batonq use.
    logs: dict[str, Any] = {} if log_format == "text" else {"log_config": json_log_config(log_level)}
    if logs:
        logging.config.dictConfig(logs["log_config"])
        if first is not None:
            _log.warning("first start: an admin key (ring 0, all queues) was made; it is shown only now",
                         extra={"admin_key": first.key})  # fmt: skip
        _log.info("dashboard at %s (sign in with an API key)", dashboard)
    else:
        if first is not None:
            click.echo(
                "\nFirst start: an admin key (ring 0, all queues) was made. It is shown only now:\n\n"
                f"    {first.key}\n\n"
                "Make narrower keys with `batonq keys create --ring 2 --queues 'shop:*'`.\n",
                err=True,
            )
        click.echo(f"Dashboard: {dashboard} (sign in with an API key)", err=True)
    settings: dict[str, Any] = {"dsn": dsn, "max_body_bytes": max_body_bytes, "keepalive_s": keepalive_s,
                "max_streams_per_key": max_streams_per_key, "new_queues_per_hour": new_queues_per_key,
                "client_options": {"max_connections": max_connections}, "read_dsn": read_url}  # fmt: skip
    if workers == 1:
        uvicorn.run(create_server(**settings), host=host, port=port, log_level=log_level, **logs)
        return
    os.environ[_ENV_APP] = json.dumps(settings)  # the worker processes inherit it
    # uvicorn kills and restarts a process that does not answer its health
    # check in time, and a new process answers only once it has imported the
    # service: at uvicorn's 5 s, a busy host restarts them in a loop.
    uvicorn.run("batonq.cli.serve:app_from_env", factory=True, workers=workers,
                host=host, port=port, log_level=log_level, **logs,
                timeout_worker_healthcheck=_HEALTHCHECK_S)  # fmt: skip


def _exit_on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)


def app_from_env() -> FastAPI:
    """The service in one of ``--workers N`` processes."""
    from batonq.server import create_server

    settings: dict[str, Any] = json.loads(os.environ[_ENV_APP])
    return create_server(**settings)
