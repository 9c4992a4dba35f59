//! One request's way through the data plane: the endpoints, and for the
//! forwarded ones, the phases from reading the body to forwarding it.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sluice_chat::ChatBody;
use sluice_core::{ApiError, Condition, Fallback};
use sluice_runtime::Hooks;
use sluice_telemetry::Label;
use sluice_telemetry::metrics::FallbackLabels;
use tokio::sync::OwnedSemaphorePermit;

use sluice_telemetry::record::operation_of;
use sluice_telemetry::{RequestRecord, request_id, trace};

use crate::body::{Body, ErrorCode, error_response, json_response};
use crate::chain::{self, Filtered, Outgoing, Refusal, request_filters};
use crate::forward::{TRACEPARENT, forward};
use crate::gateway::Gateway;
use sluice_runtime::headers::not_utf8;

use crate::json::Checked;
use crate::response::{self, BodyLimits};
use crate::snapshot::{Route, Snapshot};
use crate::target::FORWARDED;

// Names rather than strings: inserting a `&'static str` key that is not
// there yet allocates its name, on every request.
const REQUEST_ID: HeaderName = HeaderName::from_static(request_id::HEADER);
const UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");

/// Auth checks `/v1/models` may run (one per protected model, shared by
/// routes with the same auth plugins); models past it are not listed.
const MAX_LISTING_CHECKS: usize = 1024;

/// Distinct auth chains asked about a model no route serves, before the
/// answer is the first refusal: it bounds what an unauthenticated request
/// can cost.
const MAX_UNKNOWN_MODEL_CHECKS: usize = 16;

pub async fn handle(gateway: Arc<Gateway>, mut request: http::Request<Incoming>) -> http::Response<Body> {
    let (mut record, id) = start_record(&mut request);
    // Shed load before doing any work: the permit lives as long as the
    // response, its stream included.
    let mut response = match gateway.in_flight.clone().try_acquire_owned() {
        Err(_) => {
            let error = ApiError::overloaded(format_args!("{} requests in flight", gateway.settings.max_in_flight));
            tracing::warn!(status = error.status, code = error.code, request_id = &*record.id, "{}", error.message);
            error_response(&error)
        }
        Ok(permit) => {
            let response = match serve(&gateway, request, &mut record).await {
                Ok(response) => response,
                Err(error) => {
                    if error.status >= 500 {
                        tracing::warn!(
                            status = error.status,
                            code = error.code,
                            request_id = &*record.id,
                            "{}",
                            error.message
                        );
                    }
                    error_response(&error)
                }
            };
            response.map(|body| {
                body.map_frame(move |frame| {
                    let _held = &permit;
                    frame
                })
                .boxed_unsync()
            })
        }
    };
    if let Some(id) = id {
        // An upstream's own id (OpenAI's `req_…`) is kept for the client,
        // under another name: support asks for it.
        let headers = response.headers_mut();
        if let Some(theirs) = headers.insert(REQUEST_ID, id).filter(|theirs| headers.get(REQUEST_ID) != Some(theirs)) {
            headers.insert(UPSTREAM_REQUEST_ID, theirs);
        }
    }
    // Unless the response body took the record over, the request ends here.
    record.status = response.status().as_u16();
    record.error_code = response.extensions().get::<ErrorCode>().map(|code| code.0);
    record.finish();
    response
}

/// The request's record, with its id and trace context, and the id as a
/// header value: it goes on with the request, to plugins and the upstream,
/// and back to the client.
fn start_record(request: &mut http::Request<Incoming>) -> (RequestRecord, Option<HeaderValue>) {
    let headers = request.headers_mut();
    let id = request_id::request_id(headers.get(REQUEST_ID).map(HeaderValue::as_bytes));
    let value = HeaderValue::from_str(&id).ok();
    if let Some(value) = &value {
        headers.insert(REQUEST_ID, value.clone());
    }
    let mut record = RequestRecord::new(id, request.method().as_str(), request.uri().path());
    record.trace = trace::start(request.headers().get(TRACEPARENT).map(HeaderValue::as_bytes));
    (record, value)
}

async fn serve(
    gateway: &Gateway,
    request: http::Request<Incoming>,
    record: &mut RequestRecord,
) -> Result<http::Response<Body>, ApiError> {
    // Held to the end of the request: a config swap does not touch it.
    let snapshot = gateway.snapshot();
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::GET, "/v1/models") => {
            let (parts, _) = request.into_parts();
            Ok(list_models(&snapshot, &Outgoing::new(parts, Bytes::new())).await)
        }
        (&Method::POST, p) if FORWARDED.contains(&p) => proxy(gateway, &snapshot, request, record).await,
        (method, p) if p == "/v1/models" || FORWARDED.contains(&p) => {
            Err(ApiError::method_not_allowed(method.as_str(), p))
        }
        (_, p) => Err(ApiError::not_found(p)),
    }
}

/// The models this caller may use: a model behind auth plugins is listed
/// only if they let the caller through, as they would for a request.
async fn list_models(snapshot: &Snapshot, request: &Outgoing) -> http::Response<Body> {
    let mut data = Vec::new();
    let mut decided = std::collections::HashMap::new();
    for route in snapshot.routes() {
        let auth_chain = route.auth_chain();
        for model in &route.decl.models {
            let admitted = if auth_chain.is_empty() {
                true
            } else if let Some(admitted) = decided.get(&(auth_chain.clone(), model)) {
                *admitted
            } else if decided.len() < MAX_LISTING_CHECKS {
                let admitted = chain::authenticate(route, model, request).await.is_ok();
                decided.insert((auth_chain.clone(), model), admitted);
                admitted
            } else {
                false
            };
            if admitted {
                let owner = route.decl.key.to_string();
                data.push(serde_json::json!({"id": model, "object": "model", "created": 0, "owned_by": owner}));
            }
        }
    }
    let body = serde_json::json!({"object": "list", "data": data});
    json_response(StatusCode::OK, body.to_string().into_bytes())
}

/// The answer for a model no route serves. Where routes have auth plugins,
/// a caller none of them admits gets their refusal, as it would for a model
/// that exists: a 404 would tell it which models do (the auth phase runs
/// before routing). Without auth plugins anywhere, it is a plain 404.
async fn unknown_model(snapshot: &Snapshot, model: &str, request: &Outgoing) -> http::Response<Body> {
    let mut refusal = None;
    let mut asked = HashSet::new();
    for route in snapshot.routes().iter().filter(|r| r.has_auth()) {
        if asked.len() == MAX_UNKNOWN_MODEL_CHECKS {
            break;
        }
        if !asked.insert(route.auth_chain()) {
            continue;
        }
        match chain::authenticate(route, model, request).await {
            Ok(()) => return error_response(&ApiError::model_not_found(model)),
            Err(response) => {
                refusal.get_or_insert(response);
            }
        }
    }
    refusal.unwrap_or_else(|| error_response(&ApiError::model_not_found(model)))
}

/// The phases of one forwarded request, each with one home: read the body,
/// route by model, the request hooks ([`chain`](crate::chain)), the
/// upstream ([`forward`](crate::forward)), and the response phase
/// ([`response`](crate::response)). A request whose route fails in a way
/// the route's fallbacks name starts again from routing, for the fallback
/// model.
async fn proxy(
    gateway: &Gateway,
    snapshot: &Snapshot,
    request: http::Request<Incoming>,
    record: &mut RequestRecord,
) -> Result<http::Response<Body>, ApiError> {
    record.operation = operation_of(request.uri().path());
    // One of FORWARDED (`serve` sends only those here), kept for the check
    // of each route's endpoints.
    let endpoint = FORWARDED.iter().copied().find(|p| *p == request.uri().path()).unwrap_or_default();
    let (parts, body) = request.into_parts();
    // The budget is held until the response head: by then the request body
    // has been sent upstream and dropped.
    let (body, _budget) = read_body(gateway, body, &parts.headers).await?;
    let (mut model, chat) = requested_model(&body)?;
    let mut client_request = Outgoing::new(parts, body);
    client_request.chat = chat;
    // Plugins see header values as strings: one that is not UTF-8 would
    // reach the upstream unseen by them.
    if let Some(name) = not_utf8(&client_request.headers) {
        return Err(ApiError::invalid_request("invalid_header", format!("the value of header `{name}` is not UTF-8")));
    }
    let Some((mut route, mut model_label)) = snapshot.routed(&model) else {
        return Ok(unknown_model(snapshot, &model, &client_request).await);
    };
    // Before any plugin runs: a route serves only the endpoints its whole
    // chain understands, or a content policy would be stepped around.
    if !route.endpoints.contains(endpoint) {
        return Err(route.endpoints.refusal(endpoint, &model));
    }
    // The client's request is kept for a fallback only if there may be one.
    let mut client_request = Some(client_request);
    let mut hops = 0;
    loop {
        // The model is one the config names: a bounded label.
        record.route = Some(route.label.clone());
        record.model = Some(model_label.clone());
        // Taken only where no fallback can follow.
        let last = route.decl.fallbacks.is_empty() || hops >= Fallback::MAX_HOPS;
        let mut outgoing = if last { client_request.take() } else { client_request.clone() }
            .ok_or_else(|| ApiError::internal("the request was not kept for its fallback"))?;
        if hops > 0 {
            outgoing.body = crate::forward::rewrite_model(&outgoing.body, &model)?;
        }
        let filtered = request_filters(route, &model, &mut outgoing, gateway.settings.max_body_bytes, record).await?;
        let (engaged, response_headers) = match filtered {
            Filtered::Forward(engaged, response_headers) => (engaged, response_headers),
            Filtered::Respond(response) => {
                // A plugin's refusal a fallback names (context-trim's
                // `context_length_exceeded`) moves the request too.
                let refused = response.extensions().get::<Refusal>().map(|r| r.0);
                if let Some(condition) = refused
                    && let Some((next, label, to)) = fallback(snapshot, route, condition, hops, endpoint)
                {
                    (route, model_label, model) = (next, label, to);
                    hops += 1;
                    continue;
                }
                return Ok(response);
            }
        };
        if engaged.iter().any(|e| e.hooks().intersects(Hooks::RESPONSE_BODY | Hooks::RESPONSE_CHUNK)) {
            // Plugins that read the response body need it as text, not gzip.
            outgoing.headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        let forwarded = forward(gateway, route, &mut outgoing, record).await;
        if let Some(condition) = forwarded.failure
            && let Some((next, label, to)) = fallback(snapshot, route, condition, hops, endpoint)
        {
            tracing::info!(route = %route.label, fallback = %to, condition = condition.name(), request_id = &*record.id, "falling back");
            (route, model_label, model) = (next, label, to);
            hops += 1;
            continue;
        }
        let upstream = forwarded.response?;
        let backend = forwarded.backend.and_then(|i| route.backends.get(i));
        let limits = BodyLimits {
            idle: backend.and_then(|b| b.timeouts.idle).unwrap_or(gateway.settings.upstream_idle_timeout),
            deadline: backend.and_then(|b| b.timeouts.total).map(|total| record.started + total),
        };
        return response::respond(upstream, engaged, response_headers, &gateway.settings, limits, record).await;
    }
}

/// Where a request that failed on `route` in the way `condition` goes
/// next, if the route names a fallback for it: a model served by a route
/// in the same namespace (another tenant's backends and keys are not
/// this route's to use), and that serves the request's endpoint.
fn fallback<'s>(
    snapshot: &'s Snapshot,
    route: &Route,
    condition: Condition,
    hops: usize,
    endpoint: &str,
) -> Option<(&'s Arc<Route>, &'s Label, String)> {
    if hops >= Fallback::MAX_HOPS {
        return None;
    }
    route.decl.fallbacks.iter().filter(|f| f.on.contains(condition)).find_map(|f| {
        let (next, label) = snapshot.routed(&f.model)?;
        if next.decl.key.namespace != route.decl.key.namespace {
            tracing::warn!(route = %route.label, fallback = %f.model, "fallback model is served in another namespace; not followed");
            return None;
        }
        if !next.endpoints.contains(endpoint) {
            tracing::warn!(route = %route.label, fallback = %f.model, endpoint, "fallback model's route does not serve the endpoint; not followed");
            return None;
        }
        let labels = FallbackLabels { route: route.label.clone(), fallback_model: label.clone(), condition: condition.name() };
        sluice_telemetry::metrics().fallbacks.get_or_create(&labels).inc();
        Some((next, label, f.model.clone()))
    })
}

/// Reads the whole request body, within the per-request size limit, the
/// body timeout, and the memory budget shared by all requests in flight;
/// returns it with its share of the budget.
async fn read_body(
    gateway: &Gateway,
    mut body: Incoming,
    headers: &HeaderMap,
) -> Result<(Bytes, OwnedSemaphorePermit), ApiError> {
    let limit = gateway.settings.max_body_bytes;
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::too_large(limit));
    }
    let over_budget = || ApiError::overloaded("too many request bodies are being buffered");
    let reserve = |bytes: usize| {
        let bytes = u32::try_from(bytes).map_err(|_| ApiError::too_large(limit))?;
        gateway.body_budget.clone().try_acquire_many_owned(bytes).map_err(|_| over_budget())
    };
    let mut held = reserve(declared.unwrap_or(0))?;
    let read = async {
        let mut buffer = BytesMut::with_capacity(declared.unwrap_or(0));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| {
                ApiError::invalid_request("body_read_failed", format!("reading the request body: {error}"))
            })?;
            let Ok(data) = frame.into_data() else { continue };
            if buffer.len() + data.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            buffer.extend_from_slice(&data);
            let have = held.num_permits();
            if buffer.len() > have {
                held.merge(reserve(buffer.len() - have)?);
            }
        }
        Ok(buffer.freeze())
    };
    let timeout = gateway.settings.request_body_timeout;
    match tokio::time::timeout(timeout, read).await {
        Ok(result) => result.map(|bytes| (bytes, held)),
        Err(_) => Err(ApiError::request_timeout(timeout)),
    }
}

/// The model a request body asks for, and the body read for the plugins:
/// by one pass where it can ([`ChatBody::read`]), else by serde_json, which
/// also says what is wrong.
pub(crate) fn requested_model(body: &Bytes) -> Result<(String, Option<ChatBody>), ApiError> {
    match ChatBody::read(body.clone()) {
        Some((chat, model)) => Ok((model, Some(chat))),
        None => model_by_serde(body).map(|model| (model, None)),
    }
}

/// The model, read by serde_json alone: slower than the one pass, and the
/// judge of what it refuses.
pub(crate) fn model_by_serde(body: &[u8]) -> Result<String, ApiError> {
    // A whole JSON object, parsed as the rewrite to a backend's model will
    // parse it: an array (which serde would read as a struct) or a body the
    // rewrite cannot read again (a number out of range, a lone surrogate) is
    // the client's error, not a 500 later (found by fuzzing). Checked by
    // serde_json exactly as a `Value` parse would check it, without building
    // one: on a 100 KB body that tree was most of the proxy's work.
    let routed: Routed = serde_json::from_slice(body).map_err(ApiError::invalid_json)?;
    match routed.model {
        Some(model) if !model.is_empty() => Ok(model),
        _ => Err(ApiError::invalid_request("missing_model", "the request body needs a `model` string")),
    }
}

/// A JSON object's last `model` member, if it is a string.
struct Routed {
    model: Option<String>,
}

impl<'de> serde::Deserialize<'de> for Routed {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = Routed;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Routed, A::Error> {
                let mut model = None;
                while let Some(key) = map.next_key::<Checked<true>>()? {
                    if key.0.as_deref() == Some("model") {
                        model = map.next_value::<Checked<true>>()?.0;
                    } else {
                        map.next_value::<Checked<false>>()?;
                    }
                }
                Ok(Routed { model })
            }
        }
        deserializer.deserialize_map(Object)
    }
}

#[cfg(test)]
mod tests {
    //! The whole data plane in-process: the gateway and the echo upstream on
    //! loopback listeners, driven over real HTTP.

    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::time::Duration;

    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use sluice_core::{BackendDecl, DesiredConfig, FailurePolicy, Isolation, Phase, PluginDecl, PluginSource};
    use sluice_core::{ConfigUpdate, ResourceKey, RouteDecl};
    use sluice_runtime::{Runtime, RuntimeConfig};
    use tokio::sync::watch;

    use super::*;
    use crate::gateway::Settings;

    async fn listen() -> (tokio::net::TcpListener, SocketAddr) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    fn add_header() -> PluginDecl {
        PluginDecl {
            key: ResourceKey::new("default", "add-header"),
            source: PluginSource::File(PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../plugins/dist/add-header.wasm"
            ))),
            phase: Phase::Filter,
            sha256: None,
            config: serde_json::json!({"header": "x-team", "value": "search",
                "responseHeader": {"name": "x-sluice-plugin", "value": "add-header"}}),
            failure_policy: FailurePolicy::Closed,
            timeout: Duration::from_secs(5),
            max_memory_bytes: 64 << 20,
            isolation: Isolation::PerRequest,
            endpoints: sluice_core::config::Endpoints::ALL,
        }
    }

    /// Starts echo and a gateway serving `chat` → echo through add-header;
    /// returns the gateway's address, the gateway and echo's address.
    async fn start() -> (SocketAddr, Arc<Gateway>, SocketAddr) {
        let (echo, echo_addr) = listen().await;
        tokio::spawn(sluice_echo::serve(echo, Default::default(), std::future::pending()));
        let runtime = Runtime::new(RuntimeConfig { max_instances: 20, ..Default::default() }).unwrap();
        let gateway = Gateway::new(runtime, None, Settings::default()).unwrap();
        let route = RouteDecl {
            backends: vec![BackendDecl::new(format!("http://{echo_addr}/v1"))],
            plugins: vec![ResourceKey::new("default", "add-header")],
            timeout: Duration::from_secs(10),
            ..RouteDecl::new(ResourceKey::new("default", "chat"), vec!["gpt-4o-mini".into()])
        };
        let desired = DesiredConfig { revision: 1, plugins: vec![add_header()], routes: vec![route] };
        let (updates, rx) = watch::channel(Some(ConfigUpdate::Desired(desired)));
        // The gateway follows the source until the sender goes: keep it.
        std::mem::forget(updates);
        tokio::spawn(gateway.clone().follow(rx));
        let (data, addr) = listen().await;
        let serving = gateway.clone();
        tokio::spawn(crate::serve_data_plane(serving, data, std::future::pending(), Duration::from_secs(1)));
        // Wait for the first config; every build either loads it or reports.
        while !gateway.is_ready() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (addr, gateway, echo_addr)
    }

    async fn post(addr: SocketAddr, body: &str) -> (StatusCode, HeaderMap, serde_json::Value) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let response = client.request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_runs_the_chain_reaches_the_upstream_and_the_response_hook_runs() {
        let (addr, _gateway, echo_addr) = start().await;
        let (status, headers, json) =
            post(addr, r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        assert_eq!(headers["x-sluice-plugin"], "add-header");
        let echoed: serde_json::Value =
            serde_json::from_str(json["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
        assert_eq!(echoed["headers"]["x-team"], "search", "{echoed}");
        // The upstream's own authority, made once per backend, not the
        // gateway's that the client sent.
        assert_eq!(echoed["headers"]["host"], echo_addr.to_string(), "{echoed}");
    }

    /// Found by the request_json fuzz target (in a copy): these were routed,
    /// then the rewrite to a backend's model failed (a 500), or an array was
    /// routed as if it were an object.
    #[test]
    fn only_objects_the_rewrite_can_read_are_routed() {
        let model_of = |body: &[u8]| requested_model(&Bytes::copy_from_slice(body)).map(|(model, _)| model);
        // Refused wherever the bad value hides, as a `Value` parse refuses it.
        for body in [
            r#"["gpt-4o-mini"]"#,
            r#"{"model":"m","x":1e400}"#,
            r#"{"model":"m","x":"\ud800"}"#,
            r#"{"model":"m","x":[{"y":-1e400}]}"#,
            r#"{"model":"m","x":{"\udc00":1}}"#,
            r#"{"model":"m"} x"#,
            r#"{"model":"\ud800"}"#,
        ] {
            let error = model_of(body.as_bytes()).expect_err(body);
            assert_eq!(error.status, 400, "{body}");
            assert!(serde_json::from_str::<serde_json::Value>(body).is_err() || body.starts_with('['), "{body}");
        }
        // The last `model` counts, as it does in a parsed object.
        assert_eq!(model_of(br#"{"model":"a","model":"b"}"#).unwrap(), "b");
        assert!(model_of(br#"{"model":"a","model":7}"#).is_err());
        assert_eq!(model_of(br#"{"m\u006fdel":"\u00e9"}"#).unwrap(), "é");
        let body = Bytes::from_static(br#"{"model":"m","temperature":0.5,"seed":18446744073709551615}"#);
        assert_eq!(model_of(&body).unwrap(), "m");
        let rewritten: serde_json::Value =
            serde_json::from_slice(&crate::forward::rewrite_model(&body, "backend").unwrap()).unwrap();
        assert_eq!(
            rewritten,
            serde_json::json!({"model": "backend", "temperature": 0.5, "seed": 18446744073709551615u64})
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn errors_are_openai_shaped() {
        let (addr, _gateway, _) = start().await;
        let (status, _, json) = post(addr, r#"{"model":"nope","messages":[]}"#).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(json["error"]["code"], "model_not_found", "{json}");
        let (status, _, json) = post(addr, r#"{"messages":[]}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(json["error"]["code"], "missing_model", "{json}");
        let (status, _, json) = post(addr, "not json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
    }
}
