//! What an upstream sends, and what plugins and clients add to a request,
//! cannot get past the plugins: a body compressed where response plugins
//! read it, usage counts that overflow, header values plugins cannot see,
//! plugin edits of framing headers.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, documents};

const KEY: &str = "sk-e2eSECRETabcdefghijklmnop0123456789";

/// How the upstream below misbehaves.
#[derive(Clone, Copy)]
enum Upstream {
    /// Gzips its answer when the request accepts gzip, as real APIs do.
    GzipWhenAsked,
    /// Gzips whatever the request asked for.
    AlwaysGzip,
    /// Reports token counts whose sum overflows 32 bits.
    HugeUsage,
}

/// An OpenAI-ish upstream on a loopback port whose answer leaks `KEY`.
async fn upstream(kind: Upstream) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| async move {
                let gzip_asked = request
                    .headers()
                    .get("accept-encoding")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("gzip"));
                let max = u32::MAX;
                let usage = match kind {
                    Upstream::HugeUsage => json!({"prompt_tokens": max, "completion_tokens": max, "total_tokens": 1}),
                    _ => json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
                };
                let body = json!({
                    "id": "x", "object": "chat.completion", "model": "m",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("the key is {KEY}")}, "finish_reason": "stop"}],
                    "usage": usage,
                })
                .to_string();
                let gzip =
                    matches!(kind, Upstream::AlwaysGzip) || (matches!(kind, Upstream::GzipWhenAsked) && gzip_asked);
                let mut response = hyper::Response::builder().header("content-type", "application/json");
                let bytes = if gzip {
                    response = response.header("content-encoding", "gzip");
                    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                    encoder.write_all(body.as_bytes()).unwrap();
                    encoder.finish().unwrap()
                } else {
                    body.into_bytes()
                };
                Ok::<_, Infallible>(response.body(Full::new(Bytes::from(bytes))).unwrap())
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn guard() -> Plugin {
    Plugin::new("response-guard", "response-guard").config(json!({
        "action": "mask",
        "rules": [{"name": "openai-key", "pattern": "sk-[A-Za-z0-9]{20,}"}]
    }))
}

async fn guarded_gateway(upstream: SocketAddr) -> Gateway {
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &guard().yaml());
    dir.write(
        "routes.yaml",
        &Route::new("chat", &["m"], &format!("http://{upstream}/v1")).plugins(&["response-guard"]).yaml(),
    );
    Gateway::start(&dir).await
}

/// Before, a client that accepted gzip made the upstream compress its
/// answer, and response-guard, reading gzip, let the key through. Now
/// response plugins read plain text whatever the client accepts.
#[tokio::test]
async fn response_plugins_read_plain_text_whatever_the_client_accepts() {
    let gateway = guarded_gateway(upstream(Upstream::GzipWhenAsked).await).await;
    let reply = gateway.chat("m", &[("accept-encoding", "gzip")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.headers.get("content-encoding"), None, "the upstream was asked for gzip");
    let content = reply.json()["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
    assert!(!content.contains(KEY) && content.contains("the key is"), "{content}");

    // An upstream that compresses anyway is refused, not passed unread.
    let gateway = guarded_gateway(upstream(Upstream::AlwaysGzip).await).await;
    let reply = gateway.chat("m", &[]).await;
    reply.assert_error(502, "upstream_unavailable");
    assert!(!reply.text().contains(KEY));
}

/// Usage counts from the upstream that overflow a u32 when added; the
/// response still reaches the client whole (docs/security.md, B2).
#[tokio::test]
async fn usage_counts_that_overflow_do_not_break_the_response() {
    let upstream = upstream(Upstream::HugeUsage).await;
    let dir = ConfigDir::new();
    // A response-end hook makes the gateway read the usage.
    dir.write("plugins.yaml", &Plugin::new("probe", "probe").yaml());
    dir.write("routes.yaml", &Route::new("chat", &["m"], &format!("http://{upstream}/v1")).plugins(&["probe"]).yaml());
    let mut gateway = Gateway::start(&dir).await;
    for _ in 0..3 {
        let reply = gateway.chat("m", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["usage"]["prompt_tokens"], u32::MAX);
    }
    assert!(gateway.is_running());
    assert!(!gateway.log().contains("panicked"), "{}", gateway.log());
}

/// Before, a header value that was not ASCII was hidden from plugins but
/// forwarded. Now plugins see UTF-8 values, and a value that is not UTF-8
/// is refused.
#[tokio::test]
async fn plugins_see_every_header_value_that_is_forwarded() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let deny = Plugin::new("deny", "deny").config(json!({"header": "x-tenant", "values": ["bloqué"]}));
    dir.write("plugins.yaml", &deny.yaml());
    dir.write("routes.yaml", &Route::new("chat", &["m"], &echo.url()).plugins(&["deny"]).yaml());
    let gateway = Gateway::start(&dir).await;
    assert_eq!(gateway.chat("m", &[("x-tenant", "bloqué")]).await.status, 403, "the plugin did not see the header");
    assert_eq!(gateway.chat("m", &[("x-tenant", "open")]).await.status, 200);

    // Not UTF-8: sent raw, since a client library would refuse it.
    let addr = gateway.url("").trim_start_matches("http://").to_string();
    let body = sluice_tests::chat_body("m").to_string();
    let mut request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nx-tenant: blo",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(b"qu\xe9\r\nconnection: close\r\n\r\n");
    request.extend_from_slice(body.as_bytes());
    let response = raw_exchange(&addr, &request).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
    assert!(response.contains("invalid_header"), "{response}");
}

/// A plugin's edits of framing and hop-by-hop headers are ignored; its
/// other edits apply (docs/security.md, T8).
#[tokio::test]
async fn plugins_cannot_edit_framing_or_hop_by_hop_headers() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let mut plugins = Vec::new();
    let mut names = Vec::new();
    for (i, header) in ["transfer-encoding", "upgrade", "te", "connection", "x-kept"].iter().enumerate() {
        let name = format!("set-{i}");
        plugins.push(Plugin::new(&name, "add-header").config(json!({"header": header, "value": "gzip"})).yaml());
        names.push(name);
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    dir.write("plugins.yaml", &documents(&plugins));
    dir.write("routes.yaml", &Route::new("chat", &["m"], &echo.url()).plugins(&names).yaml());
    let gateway = Gateway::start(&dir).await;
    let reply = gateway.chat("m", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let echoed = reply.echoed();
    let headers = &echoed["headers"];
    for header in ["transfer-encoding", "upgrade", "te"] {
        assert!(headers.get(header).is_none(), "{header} reached the upstream: {headers}");
    }
    assert_ne!(headers["connection"], "gzip", "{headers}");
    assert_eq!(headers["x-kept"], "gzip");
}

async fn raw_exchange(addr: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// An upstream that stalls mid-stream is cut off after
/// `--upstream-idle-timeout-seconds`, releasing the plugin instances that
/// wait on its body, instead of holding them for as long as it likes
/// (docs/security.md, B2).
#[tokio::test]
async fn an_upstream_that_stalls_mid_stream_is_cut_off() {
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    // A response-chunk hook keeps the plugin's instance for the whole stream.
    dir.write("plugins.yaml", &Plugin::new("probe", "probe").config(json!({"upper": true})).yaml());
    dir.write("routes.yaml", &Route::new("chat", &["m"], &echo.url()).plugins(&["probe"]).yaml());
    let options = sluice_tests::Options {
        args: vec!["--upstream-idle-timeout-seconds".into(), "1".into()],
        ..Default::default()
    };
    let gateway = Gateway::start_with(&dir, options).await;
    let addr = gateway.url("").trim_start_matches("http://").to_string();
    let mut body = sluice_tests::chat_body("m");
    body["stream"] = true.into();
    let body = body.to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         x-echo-chunks: 3\r\nx-echo-chunk-delay-ms: 4000\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let started = std::time::Instant::now();
    let response = raw_exchange(&addr, request.as_bytes()).await;
    let took = started.elapsed();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(!response.contains("[DONE]"), "the stalled stream ran to its end: {response}");
    assert!(took < std::time::Duration::from_secs(4), "cut off after {took:?}, not after the 1 s idle timeout");
}
