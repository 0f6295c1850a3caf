"""batonq: an App with one async no-op handler (run by ``batonq worker``)."""

import batonq

QUEUE = "bench:workers"

app = batonq.App()


@app.task(QUEUE)
async def noop(job: batonq.Job) -> None:
    return None
