"""Where a benchmark runs: the machine, the PostgreSQL server and its
settings, which batonq (and commit) ran, WAL and checkpoint readings, and the
scratch database the benchmarks create and drop."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import batonq
from batonq.benchmark.targets import BASELINE_SCHEMA

__all__ = [
    "POSTGRES_SETTINGS",
    "batonq_source",
    "checkpoints",
    "git_commit",
    "machine_info",
    "postgres_info",
    "pressure",
    "scratch_database",
    "wal_bytes",
    "wal_lsn",
    "with_db",
]


def with_db(dsn: str, dbname: str) -> str:
    """``dsn`` with its database replaced by ``dbname``."""
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


# --------------------------------------------------------------------------
# WAL and checkpoints


def wal_lsn(admin: psycopg.Connection[Any]) -> str:
    row = admin.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def checkpoints(admin: psycopg.Connection[Any]) -> int:
    """Checkpoints so far, server-wide: other databases' CREATE/DROP DATABASE
    force them, and every page written after one is logged in full."""
    # PostgreSQL 17 moved the counters from pg_stat_bgwriter to pg_stat_checkpointer.
    query = (
        "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
        if admin.info.server_version >= 170000
        else "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
    )
    row = admin.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def wal_bytes(admin: psycopg.Connection[Any], start: str, end: str) -> int:
    row = admin.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)).fetchone()
    assert row is not None
    return int(row[0])


# --------------------------------------------------------------------------
# The machine and the source


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def _mem_total_kib() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return None


def git_commit(where: Path | None = None) -> str | None:
    """The short commit of the git checkout holding ``where`` (default: this
    package's directory), or None outside one."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=where if where is not None else Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
        return out.stdout.strip() or None
    return None


def pressure() -> dict[str, str]:
    """Linux PSI: how much of the time tasks waited for CPU or I/O."""
    found: dict[str, str] = {}
    for kind in ("cpu", "io"):
        with contextlib.suppress(OSError, IndexError):
            found[kind] = Path(f"/proc/pressure/{kind}").read_text().splitlines()[0]
    return found


def batonq_source() -> dict[str, Any]:
    """Which batonq ran, and whether its files differ from the commit."""
    path = Path(batonq.__file__).resolve().parent
    info: dict[str, Any] = {"path": str(path), "commit": None, "modified_files": None}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=5, check=True
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "."],
            cwd=path, capture_output=True, text=True, timeout=5, check=True,
        )  # fmt: skip
        info["commit"] = commit.stdout.strip()
        info["modified_files"] = len(status.stdout.splitlines())
    return info


def machine_info() -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": _cpu_model(),
        "mem_total_kib": _mem_total_kib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "loadavg_start": list(load) if load else None,
        "pressure_start": pressure(),
    }


# --------------------------------------------------------------------------
# The server


POSTGRES_SETTINGS = (
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "full_page_writes",
    "wal_level",
    "wal_compression",
    "commit_delay",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "work_mem",
    "jit",
    "max_connections",
)


def postgres_info(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    info: dict[str, Any] = {}
    row = conn.execute("SELECT version()").fetchone()
    info["version"] = row[0] if row else None
    for name in POSTGRES_SETTINGS:
        row = conn.execute(f"SHOW {name}").fetchone()
        info[name] = row[0] if row else None
    return info


@contextlib.contextmanager
def scratch_database(server_dsn: str, *, keep: bool = False) -> Iterator[str]:
    """A new database ``batonq_bench_<pid>``, migrated; dropped afterwards."""
    name = f"batonq_bench_{os.getpid()}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = with_db(server_dsn, name)
    try:
        batonq.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(BASELINE_SCHEMA)
        yield dsn
    finally:
        if not keep:
            with psycopg.connect(server_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
