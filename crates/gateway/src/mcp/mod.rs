//! The MCP gateway: Model Context Protocol servers behind one path, over
//! Streamable HTTP (docs/mcp.md). Each client message ([`jsonrpc`])
//! passes the route's plugin chain here, then goes, in the handshake era,
//! through the session its id carries ([`session`], so any replica
//! continues any session) or, at 2026-07-28, stands alone ([`modern`]);
//! it is merged from every server or routed to one by its name's prefix
//! ([`dispatch`], [`names`]), sent to the server ([`upstream`]), and its
//! answer relayed event by event ([`stream`]).

mod dispatch;
mod jsonrpc;
mod modern;
mod names;
pub mod session;
pub mod shares;
mod stream;
mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use hyper::body::Incoming;
use serde_json::{Value, json};
use sluice_core::ApiError;
use sluice_runtime::{McpRequest, PluginRequest};
use sluice_telemetry::{Label, RequestRecord};

use crate::body::{Body, full, json_response};
use crate::chain::{Engaged, McpFiltered, mcp_filters, set_all};
use crate::gateway::Gateway;
use crate::snapshot::McpRoute;
use dispatch::Via;
pub use jsonrpc::PROTOCOL_VERSIONS;
use jsonrpc::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, Message, REFUSED, UPSTREAM_ERROR, accepted,
    rpc_error, rpc_result, unsupported_version,
};
use names::Listing;
use session::Record;
use upstream::{Failure, SESSION_HEADER, VERSION_HEADER};

/// The most of a client's `initialize` (capabilities and client info) a
/// session keeps.
const MAX_KEPT_BYTES: usize = 2048;

/// Serves one HTTP request to an MCP route's path.
pub async fn serve(
    gateway: &Gateway,
    route: &Arc<McpRoute>,
    request: http::Request<Incoming>,
    record: &mut RequestRecord,
) -> Result<http::Response<Body>, ApiError> {
    record.route = Some(route.label.clone());
    match *request.method() {
        Method::POST => post(gateway, route, request, record).await,
        Method::GET => Ok(listen(gateway, route, request, record).await),
        Method::DELETE => Ok(end(gateway, route, request, record).await),
        ref method => Err(ApiError::method_not_allowed(method.as_str(), &route.decl.path)),
    }
}

/// The Protected Resource Metadata (RFC 9728) of the MCP route at `path`,
/// if it declares its authorization.
pub fn metadata(route: &McpRoute, headers: &HeaderMap) -> Option<http::Response<Body>> {
    let authorization = route.decl.authorization.as_ref()?;
    let resource = authorization.resource.clone().unwrap_or_else(|| resource_url(headers, &route.decl.path));
    let mut body = json!({
        "resource": resource,
        "authorization_servers": authorization.authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": route.label.to_string(),
    });
    if !authorization.scopes.is_empty() {
        body["scopes_supported"] = json!(authorization.scopes);
    }
    Some(json_response(StatusCode::OK, body.to_string().into_bytes()))
}

/// The route's URL as the client reached it: the scheme a proxy in front
/// says (`x-forwarded-proto`), else http, and the `host` it named.
fn resource_url(headers: &HeaderMap, path: &str) -> String {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let scheme = match text("x-forwarded-proto") {
        Some("https") => "https",
        _ => "http",
    };
    let host = text("host").filter(|h| h.bytes().all(|b| b.is_ascii_graphic())).unwrap_or("localhost");
    format!("{scheme}://{host}{path}")
}

/// Where a route's metadata is served: RFC 9728's well-known path with
/// the resource's path appended.
pub const METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";

async fn post(
    gateway: &Gateway,
    route: &Arc<McpRoute>,
    request: http::Request<Incoming>,
    record: &mut RequestRecord,
) -> Result<http::Response<Body>, ApiError> {
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.to_ascii_lowercase().starts_with("application/json") {
        return Err(ApiError::new(
            415,
            sluice_core::ErrorType::InvalidRequestError,
            "unsupported_media_type",
            "an MCP message is POSTed as application/json",
        ));
    }
    let modern = request.headers().get(VERSION_HEADER).is_some_and(|v| v == modern::MODERN);
    if let Some(version) = request.headers().get(VERSION_HEADER).filter(|_| !modern) {
        let known = version.to_str().ok().is_some_and(|v| PROTOCOL_VERSIONS.contains(&v));
        if !known {
            // A revision this gateway does not speak: the error names those
            // it does, and the client chooses again.
            return Ok(unsupported_version(version));
        }
    }
    let limit = route.limit(gateway.settings.max_body_bytes);
    let (parts, body) = request.into_parts();
    let (body, _budget) = crate::request_body::read_body_within(gateway, body, &parts.headers, limit).await?;
    let mut message = match Message::parse(&body) {
        Ok(message) => message,
        Err((code, why)) => return Ok(rpc_error(StatusCode::BAD_REQUEST, Value::Null, code, &why)),
    };
    let id = message.id.clone().unwrap_or(Value::Null);
    let method = message.method.clone().unwrap_or_default();
    record.mcp_method = Some(method[..method.floor_char_boundary(64)].to_string());
    if method == "tools/call"
        && let Some(tool) = message.params().and_then(|p| p.get("name")).and_then(Value::as_str)
    {
        record.tool = Some(tool[..tool.floor_char_boundary(256)].to_string());
    }

    // Every message passes the chain, `initialize` included: the auth
    // plugin sees each, as it sees each chat request.
    let forward = match filter(route, &parts, &mut message, &body, record).await {
        Ok(Filtered::Forward(headers, mark, engaged)) => (headers, mark, engaged),
        Ok(Filtered::Refused(response)) => return Ok(response),
        Err(error) => return Ok(rpc_error(StatusCode::OK, id, INTERNAL_ERROR, &error.message)),
    };
    let (passed_on, marks, engaged) = forward;

    let mut response = if modern {
        modern::handle(gateway, route, message, &parts.headers, (&passed_on, engaged), record).await
    } else if method == "initialize" {
        initialize(gateway, route, &message, &passed_on).await
    } else if method == "ping" {
        rpc_result(id, json!({}))
    } else if method == "server/discover" {
        rpc_error(
            StatusCode::OK,
            id,
            METHOD_NOT_FOUND,
            "server/discover is asked at 2026-07-28 (its MCP-Protocol-Version header)",
        )
    } else {
        let Some(session) = parts.headers.get(SESSION_HEADER) else {
            let why = "the Mcp-Session-Id header is required: start with `initialize`";
            return Ok(rpc_error(StatusCode::BAD_REQUEST, id, INVALID_REQUEST, why));
        };
        let record_of =
            session.to_str().ok().map(|s| gateway.settings.mcp_session_keys.open(s, &route.decl.key.to_string()));
        let session = match record_of {
            Some(Ok(session)) => session,
            Some(Err(why)) => return Ok(rpc_error(StatusCode::NOT_FOUND, id, INVALID_REQUEST, &why.to_string())),
            None => return Ok(rpc_error(StatusCode::NOT_FOUND, id, INVALID_REQUEST, "the session id is not text")),
        };
        let key = parts.headers.get(SESSION_HEADER).cloned();
        in_session(gateway, route, &session, message, method, (&passed_on, engaged), key, record).await
    };
    set_all(response.headers_mut(), &marks);
    Ok(response)
}

enum Filtered {
    /// Go on, with the headers passed on to servers, those set for the
    /// client's response, and the plugins that see the answer.
    Forward(HeaderMap, HeaderMap, Vec<Engaged>),
    Refused(http::Response<Body>),
}

/// The message through the route's chain. A plugin's refusal becomes a
/// JSON-RPC error the SDKs raise, except a 401, which stays HTTP so that
/// clients start OAuth (with the route's resource metadata named).
async fn filter(
    route: &McpRoute,
    parts: &http::request::Parts,
    message: &mut Message,
    body: &Bytes,
    record: &mut RequestRecord,
) -> Result<Filtered, ApiError> {
    let passed_on = || passed_on(&parts.headers);
    if route.chain.is_empty() {
        return Ok(Filtered::Forward(passed_on(), HeaderMap::new(), Vec::new()));
    }
    if let Some(name) = sluice_runtime::headers::not_utf8(&parts.headers) {
        return Err(ApiError::invalid_request("invalid_header", format!("the value of header `{name}` is not UTF-8")));
    }
    let method = message.method.clone().unwrap_or_default();
    let tool = message.params().and_then(|p| p.get("name")).and_then(Value::as_str).map(String::from);
    let arguments = match method.as_str() {
        "tools/call" => message.params().and_then(|p| p.get("arguments")).map(Value::to_string),
        _ => None,
    };
    let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |p| p.to_string());
    let mut headers = parts.headers.clone();
    sluice_runtime::headers::strip_hop_by_hop(&mut headers);
    let mut request = PluginRequest::new(
        "POST".into(),
        path,
        tool.clone().unwrap_or_default(),
        route.label.to_string(),
        headers,
        sluice_chat::ChatBody::validated(body.clone()),
    );
    request.max_body_bytes = body.len().max(route.decl.limits.max_message_bytes);
    request.mcp = Some(McpRequest { method: method.clone(), tool, arguments, arguments_edited: false });
    match mcp_filters(&route.chain, &mut request, record).await? {
        McpFiltered::Respond(response, plugin) => {
            Ok(Filtered::Refused(refusal(route, &parts.headers, message, response, &plugin).await))
        }
        McpFiltered::Forward(marks, engaged) => {
            apply_edits(message, &mut request, body)?;
            let mut headers = passed_on();
            if let Some(consumer) = request.consumer.as_deref().and_then(|c| HeaderValue::from_str(c).ok()) {
                headers.insert(crate::chain::CONSUMER_HEADER, consumer);
            }
            Ok(Filtered::Forward(headers, marks, engaged))
        }
    }
}

/// The headers of a client's request that reach its servers.
fn passed_on(headers: &HeaderMap) -> HeaderMap {
    let mut passed = HeaderMap::new();
    for name in &upstream::PASSED_ON {
        if let Some(value) = headers.get(name) {
            passed.insert(name, value.clone());
        }
    }
    passed
}

/// Writes the plugins' edits into the message: a whole new body, which
/// must stay the same message (method and id), then new tool arguments.
fn apply_edits(message: &mut Message, request: &mut PluginRequest, original: &Bytes) -> Result<(), ApiError> {
    if !request.body.is_reading_of(original) {
        let refused = |why: String| ApiError::plugin_failed("of the chain", format!("its MCP message edit: {why}"));
        let edited = Message::parse(&request.body.bytes()).map_err(|(_, why)| refused(why))?;
        if edited.method != message.method || edited.id != message.id {
            return Err(refused("a plugin may not change a message's method or id".into()));
        }
        *message = edited;
    }
    if let Some(mcp) = request.mcp.as_ref().filter(|m| m.arguments_edited)
        && let Some(arguments) = &mcp.arguments
    {
        let arguments: Value = serde_json::from_str(arguments)
            .map_err(|e| ApiError::internal(format!("a plugin's tool arguments are not JSON: {e}")))?;
        if let Some(params) = message.params_mut() {
            params.insert("arguments".into(), arguments);
        }
    }
    Ok(())
}

/// A plugin's answer, as the client of an MCP route gets it.
async fn refusal(
    route: &McpRoute,
    request_headers: &HeaderMap,
    message: &Message,
    response: http::Response<Body>,
    plugin: &str,
) -> http::Response<Body> {
    let status = response.status();
    if status == StatusCode::UNAUTHORIZED {
        let mut response = response;
        if route.decl.authorization.is_some() {
            // The challenge the plugin wrote (its realm, `error=`), with
            // where the metadata is: MCP clients start OAuth from it.
            let url = resource_url(request_headers, &format!("{METADATA_PREFIX}{}", route.decl.path));
            let said = response.headers().get(header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok());
            let value = match said {
                Some(said) if said.len() > 7 && said[..7].eq_ignore_ascii_case("bearer ") => {
                    format!("{said}, resource_metadata=\"{url}\"")
                }
                _ => format!("Bearer resource_metadata=\"{url}\""),
            };
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
            }
        }
        return response;
    }
    let Some(id) = message.id.clone() else {
        // A notification has no answer to carry an error: the status says it.
        return response;
    };
    let (parts, body) = response.into_parts();
    let body = crate::body::collect_limited(body, 64 * 1024, Duration::from_secs(5)).await.unwrap_or_default();
    let said = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(String::from));
    let message = said.unwrap_or_else(|| format!("refused by plugin {plugin} (HTTP {})", parts.status.as_u16()));
    let mut refused = rpc_error(StatusCode::OK, id, REFUSED, &message);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            refused.headers_mut().insert(name, value.clone());
        }
    }
    refused
}

/// `initialize`: a session with every server, merged into one, sealed
/// into the id the client gets. A server that cannot be reached is left
/// out of the session (its tools are not listed) rather than failing it.
async fn initialize(
    gateway: &Gateway,
    route: &McpRoute,
    message: &Message,
    passed_on: &HeaderMap,
) -> http::Response<Body> {
    let id = message.id.clone().unwrap_or(Value::Null);
    let Some(params) = message.params() else {
        return rpc_error(StatusCode::OK, id, INVALID_PARAMS, "initialize needs params");
    };
    let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
    let version = PROTOCOL_VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(PROTOCOL_VERSIONS[0]);
    // What is kept of the client's initialize: enough to open a session
    // with a server again as the client would.
    let kept = json!({
        "capabilities": params.get("capabilities").cloned().unwrap_or(json!({})),
        "clientInfo": params.get("clientInfo").cloned().unwrap_or(json!({"name": "unknown", "version": "0"})),
    });
    // The session id carries them on every request: bounded well inside
    // its own bound (MAX_SESSION_ID_BYTES) beside 16 servers' sessions.
    if kept.to_string().len() > MAX_KEPT_BYTES {
        let why = format!("initialize's capabilities and clientInfo are over {MAX_KEPT_BYTES} bytes");
        return rpc_error(StatusCode::OK, id, INVALID_PARAMS, &why);
    }
    let limit = route.limit(gateway.settings.max_body_bytes);
    let opened = futures_util::future::join_all(
        route.servers.iter().map(|server| upstream::initialize(server, &kept, version, passed_on, limit)),
    )
    .await;
    let mut sessions = Vec::new();
    let mut capabilities = Vec::new();
    let mut instructions = Vec::new();
    for (server, opened) in route.servers.iter().zip(opened) {
        match opened {
            Ok((session, result)) => {
                capabilities.push(result.get("capabilities").cloned().unwrap_or(json!({})));
                if let Some(text) = result.get("instructions").and_then(Value::as_str) {
                    instructions.push(format!("{}: {text}", server.name));
                }
                sessions.push(session);
            }
            Err(error) => tracing::warn!(route = %route.label, %error, "an MCP server is left out of a new session"),
        }
    }
    if sessions.is_empty() && !route.servers.is_empty() {
        return rpc_error(StatusCode::OK, id, UPSTREAM_ERROR, "no server of this route could be reached");
    }
    let record = Record {
        r: route.decl.key.to_string(),
        e: session::expiry(route.decl.limits.session_ttl),
        v: version.into(),
        i: kept,
        u: sessions,
    };
    let sealed = match gateway.settings.mcp_session_keys.seal(&record) {
        Ok(sealed) => sealed,
        Err(why) => return rpc_error(StatusCode::OK, id, INTERNAL_ERROR, &why),
    };
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": names::merge_capabilities(&capabilities),
        "serverInfo": {"name": "sluice", "title": route.label.to_string(), "version": env!("CARGO_PKG_VERSION")},
    });
    if !instructions.is_empty() {
        result["instructions"] = Value::String(instructions.join("\n"));
    }
    let mut response = rpc_result(id, result);
    if let Ok(value) = HeaderValue::from_str(&sealed) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// A message in an open session.
#[allow(clippy::too_many_arguments)]
async fn in_session(
    gateway: &Gateway,
    route: &McpRoute,
    session: &Record,
    mut message: Message,
    method: String,
    (passed_on, engaged): (&HeaderMap, Vec<Engaged>),
    key: Option<HeaderValue>,
    record: &mut RequestRecord,
) -> http::Response<Body> {
    let id = message.id.clone().unwrap_or(Value::Null);
    let limit = route.limit(gateway.settings.max_body_bytes);
    // The client's answer to a request a server made of it.
    if message.method.is_none() {
        let Some((server, original)) = message.id.as_ref().and_then(names::untag_id) else {
            return accepted();
        };
        let Some(server) = route.server(server) else { return accepted() };
        message.value["id"] = original;
        return match upstream::post_in_session(server, session, message.bytes(), passed_on, limit).await {
            Ok(_) => accepted(),
            Err(error) => failed(route, StatusCode::OK, Value::Null, &error),
        };
    }
    if method == "notifications/initialized" {
        // Each server had its own when its session was opened.
        return accepted();
    }
    if message.id.is_none() {
        // A notification concerns every server's session (`cancelled` for
        // an id only one of them knows, roots changed).
        let sent = route.servers.iter().filter_map(|server| {
            Some((server, session.upstream_at(&server.name, &upstream::endpoint_tag(&server.url))?))
        });
        futures_util::future::join_all(
            sent.map(|(server, upstream)| upstream::notify(server, upstream, &message.value, passed_on)),
        )
        .await;
        return accepted();
    }
    if let Some(listing) = Listing::of(&method) {
        return dispatch::list(route, Via::Session { record: session, passed_on }, &message, listing, limit).await;
    }
    if method == "logging/setLevel" {
        let sent = route.servers.iter().filter_map(|server| {
            Some((server, session.upstream_at(&server.name, &upstream::endpoint_tag(&server.url))?))
        });
        let set = sent.map(|(server, upstream)| {
            let bytes = message.bytes();
            async move { upstream::post(server, Some(upstream), bytes, passed_on).await.map(drop) }
        });
        futures_util::future::join_all(set).await;
        return rpc_result(id, json!({}));
    }
    let Some((server, rename)) = dispatch::target(route, &mut message, &method) else {
        let why = format!("method `{method}` is not served by this gateway, or names no server of the route");
        return rpc_error(StatusCode::OK, id, METHOD_NOT_FOUND, &why);
    };
    let server = match server {
        Ok(server) => server,
        Err((code, why)) => return rpc_error(StatusCode::OK, id, code, &why),
    };
    let call = stream::Call {
        id: id.clone(),
        tool: (method == "tools/call").then(|| {
            let name = message.params().and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
            names::prefixed(&server.name, name)
        }),
        started: Instant::now(),
        consumer: record.consumer.clone(),
        engaged,
    };
    // A place among the session's streams before the server is asked: an
    // answer may stream for as long as the tool runs.
    let share = match key.as_ref() {
        Some(key) => match gateway.mcp_streams.take(key, route.decl.limits.max_streams_per_session) {
            Some(share) => Some(share),
            None => {
                let why = format!("this session has {} streams open", route.decl.limits.max_streams_per_session);
                return rpc_error(StatusCode::TOO_MANY_REQUESTS, id, INVALID_REQUEST, &why);
            }
        },
        None => None,
    };
    record.backend = Some(Label::from(server.url.as_str()));
    let sent = upstream::post_in_session(server, session, message.bytes(), passed_on, limit).await;
    stream::answered(route, server, sent.map(|(response, _)| response), (rename, call, share), limit)
}

/// GET: the servers' own streams (messages outside any request) merged
/// into one, for as long as the client holds it.
async fn listen(
    gateway: &Gateway,
    route: &McpRoute,
    request: http::Request<Incoming>,
    record: &mut RequestRecord,
) -> http::Response<Body> {
    record.mcp_method = Some("GET".into());
    let (session, key) = match open_session(gateway, route, request.headers()) {
        Ok(opened) => opened,
        Err(response) => return *response,
    };
    let passed = passed_on(request.headers());
    let opened = route
        .servers
        .iter()
        .filter_map(|server| Some((server, session.upstream_at(&server.name, &upstream::endpoint_tag(&server.url))?)))
        .map(|(server, upstream)| {
            let passed = &passed;
            async move { (server, upstream::listen(server, upstream, passed).await) }
        });
    let mut streams = Vec::new();
    for (server, opened) in futures_util::future::join_all(opened).await {
        match opened {
            Ok(Some(response)) => streams.push((server.name.clone(), response)),
            Ok(None) => {}
            Err(error) => tracing::debug!(route = %route.label, %error, "an MCP server's stream is left out"),
        }
    }
    if streams.is_empty() {
        let mut response = http::Response::new(full(Bytes::new()));
        *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return response;
    }
    let max = route.decl.limits.max_streams_per_session;
    let Some(share) = key.as_ref().and_then(|key| gateway.mcp_streams.take(key, max)) else {
        let why = format!("this session has {max} streams open");
        return rpc_error(StatusCode::TOO_MANY_REQUESTS, Value::Null, INVALID_REQUEST, &why);
    };
    stream::merged(route, streams, Some(share), route.limit(gateway.settings.max_body_bytes))
}

/// DELETE: ends the session on every server. The id itself cannot be
/// revoked (no replica keeps a list); it expires.
async fn end(
    gateway: &Gateway,
    route: &McpRoute,
    request: http::Request<Incoming>,
    record: &mut RequestRecord,
) -> http::Response<Body> {
    record.mcp_method = Some("DELETE".into());
    let (session, _) = match open_session(gateway, route, request.headers()) {
        Ok(opened) => opened,
        Err(response) => return *response,
    };
    let passed = passed_on(request.headers());
    let ended = route
        .servers
        .iter()
        .filter_map(|server| Some((server, session.upstream_at(&server.name, &upstream::endpoint_tag(&server.url))?)))
        .map(|(server, upstream)| upstream::end(server, upstream, &passed));
    futures_util::future::join_all(ended).await;
    let mut response = http::Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

/// The session a GET or DELETE names, or the client's error (boxed: a
/// response is large beside the record).
fn open_session(
    gateway: &Gateway,
    route: &McpRoute,
    headers: &HeaderMap,
) -> Result<(Record, Option<HeaderValue>), Box<http::Response<Body>>> {
    let Some(value) = headers.get(SESSION_HEADER) else {
        let why = "the Mcp-Session-Id header is required";
        return Err(Box::new(rpc_error(StatusCode::BAD_REQUEST, Value::Null, INVALID_REQUEST, why)));
    };
    let opened = value
        .to_str()
        .map_err(|_| session::OpenError::Invalid)
        .and_then(|id| gateway.settings.mcp_session_keys.open(id, &route.decl.key.to_string()));
    match opened {
        Ok(session) => Ok((session, Some(value.clone()))),
        Err(why) => Err(Box::new(rpc_error(StatusCode::NOT_FOUND, Value::Null, INVALID_REQUEST, &why.to_string()))),
    }
}

fn failed(route: &McpRoute, status: StatusCode, id: Value, failure: &Failure) -> http::Response<Body> {
    tracing::warn!(route = %route.label, error = %failure, "an MCP server failed a request");
    rpc_error(status, id, UPSTREAM_ERROR, &failure.to_string())
}

#[cfg(test)]
mod tests;
