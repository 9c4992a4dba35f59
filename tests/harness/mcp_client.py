"""A command-line MCP client driving the official MCP Python SDK (`mcp`,
pinned in PYTHON_TOOLS, crates/xtask/src/toolchain.rs): its `ClientSession`
over its Streamable HTTP transport, for the MCP gateway's end-to-end tests
(tests/harness/mcp.rs runs it).

Usage: python mcp_client.py URL SCENARIO [ARGS...] [options]

It prints one JSON object on stdout and exits 0 once the scenario ran, even
if its result is an error (reported in the object); it exits non-zero, with
a message on stderr, when the connection itself failed. The object also has
"protocol", the negotiated version, and "session_id", the Mcp-Session-Id
the server gave (null if none).

What the SDK does on its own: after a tools/call it lists the tools once
(tools/list) to check results against their output schemas; at 2026-07-28
this client asks for log messages (`log_level`, an opt-in per request).

Scenarios:
  list                          connect; the server's identity, the
                                negotiated version, capabilities and tools
  call NAME ARGS_JSON           {"content", "structured", "is_error"}, or
                                {"error": {"code", "message"}} on a JSON-RPC
                                error
  progress NAME ARGS_JSON       a call with a progress callback:
                                {"progress": [[p, total, message]...],
                                "logs": [...], "result": ...}
  cancel NAME ARGS_JSON AFTER_MS
                                start the call, cancel it after AFTER_MS
                                (the SDK's way: cancelling the awaiting
                                task), then the --then call on the same
                                session, if given
  prompts                       list prompts, get the first (every argument
                                "world")
  resources                     list resources and templates, read the first
  sequence                      the steps of a JSON list on stdin,
                                [{"call": NAME, "args": {...}}, ...], on one
                                session
  session-out FILE              connect, write the Mcp-Session-Id to FILE
                                and leave the session open (no DELETE), for
                                another run's --session-id

Options:
  --header 'Name: value'  an HTTP header on every request (repeatable)
  --protocol P            how to negotiate (default `auto`, see below)
  --alternate URL2        every HTTP request goes alternately to URL and to
                          URL2 (same path; their scheme, host and port)
  --then NAME ARGS_JSON   for `cancel`: the call made after the cancel
  --session-id ID         continue the handshake-era session ID (opened by
                          `session-out`) instead of opening one
  --sampling-reply TEXT   answer the server's sampling requests with TEXT
                          (without it the SDK refuses them)
  --trace                 add "http": every HTTP request the SDK made (method,
                          target, headers, JSON-RPC body and method), and its
                          response's status and headers

Protocol negotiation (--protocol):
  auto        the SDK's default (`Client(mode="auto")`): POST `server/discover`
              at the newest modern version (2026-07-28, MCP-Protocol-Version
              header and `_meta`); on any JSON-RPC error except -32022 with a
              modern-only list (and on a result naming no modern version) it
              falls back to the `initialize` handshake, offering 2025-11-25.
  legacy      the handshake only (`Client(mode="legacy")`), offering
              2025-11-25
  2025-06-18 (any handshake-era version)
              the handshake, offering that version (the SDK always offers
              2025-11-25; this sends the same request with another version)
  2026-07-28  `server/discover` at that version, no fallback
"""

import argparse
import json
import sys
import time
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp.client._probe import negotiate_auto
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.exceptions import MCPError
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    KNOWN_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)


def dump(model: Any) -> Any:
    """A pydantic model as its wire JSON."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def error_object(e: MCPError) -> dict[str, Any]:
    error: dict[str, Any] = {"code": e.code, "message": e.message}
    if e.data is not None:
        error["data"] = e.data
    return {"error": error}


class Wire(httpx2.AsyncBaseTransport):
    """Under the SDK's HTTP client: sends each request to the next of
    `targets` in turn (with `--alternate`), and records what went where and
    the Mcp-Session-Id the server gave."""

    def __init__(self, targets: list[httpx2.URL]) -> None:
        self.inner = httpx2.AsyncHTTPTransport(trust_env=False)
        self.targets = targets
        self.sent = 0
        self.log: list[dict[str, Any]] = []
        self.session_id: str | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        target = self.targets[self.sent % len(self.targets)]
        self.sent += 1
        request.url = request.url.copy_with(scheme=target.scheme, host=target.host, port=target.port)
        request.headers["host"] = request.url.netloc.decode("ascii")
        entry: dict[str, Any] = {"method": request.method, "url": str(request.url), "headers": dict(request.headers)}
        if request.method == "POST":
            try:
                entry["body"] = json.loads(request.content)
                entry["rpc"] = entry["body"].get("method", "(response)")
            except (httpx2.RequestNotRead, ValueError, AttributeError):
                pass
        self.log.append(entry)
        response = await self.inner.handle_async_request(request)
        entry["status"] = response.status_code
        entry["response_headers"] = dict(response.headers)
        if session_id := response.headers.get("mcp-session-id"):
            self.session_id = session_id
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def connect(session: ClientSession, protocol: str, resume: str | None) -> None:
    """Negotiates the protocol version as --protocol says (see the module doc)."""
    if resume is not None:
        # The SDK has no call to join an existing session: its transport sends
        # Mcp-Session-Id once `initialize` answered with one. So the header
        # comes from the HTTP client's defaults (see run) and the handshake's
        # outcome is installed without the handshake, with `adopt`, as a
        # client that initialized earlier would have it.
        version = protocol if protocol in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
        session.adopt(
            types.InitializeResult(
                protocol_version=version,
                capabilities=types.ServerCapabilities(),
                server_info=types.Implementation(name="(resumed)", version=""),
            )
        )
    elif protocol == "auto":
        # What `mcp.Client` does by default (mode="auto"); the policy lives in
        # this private module, imported rather than copied.
        await negotiate_auto(session)
    elif protocol in ("legacy", LATEST_HANDSHAKE_VERSION):
        await session.initialize()
    elif protocol in HANDSHAKE_PROTOCOL_VERSIONS:
        # `ClientSession.initialize` with another offered version.
        result = await session.send_request(
            types.InitializeRequest(
                params=types.InitializeRequestParams(
                    protocol_version=protocol,
                    capabilities=types.ClientCapabilities(),
                    client_info=types.Implementation(name="mcp", version="0.1.0"),
                )
            ),
            types.InitializeResult,
        )
        session.adopt(result)
        await session.send_notification(types.InitializedNotification())
    else:  # a modern version (main checked)
        await session.discover()


def call_result(result: types.CallToolResult) -> dict[str, Any]:
    return {
        "content": [dump(block) for block in result.content],
        "structured": result.structured_content,
        "is_error": bool(result.is_error),
    }


async def call(session: ClientSession, name: str, args: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    try:
        return call_result(await session.call_tool(name, args, **kwargs))
    except MCPError as e:
        return error_object(e)


async def scenario(session: ClientSession, opts: argparse.Namespace, logs: list[Any], wire: Wire) -> dict[str, Any]:
    name, rest = opts.scenario, opts.args
    if name == "list":
        tools = await session.list_tools()
        server = session.server_info
        capabilities = session.server_capabilities
        return {
            "server": dump(server) if server is not None else None,
            "protocol": session.protocol_version,
            "capabilities": dump(capabilities) if capabilities is not None else None,
            "tools": [tool.name for tool in tools.tools],
            "tools_full": [dump(tool) for tool in tools.tools],
        }
    if name == "call":
        return await call(session, rest[0], json.loads(rest[1]))
    if name == "progress":
        progress: list[list[Any]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append([value, total, message])

        result = await call(session, rest[0], json.loads(rest[1]), progress_callback=on_progress)
        return {"progress": progress, "logs": logs, "result": result}
    if name == "cancel":
        after = int(rest[2]) / 1000
        outcome: dict[str, Any] = {}
        started = time.monotonic()
        # Cancelling the task that awaits the call is how the SDK cancels:
        # its dispatcher then sends `notifications/cancelled` (handshake era),
        # or its transport closes the request's response stream (2026-07-28).
        with anyio.move_on_after(after) as scope:
            outcome["result"] = await call(session, rest[0], json.loads(rest[1]))
        outcome["cancelled"] = scope.cancelled_caught
        outcome["elapsed_ms"] = round((time.monotonic() - started) * 1000)
        if opts.then:
            outcome["then"] = await call(session, opts.then[0], json.loads(opts.then[1]))
        return outcome
    if name == "prompts":
        prompts = await session.list_prompts()
        out: dict[str, Any] = {"prompts": [dump(prompt) for prompt in prompts.prompts]}
        if prompts.prompts:
            first = prompts.prompts[0]
            arguments = {argument.name: "world" for argument in first.arguments or []}
            try:
                out["get"] = dump(await session.get_prompt(first.name, arguments))
            except MCPError as e:
                out["get"] = error_object(e)
        return out
    if name == "resources":
        resources = await session.list_resources()
        templates = await session.list_resource_templates()
        out = {
            "resources": [dump(resource) for resource in resources.resources],
            "templates": [dump(template) for template in templates.resource_templates],
        }
        if resources.resources:
            try:
                out["read"] = dump(await session.read_resource(str(resources.resources[0].uri)))
            except MCPError as e:
                out["read"] = error_object(e)
        return out
    if name == "sequence":
        steps = json.load(sys.stdin)
        return {"results": [await call(session, step["call"], step.get("args") or {}) for step in steps]}
    if name == "session-out":
        with open(rest[0], "w") as file:
            file.write(wire.session_id or "")
        return {"protocol": session.protocol_version}
    raise AssertionError(f"unknown scenario {name!r}")  # argparse's choices exclude it


ARITY = {"list": 0, "call": 2, "progress": 2, "cancel": 3, "prompts": 0, "resources": 0, "sequence": 0, "session-out": 1}


class Failed(Exception):
    """The connection failed: why, and the HTTP exchanges until then."""


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    url = httpx2.URL(opts.url)
    targets = [url] if opts.alternate is None else [url, httpx2.URL(opts.alternate)]
    wire = Wire(targets)
    headers = dict(opts.headers)
    if opts.session_id is not None:
        headers["mcp-session-id"] = opts.session_id
    logs: list[Any] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(dump(params))

    async def on_sampling(_context: Any, _params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        # The client's "model": it answers every sampling request so.
        reply = types.TextContent(type="text", text=opts.sampling_reply or "")
        return types.CreateMessageResult(role="assistant", content=reply, model="e2e-client")

    # The SDK's default timeouts (create_mcp_http_client), over `wire`.
    http = httpx2.AsyncClient(
        transport=wire,
        headers=headers,
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        trust_env=False,
    )
    try:
        async with http, streamable_http_client(
            opts.url, http_client=http, terminate_on_close=opts.scenario != "session-out"
        ) as (read, write):
            # log_level: 2026-07-28 servers log only to requests that opt in.
            sampling = on_sampling if opts.sampling_reply is not None else None
            async with ClientSession(
                read, write, logging_callback=on_log, log_level="debug", sampling_callback=sampling
            ) as session:
                await connect(session, opts.protocol, opts.session_id)
                out = await scenario(session, opts, logs, wire)
    except Exception as e:  # an MCPError from the handshake, an ExceptionGroup from the transport, ...
        exchanges = ", ".join(f"{x['method']} {x.get('rpc', '')} -> {x.get('status', 'no response')}" for x in wire.log)
        raise Failed(f"{describe(e)} (HTTP: {exchanges or 'none'})") from None
    out.setdefault("protocol", session.protocol_version)
    out["session_id"] = wire.session_id or opts.session_id
    if opts.trace:
        out["http"] = wire.log
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("scenario", choices=sorted(ARITY))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--protocol", default="auto")
    parser.add_argument("--alternate")
    parser.add_argument("--then", nargs=2, metavar=("NAME", "ARGS_JSON"))
    parser.add_argument("--session-id")
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--sampling-reply")
    opts = parser.parse_intermixed_args()
    if opts.protocol not in ("auto", "legacy", *HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS):
        parser.error(f"--protocol {opts.protocol}: not auto, legacy or one of {KNOWN_PROTOCOL_VERSIONS}")
    if len(opts.args) != ARITY[opts.scenario]:
        parser.error(f"{opts.scenario} takes {ARITY[opts.scenario]} arguments, not {len(opts.args)}")
    opts.headers = []
    for header in opts.header:
        key, sep, value = header.partition(":")
        if not sep:
            parser.error(f"--header {header!r}: not 'Name: value'")
        opts.headers.append((key.strip(), value.strip()))
    try:
        out = anyio.run(run, opts)
    except Failed as e:
        print(f"mcp_client: {opts.scenario} against {opts.url} failed: {e}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(out))


def describe(e: BaseException) -> str:
    """The leaf exceptions of a group, one line each."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in e.exceptions)
    if isinstance(e, MCPError):
        return f"MCPError {e.code}: {e.message}"
    return f"{type(e).__name__}: {e}"


if __name__ == "__main__":
    main()
