"""decorator-lite in Python: sets a request header, prepends a system message,
and marks the response with `x-decorated-by: python`. The request is the
host's: the plugin edits it through its methods and never parses the body.
It declares only the `request` hook, so the host keeps no instance across
the upstream call.

Build: componentize-py -d ../../../wit -w plugin componentize --stub-wasi app -o decorator-lite.wasm
"""

import json
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import (
    ChunkAction,
    ChunkAction_Pass,
    Content_Text,
    DirectResponse,
    Hooks,
    Message,
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

# Set by `configure`, which the host calls first on every instance.
config: dict = {}


def bad_request(message: str) -> RequestAction:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_messages"}
    body = json.dumps({"error": error}).encode()
    return RequestAction_Respond(DirectResponse(400, [("content-type", "application/json")], body))


class Filter(exports.Filter):
    def configure(self, config_json: str) -> Hooks:
        global config
        try:
            parsed = json.loads(config_json)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise Err("decorator-lite: the config is not a JSON object")
        for field in ("system", "header", "value"):
            if not isinstance(parsed.get(field), str):
                raise Err(f'decorator-lite: the config needs a string "{field}"')
        config = parsed
        return Hooks.REQUEST

    def request_filter(self, req: Request) -> RequestAction:
        # Counting is the cheap way to ask whether the body is a chat request.
        try:
            req.message_count()
        except Err:
            return bad_request('decorator-lite: the request body needs a "messages" array')
        req.set_header(config["header"], config["value"])
        req.splice_messages(0, 0, [Message("system", Content_Text(config["system"]), "{}")])
        req.set_response_header("x-decorated-by", "python")
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
