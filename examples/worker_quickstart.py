"""batonq quickstart: handlers, a queue, a worker.

    pip install batonq
    python worker_quickstart.py                  # enqueue three tasks
    batonq worker worker_quickstart:app --burst  # run them; exit when done

With no BATONQ_DATABASE_URL, batonq starts its own PostgreSQL; with one,
run `batonq migrate` first. The test suite runs this file as written.
"""

import batonq

app = batonq.App()


@app.task("emails")
def send_welcome(job: batonq.Job) -> dict[str, str]:
    address = job.payload["to"]
    if "@" not in address:
        raise batonq.PermanentError(f"not an address: {address}")  # dead now, no retry
    job.set_stage("sending")
    # ... send it; any other exception retries with backoff ...
    return {"sent_to": address}  # the task's result


if __name__ == "__main__":
    with batonq.connect() as client:
        for to in ["ada@example.com", "grace@example.com", "nobody"]:
            client.enqueue("emails", {"to": to}, idempotency_key=f"welcome:{to}")
