"""``batonq serve``: the HTTP service."""

from __future__ import annotations

import click

from batonq.cli.common import open_client, resolved_dsn

__all__ = ["serve"]


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
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))  # fmt: skip
@click.pass_context
def serve(
    ctx: click.Context,
    host: str,
    port: int,
    max_body_bytes: int,
    keepalive_s: float,
    max_streams_per_key: int,
    new_queues_per_key: int,
    log_level: str,
) -> None:
    """Run the HTTP API (/v1) and the dashboard (/ui), with a sweeper, on the
    embedded database by default.

    On its first start (no API key yet) it prints an admin key, once.
    Run several against one database to scale out.

    \b
    Example:
      batonq serve --port 8765
      curl -H "Authorization: Bearer $KEY" localhost:8765/v1/queues
    """
    import uvicorn

    from batonq.service import create_app

    dsn = resolved_dsn(ctx)
    with open_client(ctx) as client:
        first = client.create_first_key()
    if first is not None:
        click.echo(
            "\nFirst start: an admin key (ring 0, all queues) was made. It is shown only now:\n\n"
            f"    {first.key}\n\n"
            "Make narrower keys with `batonq keys create --ring 2 --queues 'shop:*'`.\n",
            err=True,
        )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"Dashboard: http://{shown}:{port}/ui (sign in with an API key)", err=True)
    app = create_app(
        dsn, max_body_bytes=max_body_bytes, keepalive_s=keepalive_s, max_streams_per_key=max_streams_per_key,
        new_queues_per_hour=new_queues_per_key,
    )  # fmt: skip
    uvicorn.run(app, host=host, port=port, log_level=log_level)
