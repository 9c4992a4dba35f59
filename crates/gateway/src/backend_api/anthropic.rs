//! Anthropic's Messages API: the chat request translated on the way out,
//! the response (whole, streamed or an error) on the way back.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderName, HeaderValue, header};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use sluice_core::ApiError;
use sluice_providers::anthropic;

use super::{Translated, error_code, sensitive};
use crate::body::{Body, BoxError, Held, collect_held, full_held};
use crate::gateway::Settings;
use crate::sse::{EventSplitter, data_event, data_of};

/// The largest error body read from a backend to translate it.
const MAX_ERROR_BYTES: usize = 1 << 20;

/// The longest server-sent event held while waiting for its end.
const MAX_EVENT_BYTES: usize = 4 << 20;

/// Anthropic's API takes every chat at `/messages`.
pub(super) fn url(url: &str) -> String {
    format!("{url}/messages")
}

pub(super) fn credential(key: &str) -> Result<(HeaderName, HeaderValue), String> {
    Ok((HeaderName::from_static("x-api-key"), sensitive(key)?))
}

/// An OpenAI request for an Anthropic backend: its body, and whether the
/// response will stream and the client asked for usage in it.
pub(super) fn request(path: &str, body: &Bytes, model: Option<&str>) -> Result<Translated, ApiError> {
    let path = path.strip_prefix("/v1").unwrap_or(path);
    if path != "/chat/completions" {
        return Err(ApiError::invalid_request(
            "unsupported_endpoint",
            format!("`/v1{path}` is not served by this route's Anthropic backend: use /v1/chat/completions"),
        ));
    }
    match anthropic::chat_request(body, model) {
        Ok(request) => {
            Ok(Translated { body: Bytes::from(request.body), stream: request.stream.then_some(request.include_usage) })
        }
        Err(error) if error.is_client_error() => Err(ApiError::invalid_request("invalid_request", error.to_string())),
        Err(error) => Err(ApiError::internal(error.to_string())),
    }
}

/// The headers Anthropic's API wants. The client's `Authorization` (its
/// credential for the gateway) is not Anthropic's to see; the backend's key
/// goes in `x-api-key`.
pub(super) fn request_headers(headers: &mut HeaderMap) {
    headers.remove(header::AUTHORIZATION);
    if !headers.contains_key("anthropic-version") {
        headers.insert("anthropic-version", HeaderValue::from_static(anthropic::API_VERSION));
    }
}

/// An Anthropic response as OpenAI's, with the OpenAI error code if it is
/// an error. `stream`: the request streams, and whether the client asked
/// for usage in the stream.
pub(super) async fn response(
    response: http::Response<Body>,
    stream: Option<bool>,
    settings: &Settings,
    idle: Duration,
) -> Result<(http::Response<Body>, Option<String>), ApiError> {
    let (mut parts, body) = response.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let event_stream = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    if parts.status.is_success()
        && let Some(include_usage) = stream
        && event_stream
    {
        let held = settings.response_buffers.hold(None);
        return Ok((http::Response::from_parts(parts, translate_stream(body, include_usage, held)), None));
    }
    let limit = if parts.status.is_success() { settings.max_body_bytes } else { MAX_ERROR_BYTES };
    // The whole body is held to translate it: charged to the budget all
    // responses share as it arrives, and kept charged (as the translation)
    // until it is sent.
    let mut held = settings.response_buffers.hold(None);
    let bytes = collect_held(body, limit, idle, &mut held)
        .await
        .map_err(|error| error.into_api_error("reading the Anthropic backend's response"))?;
    parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if !parts.status.is_success() {
        let translated = anthropic::error_response(parts.status.as_u16(), &bytes);
        let code = error_code(&translated);
        return Ok((http::Response::from_parts(parts, held_body(translated, held)), code));
    }
    let translated = anthropic::chat_response(&bytes)
        .map_err(|error| ApiError::upstream_unavailable(format!("the Anthropic backend's response: {error}")))?;
    Ok((http::Response::from_parts(parts, held_body(translated, held)), None))
}

/// A translated body, charged as such from now on (a larger translation is
/// held anyway: its source is freed as it is made).
fn held_body(translated: impl Into<Bytes>, mut held: Held) -> Body {
    let translated = translated.into();
    let _ = held.resize(translated.len());
    full_held(translated, held)
}

/// Anthropic's events, as OpenAI's chunks, as they arrive.
fn translate_stream(upstream: Body, include_usage: bool, held: Held) -> Body {
    let state = Translating {
        held,
        upstream: Some(upstream),
        splitter: EventSplitter::default(),
        translator: anthropic::StreamTranslator::new(include_usage),
        out: VecDeque::new(),
    };
    let frames = futures_util::stream::unfold(state, |mut state| async move {
        let frame = state.next_frame().await?;
        Some((frame, state))
    });
    StreamBody::new(frames.boxed()).boxed_unsync()
}

struct Translating {
    /// What the unfinished event holds of the response buffer budget.
    held: Held,
    upstream: Option<Body>,
    splitter: EventSplitter,
    translator: anthropic::StreamTranslator,
    out: VecDeque<Bytes>,
}

impl Translating {
    async fn next_frame(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                return Some(Ok(Frame::data(bytes)));
            }
            let upstream = self.upstream.as_mut()?;
            match upstream.frame().await {
                None => {
                    self.upstream = None;
                    if let Some(event) = self.splitter.remainder() {
                        self.event(&event);
                    }
                    self.emit(|t| t.finish());
                }
                // The relay turns it into an error event for the client.
                Some(Err(error)) => {
                    self.upstream = None;
                    return Some(Err(error));
                }
                Some(Ok(frame)) => {
                    let Ok(bytes) = frame.into_data() else { continue };
                    self.splitter.push(&bytes);
                    if self.splitter.buffered() > MAX_EVENT_BYTES {
                        self.upstream = None;
                        return Some(Err("the Anthropic backend sent an event longer than 4 MiB".into()));
                    }
                    if self.held.resize(self.splitter.buffered()).is_err() {
                        self.upstream = None;
                        return Some(Err("the memory responses may hold together is in use".into()));
                    }
                    while let Some(event) = self.splitter.next_event() {
                        self.event(&event);
                    }
                    // Smaller: never refused.
                    let _ = self.held.resize(self.splitter.buffered());
                }
            }
        }
    }

    fn event(&mut self, event: &[u8]) {
        let Some(data) = data_of(event) else { return };
        let name = event_name(event);
        self.emit(|t| t.event(name.as_deref(), &data));
    }

    fn emit(&mut self, produce: impl FnOnce(&mut anthropic::StreamTranslator) -> Vec<String>) {
        for data in produce(&mut self.translator) {
            self.out.push_back(Bytes::from(data_event(&data)));
        }
    }
}

/// The event's `event:` field.
fn event_name(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    text.lines().find_map(|line| line.strip_prefix("event:")).map(|name| name.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_read() {
        assert_eq!(event_name(b"event: message_start\ndata: {}\n\n").as_deref(), Some("message_start"));
        assert_eq!(event_name(b"data: {}\n\n"), None);
    }
}
