//! The header rules of the request a backend receives, in one place. The
//! client's headers arrive with their hop-by-hop ones stripped
//! ([`Outgoing::new`](crate::chain::Outgoing::new)) and are edited by the
//! plugins; then, per attempt, the gateway sets what no plugin may undo.

use http::{HeaderMap, HeaderValue, header};

use crate::backend_api::Adapter;
use crate::snapshot::Backend;

/// What the request to one backend carries besides the plugins' headers.
pub(crate) struct ForBackend<'a> {
    pub backend: &'a Backend,
    /// This gateway's `via` entry (`proxy::refuse_loops` refuses a request
    /// that comes back with it).
    pub via: &'a HeaderValue,
    /// The attempt's W3C trace context, when the request is traced.
    pub traceparent: Option<HeaderValue>,
    /// A plugin reads the response body, so it must arrive unencoded.
    pub plugins_read_response: bool,
}

/// The W3C trace context header, read from the client and written to the
/// upstream. A name, not a string: inserting a string key allocates the
/// name each time.
pub(crate) const TRACEPARENT: header::HeaderName = header::HeaderName::from_static("traceparent");

/// Applies the rules, after the plugins' edits.
pub(crate) fn for_backend(headers: &mut HeaderMap, to: ForBackend<'_>) {
    let ForBackend { backend, via, traceparent, plugins_read_response } = to;
    let api = Adapter::of(backend.provider);
    match backend.target.host() {
        Some(host) => {
            headers.insert(header::HOST, host.clone());
        }
        None => {
            headers.remove(header::HOST);
        }
    }
    // The body may have been rewritten: hyper sets the length of the one sent.
    headers.remove(header::CONTENT_LENGTH);
    api.request_headers(headers);
    // The one place that decides the response's encoding: a body the
    // gateway reads (a translation, a plugin's response-body hook) must be
    // text, not gzip.
    if plugins_read_response || api.translates_responses() {
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    }
    if let Some((name, value)) = &backend.credential {
        headers.insert(name.clone(), value.clone());
    }
    headers.append(header::VIA, via.clone());
    if let Some(traceparent) = traceparent {
        headers.insert(TRACEPARENT, traceparent);
    }
}
