"""The App the docs run as ``myapp.tasks:app`` (docs/worker.md,
docs/deployment.md, deploy/'s units): their commands run against it as
written, from this folder, as from a unit's WorkingDirectory."""

from __future__ import annotations

from typing import Any

import batonq

app = batonq.App()


@app.task("shop:tasks")
def order(job: batonq.Job) -> dict[str, Any]:
    return {"order": job.payload}


@app.task("shop:emails")
async def email(job: batonq.AsyncJob) -> str:
    return f"sent to {job.payload}"


def thumbnail(job: batonq.Job) -> dict[str, Any]:
    """A handler function on its own: ``batonq worker myapp.tasks:thumbnail --queue images``."""
    return {"image": job.payload, "size": 128}
