//! OpenAI-compatible backends: the request passes through as the chain left
//! it (the model renamed, if the backend has its own name for it), and so
//! does the response.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, header};
use sluice_core::ApiError;

use super::{Translated, error_code, sensitive};
use crate::body::{Body, full};
use crate::json::rewrite_model;

/// How much of an error response is read to find its code.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// `/v1/chat/completions` goes to `{backend url}/chat/completions`: the
/// backend URL names the API root, `/v1` included.
pub(super) fn url(url: &str, path: &str) -> String {
    format!("{url}{}", path.strip_prefix("/v1").unwrap_or(path))
}

pub(super) fn credential(key: &str) -> Result<(HeaderName, HeaderValue), String> {
    Ok((header::AUTHORIZATION, sensitive(&format!("Bearer {}", key.trim()))?))
}

pub(super) fn request(body: &Bytes, model: Option<&str>) -> Result<Translated, ApiError> {
    let body = match model {
        Some(model) => rewrite_model(body, model)?,
        None => body.clone(),
    };
    Ok(Translated { body, stream: None })
}

/// The response as it came, with the `code` of a 400 when it is wanted.
pub(super) async fn response(
    response: http::Response<Body>,
    idle: Duration,
    wants_error_code: bool,
) -> (http::Response<Body>, Option<String>) {
    if !wants_error_code || response.status() != http::StatusCode::BAD_REQUEST {
        return (response, None);
    }
    // A (small) error response is read to find its OpenAI `code`, and the
    // body put back for the client.
    let (parts, body) = response.into_parts();
    // Boxed: an error body's read is rare, and its state would otherwise
    // be carried in every request's future.
    match Box::pin(crate::body::collect_limited(body, ERROR_BODY_LIMIT, idle)).await {
        Ok(bytes) => {
            let code = error_code(&bytes);
            (http::Response::from_parts(parts, full(bytes)), code)
        }
        // Too large or cut short: not an error body a client could read either.
        Err(error) => {
            tracing::warn!(%error, "reading an upstream's error response");
            (http::Response::from_parts(parts, full(Bytes::new())), None)
        }
    }
}
