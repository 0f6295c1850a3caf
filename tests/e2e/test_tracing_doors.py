"""docs/observability.md's setups, run as written, export to an OTLP/HTTP
receiver on localhost:4318: ``opentelemetry-instrument batonq serve`` and
``... batonq worker``, with a caller's trace context on an HTTP request and
an MCP call; and the program's own SDK setup."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from packaging.requirements import Requirement
from tests.e2e.live import LiveServer
from tests.mcp_server.support import http_session
from tests.waiting import wait_for

PAGE = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
APPS = Path(__file__).resolve().parents[1] / "apps"
BIN = Path(sys.executable).parent


class Receiver:
    """The spans OTLP/HTTP exporters sent, as dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}.get("service.name")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    with self.lock:
                        self.spans.append({
                            "name": span.name, "service": service, "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(), "parent_id": span.parent_span_id.hex(),
                            "attributes": attributes,
                        })  # fmt: skip

    def named(self, name: str, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["name"] == name and s["trace_id"] == trace_id]


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """On 127.0.0.1:4318, the docs' endpoint (OTLP/HTTP's default port)."""
    received = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                received.add(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 4318), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield received
    server.shutdown()
    server.server_close()


def _blocks(tag: str) -> list[str]:
    """The page's fenced blocks tagged ``tag`` (every fence read as one, so
    a closing fence never opens the next block)."""
    fences = re.findall(r"^```(\w*)\n(.*?)^```$", PAGE.read_text(encoding="utf-8"), re.DOTALL | re.M)
    return [body for found, body in fences if found == tag]


def _cli_setup() -> tuple[list[Requirement], dict[str, str], list[list[str]]]:
    """The page's launcher block: what it installs, exports and runs."""
    (block,) = [b for b in _blocks("") if "opentelemetry-instrument" in b]
    installs: list[Requirement] = []
    env: dict[str, str] = {}
    commands: list[list[str]] = []
    for line in block.splitlines():
        words = shlex.split(line)
        if words[:2] == ["pip", "install"]:
            installs += [Requirement(word) for word in words[2:]]
        elif words[:1] == ["export"]:
            env |= dict(word.split("=", 1) for word in words[1:])
        else:
            commands.append(words)
    return installs, env, commands


TRACE_1, CALLER_1 = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACE_2, CALLER_2 = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
TRACE_3, CALLER_3 = "5c0cb6a8cf1b4f4e9b6f6a1d2e3f4a5b", "1a2b3c4d5e6f7a8b"


async def test_serve_and_worker_traced_as_the_page_sets_them_up(
    receiver: Receiver, serve_dsn: str, dsn: str
) -> None:
    installs, env, commands = _cli_setup()
    for requirement in installs:  # installed here by the dev extra
        extras = distribution(requirement.name).metadata.get_all("Provides-Extra") or []
        assert requirement.extras <= set(extras), requirement
    assert commands == [["opentelemetry-instrument", "batonq", "serve"],
                        ["opentelemetry-instrument", "batonq", "worker", "myapp.tasks:app"]]  # fmt: skip
    launcher = (str(BIN / "opentelemetry-instrument"),)
    env |= {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # export at once, not after 5 s
    server = LiveServer(serve_dsn, launcher=launcher, env=env)
    try:
        assert server.admin_key
        with server.http(server.admin_key) as http:
            answer = http.post("/v1/enqueue", json={"queue": "shop:tasks", "payload": {"sku": 1}},
                               headers={"traceparent": f"00-{TRACE_1}-{CALLER_1}-01"})  # fmt: skip
            assert answer.status_code == 200, answer.text
            # A worker over HTTP: the claim hands it the task's context, and
            # its submit's traceparent becomes the baton's parent.
            edge = {"from_queue": "http:a", "to_queue": "http:b"}
            assert http.post("/v1/graph/edges", json=edge).is_success
            http.post("/v1/enqueue", json={"queue": "http:a", "payload": 1},
                      headers={"traceparent": f"00-{TRACE_3}-{CALLER_3}-01"}).raise_for_status()  # fmt: skip
            claimed = http.post("/v1/claim", json={"queue": "http:a"}).json()
            assert claimed["trace_context"]["traceparent"].startswith(f"00-{TRACE_3}-")
            submit = http.post("/v1/submit", json={"lease_token": claimed["lease_token"], "result": 2},
                               headers={"traceparent": claimed["trace_context"]["traceparent"]})  # fmt: skip
            assert submit.json()["state"] == "done", submit.text
            baton = http.post("/v1/claim", json={"queue": "http:b"}).json()
        async with http_session(f"{server.url}/mcp", server.admin_key) as session:
            meta = {"traceparent": f"00-{TRACE_2}-{CALLER_2}-01"}
            result = await session.call_tool("batonq_enqueue", {"queue": "shop:emails", "payload": "a@b.c"},
                                              meta=meta)  # type: ignore[arg-type]  # fmt: skip
            assert not result.is_error
    finally:
        server.stop()
    worker_env = {k: v for k, v in os.environ.items() if not k.startswith("BATONQ_")}
    worker_env |= env | {"BATONQ_DATABASE_URL": dsn}
    run = subprocess.run([*launcher, str(BIN / "batonq"), *commands[1][2:], "--burst"],
                         cwd=APPS, env=worker_env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr

    def the_http_trace() -> dict[str, Any] | None:
        spans = {name: receiver.named(name, TRACE_1)
                 for name in ("POST /v1/enqueue", "send shop:tasks", "process shop:tasks")}  # fmt: skip
        return spans if all(spans.values()) else None

    spans = wait_for(the_http_trace, timeout=30, what="the HTTP request's trace")
    (request,) = spans["POST /v1/enqueue"]
    (send,) = spans["send shop:tasks"]
    (run_span,) = spans["process shop:tasks"]
    assert request["parent_id"] == CALLER_1 and request["service"] == "batonq"
    assert send["parent_id"] == request["span_id"]
    assert run_span["parent_id"] == send["span_id"]
    assert run_span["attributes"]["batonq.outcome"] == "done"

    submits = wait_for(lambda: receiver.named("POST /v1/submit", TRACE_3), timeout=30, what="the submit")
    (submit_span,) = submits
    assert baton["trace_context"]["traceparent"] == f"00-{TRACE_3}-{submit_span['span_id']}-01"

    def the_mcp_trace() -> dict[str, Any] | None:
        names = ("tools/call batonq_enqueue", "send shop:emails", "process shop:emails")
        spans = {name: receiver.named(name, TRACE_2) for name in names}
        return spans if all(spans.values()) else None

    spans = wait_for(the_mcp_trace, timeout=30, what="the MCP call's trace")
    (tool,) = spans["tools/call batonq_enqueue"]
    (send,) = spans["send shop:emails"]
    assert tool["parent_id"] == CALLER_2
    assert tool["attributes"]["gen_ai.tool.name"] == "batonq_enqueue"
    assert tool["attributes"]["mcp.method.name"] == "tools/call"
    assert send["parent_id"] == tool["span_id"]
    assert spans["process shop:emails"][0]["parent_id"] == send["span_id"]


def test_the_programs_setup_exports_its_enqueues(receiver: Receiver, dsn: str) -> None:
    """The page's Python block, then an enqueue in a span of the program's
    own: the OTLP exporter sends both, the enqueue's the child."""
    (setup,) = _blocks("python")
    script = setup + (
        "import batonq\n"
        "with batonq.connect(listen=False) as client:\n"
        "    with trace.get_tracer('shop').start_as_current_span('order'):\n"
        "        client.enqueue('shop:tasks', {'sku': 2})\n"
        "provider.shutdown()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATONQ_", "OTEL_"))}
    run = subprocess.run([sys.executable, "-c", script], env=env | {"BATONQ_DATABASE_URL": dsn},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    with receiver.lock:
        (order,) = [s for s in receiver.spans if s["name"] == "order"]
    (send,) = receiver.named("send shop:tasks", order["trace_id"])
    assert send["parent_id"] == order["span_id"] and send["service"] == "shop"
    assert send["attributes"]["messaging.system"] == "batonq"
