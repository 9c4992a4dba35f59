//! The echo over real HTTP: its OpenAI endpoints and knobs (here), its
//! scripted misbehaviour, Anthropic's Messages API and OpenAI's Responses API.

use std::net::SocketAddr;
use std::time::Instant;

use http::header::CONTENT_TYPE;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::*;

mod anthropic;
mod responses;
mod script;

pub(super) struct Server {
    pub addr: SocketAddr,
    pub stop: oneshot::Sender<()>,
    pub stopped: JoinHandle<std::io::Result<()>>,
}

pub(super) async fn start(opts: EchoOptions) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = oneshot::channel::<()>();
    let stopped = tokio::spawn(serve(listener, opts, async {
        let _ = stop_rx.await;
    }));
    Server { addr, stop, stopped }
}

pub(super) fn client(http2: bool) -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).http2_only(http2).build_http()
}

pub(super) fn post(
    addr: SocketAddr,
    path: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut request = Request::post(format!("http://{addr}{path}")).header(CONTENT_TYPE, "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Full::new(body.into())).unwrap()
}

pub(super) async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (StatusCode, Value) {
    let response = client.request(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// Reads a server-sent event stream, noting when each event arrived.
pub(super) async fn read_events(mut body: Incoming) -> Vec<(Instant, String)> {
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

/// Sends `request` and reads the whole reply, head included.
async fn exchange(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> (StatusCode, HeaderMap, Value) {
    let response = client.request(request).await.unwrap();
    let (head, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|err| panic!("{err}: {bytes:?}"));
    (head.status, head.headers, value)
}

/// Reads a body as far as it goes: its text, and the error it ended with.
async fn read_to_end(mut body: Incoming) -> (String, Option<hyper::Error>) {
    let mut text = String::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    text.push_str(std::str::from_utf8(&data).unwrap());
                }
            }
            Err(err) => return (text, Some(err)),
        }
    }
    (text, None)
}

/// Server-sent events as `(event name, parsed data)`; `[DONE]` is a string.
fn parse_sse(text: &str) -> Vec<(Option<String>, Value)> {
    assert!(text.is_empty() || text.ends_with("\n\n"), "a cut event: {text:?}");
    text.split_terminator("\n\n")
        .map(|event| {
            let mut name = None;
            let mut data = None;
            for line in event.lines() {
                if let Some(value) = line.strip_prefix("event: ") {
                    name = Some(value.to_owned());
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned())));
                } else {
                    panic!("unexpected line {line:?} in {event:?}");
                }
            }
            (name, data.expect("every event has data"))
        })
        .collect()
}

/// Writes a raw HTTP/1.1 request, then reads until the server closes the
/// connection or `wait` passes: what came back, and whether it closed.
async fn raw_exchange(addr: SocketAddr, path: &str, body: &str, wait: Duration) -> (Vec<u8>, bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: echo\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut received = Vec::new();
    let closed = tokio::time::timeout(wait, stream.read_to_end(&mut received)).await.is_ok();
    (received, closed)
}

/// Polls `probe` until it holds, for up to two seconds.
async fn eventually(what: &str, probe: impl Fn() -> bool) {
    for _ in 0..200 {
        if probe() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
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
    let server = start(EchoOptions { chunk_delay: Duration::from_millis(100), chunks: 5, ..Default::default() }).await;
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

    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|(_, e)| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "echo"));
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    // Role, five content pieces, the stop chunk and the usage chunk.
    assert_eq!(chunks.len(), 8);
    let content: String = chunks[1..6].iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
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
    let server = start(EchoOptions { chunk_delay: Duration::from_millis(50), chunks: 4, ..Default::default() }).await;
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
