//! A route's plugin chain during one exchange: the request phase runs each
//! plugin's request hook in chain order, and keeps the instances that want
//! to see the response ([`Engaged`]) for the response phase.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode, header};
use sluice_chat::ChatBody;
use sluice_core::{ApiError, Condition, FailurePolicy, Phase};
use sluice_runtime::headers::{MAX_HEADERS, apply_edits, strip_hop_by_hop};
use sluice_runtime::{
    Hooks, OutboundCall, PluginError, PluginInstance, PluginRequest, RequestAction, Settlement, settle_all,
};

use sluice_telemetry::{Hook, OutboundSpan, Outcome, RequestRecord};

use crate::body::{Body, error_response, full};
use crate::snapshot::{LoadedPlugin, Route, Snapshot};

/// The hooks that keep an instance alive past the request phase.
pub fn response_hooks() -> Hooks {
    Hooks::RESPONSE_HEAD | Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY | Hooks::RESPONSE_END
}

/// The request as the chain edits it.
#[derive(Clone)]
pub struct Outgoing {
    pub method: Method,
    /// Path and query.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// `body` as routing read it, handed to the plugins so they do not read
    /// it again; used only while it is a reading of `body`.
    pub chat: Option<ChatBody>,
    /// A plugin reads the response body (its headers then ask for it
    /// unencoded: [`crate::headers`]).
    pub plugins_read_response: bool,
    /// The model a plugin routed the request to (`set-model`), checked.
    pub routed_model: Option<String>,
    /// The backend of the route a plugin chose (`set-backend`), checked.
    pub routed_backend: Option<String>,
}

impl Outgoing {
    pub fn new(parts: http::request::Parts, body: Bytes) -> Self {
        let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_string(), |p| p.to_string());
        let mut headers = parts.headers;
        strip_hop_by_hop(&mut headers);
        Self {
            method: parts.method,
            path,
            headers,
            body,
            chat: None,
            plugins_read_response: false,
            routed_model: None,
            routed_backend: None,
        }
    }
}

/// A plugin instance engaged in this exchange: it saw the request and waits
/// for the response, in reverse chain order.
pub struct Engaged {
    pub plugin: Arc<LoadedPlugin>,
    pub instance: PluginInstance,
    /// Set when the plugin failed under `failurePolicy: Open`: it is skipped
    /// for the rest of this exchange.
    skipped: bool,
}

impl Engaged {
    /// The hooks still to call: none once the plugin is skipped.
    pub fn hooks(&self) -> Hooks {
        if self.skipped { Hooks::empty() } else { self.plugin.hooks() }
    }

    pub fn wants(&self, hook: Hooks) -> bool {
        self.hooks().contains(hook)
    }

    pub fn name(&self) -> &str {
        self.plugin.name()
    }

    /// A failing plugin ends the exchange (`Closed`) or is skipped from here
    /// on (`Open`).
    pub fn fail(&mut self, error: PluginError) -> Result<(), ApiError> {
        self.plugin.on_failure(error)?;
        self.skipped = true;
        Ok(())
    }

    /// Records a call of `hook` that started at `started`, and puts a
    /// failure under the plugin's policy: `Ok(None)` when it is skipped.
    pub fn settle<T>(
        &mut self,
        record: &mut RequestRecord,
        hook: Hook,
        started: Instant,
        result: Result<T, PluginError>,
    ) -> Result<Option<T>, ApiError> {
        record_calls(record, &self.plugin, hook, self.instance.take_outbound_calls());
        match result {
            Ok(value) => {
                record.plugin_call(&self.plugin.id, hook, started, Outcome::Continue);
                Ok(Some(value))
            }
            Err(error) => {
                record.plugin_call(&self.plugin.id, hook, started, outcome(&error));
                self.fail(error)?;
                record.plugin_skipped(&self.plugin.id, hook);
                Ok(None)
            }
        }
    }
}

/// The outbound calls `plugin` made in `hook`, as spans of the request.
pub fn record_calls(record: &mut RequestRecord, plugin: &LoadedPlugin, hook: Hook, calls: Vec<OutboundCall>) {
    let started = record.started;
    let since = |at: Instant| at.saturating_duration_since(started);
    for call in calls {
        let span = OutboundSpan {
            plugin: plugin.id.clone(),
            hook,
            destination: call.destination,
            start: since(call.started),
            end: since(call.ended),
            status: call.status,
            result: call.result,
            span_id: call.span_id,
        };
        record.outbound_call(span);
    }
}

/// How the request phase ended.
pub enum Filtered {
    /// Forward the (edited) request; these instances wait for the response,
    /// which gets the headers plugins set for it, and these reservations are
    /// settled by its usage when it ends.
    Forward(Vec<Engaged>, HeaderMap, Vec<Settlement>),
    /// A plugin answered the request itself.
    Respond(http::Response<Body>),
}

/// The request as plugins see it: the body is the one the proxy parsed to
/// route it (so it is valid JSON), written back once, after the chain.
fn plugin_request(route: &Route, model: &str, outgoing: &mut Outgoing, max_body_bytes: usize) -> PluginRequest {
    let body = match outgoing.chat.take() {
        Some(chat) if chat.is_reading_of(&outgoing.body) => chat,
        _ => ChatBody::validated(outgoing.body.clone()),
    };
    let mut request = PluginRequest::new(
        outgoing.method.to_string(),
        outgoing.path.clone(),
        model.to_string(),
        // The route's label is its key as text, made once.
        String::from(&*route.label),
        std::mem::take(&mut outgoing.headers),
        body,
    );
    request.max_body_bytes = max_body_bytes;
    request
}

/// Runs the route's request hooks in chain order. A body a plugin writes is
/// held to `max_body_bytes`, like the client's.
pub async fn request_filters(
    routing: Routing<'_>,
    model: &str,
    outgoing: &mut Outgoing,
    max_body_bytes: usize,
    record: &mut RequestRecord,
) -> Result<Filtered, ApiError> {
    let route = routing.route;
    // A route without plugins forwards the request as it came: nothing to
    // build for plugins (4 of a plain hop's 47 allocations).
    if route.chain.is_empty() {
        return Ok(Filtered::Forward(Vec::new(), HeaderMap::new(), Vec::new()));
    }
    // Boxed: the hooks' futures hold a plugin call's state (4 KiB), and
    // every request's future would carry it, copied whole as hyper takes
    // the future in, plugins or not.
    Box::pin(run_chain(routing, model, outgoing, max_body_bytes, record)).await
}

/// Where a routing decision may send a request: the models its route
/// serves, those of the routes of its namespace that serve its endpoint,
/// and the backends of the route that serves the model chosen.
#[derive(Clone, Copy)]
pub struct Routing<'a> {
    pub route: &'a Route,
    pub snapshot: &'a Snapshot,
    pub endpoint: &'a str,
}

impl<'a> Routing<'a> {
    /// The route that would serve `model` for this request, if a plugin
    /// may route it there: never another namespace's (its backends and
    /// keys are another tenant's), as for fallbacks.
    pub fn route_for(&self, model: &str) -> Result<&'a Route, String> {
        if self.route.decl.models.iter().any(|m| m == model) {
            return Ok(self.route);
        }
        let namespace = &self.route.decl.key.namespace;
        match self.snapshot.routed(model) {
            Some((route, _)) if route.decl.key.namespace == *namespace && route.endpoints.contains(self.endpoint) => {
                Ok(route)
            }
            Some((route, _)) if route.decl.key.namespace == *namespace => {
                Err(format!("it routed the request to model `{model}`, whose route does not serve {}", self.endpoint))
            }
            _ => Err(format!(
                "it routed the request to model `{model}`, which no route of namespace `{namespace}` serves"
            )),
        }
    }

    /// Checks the routing decisions `plugin` made in its hook.
    fn check(&self, plugin: &LoadedPlugin, request: &PluginRequest) -> Result<(), PluginError> {
        if !request.rerouted && request.backend.is_none() {
            return Ok(());
        }
        if plugin.decl.phase == Phase::Auth {
            return Err(PluginError::InvalidEdit(
                "it made a routing decision in the auth phase, which runs before routing".into(),
            ));
        }
        let route = match request.rerouted {
            true => self.route_for(&request.model).map_err(PluginError::InvalidEdit)?,
            false => self.route,
        };
        if let Some(name) = &request.backend
            && !route.decl.backends.iter().any(|b| b.name.as_deref() == Some(name.as_str()))
        {
            return Err(PluginError::InvalidEdit(format!(
                "it chose backend `{name}`, which route {} does not name",
                route.label
            )));
        }
        Ok(())
    }
}

async fn run_chain(
    routing: Routing<'_>,
    model: &str,
    outgoing: &mut Outgoing,
    max_body_bytes: usize,
    record: &mut RequestRecord,
) -> Result<Filtered, ApiError> {
    let route = routing.route;
    let mut request = plugin_request(route, model, outgoing, max_body_bytes);
    let (engaged, marks, settlements) = match walk(&route.chain, Some(routing), &mut request, record).await? {
        Walked::Forward(engaged, marks, settlements) => (engaged, marks, settlements),
        Walked::Respond(response, _) => return Ok(Filtered::Respond(response)),
    };
    outgoing.headers = request.headers;
    // Written here, once, if plugins edited it in place.
    outgoing.body = request.body.bytes();
    outgoing.routed_model = request.rerouted.then_some(request.model);
    outgoing.routed_backend = request.backend;
    Ok(Filtered::Forward(engaged, marks, settlements))
}

/// How a walk through a chain's request hooks ended.
enum Walked {
    /// The instances that wait for the response, the response headers the
    /// plugins set, and the reservations to settle at its end.
    Forward(Vec<Engaged>, HeaderMap, Vec<Settlement>),
    /// A plugin answered (its reservations settled): the answer, and the
    /// plugin's name.
    Respond(http::Response<Body>, String),
}

/// Each plugin's request hook in chain order; the consumer is read when
/// the auth phase ends. `routing` is what a plugin may route to (none on
/// MCP traffic).
async fn walk(
    chain: &[Arc<LoadedPlugin>],
    routing: Option<Routing<'_>>,
    request: &mut PluginRequest,
    record: &mut RequestRecord,
) -> Result<Walked, ApiError> {
    let mut engaged = Vec::new();
    // The response headers each plugin set, in chain order.
    let mut marks = Vec::new();
    let mut settlements = Vec::new();
    for (i, plugin) in chain.iter().enumerate() {
        let step = request_filter(plugin, routing, request, Some(&mut *record), &mut settlements).await?;
        marks.push(std::mem::take(&mut request.response_headers));
        let auth_phase_ends =
            plugin.decl.phase == Phase::Auth && chain.get(i + 1).is_none_or(|next| next.decl.phase != Phase::Auth);
        if auth_phase_ends {
            record.consumer = consumer(&request.headers);
            request.consumer.clone_from(&record.consumer);
        }
        match step {
            Step::Continue(instance) => {
                engaged.extend(instance.map(|instance| Engaged { plugin: plugin.clone(), instance, skipped: false }))
            }
            Step::Respond(mut response) => {
                set_all(response.headers_mut(), &response_marks(marks));
                // No upstream, no usage: a refusal counts the request alone,
                // another answer (a cache's) what was reserved.
                settle_all(settlements, response.status().as_u16(), None);
                return Ok(Walked::Respond(response, plugin.name().to_string()));
            }
        }
    }
    Ok(Walked::Forward(engaged, response_marks(marks), settlements))
}

/// How an MCP message's request phase ended.
pub enum McpFiltered {
    /// Forward the (edited) message; the response gets these headers, and
    /// these instances see the server's answer.
    Forward(HeaderMap, Vec<Engaged>),
    /// A plugin answered: its response, and its name.
    Respond(http::Response<Body>, String),
}

/// Runs an MCP route's request hooks in chain order on one JSON-RPC
/// message (`request.mcp` says what it is), keeping the instances that
/// want to see the answer.
pub async fn mcp_filters(
    chain: &[Arc<LoadedPlugin>],
    request: &mut PluginRequest,
    record: &mut RequestRecord,
) -> Result<McpFiltered, ApiError> {
    // Boxed, as the chat path's chain is: a plugin call's state is large.
    match Box::pin(walk(chain, None, request, record)).await? {
        Walked::Forward(engaged, marks, settlements) => {
            // No upstream usage to settle a reservation by: the message counts.
            settle_all(settlements, 200, None);
            Ok(McpFiltered::Forward(marks, engaged))
        }
        Walked::Respond(response, plugin) => Ok(McpFiltered::Respond(response, plugin)),
    }
}

/// The header in which auth plugins name the caller (the first-party auth
/// plugin's default `consumerHeader`). Read when the auth phase ends, so a
/// client cannot name itself: the auth plugin owns the header.
pub const CONSUMER_HEADER: &str = "x-sluice-consumer";

/// The longest consumer name recorded, in bytes.
const MAX_CONSUMER_BYTES: usize = 256;

fn consumer(headers: &HeaderMap) -> Option<String> {
    let name = headers.get(CONSUMER_HEADER)?.to_str().ok()?;
    Some(name[..name.floor_char_boundary(MAX_CONSUMER_BYTES)].to_string())
}

/// The response headers plugins set from the request phase, as the response
/// hooks would leave them (they run in reverse chain order): where two set
/// one header, the earlier plugin's value wins. Each plugin may set at most
/// `MAX_HEADERS`; all of them together too.
fn response_marks(marks: Vec<HeaderMap>) -> HeaderMap {
    let mut marks = marks.into_iter().filter(|mark| !mark.is_empty());
    // The headers of the first plugin that set any are taken whole (each
    // plugin's are bounded as they are set): most requests have only one
    // such plugin, and its headers need no copy.
    let mut headers = marks.next().unwrap_or_default();
    for mark in marks {
        for name in mark.keys() {
            if headers.contains_key(name) || headers.len() >= MAX_HEADERS {
                continue;
            }
            for value in mark.get_all(name) {
                headers.append(name, value.clone());
            }
        }
    }
    headers
}

/// Sets every header of `set` on `headers`, replacing values of the same
/// name; past what a `HeaderMap` holds, the rest are dropped (never a panic).
pub fn set_all(headers: &mut HeaderMap, set: &HeaderMap) {
    for name in set.keys() {
        headers.remove(name);
    }
    for (name, value) in set {
        if headers.try_append(name, value.clone()).is_err() {
            tracing::warn!(header = %name, "response header dropped: too many headers");
            break;
        }
    }
}

enum Step {
    /// Go on; the instance is kept if the plugin wants the response.
    Continue(Option<PluginInstance>),
    Respond(http::Response<Body>),
}

/// One plugin's request hook, under its failure policy: a plugin that
/// fails open is skipped, and the request goes on as it was before it.
/// Recorded in `record`, if given. The reservations the plugin leaves to
/// settle at the response's end go to `settlements`.
async fn request_filter(
    plugin: &LoadedPlugin,
    routing: Option<Routing<'_>>,
    request: &mut PluginRequest,
    mut record: Option<&mut RequestRecord>,
    settlements: &mut Vec<Settlement>,
) -> Result<Step, ApiError> {
    let before = (plugin.decl.failure_policy == FailurePolicy::Open).then(|| request.clone());
    let started = Instant::now();
    let request_id = record.as_ref().map(|record| record.id.clone());
    let trace = record.as_ref().and_then(|record| record.trace.as_ref()).filter(|t| t.sampled).map(|t| t.trace_id);
    let mut calls = Vec::new();
    let result = run_request_filter(plugin, routing, request, (request_id, trace), settlements, &mut calls).await;
    if let Some(record) = record.as_deref_mut() {
        record_calls(record, plugin, Hook::Request, calls);
    }
    // A plugin without a request hook only had an instance made here (for
    // its response hooks): not a call, unless that failed.
    let called = plugin.hooks().contains(Hooks::REQUEST) || result.is_err();
    if let Some(record) = record.as_deref_mut().filter(|_| called) {
        let outcome = match &result {
            Ok(Step::Respond(_)) => Outcome::Respond,
            Ok(Step::Continue(_)) => Outcome::Continue,
            Err(error) => outcome(error),
        };
        record.plugin_call(&plugin.id, Hook::Request, started, outcome);
    }
    match result {
        Ok(step) => Ok(step),
        Err(error) => {
            plugin.on_failure(error)?;
            if let Some(record) = record {
                record.plugin_skipped(&plugin.id, Hook::Request);
            }
            if let Some(before) = before {
                *request = before;
            }
            Ok(Step::Continue(None))
        }
    }
}

/// How a failed call counts in metrics and spans.
pub fn outcome(error: &PluginError) -> Outcome {
    match error {
        PluginError::Timeout(_) => Outcome::Timeout,
        PluginError::MemoryLimit(_) => Outcome::MemoryLimit,
        PluginError::Trap(_) | PluginError::ConfigRejected(_) => Outcome::Trap,
        PluginError::InvalidEdit(_) => Outcome::InvalidEdit,
        PluginError::Overloaded(_) => Outcome::Overloaded,
        PluginError::StateUnavailable(_) => Outcome::StateUnavailable,
    }
}

async fn run_request_filter(
    plugin: &LoadedPlugin,
    routing: Option<Routing<'_>>,
    request: &mut PluginRequest,
    (request_id, trace): (Option<Arc<str>>, Option<[u8; 16]>),
    settlements: &mut Vec<Settlement>,
    calls: &mut Vec<OutboundCall>,
) -> Result<Step, PluginError> {
    let hooks = plugin.hooks();
    if hooks == Hooks::empty() {
        return Ok(Step::Continue(None));
    }
    let mut instance = plugin.instance().await?;
    if let Some(request_id) = request_id {
        instance.serve_request(request_id);
    }
    instance.serve_trace(trace);
    if hooks.contains(Hooks::REQUEST) {
        let result = instance.request_filter(request).await;
        // Its calls are the request's, whether the hook returned or not.
        calls.extend(instance.take_outbound_calls());
        let action = result?;
        // A decision it may not make fails it, under its failure policy
        // (`Open` undoes its edits, the decision included). MCP traffic
        // has no models or backends to choose.
        match routing {
            Some(routing) => routing.check(plugin, request)?,
            None if request.rerouted || request.backend.is_some() => {
                return Err(PluginError::InvalidEdit(
                    "it made a routing decision on MCP traffic, which has no models or backends".into(),
                ));
            }
            None => {}
        }
        // Only from a hook that returned: a failed one's reservations stay
        // counted as reserved, as its edits are undone.
        settlements.extend(instance.take_settlements());
        match action {
            RequestAction::Continue => {}
            RequestAction::Respond(direct) => {
                check_direct_status(direct.status)?;
                return Ok(Step::Respond(direct_response(plugin, direct)));
            }
        }
    }
    let keep = hooks.intersects(response_hooks());
    Ok(Step::Continue(keep.then_some(instance)))
}

/// A plugin answers with a final status: not 1xx (101 would switch the
/// client's connection to another protocol), not past 599.
fn check_direct_status(status: u16) -> Result<(), PluginError> {
    if (200..=599).contains(&status) {
        Ok(())
    } else {
        Err(PluginError::InvalidEdit(format!("it answered with status {status}, outside 200..=599")))
    }
}

/// A plugin's answer names a failure a route's fallback may name: the
/// request is too long for the model (context-trim's refusal).
#[derive(Clone, Copy, Debug)]
pub struct Refusal(pub Condition);

fn direct_response(plugin: &LoadedPlugin, direct: sluice_runtime::DirectResponse) -> http::Response<Body> {
    let status = StatusCode::from_u16(direct.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if direct.body.is_empty() && status.as_u16() >= 400 {
        // The host writes the body; the plugin's headers (a 429's
        // `retry-after` and rate-limit figures) go with it, but for the
        // body's own type.
        let mut response = error_response(&ApiError::plugin_rejected(plugin.name(), status.as_u16()));
        let headers: Vec<_> =
            direct.headers.into_iter().filter(|(name, _)| !name.eq_ignore_ascii_case("content-type")).collect();
        if let Err(error) = apply_edits(response.headers_mut(), &headers, &[]) {
            tracing::warn!(plugin = plugin.name(), %error, "direct response header dropped");
        }
        return response;
    }
    let refusal = (status == StatusCode::BAD_REQUEST
        && crate::backend_api::error_code(&direct.body).as_deref() == Some("context_length_exceeded"))
    .then_some(Refusal(Condition::ContextLengthExceeded));
    let mut response = http::Response::new(full(direct.body));
    if let Some(refusal) = refusal {
        response.extensions_mut().insert(refusal);
    }
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Err(error) = apply_edits(headers, &direct.headers, &[]) {
        tracing::warn!(plugin = plugin.name(), %error, "direct response header dropped");
    }
    headers.remove(header::CONTENT_LENGTH);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first plugin to set a response header wins, as with response
    /// hooks; together plugins set at most MAX_HEADERS.
    #[test]
    fn response_marks_unwind_the_chain_and_are_bounded() {
        let mark = |pairs: &[(&str, &str)]| -> HeaderMap {
            pairs.iter().map(|(n, v)| (n.parse().unwrap(), v.parse().unwrap())).collect()
        };
        let merged = response_marks(vec![mark(&[("x-a", "1")]), mark(&[("x-a", "2"), ("x-b", "2")])]);
        assert_eq!(merged.get("x-a").unwrap(), "1");
        assert_eq!(merged.get("x-b").unwrap(), "2");
        let full: Vec<HeaderMap> = (0..3)
            .map(|p| (0..MAX_HEADERS).map(|i| (format!("x-{p}-{i}").parse().unwrap(), "v".parse().unwrap())).collect())
            .collect();
        assert_eq!(response_marks(full).len(), MAX_HEADERS);
    }

    /// A plugin's direct response must have a final status: a 1xx, or one
    /// past 599, is refused.
    #[test]
    fn a_direct_response_has_a_final_status() {
        for status in [100, 101, 199, 600, 999, 0] {
            assert!(check_direct_status(status).is_err(), "{status}");
        }
        for status in [200, 204, 403, 429, 599] {
            assert!(check_direct_status(status).is_ok(), "{status}");
        }
    }
}
