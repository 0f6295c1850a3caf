"""The registry of handlers: which function runs which queue's tasks, and
the middleware around them. ``load`` finds one from ``module:attribute``."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, Union

from batonq.limits import MAX_LEASE_S, MIN_LEASE_S, QUEUE_NAME
from batonq.models import JSON
from batonq.worker.job import AsyncJob, Job
from batonq.worker.middleware import Middleware

__all__ = ["App", "AsyncHandler", "Handler", "SyncHandler", "TaskSpec", "load"]

SyncHandler = Callable[[Job], JSON]
AsyncHandler = Callable[[AsyncJob], Awaitable[JSON]]
Handler = Union[SyncHandler, AsyncHandler]  # noqa: UP007 (a runtime alias: | does not apply to Callable)
H = TypeVar("H", bound=Callable[..., Any])
M = TypeVar("M", bound=Middleware)

def is_async(handler: Callable[..., Any]) -> bool:
    """Whether calling ``handler`` gives a coroutine (functions, methods,
    objects with an ``async def __call__``)."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (we want the method itself)
    )


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One queue's handler. ``lease_s`` None means the queue's own.
    ``is_async`` is worked out once here (the worker asks for every job)."""

    queue: str
    handler: Callable[..., Any]
    lease_s: int | None = None
    is_async: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", is_async(self.handler))


class App:
    """Handlers by queue, and middleware; run it with ``batonq worker module:app``.

    Usage::

        app = batonq.App()

        @app.task("shop:tasks")
        def ship(job: batonq.Job) -> dict:
            return {"shipped": job.payload["order"]}
    """

    def __init__(self, *, middleware: Iterable[Middleware] = ()) -> None:
        self.tasks: dict[str, TaskSpec] = {}
        self.middlewares: list[Middleware] = list(middleware)

    def __repr__(self) -> str:
        return f"<App queues={sorted(self.tasks)}>"

    def task(self, queue: str, *, lease_s: int | None = None) -> Callable[[H], H]:
        """Register the decorated function as ``queue``'s handler.

        ``async def`` handlers run on the worker's event loop and get an
        ``AsyncJob``; plain ones run in its threads and get a ``Job``.
        ``lease_s`` is the lease each claim asks for (default: the queue's).
        The function is returned unchanged: stack the decorator to serve
        several queues with one function.
        """

        def register(handler: H) -> H:
            self.add_task(queue, handler, lease_s=lease_s)
            return handler

        return register

    def add_task(self, queue: str, handler: Callable[..., Any], *, lease_s: int | None = None) -> None:
        """Register ``handler`` for ``queue`` (what ``@app.task`` does)."""
        if not QUEUE_NAME.fullmatch(queue):
            raise ValueError(f"invalid queue name {queue!r}")
        if queue in self.tasks:
            raise ValueError(f"queue {queue!r} already has a handler: {self.tasks[queue].handler!r}")
        if not callable(handler):
            raise TypeError(f"a handler must be callable, got {handler!r}")
        if lease_s is not None and not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
            raise ValueError(f"lease_s must be between {MIN_LEASE_S} and {MAX_LEASE_S}")
        self.tasks[queue] = TaskSpec(queue, handler, lease_s)

    def middleware(self, middleware: M) -> M:
        """Add a middleware (hooks before and after every job); returns it."""
        if not isinstance(middleware, Middleware):
            raise TypeError(f"middleware must be a batonq.Middleware, got {middleware!r}")
        self.middlewares.append(middleware)
        return middleware

    @property
    def queues(self) -> list[str]:
        return list(self.tasks)


def load(target: str, queues: Iterable[str] = ()) -> App:
    """The App named by ``module:attribute`` (or ``path/to/file.py:attribute``).

    The attribute is an ``App``, or a handler function served on ``queues``.
    The current directory is importable, as when running ``python -m``.
    """
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"expected module:attribute, e.g. myapp.tasks:app; got {target!r}")
    if module_name.endswith(".py"):
        directory, _, file_name = module_name.rpartition(os.sep)
        sys.path.insert(0, os.path.abspath(directory or "."))
        module_name = file_name[: -len(".py")]
    elif os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise ValueError(f"{module_name} has no attribute {attribute!r}") from None
    queues = list(queues)
    if isinstance(value, App):
        if queues:
            raise ValueError("--queue is for a handler function; to pick an App's queues use --queues")
        return value
    if callable(value):
        if not queues:
            raise ValueError(f"{target} is a function: name its queue(s) with --queue")
        app = App()
        for queue in queues:
            app.add_task(queue, value)
        return app
    raise ValueError(f"{target} is neither a batonq.App nor a handler function")
