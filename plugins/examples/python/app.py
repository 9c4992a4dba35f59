"""decorator-lite in Python: prepends a system message, sets a request header,
and marks the response with `x-decorated-by: python`.

Build: componentize-py -d ../../../wit -w plugin componentize --stub-wasi app -o decorator-lite.wasm
"""

import json
from typing import Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports.types import (
    ChunkAction,
    ChunkAction_Pass,
    DirectResponse,
    Hooks,
    Request,
    RequestAction,
    RequestAction_Continue,
    RequestAction_Respond,
    RequestEdits,
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
        return Hooks.REQUEST | Hooks.RESPONSE_HEAD

    def request_filter(self, req: Request) -> RequestAction:
        try:
            body = json.loads(req.body)
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return bad_request('decorator-lite: the request body needs a "messages" array')
        body["messages"].insert(0, {"role": "system", "content": config["system"]})
        edits = RequestEdits([(config["header"], config["value"])], [], json.dumps(body).encode())
        return RequestAction_Continue(edits)

    def response_filter(self, resp: Response) -> ResponseAction:
        return ResponseAction_Continue(ResponseEdits([("x-decorated-by", "python")], []))

    # Hooks not declared by `configure`: the host never calls them.
    def response_chunk(self, data: str) -> ChunkAction:
        return ChunkAction_Pass()

    def response_body(self, body: bytes) -> Optional[bytes]:
        return None

    def response_end(self, summary: ResponseSummary) -> None:
        pass
