"""How the commands print: JSON lines for scripts, rich tables for people."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from batonq.models import task_ref

__all__ = [
    "age_since",
    "console",
    "echo_json",
    "first_line",
    "format_age",
    "jsonable",
    "print_table",
    "tid",
    "truncate",
]

# Fields that hold a task id: shown as t_<n>, as everywhere else in batonq.
_ID_FIELDS = frozenset({"id", "task_id", "parent_id", "root_id"})


def tid(task_id: int | None) -> str:
    """``t_5521`` for 5521; ``-`` for none."""
    return "-" if task_id is None else task_ref(task_id)


def jsonable(record: Any) -> dict[str, Any]:
    """A batonq dataclass as a JSON-ready dict, task ids written ``t_<n>``."""
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    return {
        name: task_ref(value) if name in _ID_FIELDS and isinstance(value, int) else value
        for name, value in values.items()
    }


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def echo_json(value: Any) -> None:
    """Print ``value`` (a dict, or a batonq dataclass) as one JSON line."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = jsonable(value)
    click.echo(json.dumps(value, default=_default, ensure_ascii=False))


def format_age(seconds: float | None) -> str:
    """A short age: ``42s``, ``7m``, ``3h``, ``2d``; ``-`` for none."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def age_since(moment: datetime | None) -> float | None:
    """Seconds from ``moment`` to now (for display only; on this machine's clock)."""
    return None if moment is None else (datetime.now(UTC) - moment).total_seconds()


def first_line(text: str | None) -> str:
    """A worker's error text leads with the exception's message, then its traceback."""
    return (text or "").partition("\n")[0]


def truncate(text: str | None, width: int) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


# Piped output is not wrapped at rich's default of 80 columns.
_PIPE_WIDTH = 200


def console() -> Console:
    """A console on the current stdout; text is never read as markup."""
    out = Console(markup=False, emoji=False, highlight=False)
    if not out.is_terminal:
        out.width = _PIPE_WIDTH
    return out


def print_table(columns: list[str], rows: list[list[str]], *, right: frozenset[str] = frozenset()) -> None:
    """Print a rich table; ``right`` names the right-aligned (numeric) columns."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in columns:
        numeric = column in right
        table.add_column(column, justify="right" if numeric else "left", no_wrap=numeric, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    out = console()
    if out.is_terminal:
        out.print(table)
        return
    with out.capture() as captured:
        out.print(table)
    for line in captured.get().splitlines():
        click.echo(line.rstrip())
