//! A small HTTP client for the tests: whole replies, chunked uploads, and
//! streamed replies with the arrival time of every frame.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::header::{CONTENT_TYPE, HeaderMap};
use hyper::{Request, StatusCode, Version};
use hyper_util::client::legacy::{self, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = BoxBody<Bytes, BoxError>;

/// No single exchange in these tests takes this long; a hung one fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A pooled client, HTTP/1.1 or HTTP/2 with prior knowledge (h2c). Its
/// connections run on the runtime that first uses it.
#[derive(Clone)]
pub struct Client {
    inner: legacy::Client<HttpConnector, Body>,
}

impl Client {
    pub fn http1() -> Client {
        Client { inner: legacy::Client::builder(TokioExecutor::new()).build_http() }
    }

    pub fn h2c() -> Client {
        Client { inner: legacy::Client::builder(TokioExecutor::new()).http2_only(true).build_http() }
    }

    pub async fn get(&self, url: &str) -> Reply {
        let request = Request::get(url).body(empty()).expect("a valid GET request");
        self.send(request).await
    }

    /// POSTs `body` as JSON with a content-length, plus `headers`.
    pub async fn post(&self, url: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Reply {
        self.send(post_request(url, Full::new(body.into()).map_err(|never| match never {}).boxed(), headers)).await
    }

    /// POSTs `chunks` with no content-length: the body goes out chunked.
    pub async fn post_chunked(&self, url: &str, chunks: Vec<Bytes>, headers: &[(&str, &str)]) -> Reply {
        let frames = chunks.into_iter().map(|chunk| Ok::<_, BoxError>(Frame::data(chunk)));
        let body = StreamBody::new(futures_util::stream::iter(frames)).boxed();
        self.send(post_request(url, body, headers)).await
    }

    /// POSTs `body` and reads the reply as it arrives, frame by frame.
    pub async fn post_streaming(&self, url: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Streamed {
        let request = post_request(url, Full::new(body.into()).map_err(|never| match never {}).boxed(), headers);
        let read = async {
            let response = self.inner.request(request).await.unwrap_or_else(|e| panic!("POST {url}: {e:?}"));
            let (head, mut body) = response.into_parts();
            let mut frames = Vec::new();
            while let Some(frame) = body.frame().await {
                let frame = frame.unwrap_or_else(|e| panic!("POST {url}: reading the body: {e:?}"));
                if let Ok(data) = frame.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
            Streamed { status: head.status, headers: head.headers, frames }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, read).await.unwrap_or_else(|_| panic!("POST {url}: no reply in time"))
    }

    /// Sends `request` and reads the whole reply.
    pub async fn send(&self, request: Request<Body>) -> Reply {
        let what = format!("{} {}", request.method(), request.uri());
        tokio::time::timeout(REQUEST_TIMEOUT, self.try_send(request))
            .await
            .unwrap_or_else(|_| panic!("{what}: no reply in time"))
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    /// Like `send`, but a transport error is returned, not a panic.
    pub async fn try_send(&self, request: Request<Body>) -> Result<Reply, String> {
        let response = self.inner.request(request).await.map_err(|e| format!("{e:?}"))?;
        let (head, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| format!("reading the body: {e}"))?.to_bytes();
        Ok(Reply { status: head.status, version: head.version, headers: head.headers, body })
    }
}

pub fn empty() -> Body {
    Full::new(Bytes::new()).map_err(|never| match never {}).boxed()
}

fn post_request(url: &str, body: Body, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post(url).header(CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(body).expect("a valid POST request")
}

/// A chat request for `model` with one user message.
pub fn chat_body(model: &str) -> Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hello"}]})
}

/// A whole reply.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("the {} reply is not JSON ({e}): {}", self.status, self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("a UTF-8 header value"))
    }

    /// What the echo upstream received, from a successful chat reply: the
    /// JSON document `{model, messages, headers, path}` in its content.
    pub fn echoed(&self) -> Value {
        assert_eq!(self.status, StatusCode::OK, "expected a chat reply, got: {}", self.text());
        let reply = self.json();
        let content = reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("the reply has no message content: {reply}"));
        serde_json::from_str(content).unwrap_or_else(|e| panic!("the echoed content is not JSON ({e}): {content}"))
    }

    /// Asserts the reply is an OpenAI-shaped error
    /// `{"error": {"message", "type", "code"}}` with this status, and
    /// returns the `error` object.
    pub fn error(&self, status: u16) -> Value {
        assert_eq!(self.status.as_u16(), status, "unexpected status; body: {}", self.text());
        let json = self.json();
        let error = &json["error"];
        for field in ["message", "type", "code"] {
            assert!(error[field].as_str().is_some_and(|v| !v.is_empty()), "no error {field}: {json}");
        }
        error.clone()
    }

    /// Like `error`, and checks the error's code.
    pub fn assert_error(&self, status: u16, code: &str) -> Value {
        let error = self.error(status);
        assert_eq!(error["code"], code, "unexpected error code: {error}");
        error
    }
}

/// A reply read as it arrived.
#[derive(Debug)]
pub struct Streamed {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// Each body frame with the moment it was read.
    pub frames: Vec<(Instant, Bytes)>,
}

impl Streamed {
    /// The server-sent events of the body, each the data of one `data:` line
    /// with the arrival time of the frame that completed it.
    pub fn events(&self) -> Vec<(Instant, String)> {
        sse_events(&self.frames)
    }
}

/// Splits frames into server-sent events. Panics on anything that is not a
/// `data:` event, and on a stream that ends mid-event.
pub fn sse_events(frames: &[(Instant, Bytes)]) -> Vec<(Instant, String)> {
    let mut events = Vec::new();
    let mut buffer = String::new();
    for (arrived, data) in frames {
        buffer.push_str(std::str::from_utf8(data).expect("an SSE stream is UTF-8"));
        while let Some(end) = buffer.find("\n\n") {
            let event = &buffer[..end];
            let data = event
                .strip_prefix("data: ")
                .filter(|data| !data.contains('\n'))
                .unwrap_or_else(|| panic!("not a single `data:` line: {event:?}"));
            events.push((*arrived, data.to_string()));
            buffer.drain(..end + 2);
        }
    }
    assert!(buffer.is_empty(), "the stream ended mid-event: {buffer:?}");
    events
}

/// A streamed chat request for `model` on an HTTP/1.1 connection of its own
/// (no pool: each stream is its own client connection), asking the echo
/// upstream for `chunks` chunks `delay_ms` apart; the response as it comes.
pub async fn stream_on_own_connection(
    addr: std::net::SocketAddr,
    model: &str,
    chunks: u32,
    delay_ms: u64,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(connection);
    let body = serde_json::json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hello"}]});
    let request = Request::post("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("x-echo-chunks", chunks.to_string())
        .header("x-echo-chunk-delay-ms", delay_ms.to_string())
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request");
    sender.send_request(request).await.map_err(|e| format!("request: {e}"))
}
