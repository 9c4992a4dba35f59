//! OpenAI Chat Completions <-> Anthropic Messages (`POST /v1/messages`).
//!
//! A client's `chat.completions` request becomes a Messages request
//! ([`chat_request`]); Anthropic's answer becomes a `chat.completion`
//! ([`chat_response`]), an OpenAI error ([`error_response`]) or, streamed,
//! `chat.completion.chunk`s ([`StreamTranslator`]).
//!
//! Tool schemas and arguments pass through as the JSON text they came as:
//! re-encoding a parse would reorder a schema's properties (which the model
//! reads in order) and round numbers past f64.

mod request;
mod response;
mod stream;
#[cfg(test)]
mod tests;

use serde_json::{Value, json};

pub use request::{ChatRequest, chat_request};
pub use response::{chat_response, error_response, is_context_length_error};
pub use stream::StreamTranslator;

/// The `anthropic-version` header's value: the API version these
/// translations follow.
pub const API_VERSION: &str = "2023-06-01";

/// Default max_tokens when the OpenAI request sets neither max_tokens nor
/// max_completion_tokens (Anthropic requires it).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// Why a body could not be translated.
#[derive(Debug, thiserror::Error)]
pub enum TranslateError {
    /// The client's request is malformed, or asks for what Anthropic's API
    /// cannot express; the client should hear 400.
    #[error("{0}")]
    InvalidRequest(String),
    /// Anthropic's answer is not the shape its API documents; the client
    /// should hear 502.
    #[error("the upstream's response could not be read: {0}")]
    InvalidUpstream(String),
}

impl TranslateError {
    /// The client's fault (400), not the upstream's (502).
    pub fn is_client_error(&self) -> bool {
        matches!(self, Self::InvalidRequest(_))
    }

    /// The OpenAI error body to answer the client with.
    pub fn openai_body(&self) -> Vec<u8> {
        let kind = if self.is_client_error() { "invalid_request_error" } else { "server_error" };
        openai_error(&self.to_string(), kind, None).to_string().into_bytes()
    }
}

fn invalid(message: impl Into<String>) -> TranslateError {
    TranslateError::InvalidRequest(message.into())
}

/// OpenAI's error object, `{"error":{"message","type","param","code"}}`.
fn openai_error(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// An Anthropic error (its `error.type` and `error.message`) as OpenAI's.
/// Without a type, the HTTP status says which error Anthropic documents for
/// it; a stream's error event has neither.
fn mapped_error(anthropic_type: Option<&str>, message: &str, status: Option<u16>) -> Value {
    let anthropic_type = anthropic_type.unwrap_or(match status {
        Some(401) => "authentication_error",
        Some(403) => "permission_error",
        Some(404) => "not_found_error",
        Some(413) => "request_too_large",
        Some(429) => "rate_limit_error",
        Some(529) => "overloaded_error",
        Some(400..=499) => "invalid_request_error",
        _ => "api_error",
    });
    let (kind, code) = match anthropic_type {
        // The gateway falls back to a model with a larger window on this code.
        "invalid_request_error" if is_context_length_error(message) => {
            ("invalid_request_error", Some("context_length_exceeded"))
        }
        "authentication_error" => ("invalid_request_error", Some("invalid_api_key")),
        "request_too_large" => ("invalid_request_error", Some("request_too_large")),
        "rate_limit_error" => ("rate_limit_error", Some("rate_limit_exceeded")),
        "api_error" => ("server_error", None),
        "overloaded_error" => ("server_error", Some("overloaded")),
        "timeout_error" => ("server_error", Some("timeout")),
        // invalid_request_error, permission_error, not_found_error,
        // billing_error and types added later keep Anthropic's name.
        other => (other, None),
    };
    openai_error(message, kind, code)
}

/// Anthropic's token counts. A stream sends them in parts (input on
/// `message_start`, output on `message_delta`), each count cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Usage {
    input: Option<u64>,
    cache_creation: Option<u64>,
    cache_read: Option<u64>,
    output: Option<u64>,
}

impl Usage {
    /// The counts in an Anthropic `usage` object; anything else counts nothing.
    fn read(usage: &Value) -> Self {
        let count = |name: &str| usage.get(name).and_then(Value::as_u64);
        Self {
            input: count("input_tokens"),
            cache_creation: count("cache_creation_input_tokens"),
            cache_read: count("cache_read_input_tokens"),
            output: count("output_tokens"),
        }
    }

    /// Later counts replace earlier ones; absent ones keep them.
    fn update(&mut self, later: Self) {
        self.input = later.input.or(self.input);
        self.cache_creation = later.cache_creation.or(self.cache_creation);
        self.cache_read = later.cache_read.or(self.cache_read);
        self.output = later.output.or(self.output);
    }

    /// OpenAI's `usage`. Anthropic's `input_tokens` leaves out the tokens
    /// written to and read from the cache; OpenAI's `prompt_tokens` counts
    /// them all, cached ones again in `cached_tokens`.
    fn openai(&self) -> Value {
        let cached = self.cache_read.unwrap_or(0);
        // Saturating: the counts are the upstream's, not to be trusted to fit.
        let prompt = self.input.unwrap_or(0).saturating_add(self.cache_creation.unwrap_or(0)).saturating_add(cached);
        let completion = self.output.unwrap_or(0);
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt.saturating_add(completion),
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }
}

/// Anthropic's `stop_reason` as OpenAI's `finish_reason`.
fn finish_reason(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        // end_turn, stop_sequence, pause_turn and any reason added later.
        _ => "stop",
    }
}

/// Seconds since the Unix epoch, for `created`.
fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}
