//! One request's way through the data plane: the endpoints, and for the
//! forwarded ones, the phases from reading the body to forwarding it.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sluice_chat::ChatBody;
use sluice_core::ApiError;
use tokio::sync::OwnedSemaphorePermit;

use sluice_telemetry::record::operation_of;
use sluice_telemetry::{RequestRecord, request_id, trace};

use crate::body::{Body, ErrorCode, error_response, json_response};
use crate::chain::Outgoing;
use crate::fallback::{self, Hop};
use crate::gateway::Gateway;
use crate::headers::TRACEPARENT;
use sluice_runtime::headers::not_utf8;

use crate::json::Checked;
use crate::snapshot::Snapshot;
use crate::target::FORWARDED;

// Names rather than strings: inserting a `&'static str` key that is not
// there yet allocates its name, on every request.
const REQUEST_ID: HeaderName = HeaderName::from_static(request_id::HEADER);
const UPSTREAM_REQUEST_ID: HeaderName = HeaderName::from_static("x-upstream-request-id");

pub async fn handle(gateway: Arc<Gateway>, mut request: http::Request<Incoming>) -> http::Response<Body> {
    let (mut record, id) = start_record(&mut request);
    // Shed load before doing any work: the permit lives as long as the
    // response, its stream included.
    let mut response = match admit(&gateway, &request) {
        Err(error) => {
            tracing::warn!(status = error.status, code = error.code, request_id = &*record.id, "{}", error.message);
            error_response(&error)
        }
        Ok(admitted) => {
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
                    let _held = &admitted;
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

/// A request's place among those in flight: a permit of the gateway's, and
/// its count against its peer address's share. A connection may have
/// `max_in_flight_per_connection` in flight, and a peer address its share,
/// so that one client cannot take every place with requests whose
/// responses it never reads (each is held until its body is sent, or the
/// write timeout closes the connection).
fn admit(
    gateway: &Gateway,
    request: &http::Request<Incoming>,
) -> Result<(OwnedSemaphorePermit, Option<crate::gateway::PeerShare>), ApiError> {
    let settings = &gateway.settings;
    let connection = request.extensions().get::<sluice_serve::Connection>();
    let mut share = None;
    if let Some(connection) = connection {
        let most = settings.max_in_flight_per_connection;
        if connection.in_flight > most {
            return Err(ApiError::overloaded(format_args!("{most} requests in flight on this connection")));
        }
        let peer = sluice_serve::peer_group(connection.peer.ip());
        share = gateway.peers.take(peer).map_err(|most| {
            ApiError::overloaded(format_args!("{most} requests in flight from this client's address"))
        })?;
    }
    let permit = gateway
        .in_flight
        .clone()
        .try_acquire_owned()
        .map_err(|_| ApiError::overloaded(format_args!("{} requests in flight", settings.max_in_flight)))?;
    Ok((permit, share))
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
        (&Method::GET, "/v1/models") => Ok(list_models(&snapshot)),
        (&Method::POST, p) if FORWARDED.contains(&p) => proxy(gateway, &snapshot, request, record).await,
        (method, p) if p == "/v1/models" || FORWARDED.contains(&p) => {
            Err(ApiError::method_not_allowed(method.as_str(), p))
        }
        (_, p) if let Some(route) = snapshot.mcp_route(p) => {
            let route = route.clone();
            crate::mcp::serve(gateway, &route, request, record).await
        }
        (&Method::GET, p)
            if let Some(route) = p.strip_prefix(crate::mcp::METADATA_PREFIX).and_then(|p| snapshot.mcp_route(p)) =>
        {
            crate::mcp::metadata(route, request.headers()).ok_or_else(|| ApiError::not_found(p))
        }
        (_, p) => Err(ApiError::not_found(p)),
    }
}

/// The models anyone may use: those whose routes have no auth plugin. A
/// listing names no model, so it is addressed to no namespace, and no
/// tenant's plugin may see it (nor the caller's credential in it): a model
/// behind auth is usable but not listed.
fn list_models(snapshot: &Snapshot) -> http::Response<Body> {
    let data: Vec<_> =
        snapshot
            .routes()
            .iter()
            .filter(|route| !route.has_auth())
            .flat_map(|route| {
                let owner = route.decl.key.to_string();
                route.decl.models.iter().map(
                    move |model| serde_json::json!({"id": model, "object": "model", "created": 0, "owned_by": owner}),
                )
            })
            .collect();
    let body = serde_json::json!({"object": "list", "data": data});
    json_response(StatusCode::OK, body.to_string().into_bytes())
}

/// The answer for a model no route serves: a plain 404, with no plugin
/// run. The request names no route's model, so it is addressed to no
/// namespace, and no tenant's plugin may see it (nor its credential).
/// Model names can be found by probing, as with OpenAI's own API.
fn unknown_model(model: &str) -> http::Response<Body> {
    error_response(&ApiError::model_not_found(model))
}

/// Refuses a request this gateway has forwarded already (its own `via`
/// entry: a route whose backend leads back to it), or one that has passed
/// through more than `max_gateway_hops` Sluice gateways. Checked before the
/// body is read or any plugin runs, so a loop costs one refusal, not a
/// request per lap until a limit stops it.
fn refuse_loops(gateway: &Gateway, headers: &HeaderMap) -> Result<(), ApiError> {
    let ours = gateway.settings.via.as_bytes();
    let ours = ours.split(u8::is_ascii_whitespace).nth(1).unwrap_or(ours);
    let mut hops = 0;
    for entry in headers.get_all(header::VIA).iter().flat_map(|value| value.as_bytes().split(|b| *b == b',')) {
        // `protocol received-by [comment]`
        let by = entry.trim_ascii().split(u8::is_ascii_whitespace).nth(1).unwrap_or_default();
        if by == ours {
            return Err(ApiError::loop_detected(
                "this gateway has forwarded the request already; a route's backend leads back to it",
            ));
        }
        hops += usize::from(by.starts_with(b"sluice-"));
    }
    let max = gateway.settings.max_gateway_hops;
    if hops > max {
        return Err(ApiError::loop_detected(format_args!(
            "the request has passed through {hops} gateways, more than {max} (--max-gateway-hops)"
        )));
    }
    Ok(())
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
    refuse_loops(gateway, request.headers())?;
    // One of FORWARDED (`serve` sends only those here), kept for the check
    // of each route's endpoints.
    let endpoint = FORWARDED.iter().copied().find(|p| *p == request.uri().path()).unwrap_or_default();
    let (parts, body) = request.into_parts();
    // The budget is held until the response head: by then the request body
    // has been sent upstream and dropped.
    let (body, _budget) = crate::request_body::read_body(gateway, body, &parts.headers).await?;
    let (model, chat) = requested_model(&body)?;
    let mut client_request = Outgoing::new(parts, body);
    client_request.chat = chat;
    // Plugins see header values as strings: one that is not UTF-8 would
    // reach the upstream unseen by them.
    if let Some(name) = not_utf8(&client_request.headers) {
        return Err(ApiError::invalid_request("invalid_header", format!("the value of header `{name}` is not UTF-8")));
    }
    let Some((route, model_label)) = snapshot.routed(&model) else {
        return Ok(unknown_model(&model));
    };
    // Before any plugin runs: a route serves only the endpoints its whole
    // chain understands, or a content policy would be stepped around.
    if !route.endpoints.contains(endpoint) {
        return Err(route.endpoints.refusal(endpoint, &model));
    }
    let first = Hop { route, label: model_label, model };
    fallback::walk(gateway, snapshot, endpoint, first, client_request, record).await
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
    let routed: Routed = serde_json::from_slice(body).map_err(|error| {
        // A name twice in one object is JSON, but readers disagree on which
        // value counts (a plugin could check one, the upstream read the
        // other): refused as such, before routing.
        if error.is_data() && error.to_string().starts_with(sluice_chat::DUPLICATE_KEY) {
            ApiError::invalid_request("duplicate_key", format!("request body is refused: {error}"))
        } else {
            ApiError::invalid_json(error)
        }
    })?;
    match routed.model {
        Some(model) if !model.is_empty() => Ok(model),
        _ => Err(ApiError::invalid_request("missing_model", "the request body needs a `model` string")),
    }
}

/// A JSON object's `model` member, if it is a string.
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
                sluice_chat::check_members(&mut map, |map, name| {
                    if name == "model" {
                        model = map.next_value::<Checked<true>>()?.0;
                    } else {
                        map.next_value::<Checked<false>>()?;
                    }
                    Ok(())
                })?;
                Ok(Routed { model })
            }
        }
        deserializer.deserialize_map(Object)
    }
}

#[cfg(test)]
mod tests;
