//! The upstream phase: the request's attempts on the route's backends, and
//! the retry policy between them (conditions, backoff, `retry-after`, the
//! retry budget), with passive health learned from every attempt.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Uri};
use http_body_util::{BodyExt, Full};
use sluice_core::{ApiError, Condition};
use sluice_telemetry::metrics::{BackendLabels, RetryLabels};
use sluice_telemetry::{Attempt, RequestRecord, trace};

use crate::backend_api::Adapter;
use crate::balance::{self, now_ms};
use crate::body::{Body, BoxError};
use crate::chain::Outgoing;
use crate::gateway::Gateway;
use crate::headers::{self, ForBackend};
use crate::snapshot::{Backend, Route};
use crate::upstream::Refused;

/// What the upstream phase ends with.
pub(crate) struct Forwarded {
    /// The response to relay (possibly the upstream's own error), or the
    /// gateway's error.
    pub response: Result<http::Response<Body>, ApiError>,
    /// How the last attempt failed, if it did: a fallback may take the
    /// request elsewhere.
    pub failure: Option<Condition>,
    /// The backend that answered.
    pub backend: Option<usize>,
}

/// One attempt's result.
struct Tried {
    response: Result<http::Response<Body>, ApiError>,
    failure: Option<Condition>,
    retry_after: Option<Duration>,
}

/// Sends the request to the route's backends, in the order the balancer
/// gives, until one answers or the retry policy gives up; the last answer
/// (an upstream's 429 included) is what the client gets.
pub(crate) async fn forward(
    gateway: &Gateway,
    route: &Route,
    outgoing: &mut Outgoing,
    record: &mut RequestRecord,
) -> Forwarded {
    let policy = &route.decl.retry;
    let mut plan = route.plan();
    // A backend a plugin chose is tried first, unless it is ejected: its
    // health is the route's to judge. The rest follow in the route's order.
    if let Some(name) = &outgoing.routed_backend
        && let Some(index) = route.decl.backends.iter().position(|b| b.name.as_deref() == Some(name.as_str()))
        && let Some(at) = plan.iter().position(|&i| i == index)
    {
        plan[..=at].rotate_right(1);
    }
    let attempts = policy.attempts.unwrap_or(plan.len() as u32).max(1);
    let _in_flight = route.budget.request();
    // Held until the next attempt's head arrives, or the phase ends.
    let mut _retry_in_flight = None;
    // Backends that asked for more time than the route waits.
    let mut skipped: Vec<usize> = Vec::new();
    let mut position = 0;
    let mut retries = 0;
    let needs_error_code = route.wants(Condition::ContextLengthExceeded);
    loop {
        let Some(index) = next(&plan, &mut position, &skipped) else {
            return gave_up();
        };
        let backend = &route.backends[index];
        // No request follows the last attempt: it takes the headers
        // rather than a copy.
        let last = retries + 1 >= attempts;
        let tried = attempt(gateway, route, backend, outgoing, last, record, needs_error_code).await;
        learn(route, backend, tried.failure);
        let Some(condition) = tried.failure else {
            return Forwarded { response: tried.response, failure: None, backend: Some(index) };
        };
        let done =
            |tried: Tried| Forwarded { response: tried.response, failure: Some(condition), backend: Some(index) };
        if !policy.on.contains(condition) || retries + 1 >= attempts {
            return done(tried);
        }
        if let Some(after) = tried.retry_after
            && after > policy.max_retry_after
        {
            // Not worth waiting for here, nor sending it more meanwhile.
            backend.health.cool_down(now_ms(), after);
            ejected(route, backend, after, "retry-after");
            skipped.push(index);
        }
        let Some(following) = peek(&plan, position, &skipped) else {
            return done(tried);
        };
        // A connect failure put no load on the backend: only retries that
        // may have are budgeted.
        if condition != Condition::ConnectFailure {
            match route.budget.retry(policy.budget_percent, policy.budget_min_concurrency) {
                Some(held) => _retry_in_flight = Some(held),
                None => {
                    count_retry(route, backend, condition, "budget_exhausted");
                    return done(tried);
                }
            }
        }
        count_retry(route, backend, condition, "retried");
        retries += 1;
        let asked = tried.retry_after.filter(|after| *after <= policy.max_retry_after);
        // The failed response goes (its connection with it) before waiting.
        drop(tried);
        // Another backend is tried at once; the same one after a backoff,
        // and no sooner than it asked.
        if following == index {
            let wait = balance::backoff(retries, policy.backoff_base, policy.backoff_max, fastrand::u64(..));
            tokio::time::sleep(wait.max(asked.unwrap_or_default())).await;
        }
    }
}

fn gave_up() -> Forwarded {
    Forwarded {
        response: Err(ApiError::upstream_unavailable("every backend is out of rotation")),
        failure: None,
        backend: None,
    }
}

/// The next backend of the plan not skipped, from `position` on, wrapping
/// around (a single backend is retried itself).
fn next(plan: &[usize], position: &mut usize, skipped: &[usize]) -> Option<usize> {
    let found = peek(plan, *position, skipped)?;
    while plan[*position % plan.len()] != found {
        *position += 1;
    }
    *position += 1;
    Some(found)
}

fn peek(plan: &[usize], position: usize, skipped: &[usize]) -> Option<usize> {
    (0..plan.len()).map(|k| plan[(position + k) % plan.len()]).find(|i| !skipped.contains(i))
}

/// What the attempt says about the backend's health.
fn learn(route: &Route, backend: &Backend, failure: Option<Condition>) {
    let now = now_ms();
    match failure {
        Some(condition) if condition.is_backend_failure() => {
            if let Some(duration) = backend.health.failure(now, &route.decl.outlier) {
                ejected(route, backend, duration, "outlier detection");
            }
        }
        _ => backend.health.success(now, &route.decl.outlier),
    }
}

fn ejected(route: &Route, backend: &Backend, duration: Duration, why: &str) {
    tracing::warn!(route = %route.label, backend = %backend.label, seconds = duration.as_secs_f64(), "backend ejected ({why})");
    let labels = BackendLabels { route: route.label.clone(), backend: backend.label.clone() };
    sluice_telemetry::metrics().backend_ejections.get_or_create(&labels).inc();
}

fn count_retry(route: &Route, backend: &Backend, condition: Condition, result: &'static str) {
    let labels =
        RetryLabels { route: route.label.clone(), backend: backend.label.clone(), condition: condition.name(), result };
    sluice_telemetry::metrics().upstream_retries.get_or_create(&labels).inc();
}

/// One attempt on one backend: the request as the backend takes it, its
/// response head within the deadline, and the response as the client
/// takes it (translated from the backend's API).
async fn attempt(
    gateway: &Gateway,
    route: &Route,
    backend: &Backend,
    outgoing: &mut Outgoing,
    last: bool,
    record: &mut RequestRecord,
    needs_error_code: bool,
) -> Tried {
    let prepared = match prepare(backend, outgoing) {
        Ok(prepared) => prepared,
        Err(error) => return Tried { response: Err(error), failure: None, retry_after: None },
    };
    let mut request = http::Request::new(Full::new(prepared.body));
    *request.method_mut() = outgoing.method.clone();
    *request.uri_mut() = prepared.uri;
    let headers = request.headers_mut();
    if last {
        *headers = std::mem::take(&mut outgoing.headers);
    } else {
        headers.clone_from(&outgoing.headers);
    }
    // The upstream's parent span is this attempt's.
    let traced = record.trace.as_ref().map(|trace| {
        let span_id = trace::new_span_id();
        (span_id, HeaderValue::from_str(&trace.traceparent(span_id)).ok())
    });
    let (span_id, traceparent) = traced.map_or((None, None), |(id, value)| (Some(id), value));
    let rules = ForBackend {
        backend,
        via: &gateway.settings.via,
        traceparent,
        plugins_read_response: outgoing.plugins_read_response,
    };
    headers::for_backend(headers, rules);
    let timeout = head_timeout(route, backend);
    let client = backend.client.as_ref().unwrap_or(&gateway.upstream);
    let start = record.elapsed();
    let sent = tokio::time::timeout(timeout, client.send(request)).await;
    let mut attempt =
        Attempt { backend: backend.label.clone(), start, end: record.elapsed(), status: None, error: None, span_id };
    let failed = |mut attempt: Attempt, record: &mut RequestRecord, error: ApiError, condition| {
        attempt.error = Some(error.message.clone());
        record.attempt(attempt);
        Tried { response: Err(error), failure: Some(condition), retry_after: None }
    };
    let response = match sent {
        Err(_) => {
            let error = ApiError::upstream_timeout(timeout.as_millis() as u64);
            return failed(attempt, record, error, Condition::Timeout);
        }
        // Never connected: the backend's address is one the gateway's
        // backends may not reach. Not the backend's failure, nor retried.
        Ok(Err(error)) if Refused::found_in(&error).is_some() => {
            let refused = Refused::found_in(&error).map(ToString::to_string).unwrap_or_default();
            tracing::warn!(backend = %backend.label, error = %refused, request_id = &*record.id, "backend not permitted");
            let error = ApiError::backend_not_permitted(refused);
            attempt.error = Some(error.message.clone());
            record.attempt(attempt);
            return Tried { response: Err(error), failure: None, retry_after: None };
        }
        // Nothing reached the backend.
        Ok(Err(error)) if error.is_connect() => {
            let message = error_chain(&error);
            tracing::warn!(backend = %backend.label, error = %message, request_id = &*record.id, "backend unreachable");
            return failed(attempt, record, ApiError::upstream_unavailable(message), Condition::ConnectFailure);
        }
        // The request may have reached it.
        Ok(Err(error)) => {
            let error = ApiError::upstream_unavailable(error_chain(&error));
            return failed(attempt, record, error, Condition::Reset);
        }
        Ok(Ok(response)) => response,
    };
    let status = response.status().as_u16();
    attempt.status = Some(status);
    record.attempt(attempt);
    record.provider = backend.provider.name();
    let retry_after = balance::retry_after(response.headers());
    let response = response.map(|body| body.map_err(|e| -> BoxError { Box::new(e) }).boxed_unsync());
    let idle = backend.timeouts.idle.unwrap_or(gateway.settings.upstream_idle_timeout);
    let api = Adapter::of(backend.provider);
    let (response, error_code) =
        match api.response(response, prepared.stream, &gateway.settings, idle, needs_error_code).await {
            Ok(translated) => translated,
            Err(error) => return Tried { response: Err(error), failure: Some(Condition::Reset), retry_after },
        };
    let failure = match error_code.as_deref() {
        Some("context_length_exceeded") => Some(Condition::ContextLengthExceeded),
        _ => Condition::of_status(status),
    };
    Tried { response: Ok(response), failure, retry_after }
}

/// The deadline for the response head: the backend's first-byte timeout
/// (else the route's), the retry policy's per-try timeout and the
/// backend's total, whichever is shortest.
fn head_timeout(route: &Route, backend: &Backend) -> Duration {
    let mut timeout = backend.timeouts.first_byte.unwrap_or(route.decl.timeout);
    for limit in [route.decl.retry.per_try_timeout, backend.timeouts.total].into_iter().flatten() {
        timeout = timeout.min(limit);
    }
    timeout
}

/// The request as the backend takes it.
struct Prepared {
    uri: Uri,
    body: Bytes,
    /// For a translated request: it streams, and whether the client asked
    /// for usage in the stream.
    stream: Option<bool>,
}

fn prepare(backend: &Backend, outgoing: &Outgoing) -> Result<Prepared, ApiError> {
    let uri = backend
        .target
        .uri(&outgoing.path)
        .map_err(|e| ApiError::internal(format!("backend url {}: {e}", backend.label)))?;
    let translated = Adapter::of(backend.provider).request(&outgoing.path, &outgoing.body, backend.model.as_deref())?;
    Ok(Prepared { uri, body: translated.body, stream: translated.stream })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_walked_in_order_wrapping_around_and_skipping() {
        let plan = [2, 0, 1];
        let mut position = 0;
        assert_eq!(next(&plan, &mut position, &[]), Some(2));
        assert_eq!(next(&plan, &mut position, &[0]), Some(1));
        assert_eq!(next(&plan, &mut position, &[0]), Some(2));
        assert_eq!(next(&plan, &mut position, &[0, 1, 2]), None);
        // One backend: retried itself.
        let mut position = 0;
        assert_eq!(next(&[5], &mut position, &[]), Some(5));
        assert_eq!(next(&[5], &mut position, &[]), Some(5));
        assert_eq!(peek(&[], 0, &[]), None);
    }
}
