//! Relaying what MCP servers send back: one JSON answer, or an SSE stream
//! (progress, logs, requests the server makes of the client, then the
//! answer) event by event, renamed as the merged server names things, each
//! message within the size limit and the stream within its idle time; and
//! the per-session count of open streams.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::{HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::Value;
use sluice_telemetry::Label;
use sluice_telemetry::metrics::{McpCallLabels, McpDurationLabels, metrics};

use super::jsonrpc::{INTERNAL_ERROR, UPSTREAM_ERROR, rpc_error};
use super::names;
use super::shares::StreamShare;
use super::upstream::{Failure, is_stream};
use crate::body::{Body, BoxError};
use crate::chain::Engaged;
use crate::snapshot::{McpRoute, McpServer};
use crate::sse::{EventSplitter, data_event, data_of, with_data};
use sluice_runtime::{Hooks, PluginError, ResponseSummary};

/// How a request's answer is renamed for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rename {
    None,
    /// `resources/read`: the contents' URIs get the server's prefix.
    Uris,
}

/// The request being answered.
pub struct Call {
    pub id: Value,
    /// For `tools/call`, the prefixed tool name.
    pub tool: Option<String>,
    pub started: Instant,
    pub consumer: Option<String>,
    /// The plugins whose response hooks see the answer.
    pub engaged: Vec<Engaged>,
}

/// The answer, as the route's response hooks leave it: `response-body`
/// on the answer message, in reverse chain order (a replacement must
/// answer the same request), then `response-end`. A plugin that fails
/// closed turns the answer into a JSON-RPC error; one that fails open is
/// skipped.
async fn through_hooks(call: &mut Call, mut answer: Value) -> Value {
    let mut failed = None;
    for plugin in call.engaged.iter_mut().rev() {
        if !plugin.wants(Hooks::RESPONSE_BODY) {
            continue;
        }
        let body = answer.to_string();
        let outcome = match plugin.instance.response_body(body.as_bytes()).await {
            Ok(None) => Ok(()),
            Ok(Some(replaced)) => match serde_json::from_slice::<Value>(&replaced) {
                Ok(replaced) if answers(&replaced, &call.id) => {
                    answer = replaced;
                    Ok(())
                }
                _ => Err(PluginError::InvalidEdit("its response body is not a JSON-RPC answer to the call".into())),
            },
            Err(error) => Err(error),
        };
        if let Err(error) = outcome
            && let Err(refused) = plugin.fail(error)
        {
            failed = Some(refused.message);
            break;
        }
    }
    if let Some(why) = failed {
        answer =
            serde_json::json!({"jsonrpc": "2.0", "id": call.id, "error": {"code": INTERNAL_ERROR, "message": why}});
    }
    let summary = ResponseSummary {
        status: 200,
        streamed: false,
        usage: None,
        body_bytes: answer.to_string().len() as u64,
        completed: true,
        duration_ms: call.started.elapsed().as_millis() as u64,
    };
    for plugin in call.engaged.iter_mut().filter(|p| p.wants(Hooks::RESPONSE_END)) {
        if let Err(error) = plugin.instance.response_end(&summary).await {
            tracing::warn!(plugin = plugin.name(), %error, "response-end hook failed on an MCP answer");
        }
    }
    answer
}

/// Whether `message` is a JSON-RPC answer to request `id`.
fn answers(message: &Value, id: &Value) -> bool {
    message.get("jsonrpc") == Some(&Value::String("2.0".into()))
        && message.get("id") == Some(id)
        && message.get("method").is_none()
        && (message.get("result").is_some() || message.get("error").is_some())
}

/// Counts one routed request by how it ended.
pub fn count_call(route: &Label, server: &Label, call: &Call, result: &'static str) {
    let m = metrics();
    let tool = m.tool_label(call.tool.as_deref().unwrap_or_default());
    let consumer = m.consumer_label(call.consumer.as_deref().unwrap_or_default());
    let labels = McpCallLabels { route: route.clone(), server: server.clone(), tool: tool.clone(), consumer, result };
    m.mcp_calls.get_or_create(&labels).inc();
    let duration = McpDurationLabels { route: route.clone(), server: server.clone(), tool };
    sluice_telemetry::metrics::observe(&m.mcp_call_duration.get_or_create(&duration), call.started.elapsed());
}

/// How an answer ended, for the count.
fn result_of(answer: &Value) -> &'static str {
    if answer.get("error").is_some() {
        "error"
    } else if answer.pointer("/result/isError") == Some(&Value::Bool(true)) {
        "tool_error"
    } else {
        "ok"
    }
}

/// One message from `server`, as the client sees it: requests get tagged
/// ids, URIs the server's prefix. `None` if it is not a JSON-RPC message;
/// `true` beside it if it is the answer to `call`.
fn renamed(server: &str, data: &str, call: Option<(&Value, Rename)>) -> Option<(Value, bool)> {
    let mut message: Value = serde_json::from_str(data).ok()?;
    if !message.is_object() {
        return None;
    }
    let method = message.get("method").and_then(Value::as_str).map(String::from);
    let mut is_answer = false;
    match method.as_deref() {
        Some(method) => {
            if let Some(id) = message.get("id").filter(|id| !id.is_null()).cloned() {
                message["id"] = names::tag_id(server, &id);
            }
            if method == "notifications/resources/updated"
                && let Some(params) = message.get_mut("params")
            {
                names::rename_uris(server, params);
            }
        }
        None => {
            // A response is the call's answer or nothing: a server cannot
            // answer the client's requests to another server (the client
            // matches answers by id alone), nor any on a GET stream.
            let (id, rename) = call?;
            if message.get("id") != Some(id) {
                return None;
            }
            is_answer = true;
            if rename == Rename::Uris
                && let Some(result) = message.get_mut("result")
            {
                names::rename_uris(server, result);
            }
        }
    }
    Some((message, is_answer))
}

/// The answer to a routed request, relayed as the server sends it.
fn relay(
    route: &McpRoute,
    server: &McpServer,
    response: http::Response<Incoming>,
    rename: Rename,
    call: Call,
    share: Option<StreamShare>,
    limit: usize,
) -> http::Response<Body> {
    let idle = route.decl.limits.stream_idle_timeout;
    let labels = (route.label.clone(), Label::from(server.name.as_str()));
    if !is_stream(response.headers()) {
        return relay_json(&server.name, labels, response, rename, call, limit, idle);
    }
    let relay = Relay::new(&server.name, labels, response.into_body(), Some((call, rename)), limit, idle);
    let stream = futures_util::stream::unfold(relay, |mut relay| async move {
        let next = relay.next().await?;
        Some((next, relay))
    });
    // Held as long as the client reads the stream.
    sse_response(stream.map(move |item| {
        let _held = &share;
        item
    }))
}

/// The servers' GET streams, merged into one for the client.
pub fn merged(
    route: &McpRoute,
    streams: Vec<(String, http::Response<Incoming>)>,
    share: Option<StreamShare>,
    limit: usize,
) -> http::Response<Body> {
    let idle = route.decl.limits.stream_idle_timeout;
    let each = streams.into_iter().map(|(server, response)| {
        let labels = (route.label.clone(), Label::from(server.as_str()));
        let relay = Relay::new(&server, labels, response.into_body(), None, limit, idle);
        futures_util::stream::unfold(relay, |mut relay| async move {
            let next = relay.next().await?;
            Some((next, relay))
        })
        .boxed()
    });
    let all = futures_util::stream::select_all(each);
    sse_response(all.map(move |item| {
        let _held = &share;
        item
    }))
}

fn sse_response(
    stream: impl futures_util::Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
) -> http::Response<Body> {
    let body = StreamBody::new(stream.map(|item| item.map(Frame::data))).boxed_unsync();
    let mut response = http::Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// A server's answer sent as one JSON message: read whole (within the
/// limit and idle time), renamed, counted.
fn relay_json(
    server: &str,
    (route, server_label): (Label, Label),
    response: http::Response<Incoming>,
    rename: Rename,
    call: Call,
    limit: usize,
    idle: Duration,
) -> http::Response<Body> {
    let server = server.to_string();
    let read = async move {
        let mut call = call;
        let body = response.into_body().map_err(|e| Box::new(e) as BoxError).boxed_unsync();
        let read = match crate::body::collect_limited(body, limit, idle).await {
            Err(why) => Err(why),
            Ok(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| renamed(&server, text, Some((&call.id, rename))))
                .filter(|(_, is_answer)| *is_answer)
                .map(|(message, _)| message)
                .ok_or_else(|| "its answer is not a JSON-RPC response to the request".to_string()),
        };
        let message = match read {
            Ok(message) => through_hooks(&mut call, message).await,
            Err(why) => serde_json::json!({
                "jsonrpc": "2.0", "id": call.id,
                "error": {"code": UPSTREAM_ERROR, "message": format!("server `{server}`: {why}")},
            }),
        };
        count_call(&route, &server_label, &call, result_of(&message));
        Ok::<Bytes, BoxError>(Bytes::from(message.to_string()))
    };
    // Read before the head is sent, so a bad answer becomes a JSON-RPC
    // error rather than a broken body: a body future in a one-item stream.
    let body = StreamBody::new(futures_util::stream::once(read).map(|item| item.map(Frame::data))).boxed_unsync();
    let mut response = http::Response::new(body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// One server's SSE stream on its way to the client.
struct Relay {
    server: String,
    route: Label,
    server_label: Label,
    body: Incoming,
    splitter: EventSplitter,
    /// The request whose answer this stream carries (none on GET streams).
    answering: Option<(Call, Rename)>,
    limit: usize,
    idle: Duration,
    done: bool,
}

impl Relay {
    fn new(
        server: &str,
        (route, server_label): (Label, Label),
        body: Incoming,
        answering: Option<(Call, Rename)>,
        limit: usize,
        idle: Duration,
    ) -> Relay {
        Relay {
            server: server.into(),
            route,
            server_label,
            body,
            splitter: EventSplitter::default(),
            answering,
            limit,
            idle,
            done: false,
        }
    }

    /// The next bytes for the client; `None` once the stream is over.
    async fn next(&mut self) -> Option<Result<Bytes, BoxError>> {
        loop {
            if self.done {
                return None;
            }
            let mut out = BytesMut::new();
            let mut answer = None;
            while !self.done
                && answer.is_none()
                && let Some(event) = self.splitter.next_event()
            {
                // However its bytes arrived: one frame may complete an
                // event past the limit.
                if event.len() > self.limit {
                    out.extend_from_slice(&self.fail(&format!("a message over {} bytes", self.limit)));
                    return Some(Ok(out.freeze()));
                }
                answer = self.relay_event(&event, &mut out);
            }
            if let Some((event, message)) = answer {
                out.extend_from_slice(&self.answer(&event, message).await);
                return Some(Ok(out.freeze()));
            }
            if !out.is_empty() {
                return Some(Ok(out.freeze()));
            }
            if self.splitter.buffered() > self.limit {
                return Some(Ok(self.fail(&format!("a message over {} bytes", self.limit))));
            }
            match tokio::time::timeout(self.idle, self.body.frame()).await {
                Err(_) => return Some(Ok(self.fail(&format!("sent nothing for {} ms", self.idle.as_millis())))),
                Ok(None) => {
                    if let Some(rest) = self.splitter.remainder()
                        && let Some((event, message)) = self.relay_event(&rest, &mut out)
                    {
                        out.extend_from_slice(&self.answer(&event, message).await);
                    }
                    if self.answering.is_some() {
                        out.extend_from_slice(&self.fail("its stream ended without the answer"));
                    }
                    self.done = true;
                    return (!out.is_empty()).then(|| Ok(out.freeze()));
                }
                Ok(Some(Err(error))) => return Some(Ok(self.fail(&format!("its stream broke: {error}")))),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.splitter.push(&data);
                    }
                }
            }
        }
    }

    /// Relays one event into `out`; the answer to the call is handed back
    /// instead, for the response hooks.
    fn relay_event(&mut self, event: &[u8], out: &mut BytesMut) -> Option<(Bytes, Value)> {
        let Some(data) = data_of(event) else {
            // A comment (keep-alive) or an empty event: passed on as is.
            out.extend_from_slice(event);
            return None;
        };
        let call = self.answering.as_ref().map(|(call, rename)| (&call.id, *rename));
        let Some((message, is_answer)) = renamed(&self.server, &data, call) else {
            tracing::debug!(server = %self.server, "an MCP server sent an event that is not a JSON-RPC message; dropped");
            return None;
        };
        if is_answer {
            return Some((Bytes::copy_from_slice(event), message));
        }
        out.extend_from_slice(&with_data(event, &message.to_string()));
        let tool = self.answering.as_ref().and_then(|(call, _)| call.tool.as_deref()).unwrap_or_default();
        let labels = McpDurationLabels {
            route: self.route.clone(),
            server: self.server_label.clone(),
            tool: metrics().tool_label(tool),
        };
        metrics().mcp_stream_messages.get_or_create(&labels).inc();
        None
    }

    /// The answer event, through the response hooks, counted. The answer
    /// ends a request's stream (the spec asks servers to close it then):
    /// nothing is held open past it.
    async fn answer(&mut self, event: &[u8], message: Value) -> Bytes {
        self.done = true;
        let Some((mut call, _)) = self.answering.take() else { return with_data(event, &message.to_string()) };
        let message = through_hooks(&mut call, message).await;
        count_call(&self.route, &self.server_label, &call, result_of(&message));
        with_data(event, &message.to_string())
    }

    /// Ends the stream: the request waiting on it gets a JSON-RPC error.
    fn fail(&mut self, why: &str) -> Bytes {
        self.done = true;
        tracing::warn!(server = %self.server, "an MCP server's stream is cut: {why}");
        let Some((call, _)) = self.answering.take() else { return Bytes::new() };
        count_call(&self.route, &self.server_label, &call, "error");
        let error = serde_json::json!({
            "jsonrpc": "2.0",
            "id": call.id,
            "error": {"code": UPSTREAM_ERROR, "message": format!("server `{}`: {why}", self.server)},
        });
        Bytes::from(data_event(&error.to_string()))
    }
}

/// The answer to a routed request as the client gets it: relayed as the
/// server sends it, or the JSON-RPC error its failure makes.
pub fn answered(
    route: &McpRoute,
    server: &McpServer,
    sent: Result<http::Response<Incoming>, Failure>,
    (rename, call, share): (Rename, Call, Option<StreamShare>),
    limit: usize,
) -> http::Response<Body> {
    match sent {
        Ok(response) => relay(route, server, response, rename, call, share, limit),
        Err(error) => {
            tracing::warn!(route = %route.label, %error, "an MCP server failed a request");
            count_call(&route.label, &Label::from(server.name.as_str()), &call, "error");
            rpc_error(StatusCode::OK, call.id, UPSTREAM_ERROR, &error.to_string())
        }
    }
}
