//! An OpenAI-compatible upstream that answers with what it received.
//!
//! The assistant's reply (or a completion's text) is a compact JSON document
//! describing the request as it arrived: `{"model", "messages" | "prompt",
//! "headers", "path", "body"}`. Tests parse it to assert exactly what a plugin chain
//! sent upstream; plugin authors read it to see what their plugin did.
//!
//! Every response carries an `x-request-id` of its own, as OpenAI's do.
//!
//! Request headers act as test knobs:
//! - `x-echo-status: NNN` replies with that status and an OpenAI error body
//!   (2xx values are ignored);
//! - `x-echo-delay-ms: N` sleeps before sending the response head;
//! - `x-echo-chunk-delay-ms: N` and `x-echo-chunks: N` override
//!   [`EchoOptions`] for one streamed response.
//!
//! Token counts in `usage` are approximate: a quarter of the characters in the
//! request's strings (or the reply), rounded up. No tokenizer is involved.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::hash::Hasher as _;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::channel::{Channel, Sender};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// How streamed responses are paced, unless a request's headers say otherwise.
#[derive(Clone, Debug)]
pub struct EchoOptions {
    /// Pause before each content chunk of a streamed response.
    pub chunk_delay: Duration,
    /// How many content chunks a streamed response is split into.
    pub chunks: usize,
}

impl Default for EchoOptions {
    fn default() -> Self {
        Self { chunk_delay: Duration::from_millis(30), chunks: 8 }
    }
}

/// Model ids listed by `GET /v1/models`. Any model id is accepted elsewhere.
const MODELS: &[&str] = &["echo", "echo-mini", "echo-embedding"];
const EMBEDDING_DIMENSIONS: usize = 8;
/// Large enough for any test prompt; a bound so a runaway client cannot exhaust memory.
const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

type Body = BoxBody<Bytes, Infallible>;

/// Serves until `shutdown` resolves (then finishes in-flight responses).
pub async fn serve(
    listener: TcpListener,
    opts: EchoOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let opts = Arc::new(opts);
    // Tests stop the echo only once their streams are done: no drain limit.
    sluice_serve::serve(listener, Default::default(), shutdown, Duration::MAX, move |req| {
        let opts = opts.clone();
        async move { handle(req, &opts).await }
    })
    .await;
    Ok(())
}

async fn handle(req: Request<Incoming>, opts: &EchoOptions) -> Response<Body> {
    respond(req, opts).await.unwrap_or_else(|rejected| error(rejected.status, rejected.code, &rejected.message))
}

/// Why a request got an OpenAI error response instead of an echo.
struct Rejection {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl Rejection {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let message = message.into();
        Self { status, code, message }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Health,
    Models,
    Chat,
    Completions,
    Embeddings,
}

async fn respond(req: Request<Incoming>, opts: &EchoOptions) -> Result<Response<Body>, Rejection> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    // A backend URL may be `http://host/v1` or `http://host`.
    let route = path.strip_prefix("/v1").filter(|rest| rest.starts_with('/')).unwrap_or(&path);
    let (endpoint, method) = match route {
        "/healthz" => (Endpoint::Health, Method::GET),
        "/models" => (Endpoint::Models, Method::GET),
        "/chat/completions" => (Endpoint::Chat, Method::POST),
        "/completions" => (Endpoint::Completions, Method::POST),
        "/embeddings" => (Endpoint::Embeddings, Method::POST),
        _ => {
            return Err(Rejection::new(StatusCode::NOT_FOUND, "unknown_url", format!("no route for {path}")));
        }
    };
    if parts.method != method {
        let message = format!("{path} expects {method}, not {}", parts.method);
        return Err(Rejection::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", &message));
    }
    if endpoint == Endpoint::Health {
        return Ok(response(StatusCode::OK, "text/plain", "ok"));
    }

    let knobs = Knobs::from_headers(&parts.headers, opts)?;
    let bytes = match Limited::new(body, MAX_REQUEST_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            return Err(Rejection::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                "request body is too large",
            ));
        }
        Err(err) => {
            return Err(Rejection::new(StatusCode::BAD_REQUEST, "invalid_body", format!("reading the body: {err}")));
        }
    };
    if !knobs.delay.is_zero() {
        tokio::time::sleep(knobs.delay).await;
    }
    if let Some(status) = knobs.status {
        return Err(Rejection::new(status, "echo_status", format!("x-echo-status asked for {}", status.as_u16())));
    }
    if endpoint == Endpoint::Models {
        let data: Vec<Value> = MODELS
            .iter()
            .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "sluice-echo"}))
            .collect();
        return Ok(json_response(&json!({"object": "list", "data": data})));
    }

    let request: serde_json::Map<String, Value> = serde_json::from_slice(&bytes).map_err(|err| {
        Rejection::new(StatusCode::BAD_REQUEST, "invalid_json", format!("request body is not a JSON object: {err}"))
    })?;
    let model = request.get("model").unwrap_or(&Value::Null);
    let model_name = model.as_str().unwrap_or("echo").to_owned();

    if endpoint == Endpoint::Embeddings {
        return Ok(json_response(&embeddings(&request, model_name)));
    }

    let headers = parts.headers.keys().map(|name| {
        let values: Vec<_> =
            parts.headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes())).collect();
        (name.as_str().to_owned(), values.join(", "))
    });
    let (kind, prompt) = match endpoint {
        Endpoint::Chat => (Kind::Chat, request.get("messages")),
        _ => (Kind::Completion, request.get("prompt")),
    };
    let prompt = prompt.unwrap_or(&Value::Null);
    let echoed = Echoed {
        model,
        messages: (kind == Kind::Chat).then_some(prompt),
        prompt: (kind == Kind::Completion).then_some(prompt),
        headers: headers.collect(),
        path: &path,
        body: &request,
    };
    let reply = Reply {
        kind,
        id: format!("{}-echo-{}", kind.id_prefix(), NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: model_name,
        // Serializing borrowed JSON values and strings cannot fail.
        content: serde_json::to_string(&echoed).unwrap_or_default(),
        prompt_tokens: approx_tokens(string_chars(prompt)),
    };

    if request.get("stream").and_then(Value::as_bool) != Some(true) {
        return Ok(json_response(&reply.completion()));
    }
    let include_usage =
        request.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let (tx, body) = Channel::new(1);
    tokio::spawn(reply.stream(tx, knobs.chunks, knobs.chunk_delay, include_usage));
    let mut response = Response::new(body.boxed());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(REQUEST_ID, upstream_request_id());
    Ok(response)
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
    headers: BTreeMap<String, String>,
    path: &'a str,
    /// The whole request body as received, for fields beyond the messages.
    body: &'a serde_json::Map<String, Value>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

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

    /// Sends the reply as server-sent events, pausing before each content chunk
    /// so clients see a response that really arrives over time.
    async fn stream(self, mut tx: Sender<Bytes>, chunks: usize, chunk_delay: Duration, include_usage: bool) {
        let mut events = Vec::new();
        if self.kind == Kind::Chat {
            let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null});
            events.push((Duration::ZERO, self.envelope(self.chunk_object(), vec![role], None)));
        }
        for piece in split(&self.content, chunks) {
            events.push((chunk_delay, self.chunk(piece, None)));
        }
        events.push((Duration::ZERO, self.chunk("", Some("stop"))));
        if include_usage {
            events.push((Duration::ZERO, self.envelope(self.chunk_object(), vec![], Some(self.usage()))));
        }

        for (delay, event) in events {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if tx.send_data(Bytes::from(format!("data: {event}\n\n"))).await.is_err() {
                return; // The client went away.
            }
        }
        let _ = tx.send_data(Bytes::from_static(b"data: [DONE]\n\n")).await;
    }
}

/// Splits `text` into at most `pieces` non-empty parts of near-equal length,
/// on character boundaries.
fn split(text: &str, pieces: usize) -> Vec<&str> {
    let chars = text.chars().count();
    let pieces = pieces.clamp(1, chars.max(1));
    let mut boundaries: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
    boundaries.push(text.len());
    (0..pieces)
        .map(|i| &text[boundaries[i * chars / pieces]..boundaries[(i + 1) * chars / pieces]])
        .filter(|piece| !piece.is_empty())
        .collect()
}

fn embeddings(request: &serde_json::Map<String, Value>, model: String) -> Value {
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
fn string_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(string_chars).sum(),
        Value::Object(fields) => fields.values().map(string_chars).sum(),
        _ => 0,
    }
}

/// Roughly four characters per token, as for English text with OpenAI's tokenizers.
fn approx_tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let kind = match status.as_u16() {
        400 | 404 | 405 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        _ => "server_error",
    };
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    let mut response = json_response(&body);
    *response.status_mut() = status;
    response
}

fn json_response(value: &Value) -> Response<Body> {
    response(StatusCode::OK, "application/json", value.to_string())
}

fn response(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(REQUEST_ID, upstream_request_id());
    response
}

/// OpenAI names each response with its own `x-request-id` (`req_…`); so does
/// the echo, so a gateway in front shows what it does with one.
const REQUEST_ID: &str = "x-request-id";

fn upstream_request_id() -> HeaderValue {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = format!("req_echo{}", NEXT.fetch_add(1, Ordering::Relaxed));
    HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("req_echo"))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Instant;

    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;
    use tokio::sync::oneshot;
    use tokio::task::JoinHandle;

    use super::*;

    struct Server {
        addr: SocketAddr,
        stop: oneshot::Sender<()>,
        stopped: JoinHandle<std::io::Result<()>>,
    }

    async fn start(opts: EchoOptions) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let stopped = tokio::spawn(serve(listener, opts, async {
            let _ = stop_rx.await;
        }));
        Server { addr, stop, stopped }
    }

    fn client(http2: bool) -> Client<HttpConnector, Full<Bytes>> {
        Client::builder(TokioExecutor::new()).http2_only(http2).build_http()
    }

    fn post(addr: SocketAddr, path: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
        let mut request = Request::post(format!("http://{addr}{path}")).header(CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Full::new(body.into())).unwrap()
    }

    async fn send(client: &Client<HttpConnector, Full<Bytes>>, request: Request<Full<Bytes>>) -> (StatusCode, Value) {
        let response = client.request(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    /// Reads a server-sent event stream, noting when each event arrived.
    async fn read_events(mut body: Incoming) -> Vec<(Instant, String)> {
        let mut events = Vec::new();
        let mut buffer = String::new();
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.unwrap().into_data() else {
                continue;
            };
            buffer.push_str(std::str::from_utf8(&data).unwrap());
            while let Some(end) = buffer.find("\n\n") {
                let event = buffer[..end].strip_prefix("data: ").expect("every event is a data line").to_owned();
                events.push((Instant::now(), event));
                buffer.drain(..end + 2);
            }
        }
        assert!(buffer.is_empty(), "stream ended mid-event: {buffer:?}");
        events
    }

    #[tokio::test]
    async fn chat_echoes_what_arrived_over_http1_and_h2c() {
        let server = start(EchoOptions::default()).await;
        let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]);
        let body = json!({"model": "llama3", "messages": messages}).to_string();
        for (http2, path) in [(false, "/v1/chat/completions"), (true, "/chat/completions")] {
            let request =
                post(server.addr, path, body.clone(), &[("x-team", "search"), ("x-multi", "a"), ("x-multi", "b")]);
            let (status, reply) = send(&client(http2), request).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            assert_eq!(reply["object"], "chat.completion");
            assert_eq!(reply["model"], "llama3");
            assert_eq!(reply["choices"][0]["message"]["role"], "assistant");

            let content = reply["choices"][0]["message"]["content"].as_str().unwrap();
            let echoed: Value = serde_json::from_str(content).unwrap();
            assert_eq!(echoed["model"], "llama3");
            assert_eq!(echoed["messages"], messages);
            assert_eq!(echoed["path"], path);
            assert_eq!(echoed["headers"]["x-team"], "search");
            assert_eq!(echoed["headers"]["x-multi"], "a, b");

            let usage = &reply["usage"];
            // "system" + "be brief" + "user" + "héllo" = 23 characters.
            assert_eq!(usage["prompt_tokens"], 6);
            assert_eq!(usage["completion_tokens"], content.chars().count().div_ceil(4) as u64);
            assert_eq!(
                usage["total_tokens"].as_u64().unwrap(),
                usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap()
            );
        }
    }

    #[tokio::test]
    async fn stream_arrives_in_chunks_over_time() {
        let server = start(EchoOptions { chunk_delay: Duration::from_millis(100), chunks: 5 }).await;
        let messages = json!([{"role": "user", "content": "stream please"}]);
        let body =
            json!({"model": "echo", "messages": messages, "stream": true, "stream_options": {"include_usage": true}});
        let response =
            client(false).request(post(server.addr, "/v1/chat/completions", body.to_string(), &[])).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()[CONTENT_TYPE], "text/event-stream");
        let events = read_events(response.into_body()).await;

        let (first_at, _) = events[0];
        let (last_at, done) = events.last().unwrap();
        assert_eq!(done, "[DONE]");
        assert!(
            *last_at - first_at >= Duration::from_millis(300),
            "events arrived together rather than over time: {:?}",
            *last_at - first_at
        );

        let chunks: Vec<Value> =
            events[..events.len() - 1].iter().map(|(_, e)| serde_json::from_str(e).unwrap()).collect();
        assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "echo"));
        assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        // Role, five content pieces, the stop chunk and the usage chunk.
        assert_eq!(chunks.len(), 8);
        let content: String =
            chunks[1..6].iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
        let echoed: Value = serde_json::from_str(&content).unwrap();
        assert_eq!(echoed["messages"], messages);
        assert_eq!(chunks[6]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[7]["choices"], json!([]));
        assert_eq!(chunks[7]["usage"]["completion_tokens"], content.chars().count().div_ceil(4) as u64);
    }

    #[tokio::test]
    async fn knobs_and_errors() {
        let server = start(EchoOptions::default()).await;
        let client = client(false);
        let chat = json!({"model": "echo", "messages": []}).to_string();

        let request = post(server.addr, "/v1/chat/completions", chat.clone(), &[("x-echo-status", "429")]);
        let (status, reply) = send(&client, request).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply["error"]["type"], "rate_limit_error");

        let started = Instant::now();
        let request = post(server.addr, "/v1/chat/completions", chat.clone(), &[("x-echo-delay-ms", "150")]);
        assert_eq!(send(&client, request).await.0, StatusCode::OK);
        assert!(started.elapsed() >= Duration::from_millis(150));

        let request = post(server.addr, "/v1/chat/completions", chat, &[("x-echo-chunks", "many")]);
        assert_eq!(send(&client, request).await.1["error"]["code"], "invalid_echo_header");

        let (status, reply) = send(&client, post(server.addr, "/v1/chat/completions", "{not json", &[])).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(reply["error"]["type"], "invalid_request_error");
        assert_eq!(reply["error"]["code"], "invalid_json");

        let (status, reply) = send(&client, post(server.addr, "/v1/nowhere", "{}", &[])).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(reply["error"]["message"].is_string());
    }

    #[tokio::test]
    async fn completions_embeddings_and_models() {
        let server = start(EchoOptions::default()).await;
        let client = client(false);

        let body = json!({"model": "echo", "prompt": "say hi"}).to_string();
        let (_, reply) = send(&client, post(server.addr, "/v1/completions", body, &[])).await;
        assert_eq!(reply["object"], "text_completion");
        let echoed: Value = serde_json::from_str(reply["choices"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(echoed["prompt"], "say hi");

        let body = json!({"model": "echo-embedding", "input": ["a", "b", "a"]}).to_string();
        let (_, reply) = send(&client, post(server.addr, "/embeddings", body, &[])).await;
        let vectors: Vec<&Value> = reply["data"].as_array().unwrap().iter().map(|d| &d["embedding"]).collect();
        assert_eq!(vectors.len(), 3);
        assert_eq!(vectors[0].as_array().unwrap().len(), EMBEDDING_DIMENSIONS);
        assert_eq!(vectors[0], vectors[2]);
        assert_ne!(vectors[0], vectors[1]);

        let request = Request::get(format!("http://{}/v1/models", server.addr)).body(Full::default()).unwrap();
        let (status, reply) = send(&client, request).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(reply["data"][0]["id"], MODELS[0]);
    }

    #[tokio::test]
    async fn shutdown_finishes_in_flight_streams() {
        let server = start(EchoOptions { chunk_delay: Duration::from_millis(50), chunks: 4 }).await;
        let body = json!({"model": "echo", "messages": [], "stream": true}).to_string();
        let response = client(false).request(post(server.addr, "/v1/chat/completions", body, &[])).await.unwrap();

        server.stop.send(()).unwrap();
        let events = read_events(response.into_body()).await;
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let stopped = tokio::time::timeout(Duration::from_secs(5), server.stopped).await;
        stopped.expect("serve returns once in-flight responses finish").unwrap().unwrap();
    }

    #[test]
    fn split_keeps_every_character() {
        let text = "añb€cd";
        for pieces in 0..10 {
            let parts = split(text, pieces);
            assert_eq!(parts.concat(), text);
            assert_eq!(parts.len(), pieces.clamp(1, 6));
        }
    }
}
