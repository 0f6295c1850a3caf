"""What every command shares: the database option, opening a client, the
exit codes and the one place that maps errors to them, and parameter types.

A new command takes the client with ``with open_client(ctx) as client:`` and
raises freely: ``BatonqGroup`` turns batonq and database errors into
``error: <code>: <message>`` on stderr and the documented exit code.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import click
import psycopg
from psycopg_pool import PoolTimeout

import batonq
from batonq import models
from batonq.embedded import ENV_DSN, resolve_dsn
from batonq.errors import BatonqError, LeaseLost

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_ERROR",
    "EXIT_LEASE_LOST",
    "EXIT_NOTHING_CLAIMED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "JSON_VALUE",
    "LIMIT",
    "TASK_ID",
    "BatonqGroup",
    "Failure",
    "LeaseLostFailure",
    "Settings",
    "UnreachableFailure",
    "dsn_option",
    "json_option",
    "open_client",
    "parse_json",
    "resolved_dsn",
    "to_failure",
    "usage_error",
]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOTHING_CLAIMED = 3
EXIT_LEASE_LOST = 4
EXIT_UNREACHABLE = 5

EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  ok
  {EXIT_ERROR}  error ("error: <code>: <message>" on stderr)
  {EXIT_USAGE}  usage error (bad option or argument)
  {EXIT_NOTHING_CLAIMED}  claim: nothing was claimed
  {EXIT_LEASE_LOST}  complete/fail/heartbeat: lease no longer held
  {EXIT_UNREACHABLE}  database unreachable"""

# A CLI call should fail fast on a wrong host rather than wait for the pool.
CONNECT_TIMEOUT_S = 10


class Failure(click.ClickException):
    """An error printed as ``error: <code>: <message>``, exiting 1."""

    exit_code = EXIT_ERROR

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.code}: {self.message}", err=True)


class LeaseLostFailure(Failure):
    exit_code = EXIT_LEASE_LOST


class UnreachableFailure(Failure):
    exit_code = EXIT_UNREACHABLE


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _unreachable(error: Exception) -> bool:
    """A failure to reach the database (not a query that failed on it)."""
    if isinstance(error, PoolTimeout):
        return True
    if not isinstance(error, psycopg.OperationalError):
        return False
    # No SQLSTATE: libpq could not connect. 08: connection exceptions. 57P01-03:
    # the server is shutting down or not yet accepting connections.
    state = error.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def to_failure(error: Exception) -> Failure | None:
    """The exit code and message for an error raised by a command, if ours."""
    if isinstance(error, LeaseLost):
        return LeaseLostFailure(error.code, error.message)
    if isinstance(error, BatonqError):
        return Failure(error.code, error.message)
    if _unreachable(error):
        return UnreachableFailure("database_unreachable", _first_line(error))
    if isinstance(error, psycopg.Error):
        return Failure("database_error", _first_line(error))
    return None


class BatonqGroup(click.Group):
    """A group whose subcommands' errors become exit codes (see ``to_failure``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """In the order they were added: the workflow's order, not the alphabet's."""
        return list(self.commands)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as error:
            failure = to_failure(error)
            if failure is None:
                raise
            raise failure from error


@dataclass(slots=True)
class Settings:
    """The group's options, kept on ``ctx.obj`` for the subcommands."""

    dsn: str | None = None
    _resolved: str | None = None

    def resolve(self) -> str:
        """The DSN to use (explicit, else $BATONQ_DATABASE_URL, else embedded),
        checked to answer: an unreachable database fails here, fast."""
        if self._resolved is None:
            dsn = resolve_dsn(self.dsn)
            psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S).close()
            self._resolved = dsn
        return self._resolved


def resolved_dsn(ctx: click.Context) -> str:
    """The reachable DSN for this invocation."""
    return ctx.ensure_object(Settings).resolve()


@contextlib.contextmanager
def open_client(ctx: click.Context, *, listen: bool = False) -> Iterator[batonq.Client]:
    """A small client for one command, closed when it ends; ``listen`` for
    a command that waits (it then needs $BATONQ_LISTEN_URL behind a
    transaction pooler)."""
    client = batonq.Client(
        resolved_dsn(ctx), min_connections=1, max_connections=2, poll_interval_s=0.5, listen=listen
    )
    with client.open():
        yield client


def dsn_option(func: Any) -> Any:
    """The group's ``--dsn`` option."""
    return click.option(
        "--dsn",
        metavar="URL",
        help=f"PostgreSQL URL. Default: ${ENV_DSN}, else an embedded PostgreSQL under $BATONQ_HOME.",
    )(func)


def json_option(func: Any) -> Any:
    """``--json``: print JSON (one object per line) instead of text."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(func)


class TaskIdType(click.ParamType[int]):
    """A task id, given as ``5`` or ``t_5``."""

    name = "task_id"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return models.task_id(value)
        except BatonqError as error:
            self.fail(error.message, param, ctx)


def parse_json(text: str, name: str, ctx: click.Context | None) -> Any:
    """``json.loads(text)``; invalid JSON is a usage error naming ``name``."""
    try:
        return json.loads(text)
    except ValueError as error:
        usage_error(f"{name} is not valid JSON: {error}", ctx)


def usage_error(message: str, ctx: click.Context | None) -> NoReturn:
    """Exit 2 with click's usage message."""
    raise click.UsageError(message, ctx)


class JsonValueType(click.ParamType[Any]):
    """A JSON text (``-`` reads it from stdin), parsed with ``json.loads``."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        text = sys.stdin.read() if value == "-" else value
        return parse_json(text, param.human_readable_name if param is not None else "value", ctx)


class LimitType(click.ParamType[int]):
    """A limit: a count from 1, or ``0``/``none`` for no limit (given as 0)."""

    name = "limit"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "none":
            return 0
        if not text.isascii() or not text.isdigit() or int(text) > 2**31 - 1:
            self.fail(f"{value!r} is not a count from 0 to {2**31 - 1}, or none", param, ctx)
        return int(text)


TASK_ID = TaskIdType()
JSON_VALUE = JsonValueType()
LIMIT = LimitType()
