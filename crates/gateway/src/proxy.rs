//! One request's way through the data plane: route by model, run the
//! plugin chain, forward, run response hooks, stream the body back.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use sluice_core::{ApiError, FailurePolicy};
use sluice_runtime::{Hooks, PluginError, PluginInstance, RequestAction, Response as PluginResponse, ResponseAction};

use crate::body::{Body, BoxError, collect_limited, error_response, full, json_response};
use crate::gateway::Gateway;
use crate::headers::{apply_edits, strip_hop_by_hop, to_pairs};
use crate::response::{BodyPlugin, Exchange, body_hooks, relay, run_body_hooks, usage_in};
use crate::snapshot::{LoadedPlugin, Route, Snapshot};

/// The OpenAI endpoints that carry a `model` and are forwarded.
const FORWARDED: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

pub async fn handle(gateway: Arc<Gateway>, request: http::Request<Incoming>) -> http::Response<Body> {
    match serve(&gateway, request).await {
        Ok(response) => response,
        Err(error) => {
            if error.status >= 500 {
                tracing::warn!(status = error.status, code = error.code, "{}", error.message);
            }
            error_response(&error)
        }
    }
}

async fn serve(gateway: &Gateway, request: http::Request<Incoming>) -> Result<http::Response<Body>, ApiError> {
    // Held to the end of the request: a config swap does not touch it.
    let snapshot = gateway.snapshot();
    let path = request.uri().path();
    match (request.method(), path) {
        (&Method::GET, "/v1/models") => Ok(list_models(&snapshot)),
        (&Method::POST, p) if FORWARDED.contains(&p) => proxy(gateway, &snapshot, request).await,
        (method, p) if p == "/v1/models" || FORWARDED.contains(&p) => {
            Err(ApiError::method_not_allowed(method.as_str(), p))
        }
        (_, p) => Err(ApiError::not_found(p)),
    }
}

fn list_models(snapshot: &Snapshot) -> http::Response<Body> {
    let data: Vec<_> = snapshot
        .routes()
        .iter()
        .flat_map(|route| {
            route.decl.models.iter().map(|model| {
                serde_json::json!({"id": model, "object": "model", "created": 0, "owned_by": route.decl.key.to_string()})
            })
        })
        .collect();
    let body = serde_json::json!({"object": "list", "data": data});
    json_response(StatusCode::OK, body.to_string().into_bytes())
}

/// The request as the chain edits it.
struct Outgoing {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

async fn proxy(
    gateway: &Gateway,
    snapshot: &Snapshot,
    request: http::Request<Incoming>,
) -> Result<http::Response<Body>, ApiError> {
    let (parts, body) = request.into_parts();
    let body = read_body(body, &parts.headers, gateway.settings.max_body_bytes).await?;
    let model = requested_model(&body)?;
    let route = snapshot.route_for(&model).ok_or_else(|| ApiError::model_not_found(&model))?;

    let mut outgoing = Outgoing {
        method: parts.method,
        path: parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_else(|| parts.uri.path().to_string()),
        headers: parts.headers,
        body,
    };
    strip_hop_by_hop(&mut outgoing.headers);

    let exchange_started = std::time::Instant::now();
    let mut awaiting_response = Vec::new();
    for plugin in &route.chain {
        match run_request_hook(plugin, route, &model, &mut outgoing).await {
            Ok(Step::Continue(instance)) => awaiting_response.extend(instance.map(|i| (plugin.clone(), i))),
            Ok(Step::Respond(response)) => return Ok(response),
            Err(error) => apply_failure_policy(plugin, error)?,
        }
    }

    let upstream = forward(gateway, route, outgoing).await?;
    let (mut head, body) = upstream.into_parts();
    strip_hop_by_hop(&mut head.headers);

    // Response hooks run in reverse chain order, like unwinding the chain.
    let mut body_plugins = Vec::new();
    for (plugin, mut instance) in awaiting_response.into_iter().rev() {
        let hooks = plugin.plugin.hooks();
        if hooks.contains(Hooks::RESPONSE_HEAD) {
            let view = PluginResponse { status: head.status.as_u16(), headers: to_pairs(&head.headers) };
            let result = instance.response_filter(&view).await.and_then(|ResponseAction::Continue(edits)| {
                apply_edits(&mut head.headers, &edits.set_headers, &edits.remove_headers)
                    .map_err(PluginError::InvalidEdit)
            });
            if let Err(error) = result {
                apply_failure_policy(&plugin, error)?;
                continue;
            }
        }
        if hooks.intersects(body_hooks()) {
            body_plugins.push(BodyPlugin::new(plugin, instance));
        }
    }

    let streamed = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let exchange = Exchange {
        started: exchange_started,
        status: head.status.as_u16(),
        model,
        route: route.decl.key.to_string(),
        streamed,
    };
    let wanted = body_plugins.iter().fold(Hooks::empty(), |hooks, p| hooks | p.plugin.plugin.hooks());
    let mut body: Body = body.map_err(|e| -> BoxError { Box::new(e) }).boxed_unsync();
    let mut known_usage = None;
    if !streamed && wanted.contains(Hooks::RESPONSE_BODY) {
        // Only a `response-body` hook makes the gateway hold a whole body.
        let limit = gateway.settings.max_body_bytes;
        let whole = match collect_limited(body, limit).await {
            Ok(whole) => whole,
            Err(error) => {
                return Err(ApiError::upstream_unavailable(format!(
                    "reading the upstream's response for response-body plugins: {error}"
                )));
            }
        };
        known_usage = usage_in(&whole);
        body = full(run_body_hooks(&mut body_plugins, whole).await?);
        head.headers.remove(header::CONTENT_LENGTH);
    } else if streamed && wanted.contains(Hooks::RESPONSE_CHUNK) {
        head.headers.remove(header::CONTENT_LENGTH);
    }
    // The body streams through frame by frame as the upstream sends it: SSE
    // events reach the client as they are produced.
    Ok(http::Response::from_parts(head, relay(body, exchange, body_plugins, known_usage)))
}

/// A failed plugin fails the request (`Closed`) or is skipped (`Open`).
pub(crate) fn apply_failure_policy(plugin: &LoadedPlugin, error: PluginError) -> Result<(), ApiError> {
    match plugin.decl.failure_policy {
        FailurePolicy::Closed => Err(ApiError::plugin_failed(plugin.plugin.name(), error)),
        FailurePolicy::Open => {
            tracing::warn!(plugin = plugin.plugin.name(), %error, "plugin failed; skipped (failurePolicy: Open)");
            Ok(())
        }
    }
}

async fn read_body(body: Incoming, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > limit) {
        return Err(ApiError::too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(limit)),
        Err(error) => Err(ApiError::invalid_request("body_read_failed", format!("reading the request body: {error}"))),
    }
}

fn requested_model(body: &[u8]) -> Result<String, ApiError> {
    #[derive(serde::Deserialize)]
    struct ModelOnly {
        model: Option<serde_json::Value>,
    }
    let parsed: ModelOnly = serde_json::from_slice(body).map_err(ApiError::invalid_json)?;
    match parsed.model {
        Some(serde_json::Value::String(model)) if !model.is_empty() => Ok(model),
        _ => Err(ApiError::invalid_request("missing_model", "the request body needs a `model` string")),
    }
}

enum Step {
    /// Go on; the instance is kept if the plugin wants the response head.
    Continue(Option<PluginInstance>),
    Respond(http::Response<Body>),
}

async fn run_request_hook(
    plugin: &LoadedPlugin,
    route: &Route,
    model: &str,
    outgoing: &mut Outgoing,
) -> Result<Step, PluginError> {
    let hooks = plugin.plugin.hooks();
    if hooks == Hooks::empty() {
        return Ok(Step::Continue(None));
    }
    let mut instance = plugin.plugin.instance().await?;
    if hooks.contains(Hooks::REQUEST) {
        let view = sluice_runtime::Request {
            method: outgoing.method.to_string(),
            path: outgoing.path.clone(),
            headers: to_pairs(&outgoing.headers),
            body: outgoing.body.to_vec(),
            model: model.to_string(),
            route: route.decl.key.to_string(),
        };
        match instance.request_filter(&view).await? {
            RequestAction::Continue(edits) => {
                apply_edits(&mut outgoing.headers, &edits.set_headers, &edits.remove_headers)
                    .map_err(PluginError::InvalidEdit)?;
                if let Some(body) = edits.body {
                    outgoing.body = Bytes::from(body);
                }
            }
            RequestAction::Respond(direct) => return Ok(Step::Respond(direct_response(plugin, direct))),
        }
    }
    let keep = hooks.intersects(Hooks::RESPONSE_HEAD | body_hooks());
    Ok(Step::Continue(keep.then_some(instance)))
}

fn direct_response(plugin: &LoadedPlugin, direct: sluice_runtime::DirectResponse) -> http::Response<Body> {
    let status = StatusCode::from_u16(direct.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if direct.body.is_empty() && status.as_u16() >= 400 {
        return error_response(&ApiError::plugin_rejected(plugin.plugin.name(), status.as_u16()));
    }
    let mut response = http::Response::new(full(direct.body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Err(error) = apply_edits(headers, &direct.headers, &[]) {
        tracing::warn!(plugin = plugin.plugin.name(), %error, "direct response header dropped");
    }
    headers.remove(header::CONTENT_LENGTH);
    response
}

async fn forward(gateway: &Gateway, route: &Route, outgoing: Outgoing) -> Result<http::Response<Incoming>, ApiError> {
    // `/v1/chat/completions` goes to `{backend url}/chat/completions`: the
    // backend URL names the API root, `/v1` included.
    let suffix = outgoing.path.strip_prefix("/v1").unwrap_or(&outgoing.path).to_string();
    let timeout = route.decl.timeout;
    let mut last_error = None;
    for backend in route.backends_in_order() {
        let body = match &backend.model {
            Some(model) => rewrite_model(&outgoing.body, model)?,
            None => outgoing.body.clone(),
        };
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = outgoing.method.clone();
        *request.uri_mut() = format!("{}{suffix}", backend.url)
            .parse()
            .map_err(|e| ApiError::internal(format!("backend url {}: {e}", backend.url)))?;
        let headers = request.headers_mut();
        headers.clone_from(&outgoing.headers);
        headers.remove(header::HOST);
        headers.remove(header::CONTENT_LENGTH);
        if let Some(authorization) = &backend.authorization {
            headers.insert(header::AUTHORIZATION, authorization.clone());
        }
        match tokio::time::timeout(timeout, gateway.upstream.send(request)).await {
            Err(_) => return Err(ApiError::upstream_timeout(timeout.as_millis() as u64)),
            Ok(Ok(response)) => return Ok(response),
            // Nothing reached the backend: the next one may serve it.
            Ok(Err(error)) if error.is_connect() => {
                tracing::warn!(backend = %backend.url, error = %error_chain(&error), "backend unreachable");
                last_error = Some(error);
            }
            Ok(Err(error)) => return Err(ApiError::upstream_unavailable(error_chain(&error))),
        }
    }
    Err(ApiError::upstream_unavailable(last_error.map(|e| error_chain(&e)).unwrap_or_else(|| "no backends".into())))
}

fn rewrite_model(body: &Bytes, model: &str) -> Result<Bytes, ApiError> {
    let mut json: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::internal(format!("the plugin chain left a body that is not JSON: {e}")))?;
    if let Some(object) = json.as_object_mut() {
        object.insert("model".into(), serde_json::Value::String(model.to_string()));
    }
    Ok(Bytes::from(json.to_string()))
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
