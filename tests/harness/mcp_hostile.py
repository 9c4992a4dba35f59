"""A hostile MCP server for the MCP gateway's end-to-end tests
(tests/e2e/mcp_hostile.rs; tests/harness/mcp.rs starts it).

Usage: python mcp_hostile.py --name NAME [--port PORT] [--listing MODE]
                             [--initialize MODE] [--tools N]

Python's standard library only (http.server), so that every byte it sends
is the one written here. It serves Streamable HTTP at
http://127.0.0.1:PORT/mcp and prints `READY <port>` once it listens.

`initialize` is answered properly (JSON, with an Mcp-Session-Id) unless
`--initialize trickle` (an SSE answer sending a `: ping` comment every
100 ms, forever, never the answer), and any notification with 202; then
it misbehaves:

tools/list, by --listing:
  normal          one page naming the tools below
  huge            N tools (--tools, default 100000: about 5.5 MB) in one
                  page
  endless-cursor  one tool per page (`page0`, `page1`, ...), and always
                  a nextCursor
  trickle         an SSE answer sending a `: ping` comment every 100 ms,
                  forever, never the answer
  slow-head       never sends the response head
  not-json        a body that is not JSON
  poison          a `tools` list of things that are not tools (a number,
                  a string, null, an object without a name) and one tool,
                  `real`

tools/call, by the tool's name (`arguments.bytes` sizes the huge ones):
  ok                     a proper JSON answer: text `NAME ok`
  huge_json              a JSON answer of `bytes` bytes (default 256 KiB)
  huge_sse               one SSE event of `bytes` bytes, in one write
  sse_just_over          one SSE event whose data is `bytes` bytes (the
                         answer), all but its last 100 bytes in one
                         write, those and the event's end 200 ms later
  huge_sse_unterminated  an SSE `data:` line that grows 4 KiB at a time
                         up to `bytes` bytes and never ends, then holds
  progress_forever       SSE: a progress notification every 10 ms, forever
  flood                  SSE: 32 KiB progress notifications as fast as the
                         socket takes them, forever
  idle_stream            SSE: the head, then nothing
  idle_json              JSON: the head (Content-Length 100), then nothing
  slow_head              never sends the response head
  not_json               a JSON content type over a body that is not JSON
  not_utf8               bytes that are not UTF-8
  json_array             a JSON array
  not_jsonrpc            a JSON object that is no JSON-RPC message
  wrong_id               a proper answer to another id (`arguments.id`,
                         default "not-your-id"): `forged by NAME`
  sse_garbage            SSE events whose data is not JSON-RPC, then the
                         end of the stream
  sse_garbage_then_answer  the same, then the answer
  sse_wrong_id           SSE: the same answer to another id, then the end

GET /stats answers what it has seen: requests by method and tool, streams
open now, streams whose client (the gateway) went away, bytes written on
`flood` streams.
"""

import argparse
import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATS = {"requests": {}, "calls": {}, "open_streams": 0, "closed_streams": 0, "flood_bytes": 0}
LOCK = threading.Lock()
CALL_TOOLS = [
    "ok", "huge_json", "huge_sse", "huge_sse_unterminated", "progress_forever", "flood", "idle_stream",
    "idle_json", "slow_head", "not_json", "not_utf8", "json_array", "not_jsonrpc", "wrong_id", "sse_garbage",
    "sse_garbage_then_answer", "sse_wrong_id", "sse_just_over",
]


def count(kind, key):
    with LOCK:
        STATS[kind][key] = STATS[kind].get(key, 0) + 1


def add(key, n):
    with LOCK:
        STATS[key] += n


HUGE = []


def huge_tools():
    """The `huge` listing's tools as JSON, written once."""
    with LOCK:
        if not HUGE:
            tools = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(Handler.tools)]
            HUGE.append(json.dumps(tools).encode())
    return HUGE[0]


def tool(name):
    return {"name": name, "description": f"hostile {name}", "inputSchema": {"type": "object"}}


class Gone(Exception):
    """The client (the gateway) closed the connection."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_name_ = "hostile"
    listing = "normal"
    initialize = "normal"
    tools = 100_000

    def log_message(self, format, *args):
        pass

    # --- plumbing -------------------------------------------------------

    def head(self, status, content_type=None, length=None, extra=()):
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.flush()

    def whole(self, status, body, content_type="application/json", extra=()):
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        try:
            self.head(status, content_type, len(body), extra)
            self.wfile.write(body)
        except OSError:
            # The gateway stopped reading (an answer over its bound).
            self.close_connection = True

    def chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as error:
            raise Gone() from error

    def end_chunks(self):
        self.chunk(b"")

    def event(self, message):
        self.chunk("data: " + (message if isinstance(message, str) else json.dumps(message)) + "\n\n")

    def hold(self):
        """Waits until the gateway closes the connection."""
        sock = self.connection
        while True:
            readable, _, _ = select.select([sock], [], [], 0.1)
            if readable:
                try:
                    if sock.recv(1, socket.MSG_PEEK) == b"":
                        raise Gone()
                except OSError as error:
                    raise Gone() from error

    def stream(self, body):
        """Runs `body` as an SSE stream, counted open until it ends."""
        add("open_streams", 1)
        try:
            self.head(200, "text/event-stream")
            body()
            self.end_chunks()
        except Gone:
            add("closed_streams", 1)
            self.close_connection = True
        finally:
            add("open_streams", -1)

    # --- HTTP -----------------------------------------------------------

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                self.whole(200, json.dumps(STATS))
            return
        self.whole(405, b"", "text/plain")

    def do_DELETE(self):
        self.whole(200, b"", "text/plain")

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        try:
            message = json.loads(self.rfile.read(length))
        except ValueError:
            self.whole(400, {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}})
            return
        method = message.get("method", "")
        count("requests", method)
        rid = message.get("id")
        if rid is None:
            self.whole(202, b"", "text/plain")
            return
        if method == "initialize" and self.initialize == "trickle":
            self.trickle()
        elif method == "initialize":
            version = message.get("params", {}).get("protocolVersion", "2025-11-25")
            result = {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": self.server_name_, "version": "0"},
            }
            session = [("Mcp-Session-Id", f"{self.server_name_}-session")]
            self.whole(200, {"jsonrpc": "2.0", "id": rid, "result": result}, extra=session)
        elif method == "tools/list":
            self.tools_list(rid, message.get("params") or {})
        elif method == "tools/call":
            params = message.get("params") or {}
            name = params.get("name", "")
            count("calls", name)
            self.tools_call(rid, name, params.get("arguments") or {})
        else:
            self.whole(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no such method"}})

    def answer(self, rid, result):
        return {"jsonrpc": "2.0", "id": rid, "result": result}

    def tools_list(self, rid, params):
        mode = self.listing
        if mode == "normal":
            self.whole(200, self.answer(rid, {"tools": [tool(name) for name in CALL_TOOLS]}))
        elif mode == "huge":
            # Written once: answering many listings at once stays fast.
            body = b'{"jsonrpc": "2.0", "id": %s, "result": {"tools": %s}}' % (json.dumps(rid).encode(), huge_tools())
            self.whole(200, body)
        elif mode == "endless-cursor":
            page = int(str(params.get("cursor", "c0"))[1:] or 0)
            result = {"tools": [tool(f"page{page}")], "nextCursor": f"c{page + 1}"}
            self.whole(200, self.answer(rid, result))
        elif mode == "trickle":
            self.trickle()
        elif mode == "slow-head":
            try:
                self.hold()
            except Gone:
                add("closed_streams", 1)
                self.close_connection = True
        elif mode == "not-json":
            self.whole(200, b"<html>this is not JSON</html>")
        elif mode == "poison":
            poison = [7, "a string", None, {"description": "no name"}, {"name": 42}, tool("real")]
            self.whole(200, self.answer(rid, {"tools": poison}))
        else:
            raise SystemExit(f"unknown listing mode {mode}")

    def trickle(self):
        def body():
            while True:
                self.chunk(": ping\n\n")
                time.sleep(0.1)

        self.stream(body)

    def tools_call(self, rid, name, arguments):
        size = int(arguments.get("bytes", 256 * 1024))
        text = lambda text: {"content": [{"type": "text", "text": text}]}
        progress = lambda n, pad="": {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": "p", "progress": n, "message": pad},
        }
        if name == "ok":
            self.whole(200, self.answer(rid, text(f"{self.server_name_} ok")))
        elif name == "huge_json":
            self.whole(200, self.answer(rid, text("x" * size)))
        elif name == "huge_sse":

            def body():
                self.event(self.answer(rid, text("x" * size)))

            self.stream(body)
        elif name == "sse_just_over":
            empty = json.dumps(self.answer(rid, text("")))
            data = json.dumps(self.answer(rid, text("x" * (size - len(empty)))))
            assert len(data) == size

            def body():
                self.chunk("data: " + data[:-100])
                time.sleep(0.2)
                self.chunk(data[-100:] + "\n\n")

            self.stream(body)
        elif name == "huge_sse_unterminated":

            def body():
                self.chunk('data: {"jsonrpc": "2.0", "id": ' + json.dumps(rid) + ', "result": "')
                sent = 0
                while sent < size:
                    self.chunk("x" * 4096)
                    sent += 4096
                self.hold()

            self.stream(body)
        elif name == "progress_forever":

            def body():
                n = 0
                while True:
                    n += 1
                    self.event(progress(n))
                    time.sleep(0.01)

            self.stream(body)
        elif name == "flood":
            event = ("data: " + json.dumps(progress(1, "y" * 32 * 1024)) + "\n\n").encode()

            def body():
                while True:
                    self.chunk(event)
                    add("flood_bytes", len(event))

            self.stream(body)
        elif name == "idle_stream":
            self.stream(self.hold)
        elif name == "idle_json":
            add("open_streams", 1)
            try:
                self.head(200, "application/json", 100)
                self.hold()
            except Gone:
                add("closed_streams", 1)
                self.close_connection = True
            finally:
                add("open_streams", -1)
        elif name == "slow_head":
            try:
                self.hold()
            except Gone:
                add("closed_streams", 1)
                self.close_connection = True
        elif name == "not_json":
            self.whole(200, b"this is {not JSON")
        elif name == "not_utf8":
            self.whole(200, b'{"jsonrpc": "2.0", "id": 1, "result": "\xff\xfe"}')
        elif name == "json_array":
            self.whole(200, [self.answer(rid, text("in an array"))])
        elif name == "not_jsonrpc":
            self.whole(200, {"hello": "world"})
        elif name == "wrong_id":
            self.whole(200, self.answer(arguments.get("id", "not-your-id"), text(f"forged by {self.server_name_}")))
        elif name in ("sse_garbage", "sse_garbage_then_answer"):

            def body():
                for garbage in ["not json at all", "[1, 2, 3]", '"a string"', "{\"unclosed\": ", "\u00ff\u00fe"]:
                    self.event(garbage)
                self.chunk("event: weird\nid: 9\n\n")
                if name == "sse_garbage_then_answer":
                    self.event(self.answer(rid, text("after the garbage")))

            self.stream(body)
        elif name == "sse_wrong_id":

            def body():
                self.event(self.answer(arguments.get("id", "not-your-id"), text(f"forged by {self.server_name_}")))

            self.stream(body)
        else:
            self.whole(200, {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"unknown tool {name}"}})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--listing", default="normal")
    parser.add_argument("--initialize", default="normal")
    parser.add_argument("--tools", type=int, default=100_000)
    args = parser.parse_args()
    Handler.server_name_ = args.name
    Handler.listing = args.listing
    Handler.initialize = args.initialize
    Handler.tools = args.tools
    if args.listing == "huge":
        huge_tools()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
