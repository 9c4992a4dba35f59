//! The response phase: the response-head hooks, then the body on its way
//! back: passed through frame by frame, held whole for `response-body`
//! hooks, rewritten event by event for `response-chunk` hooks, and
//! accounted for (usage, bytes, duration) for `response-end` hooks and the
//! access log. Plugins see the response in reverse chain order, like
//! unwinding the chain.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::header;
use http_body::{Body as _, Frame};
use http_body_util::{BodyExt, StreamBody};
use sluice_core::ApiError;
use sluice_runtime::{ChunkAction, Hooks, PluginError, ResponseAction, ResponseSummary, Settlement, Usage, settle_all};

use sluice_telemetry::{Hook, RequestRecord, Tokens};

use crate::body::{Body, BoxError, Held, collect_held, full};
use crate::chain::Engaged;
use crate::gateway::Settings;
use crate::json::Checked;
use crate::sse::{EventSplitter, data_event, data_of, with_data};
use sluice_runtime::headers::{apply_edits, drop_not_utf8, strip_hop_by_hop, to_pairs};

/// How much of a JSON response is copied aside to read its `usage`. Larger
/// bodies still pass through; their usage goes unreported.
const USAGE_COPY_LIMIT: usize = 1 << 20;

/// The longest server-sent event held while waiting for its end.
const MAX_EVENT_BYTES: usize = 4 << 20;

/// What the request phase leaves the response phase.
pub struct Exchange {
    /// The plugins that wait for the response, in chain order.
    pub plugins: Vec<Engaged>,
    /// The headers plugins set for the response from the request phase.
    pub set_headers: http::HeaderMap,
    /// Reservations to settle by the response's usage when it ends.
    pub settlements: Vec<Settlement>,
}

/// The response as the client receives it. Plugins engaged in the exchange
/// see the head, then the body; a `Closed` plugin that fails before the head
/// is sent turns the response into an error (and the reservations left to
/// settle keep what was reserved).
pub async fn respond(
    upstream: http::Response<Body>,
    exchange: Exchange,
    settings: &Settings,
    limits: BodyLimits,
    record: &mut RequestRecord,
) -> Result<http::Response<Body>, ApiError> {
    let Exchange { plugins: mut engaged, set_headers, settlements } = exchange;
    let max_body_bytes = settings.max_body_bytes;
    let (mut head, body) = upstream.into_parts();
    strip_hop_by_hop(&mut head.headers);
    // What response plugins cannot see does not reach the client.
    drop_not_utf8(&mut head.headers);
    let reads_body = engaged.iter().any(|e| e.hooks().intersects(Hooks::RESPONSE_BODY | Hooks::RESPONSE_CHUNK));
    if reads_body && let Some(encoding) = encoded(&head.headers) {
        // Asked for identity and sent something else: the plugins could
        // not read it, and passing it unread would let it past them.
        return Err(ApiError::upstream_unavailable(format!(
            "the upstream sent a `{encoding}`-encoded body, which the route's response plugins cannot read"
        )));
    }
    engaged.reverse();
    response_filters(&mut head, &mut engaged, record).await?;
    crate::chain::set_all(&mut head.headers, &set_headers);

    let streamed = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let wanted = engaged.iter().fold(Hooks::empty(), |hooks, e| hooks | e.hooks());
    let mut body = body;
    let mut known = None;
    // What this response holds in memory (a whole body, a usage copy, an
    // unfinished event), charged to the budget all responses share, and
    // to its backend's share of it, until the response is over.
    let mut held = settings.response_buffers.hold(record.backend.as_deref());
    if !streamed && wanted.contains(Hooks::RESPONSE_BODY) {
        // Only a `response-body` hook makes the gateway hold a whole body.
        let (filtered, reported) = Box::pin(async {
            let whole = collect_held(body, max_body_bytes, limits.idle, &mut held)
                .await
                .map_err(|error| error.into_api_error("reading the upstream's response for response-body plugins"))?;
            let reported = reported_in(&whole);
            Ok::<_, ApiError>((response_body_filters(&mut engaged, whole, max_body_bytes, record).await?, reported))
        })
        .await?;
        known = Some(reported);
        // A larger body written by a plugin is held anyway: charged if it can be.
        let _ = held.resize(filtered.len());
        body = full(filtered);
        head.headers.remove(header::CONTENT_LENGTH);
    } else if streamed && wanted.contains(Hooks::RESPONSE_CHUNK) {
        head.headers.remove(header::CONTENT_LENGTH);
    }
    record.streamed = streamed;
    record.status = head.status.as_u16();
    let read_already = known.is_some();
    if let Some(known) = known {
        known.apply(record);
    }
    // The body streams through frame by frame as the upstream sends it: SSE
    // events reach the client as they are produced. It ends the request.
    let tail = Tail { record: record.hand_off(), plugins: engaged, settlements };
    let body = relay(body, tail, read_already, limits, held);
    Ok(http::Response::from_parts(head, body))
}

/// How long the upstream may take over the response body.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    /// Between two frames.
    pub idle: Duration,
    /// The whole exchange must end by then.
    pub deadline: Option<Instant>,
}

/// The body's content coding, unless it is none (`identity`).
fn encoded(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_ENCODING)?;
    let value = String::from_utf8_lossy(value.as_bytes()).trim().to_ascii_lowercase();
    (!value.is_empty() && value != "identity").then_some(value)
}

/// Runs `response-head` hooks; a plugin that wants nothing later is let go.
async fn response_filters(
    head: &mut http::response::Parts,
    engaged: &mut Vec<Engaged>,
    record: &mut RequestRecord,
) -> Result<(), ApiError> {
    if engaged.iter().any(|e| e.wants(Hooks::RESPONSE_HEAD)) {
        // Boxed, as the request hooks are: a plugin call's state would
        // otherwise be in every request's future.
        Box::pin(response_head_hooks(head, engaged, record)).await?;
    }
    engaged.retain(|e| e.hooks().intersects(Hooks::RESPONSE_CHUNK | Hooks::RESPONSE_BODY | Hooks::RESPONSE_END));
    Ok(())
}

async fn response_head_hooks(
    head: &mut http::response::Parts,
    engaged: &mut [Engaged],
    record: &mut RequestRecord,
) -> Result<(), ApiError> {
    for plugin in engaged.iter_mut().filter(|e| e.wants(Hooks::RESPONSE_HEAD)) {
        let started = Instant::now();
        let view = sluice_runtime::Response { status: head.status.as_u16(), headers: to_pairs(&head.headers) };
        let result = plugin.instance.response_filter(&view).await.and_then(|ResponseAction::Continue(edits)| {
            apply_edits(&mut head.headers, &edits.set_headers, &edits.remove_headers).map_err(PluginError::InvalidEdit)
        });
        plugin.settle(record, Hook::ResponseHead, started, result)?;
    }
    Ok(())
}

/// Runs `response-body` hooks over a whole non-streamed body. An error is
/// what a `Closed` plugin's failure turns into; the response has not been
/// sent, so it can still become an error response.
async fn response_body_filters(
    plugins: &mut [Engaged],
    mut body: Bytes,
    limit: usize,
    record: &mut RequestRecord,
) -> Result<Bytes, ApiError> {
    for plugin in plugins.iter_mut().filter(|p| p.wants(Hooks::RESPONSE_BODY)) {
        let started = Instant::now();
        let result = plugin.instance.response_body(&body).await.and_then(|replacement| match replacement {
            Some(replacement) if replacement.len() > limit => Err(PluginError::InvalidEdit(format!(
                "the body it wrote ({} bytes) is over the limit of {limit} bytes",
                replacement.len()
            ))),
            replacement => Ok(replacement),
        });
        if let Some(Some(replacement)) = plugin.settle(record, Hook::ResponseBody, started, result)? {
            body = Bytes::from(replacement);
        }
    }
    Ok(body)
}

/// The body the client receives. It ends the exchange (`response-end`
/// hooks, the request's record) when the upstream's body ends, or when the
/// client goes away. `known`: the usage and model were read already.
fn relay(upstream: Body, tail: Tail, known: bool, limits: BodyLimits, held: Held) -> Body {
    let streamed = tail.record.streamed;
    let chunk_hooks = streamed && tail.plugins.iter().any(|p| p.wants(Hooks::RESPONSE_CHUNK));
    let relay = Relay {
        upstream: Some(upstream),
        splitter: streamed.then(EventSplitter::default),
        json_copy: (!streamed && !known).then(BytesMut::new),
        chunk_hooks,
        out: VecDeque::new(),
        failed: false,
        limits,
        held,
        tail: Some(tail),
    };
    let frames = futures_util::stream::unfold(relay, |mut relay| async move {
        let frame = relay.next_frame().await?;
        Some((frame, relay))
    });
    StreamBody::new(frames.boxed()).boxed_unsync()
}

struct Relay {
    /// `None` once the stream is over or a plugin stopped it (which also
    /// releases the upstream connection).
    upstream: Option<Body>,
    /// Event boundaries of an event stream.
    splitter: Option<EventSplitter>,
    /// A copy of a JSON body, to read `usage` from at the end.
    json_copy: Option<BytesMut>,
    chunk_hooks: bool,
    /// Bytes ready for the client.
    out: VecDeque<Bytes>,
    /// `None` once the exchange has been ended.
    tail: Option<Tail>,
    /// The stream was cut short by a failure, not ended by the upstream or
    /// a plugin.
    failed: bool,
    /// How long the upstream may send nothing (or take in all) before the
    /// exchange is cut: a stalled upstream must not hold plugin instances
    /// for good.
    limits: BodyLimits,
    /// What the body held, the usage copy or the unfinished event hold of
    /// the response buffer budget.
    held: Held,
}

struct Tail {
    record: RequestRecord,
    plugins: Vec<Engaged>,
    settlements: Vec<Settlement>,
}

impl Relay {
    async fn next_frame(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                if let Some(tail) = &mut self.tail {
                    let record = &mut tail.record;
                    if record.first_byte.is_none() && !bytes.is_empty() {
                        record.first_byte = Some(record.elapsed());
                    }
                    record.response_bytes += bytes.len() as u64;
                }
                // A client that knows the length stops reading at the last
                // byte, so the exchange ends before the last frame goes out.
                if self.out.is_empty() && self.upstream.is_none() {
                    self.finish(!self.failed).await;
                }
                return Some(Ok(Frame::data(bytes)));
            }
            let Some(upstream) = &mut self.upstream else {
                self.finish(!self.failed).await;
                return None;
            };
            let idle = Instant::now() + self.limits.idle;
            let wait = self.limits.deadline.map_or(idle, |deadline| deadline.min(idle));
            let Ok(frame) = tokio::time::timeout_at(wait.into(), upstream.frame()).await else {
                let error = if self.limits.deadline.is_some_and(|deadline| deadline <= idle) {
                    "the upstream's response took longer than the backend's total timeout".to_string()
                } else {
                    format!("the upstream sent nothing for {} s", self.limits.idle.as_secs_f64())
                };
                if let Some(frame) = self.cut_short(error).await {
                    return Some(frame);
                }
                continue;
            };
            match frame {
                None => {
                    self.upstream = None;
                    self.end_of_upstream().await;
                }
                Some(Err(error)) => {
                    if let Some(frame) = self.cut_short(error.to_string()).await {
                        return Some(frame);
                    }
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(bytes) => {
                        let last = upstream.is_end_stream();
                        self.take(bytes).await;
                        if last && self.upstream.take().is_some() {
                            self.end_of_upstream().await;
                        }
                    }
                    // Trailers pass through as they are.
                    Err(frame) => return Some(Ok(frame)),
                },
            }
        }
    }

    /// The upstream failed mid-body. An event stream ends with an error
    /// event, as OpenAI reports errors mid-stream (its head is sent: it can
    /// be neither retried nor turned into an error response); any other
    /// body ends with an error, which cuts the connection so the client
    /// cannot take a short body for a whole one.
    async fn cut_short(&mut self, message: String) -> Option<Result<Frame<Bytes>, BoxError>> {
        self.upstream = None;
        self.failed = true;
        tracing::warn!(error = %message, "the upstream's response was cut short");
        if let Some(splitter) = &self.splitter {
            // Bytes of an unfinished event reached the client already:
            // end that event first, so the error is an event of its own.
            if !self.chunk_hooks && splitter.buffered() > 0 {
                self.out.push_back(Bytes::from_static(b"\n\n"));
            }
            let error = ApiError::upstream_unavailable(message);
            self.out.push_back(Bytes::from(data_event(&String::from_utf8_lossy(&error.to_json()))));
            return None;
        }
        self.finish(false).await;
        Some(Err(message.into()))
    }

    /// Takes one frame of the upstream's body.
    async fn take(&mut self, bytes: Bytes) {
        if let Some(copy) = &mut self.json_copy {
            let needed = copy.len() + bytes.len();
            // Charged by capacity, before it grows; a copy the budget cannot
            // hold is given up (its usage goes unreported), the body passes.
            let fits = needed <= USAGE_COPY_LIMIT
                && (needed <= copy.capacity() || {
                    let capacity = needed.max(copy.capacity() * 2).min(USAGE_COPY_LIMIT);
                    let held = self.held.resize(capacity).is_ok();
                    if held {
                        copy.reserve(capacity - copy.len());
                    }
                    held
                });
            if fits {
                copy.extend_from_slice(&bytes);
            } else {
                self.json_copy = None;
                let _ = self.held.resize(0);
            }
        }
        let Some(splitter) = &mut self.splitter else {
            self.out.push_back(bytes);
            return;
        };
        splitter.push(&bytes);
        if !self.chunk_hooks {
            // Forwarded as it came, before the events in it are looked at:
            // a route without chunk hooks adds no latency to a stream.
            self.out.push_back(bytes);
        }
        let too_long = splitter.buffered() > MAX_EVENT_BYTES;
        let unheld = !too_long && self.held.resize(splitter.buffered()).is_err();
        if too_long || unheld {
            let _ = self.held.resize(0);
            if self.chunk_hooks {
                let error = if too_long {
                    ApiError::upstream_unavailable(format!(
                        "the upstream sent an event longer than {MAX_EVENT_BYTES} bytes"
                    ))
                } else {
                    ApiError::overloaded("the memory responses may hold together is in use")
                };
                self.out.push_back(Bytes::from(data_event(&String::from_utf8_lossy(&error.to_json()))));
                self.upstream = None;
                self.failed = true;
            } else {
                // Not an event stream after all: stop looking for usage in it.
                self.splitter = None;
            }
            return;
        }
        while let Some(event) = self.splitter.as_mut().and_then(EventSplitter::next_event) {
            self.event(event).await;
            if self.upstream.is_none() {
                return;
            }
        }
        if let Some(splitter) = &self.splitter {
            // Smaller: never refused.
            let _ = self.held.resize(splitter.buffered());
        }
    }

    /// The upstream's body has ended; an event missing its final blank
    /// line is still an event.
    async fn end_of_upstream(&mut self) {
        if let Some(event) = self.splitter.as_mut().and_then(EventSplitter::remainder) {
            self.event(event).await;
        }
        if let (Some(copy), Some(tail)) = (self.json_copy.take(), &mut self.tail) {
            reported_in(&copy).apply(&mut tail.record);
        }
    }

    async fn event(&mut self, event: Bytes) {
        let Some(tail) = &mut self.tail else { return };
        let Some(data) = data_of(&event) else {
            if self.chunk_hooks {
                self.out.push_back(event);
            }
            return;
        };
        // Every chunk names the model; the last one may carry the usage.
        if tail.record.response_model.is_none() || data.contains("\"usage\"") {
            reported_in(data.as_bytes()).apply(&mut tail.record);
        }
        if !self.chunk_hooks {
            return;
        }
        match response_chunk_filters(&mut tail.plugins, data, &mut tail.record).await {
            Chunk::Pass => self.out.push_back(event),
            Chunk::Replace(data) => self.out.push_back(with_data(&event, &data)),
            Chunk::Drop => {}
            Chunk::Stop(last) => {
                if let Some(last) = last {
                    self.out.push_back(Bytes::from(data_event(&last)));
                }
                self.out.push_back(Bytes::from(data_event("[DONE]")));
                self.upstream = None;
            }
            Chunk::Failed(error) => {
                // The head is sent: the client learns of the failure the way
                // OpenAI reports errors mid-stream, as an error event.
                let json = String::from_utf8_lossy(&error.to_json()).into_owned();
                self.out.push_back(Bytes::from(data_event(&json)));
                self.upstream = None;
                self.failed = true;
            }
        }
    }

    async fn finish(&mut self, completed: bool) {
        if let Some(tail) = self.tail.take() {
            tail.end(completed).await;
        }
    }
}

impl Drop for Relay {
    /// The client went away before the end: the exchange still ends, off
    /// the request's task.
    fn drop(&mut self) {
        if let Some(tail) = self.tail.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(tail.end(false));
        }
    }
}

enum Chunk {
    Pass,
    Replace(String),
    Drop,
    Stop(Option<String>),
    Failed(ApiError),
}

async fn response_chunk_filters(plugins: &mut [Engaged], data: String, record: &mut RequestRecord) -> Chunk {
    let mut current: Option<String> = None;
    for plugin in plugins.iter_mut().filter(|p| p.wants(Hooks::RESPONSE_CHUNK)) {
        let seen = current.as_deref().unwrap_or(&data);
        let started = Instant::now();
        let result = plugin.instance.response_chunk(seen).await;
        match plugin.settle(record, Hook::ResponseChunk, started, result) {
            Ok(Some(ChunkAction::Pass) | None) => {}
            Ok(Some(ChunkAction::Replace(replacement))) => current = Some(replacement),
            Ok(Some(ChunkAction::Drop)) => return Chunk::Drop,
            Ok(Some(ChunkAction::Stop(last))) => return Chunk::Stop(last),
            Err(error) => return Chunk::Failed(error),
        }
    }
    match current {
        Some(data) => Chunk::Replace(data),
        None => Chunk::Pass,
    }
}

impl Tail {
    async fn end(mut self, completed: bool) {
        let record = &mut self.record;
        record.completed = completed;
        let summary = ResponseSummary {
            status: record.status,
            streamed: record.streamed,
            // The counts came from u32s.
            usage: record.tokens.map(|t| Usage {
                prompt_tokens: u32::try_from(t.input).unwrap_or(u32::MAX),
                completion_tokens: u32::try_from(t.output).unwrap_or(u32::MAX),
                total_tokens: u32::try_from(t.total).unwrap_or(u32::MAX),
            }),
            body_bytes: record.response_bytes,
            completed,
            duration_ms: record.elapsed().as_millis() as u64,
        };
        for plugin in self.plugins.iter_mut().filter(|p| p.wants(Hooks::RESPONSE_END)) {
            // Nothing can change any more; a failure is only worth a log line.
            let started = Instant::now();
            let result = plugin.instance.response_end(&summary).await;
            if let Err(error) = &result {
                tracing::warn!(plugin = plugin.name(), %error, request_id = &*record.id, "response-end hook failed");
            }
            let _ = plugin.settle(record, Hook::ResponseEnd, started, result);
        }
        // A response cut short (`completed` false) with no usage keeps what
        // was reserved: the upstream may have spent it.
        let usage = record.tokens.map(|t| (t.input, t.output));
        settle_all(std::mem::take(&mut self.settlements), record.status, usage);
        self.record.finish();
    }
}

/// What an upstream's response (or one stream event) says about itself.
#[derive(Default)]
struct Reported {
    usage: Option<Usage>,
    model: Option<String>,
}

/// The longest response model name kept, in bytes.
const MAX_MODEL_BYTES: usize = 256;

impl Reported {
    fn apply(self, record: &mut RequestRecord) {
        if let Some(usage) = self.usage {
            record.tokens = Some(Tokens {
                input: usage.prompt_tokens.into(),
                output: usage.completion_tokens.into(),
                total: usage.total_tokens.into(),
            });
        }
        if let Some(mut model) = self.model {
            model.truncate(model.floor_char_boundary(MAX_MODEL_BYTES));
            record.response_model = Some(model);
        }
    }
}

/// Read in one pass: the body may be large, and every request has one.
fn reported_in(json: &[u8]) -> Reported {
    #[derive(serde::Deserialize)]
    struct Raw {
        // An object, as OpenAI sends it: serde would also read a struct
        // from an array (`[1, 2]`), which no upstream means as usage.
        usage: Option<UsageObject>,
        // Any value, kept if it is a string.
        #[serde(default)]
        model: Option<Checked<true>>,
        /// The Responses API's stream events carry the response inside.
        #[serde(default)]
        response: Option<Inner>,
    }
    #[derive(serde::Deserialize)]
    struct Inner {
        usage: Option<UsageObject>,
        #[serde(default)]
        model: Option<Checked<true>>,
    }
    let Ok(raw) = serde_json::from_slice::<Raw>(json) else { return Reported::default() };
    let (usage, model) = match raw.response {
        Some(inner) if raw.usage.is_none() => (inner.usage, inner.model.or(raw.model)),
        _ => (raw.usage, raw.model),
    };
    let usage = usage.and_then(UsageObject::usage);
    Reported { usage, model: model.and_then(|model| model.0) }
}

/// Chat and completions name the counts `prompt_tokens` and
/// `completion_tokens`; the Responses API `input_tokens` and `output_tokens`.
const COUNTS: [&str; 5] = ["prompt_tokens", "input_tokens", "completion_tokens", "output_tokens", "total_tokens"];

/// A `usage` object's token counts as sent, in the order of [`COUNTS`] (of
/// a repeated name the last, as in a parsed object). Its other members
/// (the nested details) are checked as a `Value` parse would check them
/// and dropped: building a map of them was most of reading a small response.
struct UsageObject([Option<serde_json::Value>; 5]);

impl UsageObject {
    /// The counts, if each one sent is a u32 and none is sent under both
    /// its names (both `prompt_tokens` and `input_tokens`): neither is
    /// believed then.
    fn usage(self) -> Option<Usage> {
        let [prompt, input, completion, output, total] = self.0;
        let count = |value: Option<serde_json::Value>| match value {
            None => Some(0),
            Some(value) => value.as_u64().and_then(|n| u32::try_from(n).ok()),
        };
        let either = |a: Option<serde_json::Value>, b: Option<serde_json::Value>| match (a, b) {
            (Some(_), Some(_)) => None,
            (a, b) => count(a.or(b)),
        };
        let (prompt_tokens, completion_tokens) = (either(prompt, input)?, either(completion, output)?);
        Some(Usage {
            prompt_tokens,
            completion_tokens,
            // Saturating: a hostile upstream's counts must not overflow.
            total_tokens: count(total)?.max(prompt_tokens.saturating_add(completion_tokens)),
        })
    }
}

impl<'de> serde::Deserialize<'de> for UsageObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A member's name: where it is in [`COUNTS`], or another.
        struct Key(Option<usize>);
        impl<'de> serde::Deserialize<'de> for Key {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Name;
                impl serde::de::Visitor<'_> for Name {
                    type Value = Key;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a member name")
                    }
                    fn visit_str<E>(self, name: &str) -> Result<Key, E> {
                        Ok(Key(COUNTS.iter().position(|count| *count == name)))
                    }
                }
                deserializer.deserialize_str(Name)
            }
        }
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = UsageObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UsageObject, A::Error> {
                let mut counts = [None, None, None, None, None];
                while let Some(Key(name)) = map.next_key()? {
                    match name.and_then(|i| counts.get_mut(i)) {
                        Some(count) => {
                            *count = Some(map.next_value()?);
                        }
                        None => {
                            map.next_value::<Checked<false>>()?;
                        }
                    }
                }
                Ok(UsageObject(counts))
            }
        }
        deserializer.deserialize_map(Object)
    }
}

/// The `usage` object of an OpenAI response or final stream chunk.
pub fn usage_in(json: &[u8]) -> Option<Usage> {
    reported_in(json).usage
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_usage_from_responses_and_chunks() {
        let usage = usage_in(br#"{"id":"x","usage":{"prompt_tokens":6,"completion_tokens":4,"total_tokens":10}}"#);
        let usage = usage.unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (6, 4, 10));
        // Embeddings report no completion tokens.
        let usage = usage_in(br#"{"usage":{"prompt_tokens":3,"total_tokens":3}}"#).unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 0));
        assert!(usage_in(br#"{"choices":[],"usage":null}"#).is_none());
        // The Responses API, whole and as its stream's last event.
        let usage = usage_in(br#"{"object":"response","usage":{"input_tokens":5,"output_tokens":2,"total_tokens":7}}"#);
        assert_eq!(usage.map(|u| (u.prompt_tokens, u.completion_tokens, u.total_tokens)), Some((5, 2, 7)));
        let event =
            br#"{"type":"response.completed","response":{"model":"m","usage":{"input_tokens":3,"output_tokens":1}}}"#;
        let reported = reported_in(event);
        assert_eq!(reported.model.as_deref(), Some("m"));
        assert_eq!(reported.usage.map(|u| u.total_tokens), Some(4));
        assert!(usage_in(b"[DONE]").is_none());
    }

    /// Usage as OpenAI sends it now, with nested details: the counts are
    /// read; the details are checked as a `Value` parse checks them, and
    /// dropped.
    #[test]
    fn usage_details_are_checked_but_not_kept() {
        let json = br#"{"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},
            "completion_tokens":2,"completion_tokens_details":{"reasoning_tokens":1},"total_tokens":11}}"#;
        let usage = usage_in(json).map(|u| (u.prompt_tokens, u.completion_tokens, u.total_tokens));
        assert_eq!(usage, Some((9, 2, 11)));
        assert!(usage_in(br#"{"usage":{"prompt_tokens":1,"details":{"x":1e400}}}"#).is_none());
        assert!(usage_in(br#"{"usage":{"prompt_tokens":1,"\ud800":2}}"#).is_none());
        // A repeated count: the last, as in a parsed object; both names of
        // one count: neither.
        assert_eq!(usage_in(br#"{"usage":{"prompt_tokens":1,"prompt_tokens":4}}"#).map(|u| u.prompt_tokens), Some(4));
        assert!(usage_in(br#"{"usage":{"prompt_tokens":1,"input_tokens":4}}"#).is_none());
    }

    /// A hostile upstream's usage: counts that overflow a u32 when added
    /// saturate instead of panicking, and malformed usage is not believed.
    #[test]
    fn hostile_usage_neither_overflows_nor_is_believed_when_malformed() {
        let max = u32::MAX;
        let usage = usage_in(format!(r#"{{"usage":{{"prompt_tokens":{max},"completion_tokens":{max}}}}}"#).as_bytes());
        assert_eq!(usage.unwrap().total_tokens, max);
        for bad in [
            r#"{"usage":{"prompt_tokens":-1}}"#,
            r#"{"usage":{"prompt_tokens":4294967296}}"#,
            r#"{"usage":{"prompt_tokens":"7"}}"#,
            r#"{"usage":[1,2]}"#,
        ] {
            assert!(usage_in(bad.as_bytes()).is_none(), "{bad}");
        }
    }
}
