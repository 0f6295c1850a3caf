"""`batonq serve --log-format json`: every line on stderr is one JSON object."""

from __future__ import annotations

import json

from tests.e2e.conftest import Serve
from tests.waiting import wait_for


def test_json_logs_are_one_object_a_line_with_each_requests_fields(serve: Serve) -> None:
    server = serve("--log-format", "json", "--log-level", "info")
    assert server.admin_key, server.log
    with server.http(server.admin_key) as http:
        assert http.get("/v1/queues").status_code == 200
        assert http.get("/v1/tasks/t_999999").status_code == 404

    def entries() -> list[dict[str, object]] | None:
        lines = [line for line in server.log.splitlines() if line.strip()]
        parsed = [json.loads(line) for line in lines]  # a line that is not JSON fails here
        return parsed if any(e.get("path") == "/v1/tasks/t_999999" for e in parsed) else None

    logged = wait_for(entries, timeout=10, what="the access entry of the 404")
    for entry in logged:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
    [key] = [e for e in logged if "admin_key" in e]
    assert key["admin_key"] == server.admin_key and key["level"] == "warning"
    [missing] = [e for e in logged if e.get("path") == "/v1/tasks/t_999999"]
    assert missing["method"] == "GET" and missing["status"] == 404 and missing["logger"] == "uvicorn.access"
    assert any(e.get("logger") == "uvicorn.error" and "startup complete" in str(e["message"]) for e in logged)
