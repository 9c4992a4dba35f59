//! Talking to one upstream MCP server over Streamable HTTP: a message
//! POSTed with the server's own session, and its answer read whole (for
//! the exchanges the gateway merges) or relayed as it streams.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use super::session::{Record, Upstream};
use crate::snapshot::McpServer;
use crate::sse::{EventSplitter, data_of};

pub const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
pub const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
const ACCEPT_BOTH: HeaderValue = HeaderValue::from_static("application/json, text/event-stream");
const ACCEPT_STREAM: HeaderValue = HeaderValue::from_static("text/event-stream");

/// The longest `Mcp-Session-Id` a server may hand out.
pub const MAX_UPSTREAM_SESSION_ID_BYTES: usize = 256;

/// How a session record names the endpoint a session was opened on: the
/// first 8 bytes of its URL's SHA-256, in hex (the URL itself could be
/// 2 KiB, and the record travels on every request).
pub fn endpoint_tag(url: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(url.as_bytes())[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Why a server's answer could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("server `{server}` could not be reached: {why}")]
    Unreachable { server: String, why: String },
    #[error("server `{server}` did not answer within {} ms", .after.as_millis())]
    Timeout { server: String, after: Duration },
    /// The server no longer knows the session (it restarted): 404.
    #[error("server `{server}` no longer knows the session")]
    SessionGone { server: String },
    #[error("server `{server}` answered HTTP {status}")]
    Status { server: String, status: u16 },
    #[error("server `{server}` sent a bad answer: {why}")]
    Malformed { server: String, why: String },
}

/// The headers of the client's request that reach a server: trace context
/// and request id. Never its credentials: the auth plugin consumed them,
/// and a server gets its own (`apiKey`).
pub const PASSED_ON: [HeaderName; 3] = [
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
    HeaderName::from_static("x-request-id"),
];

/// Sends one message to `server`, in its session if it has one, and
/// returns the response head once it arrives (within the server's
/// timeout). A 404 on a session is [`Failure::SessionGone`].
pub async fn post(
    server: &McpServer,
    session: Option<&Upstream>,
    message: Bytes,
    passed_on: &HeaderMap,
) -> Result<http::Response<Incoming>, Failure> {
    let mut request = http::Request::new(Full::new(message));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = server.uri.clone();
    let headers = request.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::ACCEPT, ACCEPT_BOTH);
    session_headers(headers, server, session, passed_on);
    let response = send(server, request).await?;
    match response.status() {
        StatusCode::NOT_FOUND if session.is_some_and(|s| s.s.is_some()) => {
            Err(Failure::SessionGone { server: server.name.clone() })
        }
        status if status.is_success() => Ok(response),
        // A JSON-RPC error in the body at a 4xx (the spec's way at
        // 2026-07-28): the answer, relayed as any other.
        status if status.is_client_error() && is_json(response.headers()) => Ok(response),
        status => Err(Failure::Status { server: server.name.clone(), status: status.as_u16() }),
    }
}

fn is_json(headers: &HeaderMap) -> bool {
    content_type_is(headers, "application/json")
}

/// Whether the response's media type is `media_type` (parameters aside).
fn content_type_is(headers: &HeaderMap, media_type: &str) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with(media_type))
}

/// Opens the server's stream of messages outside any request (GET).
/// `None` when the server offers none (405).
pub async fn listen(
    server: &McpServer,
    session: &Upstream,
    passed_on: &HeaderMap,
) -> Result<Option<http::Response<Incoming>>, Failure> {
    let mut request = http::Request::new(Full::new(Bytes::new()));
    *request.uri_mut() = server.uri.clone();
    request.headers_mut().insert(header::ACCEPT, ACCEPT_STREAM);
    session_headers(request.headers_mut(), server, Some(session), passed_on);
    let response = send(server, request).await?;
    match response.status() {
        StatusCode::METHOD_NOT_ALLOWED => Ok(None),
        StatusCode::NOT_FOUND => Err(Failure::SessionGone { server: server.name.clone() }),
        status if status.is_success() => Ok(Some(response)),
        status => Err(Failure::Status { server: server.name.clone(), status: status.as_u16() }),
    }
}

/// Ends the server's session (DELETE); failures are only logged: the
/// client's session ends either way.
pub async fn end(server: &McpServer, session: &Upstream, passed_on: &HeaderMap) {
    let mut request = http::Request::new(Full::new(Bytes::new()));
    *request.method_mut() = Method::DELETE;
    *request.uri_mut() = server.uri.clone();
    session_headers(request.headers_mut(), server, Some(session), passed_on);
    if let Err(error) = send(server, request).await {
        tracing::debug!(server = %server.name, %error, "ending an upstream MCP session");
    }
}

fn session_headers(headers: &mut HeaderMap, server: &McpServer, session: Option<&Upstream>, passed_on: &HeaderMap) {
    // Chosen by the caller: trace context, request id, the consumer.
    for (name, value) in passed_on {
        headers.insert(name, value.clone());
    }
    if let Some(credential) = &server.credential {
        headers.insert(header::AUTHORIZATION, credential.clone());
    }
    if let Some(session) = session {
        if let Some(id) = session.s.as_deref().and_then(|id| HeaderValue::from_str(id).ok()) {
            headers.insert(SESSION_HEADER, id);
        }
        if let Ok(version) = HeaderValue::from_str(&session.v) {
            headers.insert(VERSION_HEADER, version);
        }
    }
}

async fn send(server: &McpServer, request: http::Request<Full<Bytes>>) -> Result<http::Response<Incoming>, Failure> {
    let sent = server.client.send(request);
    match tokio::time::timeout(server.timeout, sent).await {
        Err(_) => Err(Failure::Timeout { server: server.name.clone(), after: server.timeout }),
        Ok(Err(error)) => {
            let why = match crate::upstream::Refused::found_in(&error) {
                Some(refused) => refused.to_string(),
                None => error_chain(&error),
            };
            Err(Failure::Unreachable { server: server.name.clone(), why })
        }
        Ok(Ok(response)) => Ok(response),
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        text.push_str(": ");
        text.push_str(&error.to_string());
        cause = error.source();
    }
    text
}

/// Whether a response streams (SSE) rather than answering with one JSON
/// message.
pub fn is_stream(headers: &HeaderMap) -> bool {
    content_type_is(headers, "text/event-stream")
}

/// Reads the answer to request `id` from a response, JSON or SSE, as the
/// message's text: what else the stream carries (progress, logs) is
/// dropped, as the gateway answers the client itself. Bounded by `limit`
/// bytes in all and `idle` between frames; the caller bounds the whole
/// exchange (a server trickling keep-alives is cut there).
pub async fn answer(
    server: &str,
    response: http::Response<Incoming>,
    id: &Value,
    limit: usize,
    idle: Duration,
) -> Result<String, Failure> {
    let malformed = |why: String| Failure::Malformed { server: server.to_string(), why };
    let streamed = is_stream(response.headers());
    let mut body = response.into_body();
    let mut splitter = EventSplitter::default();
    let mut read = 0usize;
    let mut json = Vec::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(Failure::Timeout { server: server.to_string(), after: idle }),
            Ok(None) => break,
            Ok(Some(frame)) => frame.map_err(|e| Failure::Unreachable { server: server.into(), why: e.to_string() })?,
        };
        let Ok(data) = frame.into_data() else { continue };
        read += data.len();
        if read > limit {
            return Err(malformed(format!("its answer is over {limit} bytes")));
        }
        if !streamed {
            json.extend_from_slice(&data);
            continue;
        }
        splitter.push(&data);
        while let Some(event) = splitter.next_event() {
            if let Some(data) = data_of(&event).filter(|data| answers(data, id)) {
                return Ok(data);
            }
        }
    }
    if streamed {
        return match splitter.remainder().and_then(|rest| data_of(&rest)).filter(|data| answers(data, id)) {
            Some(data) => Ok(data),
            None => Err(malformed("its stream ended without the answer".into())),
        };
    }
    let text = String::from_utf8(json).map_err(|_| malformed("its answer is not UTF-8".into()))?;
    if answers(&text, id) {
        Ok(text)
    } else {
        Err(malformed("its answer is not a JSON-RPC response to the request".into()))
    }
}

/// The members of a JSON-RPC message that say what it is, read without
/// building the rest (a listing's items are parsed only if kept).
#[derive(serde::Deserialize)]
pub struct Envelope<'a> {
    #[serde(default)]
    pub id: Option<Value>,
    #[serde(default, borrow)]
    pub method: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub result: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub error: Option<&'a RawValue>,
}

/// Whether `text` is a JSON-RPC answer (result or error) to request `id`.
fn answers(text: &str, id: &Value) -> bool {
    serde_json::from_str::<Envelope>(text).is_ok_and(|message| {
        message.id.as_ref() == Some(id)
            && message.method.is_none()
            && (message.result.is_some() || message.error.is_some())
    })
}

/// Opens a session with `server` as the client opened its own: the
/// client's `initialize` params at `version`, then
/// `notifications/initialized`. Returns the server's side of the session
/// and its `initialize` result.
pub async fn initialize(
    server: &McpServer,
    params: &Value,
    version: &str,
    passed_on: &HeaderMap,
    limit: usize,
) -> Result<(Upstream, Value), Failure> {
    // One deadline for the whole exchange: a server that trickles
    // keep-alives must not hold a new session (every server's) open.
    let opened = initialize_unbounded(server, params, version, passed_on, limit);
    tokio::time::timeout(server.timeout, opened)
        .await
        .unwrap_or_else(|_| Err(Failure::Timeout { server: server.name.clone(), after: server.timeout }))
}

async fn initialize_unbounded(
    server: &McpServer,
    params: &Value,
    version: &str,
    passed_on: &HeaderMap,
    limit: usize,
) -> Result<(Upstream, Value), Failure> {
    let mut params = params.clone();
    if let Some(params) = params.as_object_mut() {
        params.insert("protocolVersion".into(), Value::String(version.into()));
    }
    let id = json!("sluice-initialize");
    let message = json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params});
    let response = post(server, None, Bytes::from(message.to_string()), passed_on).await?;
    let session = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(String::from);
    // Carried in the client's session id on every request: a server may
    // not make that arbitrarily large.
    if session.as_ref().is_some_and(|s| s.len() > MAX_UPSTREAM_SESSION_ID_BYTES) {
        let why = format!("its Mcp-Session-Id is over {MAX_UPSTREAM_SESSION_ID_BYTES} bytes");
        return Err(Failure::Malformed { server: server.name.clone(), why });
    }
    let answer = answer(&server.name, response, &id, limit, server.timeout).await?;
    let malformed = |why: &str| Failure::Malformed { server: server.name.clone(), why: why.into() };
    let answer: Value = serde_json::from_str(&answer).map_err(|_| malformed("its answer is not JSON"))?;
    if let Some(error) = answer.get("error") {
        return Err(malformed(&format!("it refused `initialize`: {error}")));
    }
    let result = answer.get("result").cloned().ok_or_else(|| malformed("no result"))?;
    let negotiated = result.get("protocolVersion").and_then(Value::as_str).unwrap_or(version).to_string();
    let upstream = Upstream { n: server.name.clone(), u: endpoint_tag(&server.url), s: session, v: negotiated };
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    notify(server, &upstream, &initialized, passed_on).await;
    Ok((upstream, result))
}

/// Sends a notification; its answer (202) carries nothing, and a failure
/// is logged only.
pub async fn notify(server: &McpServer, session: &Upstream, message: &Value, passed_on: &HeaderMap) {
    match post(server, Some(session), Bytes::from(message.to_string()), passed_on).await {
        Ok(response) => drop(response),
        Err(error) => tracing::debug!(server = %server.name, %error, "an MCP notification was not delivered"),
    }
}

/// The server's side of `record`'s session, opening one if it has none
/// (the server was added to the route since, or failed at `initialize`).
pub async fn session_of(
    server: &McpServer,
    record: &Record,
    passed_on: &HeaderMap,
    limit: usize,
) -> Result<Upstream, Failure> {
    // Opened on the endpoint the route names now: its session. One opened
    // where the route pointed before lives there, and its id is not for
    // another server to see: a new session is opened instead.
    match record.upstream_at(&server.name, &endpoint_tag(&server.url)) {
        Some(upstream) => Ok(upstream.clone()),
        None => initialize(server, &record.i, &record.v, passed_on, limit).await.map(|(upstream, _)| upstream),
    }
}

/// Sends `message` in the server's session; if the server forgot the
/// session (it restarted), opens a new one as the client opened its own
/// and sends it again. Each request of an old session then pays for that
/// until the client starts a new session: the id it holds cannot change.
pub async fn post_in_session(
    server: &McpServer,
    record: &Record,
    message: Bytes,
    passed_on: &HeaderMap,
    limit: usize,
) -> Result<(http::Response<Incoming>, Upstream), Failure> {
    let session = session_of(server, record, passed_on, limit).await?;
    match post(server, Some(&session), message.clone(), passed_on).await {
        Err(Failure::SessionGone { .. }) => {
            tracing::info!(server = %server.name, "the upstream MCP server forgot the session; opening another");
            let (fresh, _) = initialize(server, &record.i, &record.v, passed_on, limit).await?;
            let response = post(server, Some(&fresh), message, passed_on).await?;
            Ok((response, fresh))
        }
        other => other.map(|response| (response, session)),
    }
}
