//! The request a route's plugins see and edit, one after another: in 0.3 a
//! handle (`resource request`) to this value, in 0.2 a copy of it.

use http::{HeaderMap, HeaderName};
use sluice_chat::ChatBody;

use crate::headers::apply_edits;

/// The request, as the plugins before the current one left it.
#[derive(Clone, Debug, Default)]
pub struct PluginRequest {
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The model the client asked for.
    pub model: String,
    /// The route serving it, `namespace/name`.
    pub route: String,
    pub headers: HeaderMap,
    /// Parsed once for the whole chain; written once, after it.
    pub body: ChatBody,
    /// Headers plugins set for the client's response.
    pub response_headers: HeaderMap,
    /// The most bytes a body a plugin leaves may have.
    pub max_body_bytes: usize,
    /// The first edit of the current call that could not be applied.
    pub(crate) invalid: Option<String>,
}

impl PluginRequest {
    /// A request no plugin has seen yet.
    pub fn new(method: String, path: String, model: String, route: String, headers: HeaderMap, body: ChatBody) -> Self {
        PluginRequest { method, path, model, route, headers, body, max_body_bytes: usize::MAX, ..Default::default() }
    }

    /// Why the current call's edits cannot stand, if they cannot: an edit
    /// refused during the call, or a body over the limit. Cleared.
    pub(crate) fn take_invalid(&mut self) -> Option<String> {
        let invalid = self.invalid.take();
        let len = self.body.len();
        invalid.or_else(|| {
            (len > self.max_body_bytes)
                .then(|| format!("the body it left ({len} bytes) is over the limit of {} bytes", self.max_body_bytes))
        })
    }

    fn refuse(&mut self, why: String) {
        self.invalid.get_or_insert(why);
    }

    pub(crate) fn edit_headers(&mut self, set: &[(String, String)], remove: &[String]) {
        if let Err(why) = apply_edits(&mut self.headers, set, remove) {
            self.refuse(why);
        }
    }

    pub(crate) fn set_body(&mut self, body: Vec<u8>) {
        self.body.set_bytes(body.into());
    }

    pub(crate) fn set_response_header(&mut self, name: String, value: String) {
        let mut fresh = HeaderMap::new();
        if let Err(why) = apply_edits(&mut fresh, &[(name, value)], &[]) {
            return self.refuse(why);
        }
        for (name, value) in fresh.drain().filter_map(|(name, value)| Some((name?, value))) {
            self.response_headers.insert::<HeaderName>(name, value);
        }
    }

    pub(crate) fn edit_body(&mut self, edit: impl FnOnce(&mut ChatBody) -> Result<(), String>) {
        if let Err(why) = edit(&mut self.body) {
            self.refuse(why);
        }
    }
}
