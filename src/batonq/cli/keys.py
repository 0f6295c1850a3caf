"""``batonq keys``: API keys for the HTTP service and the MCP server."""

from __future__ import annotations

import click

from batonq.cli.common import json_option, open_client
from batonq.cli.output import echo_json
from batonq.rings import RINGS

__all__ = ["keys"]

_RING_HELP = "0 admin (keys, settings, graph), 1 operator (retry/cancel/hold/release), 2 worker, 3 observer"


@click.group()
def keys() -> None:
    """Create, list and revoke API keys (works on the database directly)."""


@keys.command("create")
@click.option("--ring", required=True, type=click.IntRange(0, 3), help=_RING_HELP)
@click.option(
    "--queues",
    "patterns",
    default="*",
    show_default=True,
    help="Comma-separated glob patterns of the queues the key may use, e.g. 'shop:*,mail:outbox'.",
)
@click.option("--name", default="", help="A note saying whose key it is.")
@json_option
@click.pass_context
def create(ctx: click.Context, ring: int, patterns: str, name: str, as_json: bool) -> None:
    """Make a key and print it: it is shown only this once.

    \b
    Example:
      batonq keys create --ring 2 --queues 'shop:*' --name checkout-workers
    """
    queues = [p.strip() for p in patterns.split(",") if p.strip()]
    with open_client(ctx) as client:
        made = client.create_key(ring, queues, name)
    if as_json:
        echo_json(
            {"key": made.key, "id": made.id, "name": made.name, "ring": made.ring, "queues": made.queues}
        )
        return
    click.echo(made.key)
    click.echo(
        f"key {made.id}: ring {made.ring} ({RINGS[made.ring]}), queues {', '.join(made.queues)}"
        " -- store the key now, it is not shown again",
        err=True,
    )


@keys.command("list")
@json_option
@click.pass_context
def list_keys(ctx: click.Context, as_json: bool) -> None:
    """List keys (never their secrets)."""
    with open_client(ctx) as client:
        found = client.keys()
    for key in found:
        if as_json:
            echo_json(key)
        else:
            status = "revoked" if key.revoked_at else f"last used {key.last_used_at or 'never'}"
            click.echo(
                f"{key.id}\tring {key.ring} ({RINGS[key.ring]})\t{','.join(key.queues)}\t{key.name}\t{status}"
            )


@keys.command("revoke")
@click.argument("key_id", type=int)
@click.pass_context
def revoke(ctx: click.Context, key_id: int) -> None:
    """Revoke a key: refused from its next request on."""
    with open_client(ctx) as client:
        revoked = client.revoke_key(key_id)
    click.echo(f"key {revoked.id} revoked")
