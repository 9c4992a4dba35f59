//! The fallback walk: one route's attempt (its request hooks, the upstream,
//! the response phase) and, when the attempt fails in a way the route's
//! fallbacks name, the same again on the fallback model's route, up to
//! [`Fallback::MAX_HOPS`] times.

use std::sync::Arc;

use http::StatusCode;
use sluice_core::{ApiError, Condition, Fallback};
use sluice_runtime::{Hooks, settle_all};
use sluice_telemetry::metrics::FallbackLabels;
use sluice_telemetry::{Label, RequestRecord};

use crate::body::Body;
use crate::chain::{Filtered, Outgoing, Refusal, Routing, request_filters};
use crate::forward::forward;
use crate::gateway::Gateway;
use crate::response::{self, BodyLimits};
use crate::snapshot::{Route, Snapshot};

/// A route to try, for the model the request is then sent as.
pub(crate) struct Hop<'s> {
    pub route: &'s Arc<Route>,
    /// The model as a metric label: one the config names.
    pub label: &'s Label,
    pub model: String,
}

/// Runs `first`, then each fallback a failure leads to, and returns the
/// response of the last attempt.
pub(crate) async fn walk(
    gateway: &Gateway,
    snapshot: &Snapshot,
    endpoint: &str,
    first: Hop<'_>,
    client_request: Outgoing,
    record: &mut RequestRecord,
) -> Result<http::Response<Body>, ApiError> {
    let mut hop = first;
    // The client's request is kept for a fallback only if there may be one.
    let mut client_request = Some(client_request);
    let mut hops = 0;
    // What the chains of routes a plugin routed away from left waiting for
    // the response: their instances, marks and reservations.
    let mut routed_from: Option<Filtered> = None;
    // The backend a plugin chose on the route it routed the request to.
    let mut chosen_backend: Option<String> = None;
    loop {
        let route = hop.route;
        record.route = Some(route.label.clone());
        record.model = Some(hop.label.clone());
        // Taken only where no fallback can follow.
        let last = route.decl.fallbacks.is_empty() || hops >= Fallback::MAX_HOPS;
        let mut outgoing = if last { client_request.take() } else { client_request.clone() }
            .ok_or_else(|| ApiError::internal("the request was not kept for its fallback"))?;
        if hops > 0 {
            outgoing.body = crate::json::rewrite_model(&outgoing.body, &hop.model)?;
        }
        let routing = Routing { route, snapshot, endpoint };
        let filtered =
            request_filters(routing, &hop.model, &mut outgoing, gateway.settings.max_body_bytes, record).await?;
        let (mut engaged, mut response_headers, mut settlements) = match filtered {
            Filtered::Forward(engaged, response_headers, settlements) => (engaged, response_headers, settlements),
            Filtered::Respond(response) => {
                if let Some(Filtered::Forward(_, _, earlier)) = routed_from.take() {
                    settle_all(earlier, response.status().as_u16(), None);
                }
                // A plugin's refusal a fallback names (context-trim's
                // `context_length_exceeded`) moves the request too.
                let refused = response.extensions().get::<Refusal>().map(|r| r.0);
                if let Some(condition) = refused
                    && let Some(next) = next_hop(snapshot, route, condition, hops, endpoint)
                {
                    hop = next;
                    hops += 1;
                    continue;
                }
                return Ok(response);
            }
        };
        // A plugin routed the request to another model: on this route, it
        // goes on as that model; on another route of the namespace, it moves
        // there as if the client had asked for it (that route's chain,
        // backends, retries and fallbacks), as the edited request, and this
        // chain's instances wait for the response it gets.
        if let Some(model) = outgoing.routed_model.take() {
            if record.requested_model.is_none() {
                record.requested_model = record.model.clone();
            }
            let target = routing.route_for(&model).ok();
            match (target, snapshot.routed(&model)) {
                (Some(target), Some((_, label))) if std::ptr::eq(target, &**route) => {
                    record.model = Some(label.clone());
                    outgoing.body = crate::json::rewrite_model(&outgoing.body, &model)?;
                    hop.model = model;
                }
                (Some(_), Some((next, label))) if hops < Fallback::MAX_HOPS => {
                    tracing::debug!(route = %route.label, model = %model, request_id = &*record.id, "routed by a plugin");
                    routed_from =
                        Some(join(routed_from.take(), Filtered::Forward(engaged, response_headers, settlements)));
                    chosen_backend = outgoing.routed_backend.take();
                    client_request = Some(outgoing);
                    hop = Hop { route: next, label, model };
                    hops += 1;
                    continue;
                }
                _ => {
                    // Past the hops a request may take (or, checked a moment
                    // ago, a model the snapshot no longer routes): every
                    // chain's reservations count the request alone.
                    let status = StatusCode::INTERNAL_SERVER_ERROR.as_u16();
                    if let Some(Filtered::Forward(_, _, earlier)) = routed_from.take() {
                        settle_all(earlier, status, None);
                    }
                    settle_all(settlements, status, None);
                    return Err(ApiError::internal(format!(
                        "a plugin routed the request to `{model}` past the {} hops a request may take",
                        Fallback::MAX_HOPS
                    )));
                }
            }
        }
        // The next route's own chain may choose again.
        if outgoing.routed_backend.is_none() {
            outgoing.routed_backend = chosen_backend.take();
        }
        if let Some(Filtered::Forward(earlier, marks, reserved)) = routed_from.take() {
            // The earlier chains' response hooks run after this one's, as
            // its plugins came first; where both set a header, theirs wins.
            engaged.splice(0..0, earlier);
            crate::chain::set_all(&mut response_headers, &marks);
            settlements.extend(reserved);
        }
        outgoing.plugins_read_response =
            engaged.iter().any(|e| e.hooks().intersects(Hooks::RESPONSE_BODY | Hooks::RESPONSE_CHUNK));
        let forwarded = forward(gateway, route, &mut outgoing, record).await;
        if let Some(condition) = forwarded.failure
            && let Some(next) = next_hop(snapshot, route, condition, hops, endpoint)
        {
            tracing::info!(route = %route.label, fallback = %next.model, condition = condition.name(), request_id = &*record.id, "falling back");
            // This hop's upstream failed: its reservations count the request
            // alone; the next hop's chain reserves its own.
            settle_all(settlements, StatusCode::BAD_GATEWAY.as_u16(), None);
            hop = next;
            hops += 1;
            continue;
        }
        let upstream = match forwarded.response {
            Ok(upstream) => upstream,
            Err(error) => {
                settle_all(settlements, error.status, None);
                return Err(error);
            }
        };
        let backend = forwarded.backend.and_then(|i| route.backends.get(i));
        let limits = BodyLimits {
            idle: backend.and_then(|b| b.timeouts.idle).unwrap_or(gateway.settings.upstream_idle_timeout),
            deadline: backend.and_then(|b| b.timeouts.total).map(|total| record.started + total),
        };
        let exchange = response::Exchange { plugins: engaged, set_headers: response_headers, settlements };
        return response::respond(upstream, exchange, &gateway.settings, limits, record).await;
    }
}

/// Two chains' waiting instances, marks and reservations as one, the
/// earlier's first.
fn join(earlier: Option<Filtered>, later: Filtered) -> Filtered {
    match (earlier, later) {
        (Some(Filtered::Forward(mut engaged, mut marks, mut settlements)), Filtered::Forward(e, m, s)) => {
            engaged.extend(e);
            for (name, value) in &m {
                if !marks.contains_key(name) {
                    marks.append(name, value.clone());
                }
            }
            settlements.extend(s);
            Filtered::Forward(engaged, marks, settlements)
        }
        (_, later) => later,
    }
}

/// Where a request that failed on `route` in the way `condition` goes
/// next, if the route names a fallback for it: a model served by a route
/// in the same namespace (another tenant's backends and keys are not
/// this route's to use), and that serves the request's endpoint.
fn next_hop<'s>(
    snapshot: &'s Snapshot,
    route: &Route,
    condition: Condition,
    hops: usize,
    endpoint: &str,
) -> Option<Hop<'s>> {
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
        Some(Hop { route: next, label, model: f.model.clone() })
    })
}
