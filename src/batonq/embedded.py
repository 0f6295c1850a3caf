"""The default database: a private PostgreSQL from the pgserver package.

With no DSN and no ``BATONQ_DATABASE_URL``, batonq runs PostgreSQL under
``$BATONQ_HOME`` (default ``~/.local/share/batonq``; ``/var/lib/batonq`` for
root), shared by every batonq process on the machine and stopped when the last
of them exits (``batonq embedded stop`` stops it after a process was killed).

The server trusts every connection that reaches its socket, so the socket
lives in the data directory, which only the server's user may enter; a home
whose socket path would be too long for the system is refused rather than
moved to a shared folder. Run as root, PostgreSQL runs as the unprivileged
user ``pgserver``, which must be able to pass through the folders above the
data directory and the binaries: batonq checks that they let it and refuses
otherwise, and leaves every folder's mode as it found it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batonq.errors import EmbeddedUnavailable

__all__ = [
    "ENV_DSN",
    "ENV_HOME",
    "EmbeddedStatus",
    "embedded_dsn",
    "home",
    "resolve_dsn",
    "status",
    "stop",
]

ENV_DSN = "BATONQ_DATABASE_URL"
ENV_HOME = "BATONQ_HOME"

# sun_path holds 108 bytes on Linux and 104 on macOS, its last one a NUL.
_SOCKET_PATH_MAX = 103
_SOCKET_NAME = ".s.PGSQL.5432"
_ROOT_HOME = Path("/var/lib/batonq")

_lock = threading.Lock()
_servers: dict[Path, Any] = {}


@dataclass(frozen=True, slots=True)
class EmbeddedStatus:
    pgdata: Path
    pid: int | None  # None: not running
    dsn: str | None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI).
        warnings.simplefilter("ignore")
        yield


def home() -> Path:
    configured = os.environ.get(ENV_HOME)
    if configured:
        return Path(configured).expanduser()
    if os.geteuid() == 0:
        return _ROOT_HOME
    return Path.home() / ".local" / "share" / "batonq"


def _pgdata() -> Path:
    return (home() / "pgdata").absolute()


def _prefixes(path: Path) -> Iterator[Path]:
    yield from path.parents


def _check_socket_path(pgdata: Path) -> None:
    socket = pgdata / _SOCKET_NAME
    if len(os.fsencode(socket)) > _SOCKET_PATH_MAX:
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL's socket would be {socket} ({len(os.fsencode(socket))} bytes; "
            f"at most {_SOCKET_PATH_MAX}): set {ENV_HOME} to a shorter path"
        )


def _check_reachable_as_root(pgdata: Path, binaries: Path) -> None:
    """As root, PostgreSQL runs as ``pgserver``: every folder above its data
    and binaries must let others pass (x), since batonq will not open them."""
    for target in (pgdata, binaries):
        for folder in _prefixes(target):
            if folder.exists() and not folder.stat().st_mode & stat.S_IXOTH:
                raise EmbeddedUnavailable(
                    f"the embedded PostgreSQL runs as the user 'pgserver' when batonq runs as root, "
                    f"and it cannot pass through {folder} (mode {stat.S_IMODE(folder.stat().st_mode):o}) "
                    f"to reach {target}: set {ENV_HOME} to a folder it can reach (default {_ROOT_HOME}), "
                    f"or allow it yourself with `chmod o+x {folder}`"
                )


def _forget_exited(pgdata: Path) -> None:
    """pgserver stops the server when the last process on its list exits; one
    killed before it could take itself off stays listed and the server would
    never stop again: take off the processes that are gone."""
    with _quiet():
        from pgserver.postgres_server import PostgresServer
        from pgserver.utils import DiskList, process_is_running

    listed = DiskList(pgdata / ".handle_pids.json")
    with PostgresServer._lock:
        pids = listed.get()
        alive = [pid for pid in pids if process_is_running(pid)]
        if alive != pids:
            listed.put(alive)


def _start(pgdata: Path) -> Any:
    with _quiet():
        import pgserver
        from pgserver._commands import POSTGRES_BIN_PATH

    _check_socket_path(pgdata)
    if pgdata.exists():
        _forget_exited(pgdata)
    if os.geteuid() != 0:
        pgdata.parent.mkdir(parents=True, exist_ok=True)
        return pgserver.get_server(pgdata)  # type: ignore[attr-defined]
    if not pgdata.parent.exists():
        pgdata.parent.mkdir(parents=True, mode=0o711)
    _check_reachable_as_root(pgdata, Path(POSTGRES_BIN_PATH))
    # pgserver opens every folder above the data and the binaries to others
    # (g+rx, o+rx); they already let the server pass, so put their modes back.
    folders = {f for target in (pgdata, Path(POSTGRES_BIN_PATH)) for f in _prefixes(target) if f.exists()}
    modes = {folder: stat.S_IMODE(folder.stat().st_mode) for folder in folders}
    try:
        return pgserver.get_server(pgdata)  # type: ignore[attr-defined]
    finally:
        for folder, mode in modes.items():
            if stat.S_IMODE(folder.stat().st_mode) != mode:
                folder.chmod(mode)


def embedded_dsn() -> str:
    """Start (or join) the embedded server and return its DSN, migrated."""
    from batonq.migrate import migrate

    pgdata = _pgdata()
    with _lock:
        server = _servers.get(pgdata)
        if server is None:
            server = _start(pgdata)
            _servers[pgdata] = server
            migrate(server.get_uri())
    return str(server.get_uri())


def _postmaster() -> Any:
    with _quiet():
        from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(_pgdata())
    return info if info is not None and info.is_running() else None


def status() -> EmbeddedStatus:
    """Whether the embedded server under ``$BATONQ_HOME`` runs, and where."""
    info = _postmaster()
    if info is None:
        return EmbeddedStatus(_pgdata(), None, None)
    return EmbeddedStatus(_pgdata(), int(info.pid), str(info.get_uri()))


def stop() -> bool:
    """Stop the embedded server under ``$BATONQ_HOME`` (batonq processes
    using it lose their connections); False if it was not running."""
    info = _postmaster()
    if info is None:
        return False
    with _quiet():
        from pgserver._commands import POSTGRES_BIN_PATH

    owner = _pgdata().stat().st_uid
    user = None if owner == os.geteuid() else owner
    subprocess.run(
        [str(Path(POSTGRES_BIN_PATH) / "pg_ctl"), "-D", str(_pgdata()), "-w", "-m", "fast", "stop"],
        check=True, capture_output=True, user=user, timeout=60,
    )  # fmt: skip
    (_pgdata() / ".handle_pids.json").unlink(missing_ok=True)
    return True


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: the one given, else ``$BATONQ_DATABASE_URL``, else embedded."""
    return dsn or os.environ.get(ENV_DSN) or embedded_dsn()
