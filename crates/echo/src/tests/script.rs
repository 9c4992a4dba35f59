//! Scripted steps over real HTTP, seen by a hyper client or a raw socket.

use super::*;

const CHAT: &str = "/v1/chat/completions";

fn chat_body(stream: bool) -> String {
    json!({"model": "echo", "messages": [{"role": "user", "content": "hi"}], "stream": stream}).to_string()
}

#[tokio::test]
async fn status_steps_then_normal_replies_and_the_counters() {
    let opts = EchoOptions::default();
    let script = opts.script.clone();
    let server = start(opts).await;
    let client = client(false);
    script.push(Step::rate_limited("1"), 2);
    script.push(Step::status(503), 1);

    for _ in 0..2 {
        let (status, headers, reply) = exchange(&client, post(server.addr, CHAT, chat_body(false), &[])).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(headers[RETRY_AFTER], "1");
        assert!(headers["x-request-id"].to_str().unwrap().starts_with("req_"));
        assert_eq!(reply["error"]["type"], "rate_limit_error");
        assert_eq!(reply["error"]["code"], "rate_limit_exceeded");
    }
    let (status, headers, reply) = exchange(&client, post(server.addr, "/v1/embeddings", "{}", &[])).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(headers.get(RETRY_AFTER).is_none());
    assert_eq!(reply["error"]["type"], "server_error");
    assert_eq!((script.requests(), script.completed(), script.queued()), (3, 0, 0));

    let (status, _, reply) = exchange(&client, post(server.addr, CHAT, chat_body(false), &[])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    // Endpoints without a model neither count nor take steps.
    script.push(Step::status(500), 1);
    let models = Request::get(format!("http://{}/v1/models", server.addr)).body(Full::default()).unwrap();
    assert_eq!(send(&client, models).await.0, StatusCode::OK);
    assert_eq!((script.requests(), script.completed(), script.queued()), (4, 1, 1));
    // Failures that are not scripted count as requests, not completions.
    script.clear();
    let request = post(server.addr, CHAT, chat_body(false), &[("x-echo-status", "502")]);
    assert_eq!(send(&client, request).await.0, StatusCode::BAD_GATEWAY);
    assert_eq!(send(&client, post(server.addr, CHAT, "{oops", &[])).await.0, StatusCode::BAD_REQUEST);
    assert_eq!((script.requests(), script.completed()), (6, 1));
}

#[tokio::test]
async fn always_fails_until_cleared_and_context_length_reads_like_openai() {
    let opts = EchoOptions::default();
    let script = opts.script.clone();
    let server = start(opts).await;
    let client = client(true);
    script.always(Some(Step::context_length_exceeded()));
    for _ in 0..3 {
        let (status, _, reply) = exchange(&client, post(server.addr, CHAT, chat_body(false), &[])).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let error = &reply["error"];
        assert_eq!(error["type"], "invalid_request_error");
        assert_eq!(error["code"], "context_length_exceeded");
        assert_eq!(error["param"], "messages");
        // "user" + "hi": 6 characters, 2 tokens over the window.
        assert_eq!(
            error["message"],
            "This model's maximum context length is 128000 tokens. However, your messages resulted in 128002 \
             tokens. Please reduce the length of the messages."
        );
    }
    script.always(None);
    assert_eq!(send(&client, post(server.addr, CHAT, chat_body(false), &[])).await.0, StatusCode::OK);
    assert_eq!((script.requests(), script.completed()), (4, 1));
}

#[tokio::test]
async fn hang_sends_nothing_until_the_echo_stops() {
    let opts = EchoOptions::default();
    let script = opts.script.clone();
    let server = start(opts).await;
    script.push(Step::Hang, 2);

    // A client that gives up: nothing arrived, and the echo lets go of it.
    let (received, closed) = raw_exchange(server.addr, CHAT, &chat_body(false), Duration::from_millis(300)).await;
    assert!(received.is_empty() && !closed, "{:?}", String::from_utf8_lossy(&received));

    let addr = server.addr;
    let hung = tokio::spawn(async move { raw_exchange(addr, CHAT, &chat_body(false), Duration::from_secs(10)).await });
    eventually("the second request to arrive", || script.requests() == 2).await;
    assert!(!hung.is_finished());
    let started = Instant::now();
    server.stop.send(()).unwrap();
    let (received, closed) = hung.await.unwrap();
    assert!(closed && received.is_empty(), "{:?}", String::from_utf8_lossy(&received));
    assert!(started.elapsed() < Duration::from_secs(5));
    let stopped = tokio::time::timeout(Duration::from_secs(5), server.stopped).await;
    stopped.expect("a hang does not hold up the echo's stop").unwrap().unwrap();
    assert_eq!((script.requests(), script.completed()), (2, 0));
}

#[tokio::test]
async fn close_drops_the_connection_without_a_response() {
    let opts = EchoOptions::default();
    let script = opts.script.clone();
    let server = start(opts).await;
    script.push(Step::Close, 2);

    let (received, closed) = raw_exchange(server.addr, CHAT, &chat_body(true), Duration::from_secs(5)).await;
    assert!(closed && received.is_empty(), "{:?}", String::from_utf8_lossy(&received));
    let err = client(false).request(post(server.addr, CHAT, chat_body(false), &[])).await.unwrap_err();
    assert!(!err.is_connect(), "the request was sent, then the connection dropped: {err:?}");
    assert_eq!(send(&client(false), post(server.addr, CHAT, chat_body(false), &[])).await.0, StatusCode::OK);
    assert_eq!((script.requests(), script.completed()), (3, 1));
}

#[tokio::test]
async fn reset_after_chunks_breaks_streams_over_http1_and_h2() {
    let opts = EchoOptions { chunk_delay: Duration::from_millis(5), chunks: 6, ..Default::default() };
    let script = opts.script.clone();
    let server = start(opts).await;
    for http2 in [false, true] {
        script.push(Step::ResetAfterChunks(2), 1);
        let response = client(http2).request(post(server.addr, CHAT, chat_body(true), &[])).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let (text, error) = read_to_end(response.into_body()).await;
        assert!(error.is_some(), "http2 {http2}: the stream ended cleanly: {text}");
        let events = parse_sse(&text);
        // The role chunk and two content chunks; no finish, no [DONE].
        assert_eq!(events.len(), 3, "{text}");
        assert_eq!(events[0].1["choices"][0]["delta"]["role"], "assistant");
        assert!(events[1..].iter().all(|(_, e)| e["choices"][0]["delta"]["content"].is_string()));
    }
    // More chunks than the reply has: everything but the end.
    script.push(Step::ResetAfterChunks(100), 1);
    let response = client(false).request(post(server.addr, CHAT, chat_body(true), &[])).await.unwrap();
    let (text, error) = read_to_end(response.into_body()).await;
    assert!(error.is_some());
    let events = parse_sse(&text);
    assert_eq!(events.len(), 7, "{text}");
    assert!(events.iter().all(|(_, e)| e["choices"][0]["finish_reason"].is_null()));
    assert_eq!(script.completed(), 0);

    // A whole reply, cut: the head, part of the JSON, then an error.
    script.push(Step::ResetAfterChunks(1), 1);
    let response = client(false).request(post(server.addr, CHAT, chat_body(false), &[])).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (text, error) = read_to_end(response.into_body()).await;
    assert!(error.is_some() && text.starts_with('{') && serde_json::from_str::<Value>(&text).is_err(), "{text}");

    let response = client(false).request(post(server.addr, CHAT, chat_body(true), &[])).await.unwrap();
    let (text, error) = read_to_end(response.into_body()).await;
    assert!(error.is_none());
    assert_eq!(parse_sse(&text).last().unwrap().1, "[DONE]");
    eventually("the whole stream to count", || script.completed() == 1).await;
    assert_eq!(script.requests(), 5);
}

#[tokio::test]
async fn delay_holds_the_head_then_answers() {
    let opts = EchoOptions::default();
    let script = opts.script.clone();
    let server = start(opts).await;
    script.push(Step::Delay(Duration::from_millis(200)), 1);
    let started = Instant::now();
    let (status, reply) = send(&client(false), post(server.addr, CHAT, chat_body(false), &[])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(started.elapsed() >= Duration::from_millis(200));
    let started = Instant::now();
    send(&client(false), post(server.addr, CHAT, chat_body(false), &[])).await;
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_eq!(script.completed(), 2);
}

#[tokio::test]
async fn the_script_over_http() {
    let server = start(EchoOptions::default()).await;
    let client = client(false);
    let url = |path: &str| format!("http://{}{path}", server.addr);
    let script = json!({"push": [{"step": "status", "status": 429, "retry_after": "2", "times": 1}]});
    let (status, reply) = send(&client, post(server.addr, "/_echo/script", script.to_string(), &[])).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply["queued"], 1);

    let (status, headers, _) = exchange(&client, post(server.addr, CHAT, chat_body(false), &[])).await;
    assert_eq!((status, &headers[RETRY_AFTER]), (StatusCode::TOO_MANY_REQUESTS, &HeaderValue::from_static("2")));
    send(&client, post(server.addr, CHAT, chat_body(false), &[])).await;
    let stats = Request::get(url("/_echo/stats")).body(Full::default()).unwrap();
    let (_, stats) = send(&client, stats).await;
    assert_eq!(stats, json!({"requests": 2, "completed": 1, "queued": 0, "always": false}));

    let bad = json!({"push": [{"step": "status", "status": 204}]});
    let (status, reply) = send(&client, post(server.addr, "/v1/_echo/script", bad.to_string(), &[])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reply["error"]["code"], "invalid_echo_script");
    let too_big = vec![b' '; MAX_SCRIPT_BYTES + 1];
    assert_eq!(send(&client, post(server.addr, "/_echo/script", too_big, &[])).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}
