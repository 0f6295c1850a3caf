"""The public surface, without a database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import batonq
from batonq import models

ROOT = Path(__file__).resolve().parents[2]


def test_all_is_sorted_and_complete() -> None:
    assert batonq.__all__ == sorted(batonq.__all__)
    assert len(set(batonq.__all__)) == len(batonq.__all__)
    missing = [name for name in batonq.__all__ if not hasattr(batonq, name)]
    assert missing == []
    namespace: dict[str, Any] = {}
    exec("from batonq import *", namespace)
    assert set(batonq.__all__) <= set(namespace)


def test_exported_errors_are_batonq_errors_with_codes() -> None:
    errors = [
        getattr(batonq, name)
        for name in batonq.__all__
        if isinstance(getattr(batonq, name), type) and issubclass(getattr(batonq, name), Exception)
    ]
    assert batonq.LeaseLost in errors and batonq.TaskFinished in errors
    for cls in errors:
        assert issubclass(cls, batonq.BatonqError)
    # A write refused because the task finished is still a lease_lost.
    assert issubclass(batonq.TaskFinished, batonq.LeaseLost)
    assert batonq.TaskFinished.code == batonq.LeaseLost.code == "lease_lost"
    codes = [cls.code for cls in errors if cls not in (batonq.BatonqError, batonq.TaskFinished)]
    assert len(codes) == len(set(codes)), "each error has its own code"


def test_sync_client_is_generated_and_current() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_sync.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr


def test_sync_client_has_every_async_method() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in vars(cls) if not name.startswith("_")}

    assert public(batonq.AsyncClient) == public(batonq.Client)


@pytest.mark.parametrize(("value", "expected"), [(5, 5), ("5", 5), ("t_5", 5), ("t_5521", 5521), (0, 0)])
def test_task_id_accepts(value: int | str, expected: int) -> None:
    assert models.task_id(value) == expected


@pytest.mark.parametrize(
    "value",
    ["x5", True, False, "", "t_", "T_5", "5 ", "-5", "t_-5", "5.0", "t_t_5", "²", "t_²", "\u0665", "1" * 19],
)
def test_task_id_rejects(value: Any) -> None:
    with pytest.raises(batonq.InvalidArgument, match="task id must look like t_5521 or 5521"):
        models.task_id(value)


def test_lease_lost_message_names_the_holder() -> None:
    lost = batonq.LeaseLost(7, "leased", 3, 9)
    assert lost.message == "lease no longer held: task t_7 is leased under fencing token 9 (yours is 3)"
    assert (lost.code, lost.detail["current_fencing_token"]) == ("lease_lost", 9)
    finished = batonq.TaskFinished(7, "done", 9, 9)
    assert finished.message == "lease no longer held: task t_7 is done"
    assert isinstance(finished, batonq.LeaseLost)
