"""The worker's pure parts: error bodies, the App registry, target loading
and the JSON log format (no database)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

import batonq
from batonq.json_values import json_size
from batonq.worker import load
from batonq.worker.failure import failure_of, fit_text
from batonq.worker.logs import JsonFormatter


def test_fit_text_keeps_short_text_and_cuts_long_text_in_the_middle() -> None:
    assert fit_text("short", 100) == "short"
    text = "start\n" + "é\"\n" * 50_000 + "ValueError: the end"
    fitted = fit_text(text, 10_000)
    assert json_size(fitted) <= 10_000
    assert fitted.startswith("start") and fitted.endswith("ValueError: the end")
    assert "characters cut" in fitted
    assert fit_text("nul\x00byte", 100) == "nul\\x00byte"


def test_failure_of_maps_exceptions_to_fail_arguments() -> None:
    try:
        raise batonq.PermanentError("gone")
    except batonq.PermanentError as error:
        permanent = failure_of(error)
    assert not permanent.requeue and permanent.retry_delay_s is None
    assert permanent.error.startswith("PermanentError: gone\n\nTraceback (most recent call last)")
    assert permanent.error.endswith("PermanentError: gone")

    retry = failure_of(batonq.Retry(delay_s=7, message="later"))
    assert (retry.error, retry.retry_delay_s, retry.requeue) == ("Retry: later", 7, True)
    assert failure_of(batonq.Retry()).retry_delay_s is None  # the queue's backoff

    plain = failure_of(KeyError("k"), limit_bytes=64)
    assert plain.requeue and json_size(plain.error) <= 64
    with pytest.raises(ValueError):
        batonq.Retry(delay_s=-1)


def test_app_registers_handlers_once_per_queue() -> None:
    app = batonq.App()

    @app.task("a")
    @app.task("b", lease_s=60)
    async def handle(job: batonq.AsyncJob) -> None:
        return None

    assert app.queues == ["b", "a"]
    assert app.tasks["b"].lease_s == 60 and app.tasks["a"].is_async
    with pytest.raises(ValueError, match="already has a handler"):
        app.add_task("a", handle)
    with pytest.raises(ValueError, match="invalid queue name"):
        app.add_task("Bad Name", handle)
    with pytest.raises(ValueError, match="lease_s"):
        app.add_task("c", handle, lease_s=0)
    with pytest.raises(TypeError):
        app.middleware(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no handler for queue"):
        batonq.Worker(app, queues=["zzz"])


def test_load_finds_an_app_or_a_function(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    (tmp_path / "loadme_tasks.py").write_text(
        "import batonq\napp = batonq.App()\n\n@app.task('q1')\ndef one(job):\n    return 1\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    app = load("loadme_tasks:app")
    assert app.queues == ["q1"]
    function_app = load("loadme_tasks:one", ["x", "y"])
    assert function_app.queues == ["x", "y"] and not function_app.tasks["x"].is_async
    for target, message in [
        ("loadme_tasks", "module:attribute"),
        ("loadme_tasks:nope", "no attribute"),
        ("loadme_tasks:one", "--queue"),
        ("loadme_tasks:batonq", "neither"),
    ]:
        with pytest.raises(ValueError, match=message):
            load(target)
    with pytest.raises(ValueError, match="--queues"):
        load("loadme_tasks:app", ["q1"])


def test_json_log_lines_carry_the_job_fields() -> None:
    record = logging.LogRecord("batonq.worker", logging.INFO, __file__, 1, "t_%d done", (5,), None)
    record.__dict__.update(task_id="t_5", queue="q", attempt=1, fencing_token=9, duration_s=0.25)
    line = json.loads(JsonFormatter().format(record))
    assert line["message"] == "t_5 done" and line["level"] == "info"
    assert (line["task_id"], line["queue"], line["attempt"], line["fencing_token"]) == ("t_5", "q", 1, 9)
