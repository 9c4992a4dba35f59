//! JSON-RPC as MCP speaks it: a client's message, the error codes, and the
//! answers the gateway writes itself. Every error an MCP client sees is
//! written here ([`rpc_error`]), as chat errors are in `crate::body`.

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::{Map, Value, json};

use crate::body::{Body, full, json_response};

/// The handshake-era revisions this gateway speaks with clients, newest
/// first (2026-07-28 is `modern::MODERN`). 2024-11-05 over Streamable HTTP,
/// as the official SDK speaks it; its own HTTP+SSE transport is not served.
pub const PROTOCOL_VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

// JSON-RPC's codes, and MCP's.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// A server-defined code (-32000 to -32099): a server could not be reached
/// or answered badly.
pub const UPSTREAM_ERROR: i64 = -32002;
/// A plugin or the route's tool lists refused the call.
pub const REFUSED: i64 = -32001;
/// MCP's "unsupported protocol version".
pub const UNSUPPORTED_VERSION: i64 = -32022;
/// One JSON-RPC message from a client.
pub struct Message {
    /// The message as parsed; forwarded as written again from this.
    pub value: Value,
    pub id: Option<Value>,
    pub method: Option<String>,
}

impl Message {
    pub fn parse(body: &[u8]) -> Result<Message, (i64, String)> {
        let value: Value = serde_json::from_slice(body).map_err(|e| (PARSE_ERROR, format!("not JSON: {e}")))?;
        if value.is_array() {
            // Batches left the protocol in 2025-06-18; no client sends them.
            return Err((INVALID_REQUEST, "JSON-RPC batches are not supported".into()));
        }
        let Some(object) = value.as_object() else {
            return Err((INVALID_REQUEST, "a JSON-RPC message is an object".into()));
        };
        if object.get("jsonrpc") != Some(&Value::String("2.0".into())) {
            return Err((INVALID_REQUEST, "`jsonrpc` must be \"2.0\"".into()));
        }
        let id = object.get("id").cloned();
        if id.as_ref().is_some_and(|id| !(id.is_string() || id.is_number())) {
            return Err((INVALID_REQUEST, "`id` must be a string or a number".into()));
        }
        let method = match object.get("method") {
            None => None,
            Some(Value::String(method)) => Some(method.clone()),
            Some(_) => return Err((INVALID_REQUEST, "`method` must be a string".into())),
        };
        if method.is_none() && (id.is_none() || !(object.contains_key("result") || object.contains_key("error"))) {
            return Err((INVALID_REQUEST, "a message needs a `method`, or an `id` and a `result` or `error`".into()));
        }
        Ok(Message { value, id, method })
    }

    pub fn params(&self) -> Option<&Map<String, Value>> {
        self.value.get("params").and_then(Value::as_object)
    }

    pub fn params_mut(&mut self) -> Option<&mut Map<String, Value>> {
        self.value.get_mut("params").and_then(Value::as_object_mut)
    }

    pub fn bytes(&self) -> Bytes {
        Bytes::from(self.value.to_string())
    }
}

/// MCP's answer to a revision it does not speak (-32022), naming those it
/// does.
pub fn unsupported_version(asked: &HeaderValue) -> http::Response<Body> {
    let asked = String::from_utf8_lossy(asked.as_bytes());
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {
        "code": UNSUPPORTED_VERSION,
        "message": format!("unsupported MCP-Protocol-Version `{asked}`; this gateway speaks {}", PROTOCOL_VERSIONS.join(", ")),
        "data": {"supported": PROTOCOL_VERSIONS, "requested": asked},
    }});
    json_response(StatusCode::BAD_REQUEST, body.to_string().into_bytes())
}

pub fn accepted() -> http::Response<Body> {
    let mut response = http::Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::ACCEPTED;
    response
}

pub fn rpc_result(id: Value, result: Value) -> http::Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "result": result});
    json_response(StatusCode::OK, body.to_string().into_bytes())
}

/// Every error an MCP client sees goes through here, in JSON-RPC's shape
/// (the MCP counterpart of [`crate::body::error_response`]).
pub fn rpc_error(status: StatusCode, id: Value, code: i64, message: &str) -> http::Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    json_response(status, body.to_string().into_bytes())
}
