"""What tells agents and operators about a live service: /llms.txt, the
agent card, /openapi.json, /healthz, /readyz and Prometheus /metrics."""

from __future__ import annotations

import re

import httpx
from tests.e2e.live import LiveServer, claim_one, enqueue


def test_llms_txt_and_the_cards_point_at_the_endpoints(server: LiveServer) -> None:
    with server.http() as anonymous:  # no key needed to find out how to use the service
        llms = anonymous.get("/llms.txt")
        assert llms.status_code == 200 and llms.headers["content-type"].startswith("text/plain")
        for words in ("POST /v1/claim", "lease_token", "POST /v1/submit", "lease_lost", "/openapi.json"):
            assert words in llms.text

        card = anonymous.get("/.well-known/agent-card.json").json()
        assert card["name"] == "batonq" and card["url"] == f"{server.url}/v1"
        assert card["authentication"] == {"schemes": ["bearer"]}
        for link in ("documentation", "openapi", "mcp"):
            assert card[link].startswith(server.url)
            assert anonymous.get(card[link]).status_code == 200, link

        schema = anonymous.get(card["openapi"]).json()
        operations = {(method.upper(), path) for path, item in schema["paths"].items() for method in item}
        expected = {
            ("POST", "/v1/enqueue"), ("POST", "/v1/claim"), ("POST", "/v1/heartbeat"), ("POST", "/v1/submit"),
            ("POST", "/v1/fail"), ("POST", "/v1/release"), ("GET", "/v1/stream"), ("GET", "/v1/queues"),
            ("GET", "/v1/tasks"), ("GET", "/v1/tasks/{task_id}"), ("GET", "/v1/runs/{root_id}"),
            ("POST", "/v1/tasks/{task_id}/{action}"), ("PATCH", "/v1/queues/{queue}"), ("GET", "/v1/graph"),
            ("POST", "/v1/graph/edges"), ("DELETE", "/v1/graph/edges/{from_queue}/{to_queue}"),
            ("GET", "/v1/keys"), ("POST", "/v1/keys"), ("DELETE", "/v1/keys/{key_id}"),
            ("GET", "/v1/queues/{queue}/settings"), ("GET", "/v1/schedules"), ("POST", "/v1/schedules"),
            ("DELETE", "/v1/schedules/{name}"), ("POST", "/v1/schedules/{name}/{action}"),
            ("GET", "/v1/audit"),
        }  # fmt: skip
        assert operations == expected
        for method, path in expected:
            documented = schema["paths"][path][method.lower()]["responses"]
            assert {"400", "401", "403", "422"} <= set(documented), (method, path)


def test_health_readiness_and_metrics(server: LiveServer, http: httpx.Client) -> None:
    with server.http() as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok"}
        assert anonymous.get("/readyz").json() == {"status": "ready"}

    enqueue(http, "metrics:q", 1)
    enqueue(http, "metrics:q", 2)
    lease = claim_one(http, "metrics:q")
    assert http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": 1}).status_code == 200
    assert http.post("/v1/submit", json={"lease_token": lease["lease_token"], "result": 1}).status_code == 200
    assert http.get("/v1/tasks/t_424242").status_code == 404

    with server.http() as anonymous:
        response = anonymous.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in response.text.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['batonq_tasks{queue="metrics:q",state="done"}'] == 1
    assert samples['batonq_tasks{queue="metrics:q",state="pending"}'] == 1
    assert samples['batonq_claims_total{queue="metrics:q"}'] == 1
    assert samples['batonq_completions_total{outcome="accepted",queue="metrics:q"}'] == 1
    assert samples['batonq_completions_total{outcome="replayed",queue="metrics:q"}'] == 1
    assert "batonq_lease_expiries_total" in samples
    latency = [name for name in samples if name.startswith("batonq_http_request_duration_seconds_count")]
    routes = {re.search(r'route="([^"]*)"', name).group(1) for name in latency}  # type: ignore[union-attr]
    assert {"/v1/enqueue", "/v1/claim", "/v1/submit", "/v1/tasks/{task_id}"} <= routes
    assert (
        samples['batonq_http_request_duration_seconds_count{method="POST",route="/v1/enqueue",status="200"}']
        == 2
    )
    assert (
        samples[
            'batonq_http_request_duration_seconds_count{method="GET",route="/v1/tasks/{task_id}",status="404"}'
        ]
        == 1
    )
