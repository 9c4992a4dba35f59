//! An OpenAI- and Anthropic-compatible upstream that answers with what it
//! received.
//!
//! The assistant's reply (or a completion's text) is a compact JSON document
//! describing the request as it arrived: `{"model", "messages" | "prompt" |
//! "input", "system", "instructions", "headers", "path", "body"}` (the fields
//! the endpoint has). Tests parse it to assert exactly what a plugin chain
//! sent upstream; plugin authors read it to see what their plugin did.
//!
//! Endpoints, under `/v1` or not: `chat/completions`, `completions`,
//! `embeddings` and `models` (OpenAI); `responses` (OpenAI's Responses API);
//! `messages` (Anthropic's Messages API, with its headers, errors and events;
//! a request with `tools` whose last user message says `call tool` gets a
//! `tool_use` block with input [`TOOL_INPUT`]); `healthz`.
//!
//! Every response carries a request id of its own, as the providers' do
//! (`x-request-id`, or `request-id` on `messages`).
//!
//! Request headers act as test knobs:
//! - `x-echo-status: NNN` replies with that status and an error body in the
//!   endpoint's shape (2xx values are ignored);
//! - `x-echo-delay-ms: N` sleeps before sending the response head;
//! - `x-echo-chunk-delay-ms: N` and `x-echo-chunks: N` override
//!   [`EchoOptions`] for one streamed response.
//!
//! A [`Script`] makes one echo misbehave on purpose (errors, hangs, resets,
//! delays, dropped connections) and counts the requests that reached it. It
//! is a shared handle in [`EchoOptions`]; the same steps can be set over
//! HTTP on the echo's own listener:
//! - `POST /_echo/script` with `{"clear": true, "always": {"step": "close"},
//!   "push": [{"step": "status", "status": 429, "retry_after": "1", "times":
//!   2}, {"step": "hang"}, {"step": "reset_after_chunks", "chunks": 3},
//!   {"step": "delay", "ms": 500}]}` (every key optional; `clear` applies
//!   first, then `always`, then `push`);
//! - `GET /_echo/stats` gives `{"requests", "completed", "queued", "always"}`.
//!
//! Token counts in `usage` are approximate: a quarter of the characters in the
//! request's strings (or the reply), rounded up. No tokenizer is involved.

mod anthropic;
mod responses;
mod script;
mod stream;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::Hasher as _;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{HeaderName, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use anthropic::TOOL_INPUT;
pub use script::{Script, Step};
use stream::{Body, Delivery, Frame};

/// How streamed responses are paced, unless a request's headers say
/// otherwise, and the echo's [`Script`].
#[derive(Clone, Debug)]
pub struct EchoOptions {
    /// Pause before each content chunk of a streamed response.
    pub chunk_delay: Duration,
    /// How many content chunks a streamed response is split into.
    pub chunks: usize,
    /// Scripted failures and request counters; keep a clone to use them.
    pub script: Script,
}

impl Default for EchoOptions {
    fn default() -> Self {
        Self { chunk_delay: Duration::from_millis(30), chunks: 8, script: Script::default() }
    }
}

/// Model ids listed by `GET /v1/models`. Any model id is accepted elsewhere.
const MODELS: &[&str] = &["echo", "echo-mini", "echo-embedding"];
const EMBEDDING_DIMENSIONS: usize = 8;
/// Large enough for any test prompt; a bound so a runaway client cannot exhaust memory.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;
/// A `POST /_echo/script` body is a handful of steps.
const MAX_SCRIPT_BYTES: usize = 64 * 1024;

struct State {
    opts: EchoOptions,
    /// Turns true when the echo stops: hung requests give up then.
    stopping: watch::Receiver<bool>,
}

/// Serves until `shutdown` resolves (then finishes in-flight responses;
/// scripted hangs end then, without a response).
pub async fn serve(
    listener: TcpListener,
    opts: EchoOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let (stop, stopping) = watch::channel(false);
    let state = Arc::new(State { opts, stopping });
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    // Tests stop the echo only once their streams are done: no drain limit.
    sluice_serve::serve(listener, Default::default(), shutdown, Duration::MAX, move |req| {
        let state = state.clone();
        async move { handle(req, &state).await }
    })
    .await;
    Ok(())
}

async fn handle(req: Request<Incoming>, state: &State) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let Some(endpoint) = Endpoint::route(&path) else {
        let rejection = Rejection::new(StatusCode::NOT_FOUND, "unknown_url", format!("no route for {path}"));
        return rejection.into_response(Dialect::OpenAi);
    };
    let dialect = endpoint.dialect();
    respond(req, endpoint, &path, state).await.unwrap_or_else(|rejected| rejected.into_response(dialect))
}

/// Whose conventions a reply follows: error shapes and request id headers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Dialect {
    OpenAi,
    Anthropic,
}

impl Dialect {
    fn request_id_header(self) -> HeaderName {
        match self {
            Dialect::OpenAi => HeaderName::from_static("x-request-id"),
            Dialect::Anthropic => HeaderName::from_static("request-id"),
        }
    }
}

/// Why a request got an error response instead of an echo.
pub(crate) struct Rejection {
    status: StatusCode,
    code: Option<String>,
    message: String,
    /// OpenAI's `param`: the request field at fault.
    param: Option<&'static str>,
    retry_after: Option<HeaderValue>,
}

impl Rejection {
    fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self { status, code: Some(code.to_owned()), message: message.into(), param: None, retry_after: None }
    }

    /// The reply a [`Step::Status`] asks for; `prompt_tokens` makes the
    /// context-length message plausible.
    fn scripted(
        status: u16,
        retry_after: Option<&str>,
        code: Option<&str>,
        prompt_tokens: u64,
        dialect: Dialect,
    ) -> Self {
        let step = Step::Status { status, retry_after: retry_after.map(Into::into), code: code.map(Into::into) };
        // `Script` refuses steps it cannot carry out; answer loudly all the same.
        let checked = step.check().and_then(|()| StatusCode::from_u16(status).map_err(|err| err.to_string()));
        let status_code = match checked {
            Ok(status_code) => status_code,
            Err(problem) => return Rejection::new(StatusCode::INTERNAL_SERVER_ERROR, "invalid_echo_script", problem),
        };
        let context_length = code == Some(script::CONTEXT_LENGTH_EXCEEDED);
        let message = match (context_length, dialect) {
            (true, Dialect::OpenAi) => format!(
                "This model's maximum context length is {CONTEXT_WINDOW} tokens. However, your messages resulted \
                 in {} tokens. Please reduce the length of the messages.",
                CONTEXT_WINDOW + prompt_tokens.max(1)
            ),
            (true, Dialect::Anthropic) => anthropic::context_length_message(prompt_tokens),
            (false, _) => format!("the echo's script answered {status}"),
        };
        Self {
            status: status_code,
            code: code.map(str::to_owned).or_else(|| (status == 429).then(|| "rate_limit_exceeded".to_owned())),
            message,
            param: context_length.then_some("messages"),
            retry_after: retry_after.and_then(|value| HeaderValue::from_str(value).ok()),
        }
    }

    fn into_response(self, dialect: Dialect) -> Response<Body> {
        let request_id = request_id();
        let body = match dialect {
            Dialect::OpenAi => {
                let kind = match self.status.as_u16() {
                    400 | 404 | 405 | 413 | 422 => "invalid_request_error",
                    401 => "authentication_error",
                    403 => "permission_error",
                    429 => "rate_limit_error",
                    _ => "server_error",
                };
                json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}})
            }
            Dialect::Anthropic => anthropic::error_body(&self, request_id.to_str().unwrap_or_default()),
        };
        let mut response = stream::full(dialect, self.status, "application/json", body.to_string());
        response.headers_mut().insert(dialect.request_id_header(), request_id);
        if let Some(retry_after) = self.retry_after {
            response.headers_mut().insert(RETRY_AFTER, retry_after);
        }
        response
    }
}

/// The context window the scripted OpenAI context-length error claims.
const CONTEXT_WINDOW: u64 = 128_000;

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Health,
    Models,
    Chat,
    Completions,
    Embeddings,
    Messages,
    Responses,
    /// `POST /_echo/script`.
    Script,
    /// `GET /_echo/stats`.
    Stats,
}

impl Endpoint {
    fn route(path: &str) -> Option<Endpoint> {
        // A backend URL may be `http://host/v1` or `http://host`.
        let route = path.strip_prefix("/v1").filter(|rest| rest.starts_with('/')).unwrap_or(path);
        Some(match route {
            "/healthz" => Endpoint::Health,
            "/models" => Endpoint::Models,
            "/chat/completions" => Endpoint::Chat,
            "/completions" => Endpoint::Completions,
            "/embeddings" => Endpoint::Embeddings,
            "/messages" => Endpoint::Messages,
            "/responses" => Endpoint::Responses,
            "/_echo/script" => Endpoint::Script,
            "/_echo/stats" => Endpoint::Stats,
            _ => return None,
        })
    }

    fn method(self) -> Method {
        match self {
            Endpoint::Health | Endpoint::Models | Endpoint::Stats => Method::GET,
            _ => Method::POST,
        }
    }

    /// Whether the script applies and the request is counted.
    fn takes_model(self) -> bool {
        matches!(
            self,
            Endpoint::Chat | Endpoint::Completions | Endpoint::Embeddings | Endpoint::Messages | Endpoint::Responses
        )
    }

    fn dialect(self) -> Dialect {
        if self == Endpoint::Messages { Dialect::Anthropic } else { Dialect::OpenAi }
    }

    /// The request fields whose strings count as prompt tokens.
    fn prompt_fields(self) -> &'static [&'static str] {
        match self {
            Endpoint::Chat => &["messages"],
            Endpoint::Completions => &["prompt"],
            Endpoint::Embeddings => &["input"],
            Endpoint::Messages => &["system", "messages"],
            Endpoint::Responses => &["instructions", "input"],
            _ => &[],
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    endpoint: Endpoint,
    path: &str,
    state: &State,
) -> Result<Response<Body>, Rejection> {
    let (parts, body) = req.into_parts();
    let method = endpoint.method();
    if parts.method != method {
        let message = format!("{path} expects {method}, not {}", parts.method);
        return Err(Rejection::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", &message));
    }
    let script = &state.opts.script;
    match endpoint {
        Endpoint::Health => return Ok(stream::full(Dialect::OpenAi, StatusCode::OK, "text/plain", "ok")),
        Endpoint::Stats => return Ok(json_response(&script.stats())),
        Endpoint::Script => {
            let bytes = read_body(body, MAX_SCRIPT_BYTES).await?;
            script
                .apply_json(&bytes)
                .map_err(|problem| Rejection::new(StatusCode::BAD_REQUEST, "invalid_echo_script", problem))?;
            return Ok(json_response(&script.stats()));
        }
        _ => {}
    }
    if endpoint.takes_model() {
        script.arrived();
    }

    let knobs = Knobs::from_headers(&parts.headers, &state.opts)?;
    let bytes = read_body(body, MAX_REQUEST_BYTES).await?;
    let request: Result<Map<String, Value>, _> = serde_json::from_slice(&bytes);
    let mut reset_after = None;
    if endpoint.takes_model() {
        match script.next_step() {
            None => {}
            Some(Step::Status { status, retry_after, code }) => {
                let prompt_tokens = request.as_ref().map_or(0, |request| prompt_tokens(request, endpoint));
                let (retry_after, code) = (retry_after.as_deref(), code.as_deref());
                return Err(Rejection::scripted(status, retry_after, code, prompt_tokens, endpoint.dialect()));
            }
            Some(Step::Hang) => {
                let mut stopping = state.stopping.clone();
                // Ends early only when the echo stops; a client that gives up
                // closes the connection, and hyper drops this future.
                let _ = stopping.wait_for(|stopping| *stopping).await;
                return Ok(stream::closed());
            }
            Some(Step::Close) => return Ok(stream::closed()),
            Some(Step::Delay(delay)) => tokio::time::sleep(delay).await,
            Some(Step::ResetAfterChunks(n)) => reset_after = Some(n),
        }
    }
    if !knobs.delay.is_zero() {
        tokio::time::sleep(knobs.delay).await;
    }
    if let Some(status) = knobs.status {
        return Err(Rejection::new(status, "echo_status", format!("x-echo-status asked for {}", status.as_u16())));
    }
    let delivery = Delivery {
        dialect: endpoint.dialect(),
        chunks: knobs.chunks,
        chunk_delay: knobs.chunk_delay,
        reset_after,
        script: script.clone(),
    };
    if endpoint == Endpoint::Models {
        let data: Vec<Value> = MODELS
            .iter()
            .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "sluice-echo"}))
            .collect();
        return Ok(json_response(&json!({"object": "list", "data": data})));
    }
    if endpoint == Endpoint::Messages {
        // Anthropic checks credentials and version before the body.
        anthropic::check_headers(&parts.headers)?;
    }

    let request = request.map_err(|err| {
        Rejection::new(StatusCode::BAD_REQUEST, "invalid_json", format!("request body is not a JSON object: {err}"))
    })?;
    let arrived = Arrived { path, headers: &parts.headers, request: &request, endpoint };
    match endpoint {
        Endpoint::Embeddings => Ok(delivery.json(&embeddings(&request, arrived.model_name("echo")))),
        Endpoint::Messages => anthropic::messages(&arrived, delivery),
        Endpoint::Responses => Ok(responses::create(&arrived, delivery)),
        _ => Ok(chat(&arrived, delivery)),
    }
}

async fn read_body(body: Incoming, limit: usize) -> Result<Bytes, Rejection> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            Err(Rejection::new(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", "request body is too large"))
        }
        Err(err) => Err(Rejection::new(StatusCode::BAD_REQUEST, "invalid_body", format!("reading the body: {err}"))),
    }
}

/// The request as it arrived at a model endpoint, its body parsed.
pub(crate) struct Arrived<'a> {
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    pub request: &'a Map<String, Value>,
    endpoint: Endpoint,
}

impl Arrived<'_> {
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.request.get(name)
    }

    pub fn model_name(&self, default: &str) -> String {
        self.field("model").and_then(Value::as_str).unwrap_or(default).to_owned()
    }

    pub fn streamed(&self) -> bool {
        self.field("stream").and_then(Value::as_bool) == Some(true)
    }

    pub fn prompt_tokens(&self) -> u64 {
        prompt_tokens(self.request, self.endpoint)
    }

    /// The echo document: what arrived, as compact JSON, with the prompt
    /// fields of the endpoint.
    pub fn echoed(&self) -> String {
        let some = |name| self.field(name);
        // The main prompt field appears even when the request lacks it.
        let always = |name| Some(self.field(name).unwrap_or(&Value::Null));
        let (messages, prompt, system, input, instructions) = match self.endpoint {
            Endpoint::Chat => (always("messages"), None, None, None, None),
            Endpoint::Completions => (None, always("prompt"), None, None, None),
            Endpoint::Messages => (always("messages"), None, some("system"), None, None),
            Endpoint::Responses => (None, None, None, always("input"), some("instructions")),
            _ => (None, None, None, None, None),
        };
        let headers = self.headers.keys().map(|name| {
            let values: Vec<_> =
                self.headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes())).collect();
            (name.as_str().to_owned(), values.join(", "))
        });
        let echoed = Echoed {
            model: self.field("model").unwrap_or(&Value::Null),
            messages,
            prompt,
            system,
            input,
            instructions,
            headers: headers.collect(),
            path: self.path,
            body: self.request,
        };
        // Serializing borrowed JSON values and strings cannot fail.
        serde_json::to_string(&echoed).unwrap_or_default()
    }
}

fn prompt_tokens(request: &Map<String, Value>, endpoint: Endpoint) -> u64 {
    let chars = endpoint.prompt_fields().iter().filter_map(|name| request.get(*name)).map(string_chars).sum();
    approx_tokens(chars)
}

/// The per-request settings taken from `x-echo-*` headers.
struct Knobs {
    status: Option<StatusCode>,
    delay: Duration,
    chunk_delay: Duration,
    chunks: usize,
}

impl Knobs {
    fn from_headers(headers: &HeaderMap, opts: &EchoOptions) -> Result<Self, Rejection> {
        let status = match header_value::<u16>(headers, "x-echo-status")? {
            None => None,
            Some(code) => match StatusCode::from_u16(code) {
                // A success status means "answer normally".
                Ok(status) if status.is_success() => None,
                Ok(status) if status.as_u16() >= 300 => Some(status),
                _ => {
                    let message = format!("x-echo-status {code} is not a final, non-2xx status");
                    return Err(Rejection::new(StatusCode::BAD_REQUEST, "invalid_echo_header", message));
                }
            },
        };
        let millis = |name| Ok(header_value::<u64>(headers, name)?.map(Duration::from_millis));
        Ok(Self {
            status,
            delay: millis("x-echo-delay-ms")?.unwrap_or_default(),
            chunk_delay: millis("x-echo-chunk-delay-ms")?.unwrap_or(opts.chunk_delay),
            chunks: header_value(headers, "x-echo-chunks")?.unwrap_or(opts.chunks),
        })
    }
}

/// A malformed knob is a 400 rather than ignored, so a typo in a test fails loudly.
fn header_value<T: FromStr>(headers: &HeaderMap, name: &str) -> Result<Option<T>, Rejection> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    value.to_str().ok().and_then(|v| v.trim().parse().ok()).map(Some).ok_or_else(|| {
        Rejection::new(StatusCode::BAD_REQUEST, "invalid_echo_header", format!("{name} must be a non-negative integer"))
    })
}

/// The document a reply's content carries.
#[derive(Serialize)]
struct Echoed<'a> {
    model: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a Value>,
    headers: BTreeMap<String, String>,
    path: &'a str,
    /// The whole request body as received, for fields beyond the messages.
    body: &'a Map<String, Value>,
}

/// A number for ids, unique within the process.
pub(crate) fn next_id() -> u64 {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Chat completions and (legacy) completions.
fn chat(arrived: &Arrived, delivery: Delivery) -> Response<Body> {
    let kind = if arrived.endpoint == Endpoint::Chat { Kind::Chat } else { Kind::Completion };
    let reply = Reply {
        kind,
        id: format!("{}-echo-{}", kind.id_prefix(), next_id()),
        created: unix_seconds(),
        model: arrived.model_name("echo"),
        content: arrived.echoed(),
        prompt_tokens: arrived.prompt_tokens(),
    };
    if !arrived.streamed() {
        return delivery.json(&reply.completion());
    }
    let include_usage =
        arrived.field("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let frames = reply.frames(delivery.chunks, delivery.chunk_delay, include_usage);
    delivery.events(frames, "text/event-stream")
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

impl Kind {
    fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        }
    }
}

struct Reply {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    content: String,
    prompt_tokens: u64,
}

impl Reply {
    fn completion(&self) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": self.content},
                "finish_reason": "stop",
            }),
            Kind::Completion => {
                json!({"index": 0, "text": self.content, "logprobs": null, "finish_reason": "stop"})
            }
        };
        let object = match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        };
        self.envelope(object, vec![choice], Some(self.usage()))
    }

    /// A streamed chunk carrying `text`; `finish` marks the last content chunk.
    fn chunk(&self, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = if finish.is_some() { json!({}) } else { json!({"content": text}) };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        self.envelope(self.chunk_object(), vec![choice], None)
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            // The legacy completions API streams objects of the same type it returns whole.
            Kind::Completion => "text_completion",
        }
    }

    fn envelope(&self, object: &str, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut value = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            value["usage"] = usage;
        }
        value
    }

    fn usage(&self) -> Value {
        let completion_tokens = approx_tokens(self.content.chars().count());
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    /// The reply as server-sent events, with a pause before each content
    /// chunk so clients see a response that really arrives over time.
    fn frames(&self, chunks: usize, chunk_delay: Duration, include_usage: bool) -> Vec<Frame> {
        let mut frames = Vec::new();
        if self.kind == Kind::Chat {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
            frames.push(Frame::data(&self.envelope(self.chunk_object(), vec![role], None), Duration::ZERO, false));
        }
        for piece in split(&self.content, chunks) {
            frames.push(Frame::data(&self.chunk(piece, None), chunk_delay, true));
        }
        frames.push(Frame::data(&self.chunk("", Some("stop")), Duration::ZERO, false));
        if include_usage {
            let usage = self.envelope(self.chunk_object(), vec![], Some(self.usage()));
            frames.push(Frame::data(&usage, Duration::ZERO, false));
        }
        frames.push(Frame { delay: Duration::ZERO, data: Bytes::from_static(b"data: [DONE]\n\n"), content: false });
        frames
    }
}

/// Splits `text` into at most `pieces` non-empty parts of near-equal length,
/// on character boundaries.
pub(crate) fn split(text: &str, pieces: usize) -> Vec<&str> {
    let chars = text.chars().count();
    let pieces = pieces.clamp(1, chars.max(1));
    let mut boundaries: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    boundaries.push(text.len());
    (0..pieces)
        .map(|i| &text[boundaries[i * chars / pieces]..boundaries[(i + 1) * chars / pieces]])
        .filter(|piece| !piece.is_empty())
        .collect()
}

fn embeddings(request: &Map<String, Value>, model: String) -> Value {
    let inputs: Vec<String> = match request.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            items.iter().map(|item| item.as_str().map_or_else(|| item.to_string(), str::to_owned)).collect()
        }
        Some(other) => vec![other.to_string()],
        None => Vec::new(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| json!({"object": "embedding", "index": index, "embedding": embed(input)}))
        .collect();
    let tokens = approx_tokens(inputs.iter().map(|s| s.chars().count()).sum());
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// A unit vector derived from the input alone, so equal inputs embed equally
/// across runs and processes (std's `DefaultHasher` makes no such promise).
fn embed(input: &str) -> Vec<f64> {
    let raw: Vec<f64> = (0..EMBEDDING_DIMENSIONS as u64)
        .map(|dimension| {
            let mut hasher = Fnv1a::default();
            hasher.write_u64(dimension);
            hasher.write(input.as_bytes());
            // Map the hash onto [-1, 1].
            (hasher.finish() as f64 / u64::MAX as f64) * 2.0 - 1.0
        })
        .collect();
    let norm = raw.iter().map(|x| x * x).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
    raw.iter().map(|x| x / norm).collect()
}

struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv1a {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Characters in every string inside `value`: message text, roles and all.
pub(crate) fn string_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(string_chars).sum(),
        Value::Object(fields) => fields.values().map(string_chars).sum(),
        _ => 0,
    }
}

/// Roughly four characters per token, as for English text with OpenAI's tokenizers.
pub(crate) fn approx_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

fn json_response(value: &Value) -> Response<Body> {
    stream::full(Dialect::OpenAi, StatusCode::OK, "application/json", value.to_string())
}

/// Providers name each response with an id of their own (`req_…`); so does
/// the echo, so a gateway in front shows what it does with one.
pub(crate) fn request_id() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = format!("req_echo{}", NEXT.fetch_add(1, Ordering::Relaxed));
    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("req_echo"))
}
