//! The data plane's parsers, reachable from the fuzz targets in
//! crates/fuzz. Each item calls or re-exports the function the request path
//! uses; nothing here is a copy, and nothing outside the fuzz crate uses it.

use bytes::Bytes;
use http::HeaderMap;

pub use crate::sse::{EventSplitter, data_event, data_of, with_data};

/// The model a request body asks for; an error as its HTTP status and code.
pub fn requested_model(body: &[u8]) -> Result<String, (u16, &'static str)> {
    let body = Bytes::copy_from_slice(body);
    crate::proxy::requested_model(&body).map(|(model, _)| model).map_err(|e| (e.status, e.code))
}

/// The same, read by serde_json alone: what the one pass must agree with.
pub fn model_by_serde(body: &[u8]) -> Result<String, (u16, &'static str)> {
    crate::proxy::model_by_serde(body).map_err(|e| (e.status, e.code))
}

/// The body with a backend's model in place of the client's.
pub fn rewrite_model(body: &Bytes, model: &str) -> Result<Bytes, (u16, &'static str)> {
    crate::json::rewrite_model(body, model).map_err(|e| (e.status, e.code))
}

/// The `usage` of an upstream's JSON response or final stream chunk, as
/// (prompt, completion, total) tokens.
pub fn usage_in(json: &[u8]) -> Option<(u32, u32, u32)> {
    crate::response::usage_in(json).map(|u| (u.prompt_tokens, u.completion_tokens, u.total_tokens))
}

/// Applies a plugin's header edits.
pub fn apply_edits(headers: &mut HeaderMap, set: &[(String, String)], remove: &[String]) -> Result<(), String> {
    sluice_runtime::headers::apply_edits(headers, set, remove)
}

/// A plugin's one `set-header` and one `remove-header` call.
pub use sluice_runtime::headers::{remove_one, set_one};

/// Removes hop-by-hop headers and those `Connection` names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    sluice_runtime::headers::strip_hop_by_hop(headers)
}

/// The headers as plugins see them.
pub fn to_pairs(headers: &HeaderMap) -> Vec<(String, String)> {
    sluice_runtime::headers::to_pairs(headers)
}
