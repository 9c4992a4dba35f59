//! The 2026-07-28 revision: no sessions. Each request carries its
//! revision, client info and capabilities in `params._meta`, and its
//! method (and name) again in headers (`Mcp-Method`, `Mcp-Name`), which
//! must agree with the body. The gateway answers `server/discover` for
//! the route's servers together, and routes each request as in a session,
//! forwarding it with headers written from the body it forwards.
//!
//! A route is spoken to at this revision when every one of its servers
//! speaks it; otherwise `server/discover` is answered with the handshake
//! revisions, and clients fall back to `initialize`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};
use sluice_telemetry::{Label, RequestRecord};

use super::dispatch::{self, Via};
use super::jsonrpc::{
    INVALID_PARAMS, METHOD_NOT_FOUND, Message, PROTOCOL_VERSIONS, UNSUPPORTED_VERSION, accepted, rpc_error, rpc_result,
};
use super::names::{self, Listing};
use super::stream;
use super::upstream::{self, Failure, VERSION_HEADER};
use crate::body::Body;
use crate::gateway::Gateway;
use crate::snapshot::McpRoute;

pub const MODERN: &str = "2026-07-28";
const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");
/// Arguments a tool declares to be mirrored in headers: passed on as the
/// client wrote them (they carry values, not names).
const PARAM_HEADER_PREFIX: &str = "mcp-param-";
/// The headers disagree with the body.
const HEADER_MISMATCH: i64 = -32020;

/// The headers a request at this revision reaches a server with: the
/// revision, the method and name as the forwarded body says, and the
/// client's `Mcp-Param-*`.
fn headers_for(passed_on: &HeaderMap, client: &HeaderMap, method: &str, name: Option<&str>) -> HeaderMap {
    let mut headers = passed_on.clone();
    headers.insert(VERSION_HEADER, HeaderValue::from_static(MODERN));
    if let Ok(method) = HeaderValue::from_str(method) {
        headers.insert(METHOD_HEADER, method);
    }
    if let Some(value) = name.map(header_value) {
        headers.insert(NAME_HEADER, value);
    }
    for (header, value) in client {
        if header.as_str().starts_with(PARAM_HEADER_PREFIX) {
            headers.append(header, value.clone());
        }
    }
    headers
}

/// A name as a header carries it: printable ASCII as is, anything else in
/// the spec's `=?base64?…?=` wrapping.
fn header_value(name: &str) -> HeaderValue {
    let plain = !name.is_empty()
        && name.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !name.starts_with(' ')
        && !name.ends_with(' ')
        && !name.starts_with("=?base64?");
    let text = if plain { name.to_string() } else { format!("=?base64?{}?=", STANDARD.encode(name)) };
    HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static(""))
}

/// One message at 2026-07-28, past the chain.
pub async fn handle(
    gateway: &Gateway,
    route: &McpRoute,
    mut message: Message,
    client: &HeaderMap,
    (passed_on, engaged): (&HeaderMap, Vec<crate::chain::Engaged>),
    record: &mut RequestRecord,
) -> http::Response<Body> {
    let id = message.id.clone().unwrap_or(Value::Null);
    let method = message.method.clone().unwrap_or_default();
    let said = client.get(METHOD_HEADER).and_then(|v| v.to_str().ok());
    if said != Some(method.as_str()) {
        let why = "the Mcp-Method header does not match the message's method";
        return rpc_error(StatusCode::BAD_REQUEST, id, HEADER_MISMATCH, why);
    }
    let meta = message.params().and_then(|p| p.get("_meta")).cloned();
    let version = meta.as_ref().and_then(|m| m.get("io.modelcontextprotocol/protocolVersion")).and_then(Value::as_str);
    if message.method.is_some() && message.id.is_some() && version != Some(MODERN) {
        let why = "params._meta must carry the protocol version the MCP-Protocol-Version header names";
        return rpc_error(StatusCode::BAD_REQUEST, id, HEADER_MISMATCH, why);
    }
    let limit = route.limit(gateway.settings.max_body_bytes);
    if message.id.is_none() {
        // A notification (a cancel): every server may be the one it is for.
        let headers = headers_for(passed_on, client, &method, None);
        let bytes = message.bytes();
        let sent = route.servers.iter().map(|server| {
            let (headers, bytes) = (&headers, bytes.clone());
            async move {
                if let Err(error) = upstream::post(server, None, bytes, headers).await {
                    tracing::debug!(server = %server.name, %error, "an MCP notification was not delivered");
                }
            }
        });
        futures_util::future::join_all(sent).await;
        return accepted();
    }
    match method.as_str() {
        "server/discover" => return discover(route, &message, client, passed_on, limit).await,
        "ping" => return rpc_result(id, json!({})),
        "subscriptions/listen" => return listen(route, &message, client, passed_on, limit).await,
        _ => {}
    }
    if let Some(listing) = Listing::of(&method) {
        let headers = headers_for(passed_on, client, &method, None);
        let meta = meta.unwrap_or(json!({}));
        return dispatch::list(route, Via::Modern { meta: &meta, headers: &headers }, &message, listing, limit).await;
    }
    let Some((server, rename)) = dispatch::target(route, &mut message, &method) else {
        let why = format!("method `{method}` is not served by this gateway, or names no server of the route");
        return rpc_error(StatusCode::OK, id, METHOD_NOT_FOUND, &why);
    };
    let server = match server {
        Ok(server) => server,
        Err((code, why)) => return rpc_error(StatusCode::OK, id, code, &why),
    };
    let member = if method == "resources/read" { "uri" } else { "name" };
    let name = message.params().and_then(|p| p.get(member)).and_then(Value::as_str).map(String::from);
    let name_bearing = matches!(method.as_str(), "tools/call" | "prompts/get" | "resources/read");
    let headers = headers_for(passed_on, client, &method, name.as_deref().filter(|_| name_bearing));
    let call = stream::Call {
        id: id.clone(),
        tool: (method == "tools/call").then(|| names::prefixed(&server.name, name.as_deref().unwrap_or_default())),
        started: std::time::Instant::now(),
        consumer: record.consumer.clone(),
        engaged,
    };
    record.backend = Some(Label::from(server.url.as_str()));
    let sent = upstream::post(server, None, message.bytes(), &headers).await;
    stream::answered(route, server, sent, (rename, call, None), limit)
}

/// `server/discover` for the route: its servers' answers merged, if every
/// one speaks this revision; else the handshake revisions, so the client
/// falls back to `initialize`.
async fn discover(
    route: &McpRoute,
    message: &Message,
    client: &HeaderMap,
    passed_on: &HeaderMap,
    limit: usize,
) -> http::Response<Body> {
    let id = message.id.clone().unwrap_or(Value::Null);
    let headers = headers_for(passed_on, client, "server/discover", None);
    let asked = route.servers.iter().map(|server| {
        let (headers, id) = (&headers, &id);
        let asked = async move {
            let response = upstream::post(server, None, message.bytes(), headers).await?;
            let answer = upstream::answer(&server.name, response, id, limit, server.timeout).await?;
            let malformed = |why: &str| Failure::Malformed { server: server.name.clone(), why: why.into() };
            let answer: Value = serde_json::from_str(&answer).map_err(|_| malformed("its answer is not JSON"))?;
            answer.get("result").cloned().ok_or_else(|| malformed("no discover result"))
        };
        // One deadline for the exchange: a trickling server cannot hold
        // every client's discovery.
        async move {
            tokio::time::timeout(server.timeout, asked)
                .await
                .unwrap_or_else(|_| Err(Failure::Timeout { server: server.name.clone(), after: server.timeout }))
        }
    });
    let mut capabilities = Vec::new();
    for result in futures_util::future::join_all(asked).await {
        let modern = result.as_ref().ok().and_then(|r| r.get("supportedVersions")).and_then(Value::as_array);
        match modern {
            Some(versions) if versions.iter().any(|v| v == MODERN) => {
                capabilities.push(result.ok().and_then(|r| r.get("capabilities").cloned()).unwrap_or(json!({})));
            }
            _ => {
                if let Err(error) = result {
                    tracing::info!(route = %route.label, %error, "an MCP server does not speak 2026-07-28");
                }
                return unsupported(id);
            }
        }
    }
    rpc_result(
        id,
        json!({
            "supportedVersions": [MODERN],
            "capabilities": names::merge_capabilities(&capabilities),
            "cacheScope": "private",
            "ttlMs": 0,
            "resultType": "complete",
            "_meta": {"io.modelcontextprotocol/serverInfo":
                {"name": "sluice", "title": route.label.to_string(), "version": env!("CARGO_PKG_VERSION")}},
        }),
    )
}

/// MCP's "unsupported protocol version", naming the handshake revisions.
fn unsupported(id: Value) -> http::Response<Body> {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": {
        "code": UNSUPPORTED_VERSION,
        "message": format!("this route speaks {} (one of its servers does not speak {MODERN})", PROTOCOL_VERSIONS.join(", ")),
        "data": {"supported": PROTOCOL_VERSIONS, "requested": MODERN},
    }});
    crate::body::json_response(StatusCode::BAD_REQUEST, body.to_string().into_bytes())
}

/// `subscriptions/listen`: every server's notification stream, merged.
async fn listen(
    route: &McpRoute,
    message: &Message,
    client: &HeaderMap,
    passed_on: &HeaderMap,
    limit: usize,
) -> http::Response<Body> {
    let id = message.id.clone().unwrap_or(Value::Null);
    let headers = headers_for(passed_on, client, "subscriptions/listen", None);
    let opened = route.servers.iter().map(|server| {
        let headers = &headers;
        async move { (server, upstream::post(server, None, message.bytes(), headers).await) }
    });
    let mut streams = Vec::new();
    for (server, opened) in futures_util::future::join_all(opened).await {
        match opened {
            Ok(response) if upstream::is_stream(response.headers()) => streams.push((server.name.clone(), response)),
            Ok(_) => {
                tracing::debug!(server = %server.name, "an MCP server answered subscriptions/listen without a stream")
            }
            Err(error) => tracing::debug!(route = %route.label, %error, "an MCP server's stream is left out"),
        }
    }
    if streams.is_empty() {
        return rpc_error(StatusCode::OK, id, INVALID_PARAMS, "no server of this route offers a notification stream");
    }
    stream::merged(route, streams, None, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_printable_ascii_are_wrapped() {
        assert_eq!(header_value("echo"), "echo");
        assert_eq!(header_value("wetter-überall"), "=?base64?d2V0dGVyLcO8YmVyYWxs?=");
        assert_eq!(header_value(" padded"), "=?base64?IHBhZGRlZA==?=");
    }

    #[test]
    fn headers_are_written_from_the_body_with_the_clients_params() {
        let client: HeaderMap = [
            (HeaderName::from_static("mcp-name"), HeaderValue::from_static("weather__forecast")),
            (HeaderName::from_static("mcp-param-city"), HeaderValue::from_static("Lyon")),
            (HeaderName::from_static("authorization"), HeaderValue::from_static("Bearer secret")),
        ]
        .into_iter()
        .collect();
        let headers = headers_for(&HeaderMap::new(), &client, "tools/call", Some("forecast"));
        assert_eq!(headers.get("mcp-name").unwrap(), "forecast");
        assert_eq!(headers.get("mcp-method").unwrap(), "tools/call");
        assert_eq!(headers.get("mcp-protocol-version").unwrap(), MODERN);
        assert_eq!(headers.get("mcp-param-city").unwrap(), "Lyon");
        assert!(headers.get("authorization").is_none());
    }
}
