"""batonq's MCP server, on the official ``mcp`` SDK: tools for agents to
enqueue, claim, heartbeat, complete and fail tasks and to read queues, a guide
resource, and a "work through queue Q" prompt.

- ``batonq mcp`` serves it over stdio (``serve_stdio``) for a local agent;
- ``batonq serve`` mounts it as streamable HTTP at ``/mcp`` (``batonq.mcp.http``),
  behind the service's Bearer keys.

A read-only caller (a ring 3 key, or ``--read-only``) sees only the reading tools.
"""

from batonq.mcp.server import build_server, serve_stdio

__all__ = ["build_server", "serve_stdio"]
