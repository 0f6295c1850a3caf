"""batonq: Apps with one no-op handler each, async (``app``) or sync
(``sync_app``, run in the worker's threads), run by ``batonq worker``."""

import batonq

QUEUE = "bench:workers"

app = batonq.App()


@app.task(QUEUE)
async def noop(job: batonq.Job) -> None:
    return None


sync_app = batonq.App()


@sync_app.task(QUEUE)
def noop_sync(job: batonq.Job) -> None:
    return None
