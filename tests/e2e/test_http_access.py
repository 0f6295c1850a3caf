"""Keys over HTTP: each ring may do exactly its operations, queue scopes
hold, a revoked key is refused at once, and a refusal never tells whether a
queue or task exists."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.e2e.live import LiveServer, claim_one, enqueue, new_key, problem

ADMIN, OPERATOR, WORKER, OBSERVER = 0, 1, 2, 3
_names = (f"ring{n}" for n in itertools.count())


@dataclass
class Case:
    """What one operation needs: ``setup`` (run with the admin key) returns the
    context ``call`` uses; ``task`` names a task the call must not change when
    it is refused."""

    http: httpx.Client
    queue: str = field(default_factory=lambda: f"rings:{next(_names)}")
    task_id: str | None = None
    token: str | None = None

    def task(self, **fields: Any) -> str:
        self.task_id = enqueue(self.http, self.queue, {"n": 1}, **fields)
        return self.task_id

    def leased(self) -> str:
        self.task()
        self.token = claim_one(self.http, self.queue, lease_s=300)["lease_token"]
        return self.token

    def state(self) -> tuple[str, int | None]:
        shown = self.http.get(f"/v1/tasks/{self.task_id}").json()
        return shown["state"], shown["fencing_token"]


Call = Callable[[httpx.Client, Case], httpx.Response]
Setup = Callable[[Case], object]


@dataclass(frozen=True)
class Op:
    name: str
    ring: int
    setup: Setup
    call: Call
    ok: int = 200


def _nothing(case: Case) -> None:
    return None


def _edge(case: Case) -> None:
    made = case.http.post(
        "/v1/graph/edges", json={"from_queue": case.queue, "to_queue": case.queue + ".next"}
    )
    assert made.status_code == 200, made.text


def _cancelled(case: Case) -> None:
    case.task()
    assert case.http.post(f"/v1/tasks/{case.task_id}/cancel").status_code == 200


def _stream(http: httpx.Client, case: Case) -> httpx.Response:
    with http.stream("GET", "/v1/stream", params={"queue": case.queue}) as response:
        if response.status_code != 200:
            response.read()  # an error body; a stream is left unread and closed
        return response


def _revocable(case: Case) -> None:
    case.token = str(new_key(case.http, OBSERVER)[0])


OPS: tuple[Op, ...] = (
    Op("keys.list", ADMIN, _nothing, lambda h, c: h.get("/v1/keys")),
    Op("keys.create", ADMIN, _nothing, lambda h, c: h.post("/v1/keys", json={"ring": 3}), ok=201),
    Op("keys.revoke", ADMIN, _revocable, lambda h, c: h.delete(f"/v1/keys/{c.token}")),
    Op("queue.settings", ADMIN, _nothing,
       lambda h, c: h.patch(f"/v1/queues/{c.queue}", json={"lease_s": 60})),
    Op("graph.add_edge", ADMIN, _nothing,
       lambda h, c: h.post("/v1/graph/edges", json={"from_queue": c.queue, "to_queue": c.queue + ".b"})),
    Op("graph.remove_edge", ADMIN, _edge,
       lambda h, c: h.delete(f"/v1/graph/edges/{c.queue}/{c.queue}.next"), ok=204),
    Op("task.retry", OPERATOR, _cancelled, lambda h, c: h.post(f"/v1/tasks/{c.task_id}/retry")),
    Op("task.cancel", OPERATOR, lambda c: c.task(), lambda h, c: h.post(f"/v1/tasks/{c.task_id}/cancel")),
    Op("task.hold", OPERATOR, lambda c: c.task(), lambda h, c: h.post(f"/v1/tasks/{c.task_id}/hold")),
    Op("task.release", OPERATOR, lambda c: c.task(held=True),
       lambda h, c: h.post(f"/v1/tasks/{c.task_id}/release")),
    Op("enqueue", WORKER, _nothing,
       lambda h, c: h.post("/v1/enqueue", json={"queue": c.queue, "payload": 1})),
    Op("claim", WORKER, lambda c: c.task(), lambda h, c: h.post("/v1/claim", json={"queue": c.queue})),
    Op("heartbeat", WORKER, lambda c: c.leased(),
       lambda h, c: h.post("/v1/heartbeat", json={"lease_token": c.token})),
    Op("submit", WORKER, lambda c: c.leased(),
       lambda h, c: h.post("/v1/submit", json={"lease_token": c.token, "result": 1})),
    Op("fail", WORKER, lambda c: c.leased(),
       lambda h, c: h.post("/v1/fail", json={"lease_token": c.token, "error": "x"})),
    Op("release_lease", WORKER, lambda c: c.leased(),
       lambda h, c: h.post("/v1/release", json={"lease_token": c.token})),
    Op("stream", WORKER, _nothing, _stream),
    Op("queues", OBSERVER, _nothing, lambda h, c: h.get("/v1/queues")),
    Op("tasks", OBSERVER, _nothing, lambda h, c: h.get("/v1/tasks", params={"queue": c.queue})),
    Op("task", OBSERVER, lambda c: c.task(), lambda h, c: h.get(f"/v1/tasks/{c.task_id}")),
    Op("run", OBSERVER, lambda c: c.task(), lambda h, c: h.get(f"/v1/runs/{c.task_id}")),
    Op("graph", OBSERVER, _nothing, lambda h, c: h.get("/v1/graph")),
)  # fmt: skip


@pytest.fixture(scope="module")
def ring_clients(shared_server: LiveServer, shared_http: httpx.Client) -> Iterator[dict[int, httpx.Client]]:
    clients = {
        ring: shared_server.http(new_key(shared_http, ring)[1])
        for ring in (ADMIN, OPERATOR, WORKER, OBSERVER)
    }
    yield clients
    for client in clients.values():
        client.close()


@pytest.mark.parametrize("ring", [ADMIN, OPERATOR, WORKER, OBSERVER])
@pytest.mark.parametrize("op", OPS, ids=[op.name for op in OPS])
def test_each_ring_may_do_exactly_its_operations(
    op: Op, ring: int, shared_http: httpx.Client, ring_clients: dict[int, httpx.Client]
) -> None:
    case = Case(shared_http)
    op.setup(case)
    before = case.state() if case.task_id else None
    response = op.call(ring_clients[ring], case)
    if ring <= op.ring:
        assert response.status_code == op.ok, (
            f"ring {ring} may {op.name}: {response.status_code} {response.text}"
        )
    else:
        error = problem(response, 403, "forbidden")
        assert f"ring {op.ring}" in error["message"]
        if before is not None:
            assert case.state() == before, f"a refused {op.name} changed the task"


def test_a_key_scoped_to_shop_cannot_touch_mail(shared_server: LiveServer, shared_http: httpx.Client) -> None:
    mail_task = enqueue(shared_http, "mail:outbox", {"to": "a@example.com"})
    mail_lease = claim_one(shared_http, "mail:outbox", lease_s=300)
    enqueue(shared_http, "shop:scoped", {"sku": 1})
    _, key = new_key(shared_http, WORKER, ["shop:*"])
    with shared_server.http(key) as shop:
        assert shop.post("/v1/enqueue", json={"queue": "shop:scoped", "payload": 2}).status_code == 200
        assert claim_one(shop, "shop:scoped")["queue"] == "shop:scoped"

        problem(shop.post("/v1/enqueue", json={"queue": "mail:outbox", "payload": 1}), 403, "forbidden")
        problem(shop.post("/v1/claim", json={"queue": "mail:outbox"}), 403, "forbidden")
        for path in ("/v1/submit", "/v1/fail", "/v1/heartbeat", "/v1/release"):
            problem(shop.post(path, json={"lease_token": mail_lease["lease_token"]}), 403, "forbidden")
        problem(shop.get("/v1/tasks", params={"queue": "mail:outbox"}), 403, "forbidden")
        problem(shop.get("/v1/stream", params={"queue": "mail:outbox"}), 403, "forbidden")
        # A list with one out-of-scope task is refused whole: nothing is enqueued.
        mixed = [{"queue": "shop:scoped", "payload": "x", "idempotency_key": "mixed"},
                 {"queue": "mail:outbox", "payload": "y"}]  # fmt: skip
        problem(shop.post("/v1/enqueue", json=mixed), 403, "forbidden")
        listed = shop.get("/v1/tasks", params={"queue": "shop:scoped"}).json()["tasks"]
        assert "mixed" not in [t["idempotency_key"] for t in listed]

        # Listings leave other queues out; a task in one does not exist.
        assert {q["queue"] for q in shop.get("/v1/queues").json()["queues"]} == {"shop:scoped"}
        problem(shop.get(f"/v1/tasks/{mail_task}"), 404, "task_not_found")

    shown = shared_http.get(f"/v1/tasks/{mail_task}").json()
    assert (shown["state"], shown["fencing_token"]) == ("leased", mail_lease["fencing_token"])


def _without(body: dict[str, Any], *words: str) -> str:
    text = str(body)
    for word in words:
        text = text.replace(word, "<…>")
    return text


def test_refusals_do_not_tell_whether_a_queue_or_task_exists(
    shared_server: LiveServer, shared_http: httpx.Client
) -> None:
    real = enqueue(shared_http, "mail:real", {"secret": True})
    unknown = "t_999999999"
    wrong_keys = {
        "unknown key": "bq_999999_" + "0" * 64,
        "wrong secret": shared_server.admin_key[:-4] + "beef",  # type: ignore[index]
        "malformed": "not-a-key",
    }
    for label, key in wrong_keys.items():
        with shared_server.http(key) as wrong:
            answers = [
                wrong.post("/v1/claim", json={"queue": "mail:real"}),
                wrong.post("/v1/claim", json={"queue": "mail:nonexistent"}),
                wrong.get("/v1/tasks", params={"queue": "mail:real"}),
                wrong.get("/v1/tasks", params={"queue": "mail:nonexistent"}),
                wrong.get(f"/v1/tasks/{real}"),
                wrong.get(f"/v1/tasks/{unknown}"),
            ]
        bodies = {(r.status_code, r.text, r.headers.get("www-authenticate")) for r in answers}
        assert len(bodies) == 1, f"{label}: {bodies}"
        problem(answers[0], 401, "unauthorized")

    _, key = new_key(shared_http, OBSERVER, ["shop:*"])
    with shared_server.http(key) as scoped:
        existing = problem(scoped.get("/v1/tasks", params={"queue": "mail:real"}), 403, "forbidden")
        missing = problem(scoped.get("/v1/tasks", params={"queue": "mail:nonexistent"}), 403, "forbidden")
        assert _without(existing, "mail:real") == _without(missing, "mail:nonexistent")
        out_of_scope = problem(scoped.get(f"/v1/tasks/{real}"), 404, "task_not_found")
        nobody = problem(scoped.get(f"/v1/tasks/{unknown}"), 404, "task_not_found")
        assert _without(out_of_scope, real) == _without(nobody, unknown)
        assert out_of_scope["task_id"] == real


def test_a_revoked_key_is_refused_at_once(shared_server: LiveServer, shared_http: httpx.Client) -> None:
    key_id, key = new_key(shared_http, WORKER)
    with shared_server.http(key) as worker:
        assert worker.get("/v1/queues").status_code == 200
        listed = {k["id"]: k for k in shared_http.get("/v1/keys").json()["keys"]}
        assert listed[key_id]["last_used_at"] is not None and "key" not in listed[key_id]
        revoked = shared_http.delete(f"/v1/keys/{key_id}")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        problem(worker.get("/v1/queues"), 401, "unauthorized")  # the very next request

    # The same through `batonq keys`, on the database directly.
    batonq = [str(Path(sys.executable).with_name("batonq")), "--dsn", shared_server.dsn, "keys"]
    made = subprocess.run([*batonq, "create", "--ring", "2", "--queues", "shop:*"],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    cli_key = made.stdout.strip()
    with shared_server.http(cli_key) as worker:
        assert worker.post("/v1/enqueue", json={"queue": "shop:cli", "payload": 1}).status_code == 200
        cli_id = cli_key.split("_")[1]
        subprocess.run([*batonq, "revoke", cli_id], capture_output=True, check=True, timeout=60)
        problem(worker.post("/v1/enqueue", json={"queue": "shop:cli", "payload": 1}), 401, "unauthorized")


def test_no_key_at_all(shared_server: LiveServer) -> None:
    with shared_server.http() as anonymous:
        error = problem(anonymous.get("/v1/queues"), 401, "unauthorized")
        assert "Bearer" in error["message"]
        assert anonymous.get("/v1/queues").headers["www-authenticate"] == "Bearer"


def test_a_run_shows_where_it_failed_only_within_scope(
    shared_http: httpx.Client, shared_server: LiveServer
) -> None:
    """A run that died in a queue the key does not cover says failed, but not
    where or why."""
    admin = shared_http
    root = enqueue(admin, "scope:plan", {"n": 1})
    lease = claim_one(admin, "scope:plan")
    child = admin.post("/v1/enqueue", json={"queue": "hidden:step", "payload": 2, "parent": root}).json()
    assert (
        admin.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": 1}).status_code == 200
    )
    step = claim_one(admin, "hidden:step")
    failed = admin.post("/v1/fail", json={"lease_token": step["lease_token"], "error": "secret reason",
                                          "requeue": False})  # fmt: skip
    assert failed.status_code == 200, failed.text
    _, key = new_key(admin, OBSERVER, ["scope:*"])
    with shared_server.http(key) as scoped:
        run = scoped.get(f"/v1/runs/{root}").json()
        detail = scoped.get(f"/v1/tasks/{root}").json()
    assert run["status"] == "failed"
    assert (run["failed_task_id"], run["failed_queue"], run["error"]) == (None, None, None)
    assert detail["run"] == run
    assert [t["task_id"] for t in detail["lineage"]] == [root]
    full = admin.get(f"/v1/runs/{root}").json()
    assert (full["failed_task_id"], full["failed_queue"], full["error"]) == (child["task_id"], "hidden:step",
                                                                            "secret reason")  # fmt: skip


def test_a_parent_outside_the_keys_scopes_does_not_exist(
    shared_server: LiveServer, shared_http: httpx.Client
) -> None:
    """Linking a task to a parent the key cannot see is refused exactly as
    for an id nobody has: no existence, root or run leaks, and the foreign
    run cannot be made to fail through a child."""
    secret = enqueue(shared_http, "secret:jobs", {"classified": True})
    unknown = "t_999999998"
    _, key = new_key(shared_http, WORKER, ["shop:*"])
    with shared_server.http(key) as shop:
        own = enqueue(shop, "shop:parents", 1)
        assert enqueue(shop, "shop:children", 2, parent=own)
        answers = {
            parent: shop.post("/v1/enqueue", json={"queue": "shop:children", "payload": 3, "parent": parent})
            for parent in (secret, unknown)
        }
        foreign = problem(answers[secret], 404, "task_not_found")
        nobody = problem(answers[unknown], 404, "task_not_found")
        assert _without(foreign, secret) == _without(nobody, unknown)
        items = [{"queue": "shop:children", "payload": 4},
                 {"queue": "shop:children", "payload": 5, "parent": secret}]  # fmt: skip
        as_list = shop.post("/v1/enqueue", json=items)
        assert _without(problem(as_list, 404, "task_not_found"), secret) == _without(nobody, unknown)
        children = shop.get("/v1/tasks", params={"queue": "shop:children"}).json()["tasks"]
        assert [c["payload"] for c in children] == [2], "nothing else was enqueued"
    run = shared_http.get(f"/v1/runs/{secret}").json()
    assert (run["status"], run["tasks"]) == ("running", 1)


def _error_shape(response: httpx.Response, *names: str) -> tuple[int, str]:
    """The status and error body with the names in it blanked: what a caller
    can tell two answers apart by."""
    return response.status_code, _without(response.json(), *names)


def test_a_scoped_admin_manages_only_keys_inside_its_scopes(
    shared_server: LiveServer, shared_http: httpx.Client
) -> None:
    secret_id, secret_key = new_key(shared_http, OBSERVER, ["secret:*"])
    _, shop_key = new_key(shared_http, ADMIN, ["shop:*"])
    with shared_server.http(shop_key) as shop:
        for ring, queues in ((ADMIN, ["*"]), (WORKER, ["secret:*"]), (WORKER, ["shop:*", "s*"]),
                             (WORKER, ["sho?:*"]), (WORKER, ["[s]hop:*"])):  # fmt: skip
            made = shop.post("/v1/keys", json={"ring": ring, "queues": queues})
            problem(made, 403, "forbidden")
        made = shop.post("/v1/keys", json={"ring": WORKER, "queues": ["shop:eu:*", "shop:orders"]})
        assert made.status_code == 201, made.text
        listed = shop.get("/v1/keys").json()["keys"]
        assert listed and all(k["queues"] and all(q.startswith("shop:") for q in k["queues"]) for k in listed)
        assert made.json()["id"] in [k["id"] for k in listed]
        assert secret_id not in [k["id"] for k in listed]
        foreign, missing = shop.delete(f"/v1/keys/{secret_id}"), shop.delete("/v1/keys/999999999")
        problem(foreign, 404, "key_not_found")
        assert _error_shape(foreign, str(secret_id)) == _error_shape(missing, "999999999")
    with shared_server.http(secret_key) as secret:
        assert secret.get("/v1/queues").status_code == 200, "the secret key was not revoked"


def test_a_scoped_admin_cannot_tell_a_foreign_schedule_from_a_missing_one(
    shared_server: LiveServer, shared_http: httpx.Client
) -> None:
    for name in ("payroll-nightly", "shop:taken"):
        schedule = {"name": name, "cron": "0 3 * * *", "queue": "secret:pay"}
        added = shared_http.post("/v1/schedules", json=schedule)
        assert added.status_code == 200, added.text
    _, shop_key = new_key(shared_http, ADMIN, ["shop:*"])
    with shared_server.http(shop_key) as shop:

        def add(name: str) -> httpx.Response:
            return shop.post("/v1/schedules", json={"name": name, "cron": "* * * * *", "queue": "shop:q"})

        # Outside the key's names, taken or free: the same refusal.
        taken, free = add("payroll-nightly"), add("payroll-free")
        problem(taken, 403, "forbidden")
        assert _error_shape(taken, "payroll-nightly") == _error_shape(free, "payroll-free")
        # Within them but taken on a queue it does not cover: refused the same way.
        assert _error_shape(add("shop:taken"), "shop:taken") == _error_shape(free, "payroll-free")
        assert add("shop:mine").status_code == 200
        for method, path in (("DELETE", "/v1/schedules/{}"), ("POST", "/v1/schedules/{}/pause")):
            foreign = shop.request(method, path.format("payroll-nightly"))
            missing = shop.request(method, path.format("no-such-schedule"))
            problem(foreign, 404, "schedule_not_found")
            assert _error_shape(foreign, "payroll-nightly") == _error_shape(missing, "no-such-schedule")
    kept = {s["name"]: s for s in shared_http.get("/v1/schedules").json()["schedules"]}
    assert kept["payroll-nightly"]["queue"] == kept["shop:taken"]["queue"] == "secret:pay"
    assert not kept["payroll-nightly"]["paused"]


def test_a_scoped_admin_removes_only_edges_it_may_add(
    shared_server: LiveServer, shared_http: httpx.Client
) -> None:
    edge = {"from_queue": "shop:orders", "to_queue": "billing:in"}
    assert shared_http.post("/v1/graph/edges", json=edge).status_code == 200
    _, shop_key = new_key(shared_http, ADMIN, ["shop:*"])
    with shared_server.http(shop_key) as shop:
        problem(shop.post("/v1/graph/edges", json=edge), 403, "forbidden")
        problem(shop.delete("/v1/graph/edges/shop:orders/billing:in"), 403, "forbidden")
    edges = shared_http.get("/v1/graph").json()["edges"]
    assert [e for e in edges if (e["from_queue"], e["to_queue"]) == ("shop:orders", "billing:in")]
