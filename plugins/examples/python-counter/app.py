r"""A per-consumer request counter in Python, on the gateway's shared state
(`sluice:plugin/state`, the same interface token-quota uses from Rust). Each
request of a consumer (named by the route's auth plugin) counts once in a
time window; past `limit` the plugin answers OpenAI's 429 itself. Requests
without a consumer pass uncounted. The GatewayPlugin needs `state: {}`.

Config: {"limit": 100, "window": {"fixed": 60} | {"sliding": 60} | "calendarMonth",
         "header": "x-consumer-requests"}   # optional; also sets <header>-remaining

Build (from the repository root; `cargo xtask plugins` does this):
componentize-py -d wit -w stateful-plugin componentize --stub-wasi \
    -p plugins/examples/python-counter app -o plugins/dist/example-python-counter.wasm
"""

import json
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import host, state
from wit_world.imports.types import (
    ChunkAction,
    ChunkAction_Pass,
    DirectResponse,
    Hooks,
    LogLevel,
    Request,
    RequestAction,
    RequestAction_Continue,
    RequestAction_Respond,
    Response,
    ResponseAction,
    ResponseAction_Continue,
    ResponseEdits,
    ResponseSummary,
)

# The state interface's longest window: 31 days.
MAX_WINDOW_SECS = 2_678_400

# Set by `configure`, which the host calls once and snapshots.
limit: int = 0
window: state.Window = state.Window_CalendarMonth()
header: str = "x-consumer-requests"


def whole(value, low: int, high: int) -> bool:
    # JSON's true/false are Python ints too.
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def parse_window(spec) -> state.Window:
    if spec == "calendarMonth":
        return state.Window_CalendarMonth()
    if isinstance(spec, dict) and len(spec) == 1:
        ((kind, secs),) = spec.items()
        if kind in ("fixed", "sliding") and whole(secs, 1, MAX_WINDOW_SECS):
            return state.Window_Fixed(secs) if kind == "fixed" else state.Window_Sliding(secs)
    raise Err(
        'counter: "window" must be {"fixed": seconds}, {"sliding": seconds} '
        f'(1 to {MAX_WINDOW_SECS}) or "calendarMonth"'
    )


def fail(error: state.StateError) -> None:
    """The store is down or a cap was hit: raising anything but `Err` from
    `request_filter` traps the instance, so the GatewayPlugin's failure
    policy decides (`Closed`: a 500; `Open`: the request goes on uncounted),
    as token-quota's panic does. The log line says why; the trap cannot."""
    kind = "unavailable" if isinstance(error, state.StateError_Unavailable) else "refused"
    message = f"counter: the state store failed: {kind}: {error.value}"
    host.log(LogLevel.ERROR, message, [])
    raise RuntimeError(message)


def too_many(standing: state.Standing) -> RequestAction:
    """OpenAI's 429 for a request limit, with when to retry by the host's
    clock (`--stub-wasi` leaves Python without one)."""
    wait_ms = max(standing.reset_unix_ms - host.now_unix_ms(), 0)
    retry_after = max((wait_ms + 999) // 1000, 1)
    message = (
        f"Rate limit reached for requests: limit {standing.limit}, used {standing.used}. "
        f"Please try again in {retry_after}s."
    )
    error = {"message": message, "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    headers = [
        ("content-type", "application/json"),
        ("retry-after", str(retry_after)),
        (f"{header}-remaining", "0"),
    ]
    return RequestAction_Respond(DirectResponse(429, headers, json.dumps({"error": error}).encode()))


class Filter(exports.Filter):
    def configure(self, config_json: str) -> Hooks:
        global limit, window, header
        try:
            parsed = json.loads(config_json)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise Err("counter: the config is not a JSON object")
        unknown = sorted(set(parsed) - {"limit", "window", "header"})
        if unknown:
            raise Err(f"counter: unknown config field {unknown[0]!r}")
        if not whole(parsed.get("limit"), 0, 2**64 - 1):
            raise Err('counter: the config needs "limit", a whole number of requests')
        window = parse_window(parsed.get("window"))
        header = parsed.get("header", header)
        if not isinstance(header, str) or not header:
            raise Err('counter: "header" must be a header name')
        limit = parsed["limit"]
        return Hooks.REQUEST

    def request_filter(self, req: Request) -> RequestAction:
        consumer: Optional[str] = req.consumer()
        if consumer is None:
            return RequestAction_Continue()
        try:
            # Check and count in one atomic step: concurrent requests on any
            # replica never pass the limit together. Keys are this plugin's own.
            reserved = state.reserve([state.Check(consumer, window, limit, 1)])
        except Err as e:
            fail(e.value)
        if isinstance(reserved, state.Reserved_Refused):
            _, standings = reserved.value
            return too_many(standings[0])
        # The reservation is left to be dropped (its handle, when this
        # returns): a dropped reservation stays counted, and one request is
        # exactly what was reserved, so there is nothing to commit.
        _, standings = reserved.value
        req.set_response_header(header, str(standings[0].used))
        req.set_response_header(f"{header}-remaining", str(standings[0].remaining))
        return RequestAction_Continue()

    # Hooks not declared by `configure`: the host never calls them.
    def response_filter(self, resp: Response) -> ResponseAction:
        return ResponseAction_Continue(ResponseEdits([], []))

    def response_chunk(self, data: str) -> ChunkAction:
        return ChunkAction_Pass()

    def response_body(self, body: bytes) -> Optional[bytes]:
        return None

    def response_end(self, summary: ResponseSummary) -> None:
        pass
