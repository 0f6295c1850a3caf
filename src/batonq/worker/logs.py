"""Structured logs for the worker and the service: every record about a job
carries ``task_id``, ``queue``, ``attempt``, ``fencing_token`` (and, when it
ends, ``outcome`` and ``duration_s``) as ``extra`` fields; ``JsonFormatter``
prints them as one JSON object per line, and a request's access record as its
method, path, status and client."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

__all__ = ["FIELDS", "JsonFormatter", "TextFormatter", "configure", "json_log_config"]

FIELDS = (
    "worker", "task_id", "queue", "attempt", "fencing_token", "outcome", "duration_s", "state", "admin_key",
)  # fmt: skip
# uvicorn's access records: (client, method, path, HTTP version, status) as the message's arguments.
_ACCESS = ("client", "method", "path", "http_version", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the job fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            if name in record.__dict__:
                entry[name] = record.__dict__[name]
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            entry.update(zip(_ACCESS, record.args, strict=True))
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``time level message`` then the job fields as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{name}={record.__dict__[name]}" for name in FIELDS if name in record.__dict__)
        if not fields:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first}  [{fields}]{newline}{rest}"


def configure(level: str = "info", fmt: str = "text") -> None:
    """Log batonq's records to stderr, as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger = logging.getLogger("batonq")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


def json_log_config(level: str) -> dict[str, Any]:
    """A ``logging.config`` dictionary sending batonq's and uvicorn's records
    to stderr as JSON lines (for ``batonq serve --log-format json``)."""
    handler = {"handlers": ["json"], "level": level.upper(), "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "loggers": {"batonq": handler, "uvicorn": handler, "uvicorn.access": handler},
    }
