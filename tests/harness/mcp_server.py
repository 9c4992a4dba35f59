"""An MCP server built with the official MCP Python SDK (`mcp`, pinned in
PYTHON_TOOLS, crates/xtask/src/toolchain.rs), for the MCP gateway's
end-to-end tests (tests/harness/mcp.rs starts it).

Usage: python mcp_server.py --name NAME [--port PORT] [--stateless] [--json]
                            [--resumable]

It serves the SDK's high-level `MCPServer` over Streamable HTTP at
http://127.0.0.1:PORT/mcp (PORT 0: one the kernel picks) and prints one
line, `READY <port>`, once it accepts connections. `--stateless` is the
SDK's `stateless_http` (no Mcp-Session-Id on the handshake era), `--json`
its `json_response` (one JSON body per POST instead of an SSE stream; so
no progress or log notifications), `--resumable` keeps the handshake era's
SSE events in memory, so that a client resumes a closed stream (GET with
Last-Event-ID; the `interrupt` tool closes its own).

Whatever the switches, the SDK also answers the 2026-07-28 era (a POST
whose MCP-Protocol-Version header names it: `server/discover`, then
self-contained requests, never a session), so a default SDK client talks
that era to it; `mcp_client.py --protocol legacy` talks the handshake era.

Tools (NAME is in their answers, so a test sees which server answered):
echo, add, count (progress and a log message), sleep (MCP_CANCEL_LOG gets
a line `cancelled` when a call is cancelled), ask (sampling: a request to
the client, in the handshake era), whoami, headers, big,
interrupt, fail (a JSON-RPC error); a prompt `greet`, a resource
`info://about` and a template `info://item/{id}`.

When a client cancels a `sleep`, the SDK cancels it here (MCP_CANCEL_LOG)
at once in two cases: at 2026-07-28 without --json (the client closes the
request's connection, the SDK's SSE path watches it), and in a handshake-era
session (the client POSTs `notifications/cancelled`). Otherwise the call
runs on: stateless, that notification has no session to find the call in
(the call is cancelled when the client closes its connection, as it exits),
and the 2026-07-28 JSON path does not watch the connection.

The SDK's DNS rebinding protection is off: a gateway in front may send its
own Host, which is not what the tests are about.
"""

import argparse
import json
import os
import socket
import sys
import warnings
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventMessage, EventStore
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

# ctx.info() is deprecated at 2026-07-28 (SEP-2577) but is how a
# handshake-era server logs to its client; the tests use both eras.
warnings.simplefilter("ignore", MCPDeprecationWarning)


def build(name: str) -> MCPServer:
    mcp = MCPServer(name, version="1.0.0", log_level="WARNING")

    @mcp.tool()
    def echo(text: str) -> str:
        """Returns the text, prefixed with the server's name."""
        return f"{name}:{text}"

    @mcp.tool()
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    @mcp.tool()
    async def count(n: int, ctx: Context, delay_ms: int = 50) -> str:
        """Sends n progress notifications, delay_ms apart, and one log message."""
        await ctx.info(f"{name} counting to {n}")
        for i in range(1, n + 1):
            await anyio.sleep(delay_ms / 1000)
            await ctx.report_progress(i, n, f"step {i}")
        return f"{name} counted {n}"

    @mcp.tool()
    async def sleep(seconds: float) -> str:
        """Sleeps; a cancelled call leaves a line in $MCP_CANCEL_LOG."""
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            log = os.environ.get("MCP_CANCEL_LOG")
            if log:
                with open(log, "a") as file:
                    file.write("cancelled\n")
            raise
        return "slept"

    @mcp.tool()
    def whoami(ctx: Context) -> str:
        """This server's name and pid, and the session and protocol version the request came with."""
        headers = ctx.headers or {}
        return json.dumps(
            {
                "server": name,
                "pid": os.getpid(),
                "session": headers.get("mcp-session-id"),
                "protocol": headers.get("mcp-protocol-version"),
            }
        )

    @mcp.tool()
    def headers(ctx: Context) -> str:
        """The HTTP request headers of this call, names lower case."""
        return json.dumps(dict(ctx.headers or {}))

    @mcp.tool()
    async def ask(question: str, ctx: Context) -> str:
        """Asks the client's model (sampling, a request from the server to the client) and returns its answer."""
        message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text=question))
        result = await ctx.session.create_message(messages=[message], max_tokens=16)
        return f"{name} heard {result.content.text}"

    @mcp.tool()
    def big(kib: int) -> str:
        """A text of kib KiB."""
        return "x" * (kib * 1024)

    @mcp.tool()
    async def interrupt(n: int, ctx: Context) -> str:
        """With --resumable: sends progress 1, closes the call's SSE stream, sends progress 2..n."""
        await ctx.report_progress(1, n, "before")
        # The client reconnects (GET, Last-Event-ID) and gets the rest from the
        # event store; a no-op without one.
        await ctx.close_sse_stream()
        for i in range(2, n + 1):
            await anyio.sleep(0.05)
            await ctx.report_progress(i, n, "after")
        return f"{name} resumed"

    @mcp.tool()
    def fail(code: int, message: str) -> str:
        """Answers with the JSON-RPC error `code`, `message` (not a tool error)."""
        raise MCPError(code=code, message=message)

    @mcp.prompt()
    def greet(who: str) -> str:
        """A greeting."""
        return f"{name} greets {who}"

    @mcp.resource("info://about")
    def about() -> str:
        return f"about {name}"

    @mcp.resource("info://item/{id}")
    def item(id: str) -> str:
        return f"{name} item {id}"

    return mcp


class MemoryEventStore(EventStore):
    """Every SSE event of the handshake era's streams, so that a client can
    resume one (GET with Last-Event-ID); the SDK ships only the interface."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(len(self.events) + 1)
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        index = next((i for i, event in enumerate(self.events) if event[0] == last_event_id), None)
        if index is None:
            return None
        stream_id = self.events[index][1]
        for event_id, stream, message in self.events[index + 1 :]:
            # None is a priming event: an id, no message.
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


async def serve(args: argparse.Namespace) -> None:
    app = build(args.name).streamable_http_app(
        streamable_http_path="/mcp",
        stateless_http=args.stateless,
        json_response=args.json,
        event_store=MemoryEventStore() if args.resumable else None,
        # How long the client waits before it resumes a closed stream.
        retry_interval=100 if args.resumable else None,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    # Bound here, so that with port 0 the chosen port is known, and with
    # SO_REUSEADDR so that a restart takes the same port at once. IPPROTO_TCP
    # named: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it each answer after a connection's first waits ~40 ms for a
    # delayed ACK (Nagle's algorithm).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", args.port))
    except OSError as e:
        # Worded as the harness's retry on another port expects it.
        print(f"binding 127.0.0.1:{args.port}: address already in use ({e})", file=sys.stderr, flush=True)
        sys.exit(1)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:
            if server.should_exit:
                return
            await anyio.sleep(0.01)
        print(f"READY {port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--stateless", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--resumable", action="store_true")
    anyio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()
