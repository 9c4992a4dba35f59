//! Hostile clients: slow or silent connections are closed, and requests
//! past the gateway's capacity get a 503 in OpenAI's error shape instead of
//! taking memory (docs/security.md, C1 to C3).

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Route};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn gateway(echo: &Echo, args: &[&str]) -> Gateway {
    let dir = ConfigDir::new();
    dir.write("routes.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    let options = Options { args: args.iter().map(|a| a.to_string()).collect(), ..Default::default() };
    Gateway::start_with(&dir, options).await
}

/// Whether the peer has closed `stream` (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A response (e.g. a 408) before the close.
            Ok(Ok(_)) => continue,
        }
    }
}

/// With the default limits: 40 connections that trickle a request head one
/// header every 2 s, and 40 that send nothing, are all closed within the
/// 10 s header timeout (plus slack); before, they stayed open for good.
#[tokio::test]
async fn slow_and_silent_connections_are_closed() {
    let echo = Echo::start().await;
    let gateway = gateway(&echo, &[]).await;
    let addr = gateway.url("").trim_start_matches("http://").to_string();
    let started = Instant::now();
    let mut silent = Vec::new();
    let mut slow = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
        let mut stream = TcpStream::connect(&addr).await.unwrap();
        stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        slow.push(stream);
    }
    // Trickle headers until the gateway hangs up on each slow connection.
    let trickle = tokio::spawn(async move {
        let mut closed = 0;
        for round in 0..10 {
            tokio::time::sleep(Duration::from_secs(2)).await;
            for stream in &mut slow {
                let _ = stream.write_all(format!("x-slow-{round}: 1\r\n").as_bytes()).await;
            }
        }
        for stream in &mut slow {
            closed += usize::from(closed_within(stream, Duration::from_millis(100)).await);
        }
        closed
    });
    for stream in &mut silent {
        let left = Duration::from_secs(16).saturating_sub(started.elapsed());
        assert!(closed_within(stream, left).await, "a silent connection was open after {:?}", started.elapsed());
    }
    assert_eq!(trickle.await.unwrap(), 40, "slow connections were still open after 20 s");
    // The gateway still serves.
    assert_eq!(gateway.chat("m", &[]).await.status, 200);
}

/// Past `--max-in-flight-requests`, a request is refused at once with a 503
/// in OpenAI's shape; the ones in flight are not disturbed.
#[tokio::test]
async fn requests_past_the_in_flight_limit_get_an_openai_shaped_503() {
    let echo = Echo::start().await;
    let gateway = gateway(&echo, &["--max-in-flight-requests", "2"]).await;
    let slow = [("x-echo-delay-ms", "1500")];
    let (first, second, third) = tokio::join!(gateway.chat("m", &slow), gateway.chat("m", &slow), async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        gateway.chat("m", &[]).await
    });
    assert_eq!(first.status, 200);
    assert_eq!(second.status, 200);
    third.assert_error(503, "overloaded");
    assert_eq!(third.json()["error"]["type"], "server_error");
    assert_eq!(gateway.chat("m", &[]).await.status, 200, "the limit counts requests in flight, not requests served");
}

/// Request bodies in flight share one memory budget: a body that would
/// take it past `--max-buffered-body-bytes` gets a 503 at once, while the
/// gateway still holds the first; a body that stops arriving gets a 408.
#[tokio::test]
async fn request_bodies_share_a_memory_budget_and_must_arrive_in_time() {
    let echo = Echo::start().await;
    let args = ["--max-buffered-body-bytes", "1000000", "--request-body-timeout-seconds", "2"];
    let gateway = gateway(&echo, &args).await;
    let addr = gateway.url("").trim_start_matches("http://").to_string();
    let head = |len: usize| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    // 600 kB declared, all but 10 bytes sent: the gateway holds what
    // arrived (the budget counts bytes that came, not bytes declared).
    let mut holding = TcpStream::connect(&addr).await.unwrap();
    holding.write_all(head(600_000).as_bytes()).await.unwrap();
    holding.write_all(&[b' '; 599_990]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(500_000)}]}).to_string();
    let reply = gateway.post("/v1/chat/completions", body.clone(), &[("content-type", "application/json")]).await;
    reply.assert_error(503, "overloaded");

    // The stalled body times out with a 408 and its share is given back.
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), holding.read_to_string(&mut response)).await;
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    assert!(response.contains("request_timeout"), "{response}");
    let reply = gateway.post("/v1/chat/completions", body, &[("content-type", "application/json")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}
