"""The Worker: claims tasks for an App's queues and runs their handlers,
heartbeating each lease while its handler runs, until told to stop.

One dispatcher claims in batches sized to the free slots, round-robin over
the queues; a slot is free again once its handler has returned, so the next
claim overlaps the submit of the last outcomes. When every queue is empty it
sleeps on LISTEN/NOTIFY (one listener connection) and claims again at the
latest after ``wait_s``. Each claimed task runs as its own asyncio task:
``async def`` handlers on the loop, plain ones in a thread pool of
``concurrency`` threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from batonq.client import AsyncClient
from batonq.embedded import resolve_dsn
from batonq.limits import MAX_LEASE_S, MIN_LEASE_S
from batonq.listener import AsyncListener, AsyncNoListener
from batonq.models import Lease
from batonq.worker.app import App, TaskSpec
from batonq.worker.batching import Completions
from batonq.worker.execution import Execution

__all__ = ["EXIT_FORCED", "EXIT_OK", "Worker"]

log = logging.getLogger("batonq.worker")

EXIT_OK = 0
"""Stopped gracefully: every claimed task finished, or was released."""
EXIT_FORCED = 1
"""Stopped at once by ``stop(force=True)``; a second signal gives 128 + its number."""

_RELEASE_TIMEOUT_S = 5.0
_BEAT_TICK_S = 0.1
"""How often running jobs are checked for a due heartbeat (one is due a
third of the lease after the claim or the last heartbeat)."""
_RETRY_BASE_S = 0.5
_RETRY_MAX_S = 10.0
_FAILED = frozenset({"retry", "dead"})


class Worker:
    """Run an App's handlers until stopped.

    - ``concurrency``: jobs at once (threads for sync handlers), default 10;
    - ``queues``: a subset of the App's queues (default all of them);
    - ``lease_s``: the lease each claim asks for, over the App's and queue's;
    - ``wait_s``: an idle worker claims again after this long even without
      a wake-up; it is how late a delayed or retrying task can be picked up;
    - ``grace_s``: after a stop request, how long running jobs may finish
      before their leases are given back;
    - ``max_tasks``: stop after claiming this many; ``burst``: stop when no
      task is claimable and none is running;
    - ``dsn`` or ``client``: where to work; without a client the worker opens
      its own, with a ``sweeper`` (leader-elected: one per database does the
      work) that recovers expired leases in queues nobody claims from;
    - ``listen``: wake on LISTEN/NOTIFY (False: poll every ``wait_s``, e.g.
      behind a transaction-pooling PgBouncer);
    - ``summary_s``: how often a busy worker logs a summary line at INFO
      (tasks done and failed, tasks/s); each task's own record is at DEBUG.

    ``run()`` returns an exit code: 0 graceful, 128 + N after a second
    signal N (130 for SIGINT, 143 for SIGTERM), 1 after ``stop(force=True)``.

    Usage: ``batonq.Worker(app, dsn=...).run()``
    """

    def __init__(
        self,
        app: App,
        *,
        dsn: str | None = None,
        client: AsyncClient | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int = 10,
        lease_s: int | None = None,
        wait_s: float = 5.0,
        grace_s: float = 30.0,
        max_tasks: int | None = None,
        burst: bool = False,
        name: str | None = None,
        listen: bool = True,
        sweeper: bool = True,
        handle_signals: bool = True,
        summary_s: float = 10.0,
    ) -> None:
        self.app = app
        self.queues = list(queues) if queues else app.queues
        unknown = sorted(set(self.queues) - set(app.tasks))
        if unknown:
            raise ValueError(f"no handler for queue(s) {', '.join(unknown)}; the App has {app.queues}")
        if not self.queues:
            raise ValueError("the App has no handlers: register one with @app.task(queue)")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease_s is not None and not MIN_LEASE_S <= lease_s <= MAX_LEASE_S:
            raise ValueError(f"lease_s must be between {MIN_LEASE_S} and {MAX_LEASE_S}")
        if wait_s <= 0 or grace_s < 0 or summary_s <= 0:
            raise ValueError("wait_s and summary_s must be over 0, grace_s at least 0")
        if max_tasks is not None and max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self.dsn = dsn
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.grace_s = grace_s
        self.max_tasks = max_tasks
        self.burst = burst
        self.name = name
        self.listen = listen
        self.sweeper = sweeper
        self.handle_signals = handle_signals
        self.summary_s = summary_s
        self.claimed = 0
        self.finished = 0
        self.failed = 0
        """Of the finished, those whose handler failed (retried or dead)."""
        self.abandoned = 0
        """Sync handlers still running in threads when the worker stopped."""
        self._given_client = client
        self._client: AsyncClient | None = None
        self._completions: Completions | None = None
        # By task and fencing token: a token is monotonic per task, and
        # unique across tasks only while one sequence hands them all out.
        self._running: dict[tuple[int, int], Execution] = {}
        self._busy = 0
        """Jobs whose handler has not returned yet: the slots taken."""
        self._more_claimable = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poke: asyncio.Event | None = None
        self._jobs_started: asyncio.Event | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stopping = False
        self._forced = False
        self._forced_by: int | None = None
        self._stop_deadline = 0.0
        self._fields: dict[str, Any] = {}

    # -- control -------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped, in a new event loop; returns the exit code."""
        return asyncio.run(self.run_async())

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and let running jobs finish within ``grace_s``;
        ``force`` gives their leases back at once. Callable from any thread."""
        loop = self._loop
        if loop is None:
            self._stopping, self._forced = True, self._forced or force
            return
        try:
            in_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            in_loop = False
        if in_loop:
            self._request_stop(force)
        else:
            loop.call_soon_threadsafe(self._request_stop, force)

    @property
    def running(self) -> int:
        """Jobs running now."""
        return len(self._running)

    def _request_stop(self, force: bool) -> None:
        if not self._stopping:
            self._stopping = True
            self._stop_deadline = time.monotonic() + self.grace_s
        self._forced = self._forced or force
        self._poke_dispatcher()

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._stopping:
            log.warning("%s again: stopping at once, releasing %d leases", name, len(self._running),
                        extra=self._fields)  # fmt: skip
            self._forced_by = signum
            self._request_stop(True)
        else:
            log.info("%s: no more claims; %d running jobs have %g s to finish (%s again stops at once)",
                     name, len(self._running), self.grace_s, name, extra=self._fields)  # fmt: skip
            self._request_stop(False)

    def _poke_dispatcher(self) -> None:
        if self._poke is not None:
            self._poke.set()

    # -- the main loop -------------------------------------------------------

    async def run_async(self) -> int:
        """Run until stopped, on the running loop; returns the exit code."""
        self._loop = asyncio.get_running_loop()
        self._poke = asyncio.Event()
        self._jobs_started = asyncio.Event()
        if self._stopping:  # stop() before run()
            self._stop_deadline = time.monotonic() + self.grace_s
        async with contextlib.AsyncExitStack() as stack:
            client = self._given_client
            if client is None:
                dsn = await asyncio.to_thread(resolve_dsn, self.dsn)
                client = AsyncClient(dsn, max_connections=min(self.concurrency, 20) + 2, listen=False,
                                     sweeper=self.sweeper, worker_name=self.name)  # fmt: skip
                await client.open()
                stack.push_async_callback(client.close)
            self._client = client
            self._completions = Completions(client)
            self._fields = {"worker": client.worker_name}
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="batonq-job")
            stack.callback(self._executor.shutdown, wait=False, cancel_futures=True)
            # Behind a transaction pooler LISTEN needs $BATONQ_LISTEN_URL: else this raises at start.
            listener: AsyncListener | AsyncNoListener = AsyncNoListener()
            if self.listen:
                listener = AsyncListener(client.session_dsn(), client.forget_awaited)
            stack.push_async_callback(listener.close)
            relays = [asyncio.create_task(self._relay(listener, queue)) for queue in self.queues]
            tickers = [asyncio.create_task(self._beat_ticks()), asyncio.create_task(self._summaries())]
            stack.push_async_callback(_cancel_all, [*relays, *tickers])
            self._install_signal_handlers(stack)
            started = time.monotonic()
            log.info("worker %s started: queues %s, concurrency %d", client.worker_name,
                     ", ".join(self.queues), self.concurrency, extra=self._fields)  # fmt: skip
            try:
                await self._dispatch(client)
            except BaseException as error:
                if not isinstance(error, asyncio.CancelledError):
                    log.exception("worker stopping after an error", extra=self._fields)
                self._request_stop(True)
                await self._drain()
                raise
            await self._drain()
        code = self._exit_code()
        took = time.monotonic() - started
        log.info("worker %s stopped (exit %d): %d tasks finished, %d failed, in %.1f s (%.0f/s)",
                 self._fields.get("worker"), code, self.finished, self.failed, took,
                 self.finished / took if took > 0 else 0.0, extra=self._fields)  # fmt: skip
        return code

    def _exit_code(self) -> int:
        if self._forced_by is not None:
            return 128 + self._forced_by
        return EXIT_FORCED if self._forced else EXIT_OK

    def _install_signal_handlers(self, stack: contextlib.AsyncExitStack) -> None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
            stack.callback(loop.remove_signal_handler, signum)

    async def _relay(self, listener: AsyncListener | AsyncNoListener, queue: str) -> None:
        """Turn the listener's wake-ups for one queue into dispatcher pokes."""
        async with listener.watch(queue) as wake:
            self._poke_dispatcher()  # it may have missed work while connecting
            while True:
                if await wake.wait(3600):
                    self._poke_dispatcher()

    async def _beat_ticks(self) -> None:
        """Start the heartbeats that are due, every ``_BEAT_TICK_S`` while
        jobs run (an idle worker does not tick)."""
        assert self._jobs_started is not None
        while True:
            if not self._running:
                self._jobs_started.clear()
                await self._jobs_started.wait()
            await asyncio.sleep(_BEAT_TICK_S)
            now = time.monotonic()
            for execution in list(self._running.values()):
                execution.beat_if_due(now)

    async def _summaries(self) -> None:
        """Every ``summary_s``, one INFO line with what was finished since
        the last one; none while nothing was."""
        finished, failed, since = self.finished, self.failed, time.monotonic()
        while True:
            await asyncio.sleep(self.summary_s)
            now = time.monotonic()
            if self.finished != finished:
                done = self.finished - finished
                log.info("%d tasks finished in %.0f s (%.0f/s), %d failed; %d running",
                         done, now - since, done / (now - since), self.failed - failed,
                         len(self._running), extra=self._fields)  # fmt: skip
            finished, failed, since = self.finished, self.failed, now

    def _free_slots(self) -> int:
        free = self.concurrency - self._busy
        if self.max_tasks is not None:
            free = min(free, self.max_tasks - self.claimed)
        return free

    async def _dispatch(self, client: AsyncClient) -> None:
        """Claim while there is room, until stopped, drained (burst) or done
        (max_tasks). Jobs still running are left to ``_drain``."""
        assert self._poke is not None
        rotation = 0
        failures = 0
        while not self._stopping:
            self._poke.clear()
            if self.max_tasks is not None and self.claimed >= self.max_tasks:
                log.info("claimed max_tasks=%d: no more claims", self.max_tasks, extra=self._fields)
                return
            free = self._free_slots()
            if free <= 0:
                await self._poke.wait()
                continue
            claimed = await self._claim_round(client, rotation)
            rotation += 1
            if claimed is None:
                failures += 1
                await self._idle(min(_RETRY_BASE_S * 2 ** (failures - 1), _RETRY_MAX_S))
                continue
            failures = 0
            if claimed:
                # Let the new jobs start before the next claim goes out.
                await asyncio.sleep(0)
                if self._more_claimable:
                    continue
                # Else every queue gave fewer than asked: nothing more was
                # claimable. New tasks notify; finished jobs poke.
            elif self.burst and not self._running and not self._poke.is_set():
                # (A poke during the claim -- a job finished, a task arrived --
                # may mean work the claim did not see yet: claim again first.)
                log.info("burst: no claimable task left", extra=self._fields)
                return
            if await self._await_work(client):
                continue  # registered anew: tasks may have come before it
            await self._idle(await self._rate_wait(client))

    async def _await_work(self, client: AsyncClient) -> bool:
        """Keep every queue sending wake-ups while this worker idles (the
        engine notifies only while someone awaits a queue); True when one
        was registered anew."""
        if not self.listen:
            return False
        renewed = False
        for queue in self.queues:
            try:
                renewed = await client.await_work(queue, self.wait_s) or renewed
            except psycopg.OperationalError as error:
                log.warning("await_work on %s failed (%s)", queue, error, extra=self._fields)
        return renewed

    async def _rate_wait(self, client: AsyncClient) -> float:
        """How long to idle: ``wait_s``, or less when a queue's rate limit
        held claims back (an empty bucket sends no wake-up when it refills)."""
        try:
            rate_wait_s = await client.rate_wait(self.queues)
        except psycopg.OperationalError as error:
            log.warning("rate_wait failed (%s)", error, extra=self._fields)
            return self.wait_s
        return min(self.wait_s, rate_wait_s) if rate_wait_s > 0 else self.wait_s

    async def _idle(self, timeout: float) -> None:
        assert self._poke is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._poke.wait()

    async def _claim_round(self, client: AsyncClient, rotation: int) -> int | None:
        """One claim per queue while slots are free, starting at a rotating
        queue so none starves; how many were claimed, None on a lost database.
        Sets ``_more_claimable`` when a queue gave all that was asked."""
        total = 0
        self._more_claimable = False
        for i in range(len(self.queues)):
            queue = self.queues[(rotation + i) % len(self.queues)]
            free = self._free_slots()
            if free <= 0 or self._stopping:
                break
            spec = self.app.tasks[queue]
            try:
                leases = await client.claim(queue, max_tasks=free, lease_s=self.lease_s or spec.lease_s)
            except psycopg.OperationalError as error:
                log.warning("claim from %s failed (%s); retrying", queue, error, extra=self._fields)
                return None
            for lease in leases:
                self._start(client, lease, spec)
            total += len(leases)
            self._more_claimable = self._more_claimable or len(leases) == free
        return total

    def _start(self, client: AsyncClient, lease: Lease, spec: TaskSpec) -> None:
        assert self._executor is not None and self._completions is not None and self._jobs_started is not None
        execution = Execution(
            lease, spec, client=client, completions=self._completions, executor=self._executor,
            middleware=self.app.middlewares, log_fields=self._fields, on_ran=self._ran,
            on_finished=self._finished,
        )  # fmt: skip
        self.claimed += 1
        self._busy += 1
        self._jobs_started.set()
        self._running[lease.task_id, lease.fencing_token] = execution

    def _ran(self, execution: Execution) -> None:
        """A handler returned: its slot takes the next task while its outcome
        is being submitted, so claims overlap completions. (Only worth a claim
        when the last one filled every free slot: else nothing was left.)"""
        self._busy -= 1
        if self._more_claimable:
            self._poke_dispatcher()

    def _finished(self, execution: Execution) -> None:
        self._running.pop((execution.job.id, execution.job.fencing_token), None)
        self.finished += 1
        if execution.status in _FAILED:
            self.failed += 1
        self._poke_dispatcher()

    # -- shutdown ------------------------------------------------------------

    async def _drain(self) -> None:
        """Wait for running jobs: without end when the dispatcher stopped by
        itself (burst, max_tasks), until ``grace_s`` after a stop request,
        not at all when forced. Then give back every lease still held."""
        assert self._poke is not None
        while self._running and not self._forced:
            self._poke.clear()
            if not self._stopping:
                await self._poke.wait()
                continue
            remaining = self._stop_deadline - time.monotonic()
            if remaining <= 0:
                log.warning("grace of %g s is over: releasing %d leases", self.grace_s, len(self._running),
                            extra=self._fields)  # fmt: skip
                break
            await self._idle(remaining)
        await self._release_unfinished()

    async def _release_unfinished(self) -> None:
        """Give back the leases of jobs still running; wait a moment for
        jobs already submitting; abandon sync handlers' threads."""
        unfinished = [e for e in self._running.values() if e.phase == "running"]
        for execution in unfinished:
            execution.stop()
        if unfinished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(e.release() for e in unfinished)), _RELEASE_TIMEOUT_S)
        submitting = [e.task for e in self._running.values() if e.phase == "submitting"]
        if submitting:
            await asyncio.wait(submitting, timeout=_RELEASE_TIMEOUT_S)
        left = [e.task for e in self._running.values() if not e.task.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=1.0)
        self.abandoned = sum(1 for e in unfinished if e.thread_busy)
        self._running.clear()
        self._busy = 0


async def _cancel_all(tasks: Sequence[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
