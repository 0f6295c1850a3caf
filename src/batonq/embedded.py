"""The default database: a private PostgreSQL from the pgserver package.

With no DSN and no ``BATONQ_DATABASE_URL``, batonq runs PostgreSQL under
``$BATONQ_HOME`` (default ``~/.local/share/batonq``), shared by every batonq
process on the machine and stopped when the last of them exits.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

__all__ = ["ENV_DSN", "ENV_HOME", "embedded_dsn", "home", "resolve_dsn"]

ENV_DSN = "BATONQ_DATABASE_URL"
ENV_HOME = "BATONQ_HOME"

_lock = threading.Lock()
_servers: dict[Path, Any] = {}


def home() -> Path:
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".local" / "share" / "batonq").expanduser()


def embedded_dsn() -> str:
    """Start (or join) the embedded server and return its DSN, migrated."""
    from batonq.migrate import migrate

    pgdata = home() / "pgdata"
    with _lock:
        server = _servers.get(pgdata)
        if server is None:
            pgdata.parent.mkdir(parents=True, exist_ok=True)
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
                warnings.simplefilter("ignore")
                import pgserver

                server = pgserver.get_server(pgdata)  # type: ignore[attr-defined]
            _servers[pgdata] = server
            migrate(server.get_uri())
    return str(server.get_uri())


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: the one given, else ``$BATONQ_DATABASE_URL``, else embedded."""
    return dsn or os.environ.get(ENV_DSN) or embedded_dsn()
