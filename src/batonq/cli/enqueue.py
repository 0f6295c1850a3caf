"""``batonq enqueue``: one task from the command line, or many from a JSON
Lines file, resumably."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

import batonq
from batonq.cli.common import JSON_VALUE, TASK_ID, Failure, json_option, open_client, usage_error
from batonq.cli.jsonl import BadLine, Line, batches, read_lines
from batonq.cli.output import echo_json, tid
from batonq.errors import BatonqError

__all__ = ["enqueue"]


@dataclass(slots=True)
class Tally:
    """What an import has done so far."""

    created: int = 0
    existing: int = 0
    last_line: int = 0

    def summary(self) -> str:
        return f"created {self.created}, already there {self.existing}"


@click.command(epilog="With --from, each line is {\"payload\": ..., \"key\": ..., \"priority\": ..., "
               "\"delay_s\": ..., \"group\": ...}; only payload is required. See docs/cli.md.")  # fmt: skip
@click.argument("queue")
@click.argument("payload_json", type=JSON_VALUE, required=False)
@click.option("--key", metavar="KEY", help="Idempotency key: enqueue once per key and queue.")
@click.option(
    "--priority", type=int, default=0, metavar="N", show_default=True, help="Higher is claimed first."
)
@click.option(
    "--delay", "delay_s", type=float, default=0.0, metavar="SECONDS", help="Seconds before it may be claimed."
)
@click.option(
    "--max-attempts", type=int, metavar="N", help="Attempts before it is dead (default: the queue's)."
)
@click.option("--held", is_flag=True, help="Enqueue held: not claimable until `batonq release`.")
@click.option("--parent", "parent_id", type=TASK_ID, help="The task this one is a child of.")
@click.option("--group", metavar="GROUP",
              help="The task's group (a customer id, say), for the queue's "
                   "--group-max-leased and --group-rate-limit.")  # fmt: skip
@click.option("--debounce-key", metavar="KEY",
              help="Debounce: enqueues of KEY less than --debounce apart make one task.")  # fmt: skip
@click.option("--debounce", "debounce_s", type=float, metavar="SECONDS",
              help="The debounce window: the task runs this long after the last enqueue.")  # fmt: skip
@click.option("--max-wait", "max_wait_s", type=float, metavar="SECONDS",
              help="With --debounce: run at the latest this long after the first enqueue.")  # fmt: skip
@click.option("--keep", type=click.Choice(["last", "first"]), default="last", show_default=True,
              help="With --debounce: the payload the task carries.")  # fmt: skip
@click.option(
    "--from", "source", type=click.File("rb"), metavar="FILE",
    help="Enqueue every line of a JSON Lines file (- for stdin).",
)  # fmt: skip
@click.option("--batch", type=click.IntRange(1, 10000), metavar="N", default=1000, show_default=True,
              help="Lines per round trip with --from.")  # fmt: skip
@click.option("--no-keys", is_flag=True, help='With --from: lines without "key" get no key.')
@click.option(
    "--key-prefix",
    metavar="PREFIX",
    help="With --from: derived keys are PREFIX:<line> (default: the file name).",
)
@json_option
@click.pass_context
def enqueue(
    ctx: click.Context,
    queue: str,
    payload_json: Any,
    key: str | None,
    priority: int,
    delay_s: float,
    max_attempts: int | None,
    held: bool,
    parent_id: int | None,
    group: str | None,
    debounce_key: str | None,
    debounce_s: float | None,
    max_wait_s: float | None,
    keep: str,
    source: IO[bytes] | None,
    batch: int,
    no_keys: bool,
    key_prefix: str | None,
    as_json: bool,
) -> None:
    """Enqueue a task; print its id and whether it was created.

    A line without "key" in a --from file gets the key <file name>:<line>, so
    running the same import again skips what is already enqueued.

    \b
    Examples:
      batonq enqueue shop:tasks '{"order": 17}' --key order-17
      batonq enqueue mail '{"to": "ada@example.com"}' --group customer-42
      batonq enqueue digest '{"user": 7}' --debounce-key user-7 --debounce 30
      batonq enqueue shards --from shards.jsonl
    """
    if source is None:
        if payload_json is None:
            usage_error("give PAYLOAD_JSON, or --from FILE", ctx)
        given = [f"--{n.replace('_', '-')}" for n in ("batch", "no_keys", "key_prefix") if _given(ctx, n)]
        if given:
            usage_error(f"{', '.join(given)} only apply with --from", ctx)
        with open_client(ctx) as client:
            reply = client.enqueue(
                queue, payload_json, priority=priority, delay_s=delay_s, max_attempts=max_attempts,
                idempotency_key=key, held=held, parent=parent_id, debounce_key=debounce_key,
                debounce_s=debounce_s, max_wait_s=max_wait_s, keep=keep, group=group,
            )  # fmt: skip
        if as_json:
            echo_json(reply)
        else:
            existing = "debounced into it" if debounce_key is not None else "already there"
            click.echo(f"{tid(reply.task_id)} {'created' if reply.created else existing}")
        return
    if debounce_key is not None or debounce_s is not None:
        usage_error("--debounce applies to one task, not with --from", ctx)
    if payload_json is not None or key is not None:
        usage_error("--from reads payloads and keys from the file: drop PAYLOAD_JSON and --key", ctx)
    prefix = _key_prefix(ctx, source, key_prefix, no_keys)
    lines = read_lines(source, key_prefix=prefix, priority=priority, delay_s=delay_s, group=group)
    with open_client(ctx) as client:
        tally = _import(
            client, queue, lines, _size(source), batch=batch, max_attempts=max_attempts,
            held=held, parent_id=parent_id, name=_name(source), resumable=prefix is not None,
        )  # fmt: skip
    if as_json:
        echo_json({"created": tally.created, "existing": tally.existing})
    else:
        click.echo(tally.summary())


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def _name(source: IO[bytes]) -> str:
    name = getattr(source, "name", "-")
    return "stdin" if not isinstance(name, str) or name in ("-", "<stdin>") else os.path.basename(name)


def _key_prefix(ctx: click.Context, source: IO[bytes], key_prefix: str | None, no_keys: bool) -> str | None:
    if no_keys:
        if key_prefix is not None:
            usage_error("--no-keys and --key-prefix exclude each other", ctx)
        return None
    if key_prefix is not None:
        return key_prefix
    if _name(source) == "stdin":
        usage_error("reading stdin: give --key-prefix (to derive keys) or --no-keys", ctx)
    return _name(source)


def _size(source: IO[bytes]) -> int | None:
    try:
        return os.fstat(source.fileno()).st_size if source.seekable() else None
    except (OSError, ValueError):
        return None


def _progress() -> Progress:
    stderr = Console(file=sys.stderr)
    return Progress(
        TextColumn("enqueue"), BarColumn(), TaskProgressColumn(),
        TextColumn("{task.fields[lines]} lines"), TimeElapsedColumn(),
        console=stderr, disable=not stderr.is_terminal, transient=False,
    )  # fmt: skip


def _import(
    client: batonq.Client,
    queue: str,
    lines: Iterable[Line],
    size: int | None,
    *,
    batch: int,
    max_attempts: int | None,
    held: bool,
    parent_id: int | None,
    name: str,
    resumable: bool,
) -> Tally:
    """Enqueue ``lines`` in batches, each in one round trip (all or nothing)."""
    tally = Tally()
    with _progress() as progress:
        bar = progress.add_task("enqueue", total=size, lines=0)
        try:
            for chunk in batches(lines, batch):
                try:
                    replies = client.enqueue_many(
                        queue, [line.payload for line in chunk],
                        idempotency_keys=[line.key for line in chunk],
                        priorities=[line.priority for line in chunk],
                        delays_s=[line.delay_s for line in chunk],
                        groups=[line.group for line in chunk],
                        max_attempts=max_attempts, held=held, parent=parent_id,
                    )  # fmt: skip
                except BatonqError as error:
                    raise _batch_failure(error, chunk, tally, name, resumable) from error
                created = sum(reply.created for reply in replies)
                tally.created += created
                tally.existing += len(replies) - created
                tally.last_line = chunk[-1].number
                progress.update(bar, advance=sum(line.size for line in chunk), lines=tally.last_line)
        except BadLine as bad:
            raise _bad_line_failure(bad, tally, name, resumable) from bad
    return tally


def _so_far(tally: Tally, resumable: bool) -> str:
    """What an import that stopped had done, and how to go on."""
    if tally.last_line == 0:
        return "Nothing was enqueued."
    done = f"Lines up to {tally.last_line} were enqueued ({tally.summary()}), nothing after them."
    if resumable:
        done += " Fix the line and run the same command again: keyed lines already enqueued are skipped."
    return done


def _bad_line_failure(bad: BadLine, tally: Tally, name: str, resumable: bool) -> Failure:
    return Failure("invalid_line", f"{name} line {bad.number}: {bad.reason}\n{_so_far(tally, resumable)}")


def _batch_failure(
    error: BatonqError, chunk: list[Line], tally: Tally, name: str, resumable: bool
) -> Failure:
    """The engine refused a batch: name the line when it says which payload."""
    first, last = chunk[0].number, chunk[-1].number
    where = f"line {first}" if first == last else f"lines {first}-{last}"
    match = re.fullmatch(r"payload (\d+)", str(error.detail.get("what", "")))
    if match and 1 <= int(match[1]) <= len(chunk):
        where = f"line {chunk[int(match[1]) - 1].number}"
    return Failure(
        error.code,
        f"{name} {where}: {error.message}\n{_so_far(tally, resumable)}",
    )
