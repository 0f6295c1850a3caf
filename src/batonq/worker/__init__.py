"""The worker runtime: an ``App`` maps queues to handlers, a ``Worker`` runs
them (``batonq worker module:app`` on the command line).

Usage::

    import batonq

    app = batonq.App()

    @app.task("shop:tasks")
    def ship(job: batonq.Job) -> dict:
        return {"shipped": job.payload["order"]}

    batonq.Worker(app).run()
"""

from batonq.worker.app import App, load
from batonq.worker.job import AsyncJob, BaseJob, Job
from batonq.worker.middleware import Middleware, Outcome
from batonq.worker.runtime import EXIT_FORCED, EXIT_OK, Worker

__all__ = [
    "EXIT_FORCED",
    "EXIT_OK",
    "App",
    "AsyncJob",
    "BaseJob",
    "Job",
    "Middleware",
    "Outcome",
    "Worker",
    "load",
]
