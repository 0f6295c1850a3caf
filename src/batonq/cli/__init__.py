"""The batonq command line."""

from __future__ import annotations

import click


@click.group()
def main() -> None:
    """batonq: a task queue in PostgreSQL."""
