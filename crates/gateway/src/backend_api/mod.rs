//! One adapter per backend API. Each owns what differs between the APIs a
//! backend may speak: where a forwarded endpoint goes on it, how its key is
//! sent, the headers it wants, whether its responses must arrive
//! unencoded, and the translation of requests and responses, so that
//! plugins and clients only ever see OpenAI's shapes.
//!
//! A new backend API (Bedrock, Vertex, Azure OpenAI) is a module here and
//! an arm in each method of [`Adapter`]; nothing else in the data plane
//! looks at the provider. The golden fixtures in `fixtures/` pin what each
//! adapter sends a backend and returns to the client (`tests.rs`).

mod anthropic;
mod openai;
#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_core::{ApiError, Provider};

use crate::body::Body;
use crate::gateway::Settings;

/// A backend's API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Adapter {
    /// OpenAI-compatible: requests and responses pass through as they are.
    OpenAi,
    /// Anthropic's Messages API: chat requests and responses are translated.
    Anthropic,
}

/// The request body as the backend takes it.
pub(crate) struct Translated {
    pub body: Bytes,
    /// For a translated request that streams: whether the client asked for
    /// usage in the stream.
    pub stream: Option<bool>,
}

impl Adapter {
    pub(crate) fn of(provider: Provider) -> Self {
        match provider {
            Provider::OpenAi => Adapter::OpenAi,
            Provider::Anthropic => Adapter::Anthropic,
        }
    }

    /// The URL a request for the forwarded `path` (and query) goes to on a
    /// backend whose URL is `url`.
    pub(crate) fn url(self, url: &str, path: &str) -> String {
        match self {
            Adapter::OpenAi => openai::url(url, path),
            Adapter::Anthropic => anthropic::url(url),
        }
    }

    /// The header that carries the backend's API key, marked sensitive.
    pub(crate) fn credential(self, key: &str) -> Result<(HeaderName, HeaderValue), String> {
        match self {
            Adapter::OpenAi => openai::credential(key),
            Adapter::Anthropic => anthropic::credential(key),
        }
    }

    /// The body the backend takes for `body`, sent to the forwarded `path`;
    /// `model` is the backend's own name for the model, if it has one.
    pub(crate) fn request(self, path: &str, body: &Bytes, model: Option<&str>) -> Result<Translated, ApiError> {
        match self {
            Adapter::OpenAi => openai::request(body, model),
            Adapter::Anthropic => anthropic::request(path, body, model),
        }
    }

    /// The API's own header rules, applied after the plugins' edits (see
    /// [`crate::headers::for_backend`] for the rest).
    pub(crate) fn request_headers(self, headers: &mut HeaderMap) {
        match self {
            Adapter::OpenAi => {}
            Adapter::Anthropic => anthropic::request_headers(headers),
        }
    }

    /// Whether the gateway reads the response body to translate it, so the
    /// backend must send it unencoded.
    pub(crate) fn translates_responses(self) -> bool {
        match self {
            Adapter::OpenAi => false,
            Adapter::Anthropic => true,
        }
    }

    /// The backend's response as the client takes it, with the OpenAI error
    /// `code` when the response is an error that carries one (read only
    /// when `wants_error_code`, or when the translation has it anyway).
    pub(crate) async fn response(
        self,
        response: http::Response<Body>,
        stream: Option<bool>,
        settings: &Settings,
        idle: Duration,
        wants_error_code: bool,
    ) -> Result<(http::Response<Body>, Option<String>), ApiError> {
        match self {
            Adapter::OpenAi => Ok(openai::response(response, idle, wants_error_code).await),
            // Boxed: the translation's state would otherwise be carried in
            // every request's future, whatever its backend.
            Adapter::Anthropic => Box::pin(anthropic::response(response, stream, settings, idle)).await,
        }
    }
}

/// The `code` of an OpenAI-shaped error body.
pub(crate) fn error_code(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        error: Inner,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        code: Option<String>,
    }
    serde_json::from_slice::<Envelope>(body).ok()?.error.code
}

/// A key as a header value, marked sensitive (never logged, HPACK never
/// indexes it).
fn sensitive(value: &str) -> Result<HeaderValue, String> {
    let mut value = HeaderValue::from_str(value.trim())
        .map_err(|_| "the API key holds characters not allowed in a header".to_string())?;
    value.set_sensitive(true);
    Ok(value)
}
