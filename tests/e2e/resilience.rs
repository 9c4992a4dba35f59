//! Routing and resilience through the real binary: retries on each failure
//! a policy can name (and none on the others), `retry-after`, the retry
//! budget, weights, priorities, outlier ejection and recovery, model
//! fallbacks, and streams that fail after their first byte. Each backend is
//! an echo upstream scripted to misbehave, counting what reached it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_echo::{EchoOptions, Script, Step};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, chat_body, documents};

/// A route named `chat` serving model `m` from `backends` (YAML flow
/// mappings), with `extra` spec fields.
fn route(backends: &[String], extra: &str) -> String {
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: chat}}\nspec:\n  models: [m]\n  \
         backends: [{}]\n{extra}",
        backends.join(", ")
    )
}

fn backend(echo: &Echo) -> String {
    format!("{{url: '{}'}}", echo.url())
}

/// The gateway and the directory it watches, which must outlive it: bind
/// both, so the gateway (declared last) stops before the directory goes.
async fn start(yaml: &str) -> (ConfigDir, Gateway) {
    let dir = ConfigDir::new();
    dir.write("routes.yaml", yaml);
    let gateway = Gateway::start(&dir).await;
    (dir, gateway)
}

async fn metrics(gateway: &Gateway) -> String {
    gateway.client().get(&gateway.admin_url("/metrics")).await.text()
}

/// The sum of a metric family's samples whose labels include all of `labels`.
fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with(['{', ' ']))
        .filter(|line| labels.iter().all(|l| line.contains(l)))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// For each condition, a first backend failing that way and a healthy
/// second one: named in `retry.retryOn`, the request is served by the second;
/// not named, the client gets the failure and the second backend never sees
/// the request, so a request the first may have acted on is not sent twice.
#[tokio::test]
async fn each_retry_condition_is_retried_only_when_the_policy_names_it() {
    let cases: [(&str, Option<Step>, u16); 6] = [
        ("ConnectFailure", None, 502),
        ("Reset", Some(Step::Close), 502),
        ("Timeout", Some(Step::Hang), 504),
        ("RateLimited", Some(Step::rate_limited("0")), 429),
        ("Overloaded", Some(Step::overloaded()), 529),
        ("ServerError", Some(Step::status(500)), 500),
    ];
    for (condition, step, status) in cases {
        for named in [true, false] {
            let (first, second) = (Echo::start().await, Echo::start().await);
            first.script().always(step.clone());
            let first_url = match step {
                Some(_) => first.url(),
                None => format!("http://127.0.0.1:{}/v1", closed_port()),
            };
            // Weights put the first backend first for the first request.
            let backends =
                [format!("{{url: '{first_url}', priority: 0}}"), format!("{{url: '{}', priority: 1}}", second.url())];
            // Not named: the policy names some other condition.
            let other = if condition == "Reset" { "Timeout" } else { "Reset" };
            let on = if named { condition } else { other };
            let policy = format!(
                "  retry: {{attempts: 2, retryOn: [{on}], perTryTimeoutMs: 500, backoff: {{baseMs: 1, maxMs: 1}}}}\n"
            );
            let (_config, gateway) = start(&route(&backends, &policy)).await;
            let reply = gateway.chat("m", &[]).await;
            if named {
                assert_eq!(reply.status, 200, "{condition} named: {}", reply.text());
                assert_eq!(second.script().requests(), 1, "{condition}: the retry reached the second backend");
                let m = metrics(&gateway).await;
                let labels = [format!("condition=\"{condition}\""), "result=\"retried\"".to_string()];
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                assert_eq!(metric(&m, "sluice_upstream_retries_total", &labels), 1.0, "{condition}: {m}");
            } else {
                assert_eq!(reply.status.as_u16(), status, "{condition} not named: {}", reply.text());
                assert!(reply.json()["error"]["message"].is_string(), "OpenAI-shaped: {}", reply.text());
                assert_eq!(second.script().requests(), 0, "{condition} not named: nothing was sent twice");
            }
            if step.is_some() {
                assert_eq!(first.script().requests(), 1, "{condition}: the first backend saw the request once");
            }
        }
    }
}

/// One backend: a short `retry-after` is waited for and the same backend
/// tried again; one longer than the route waits is the client's answer.
#[tokio::test]
async fn retry_after_is_honoured_or_passed_on() {
    let echo = Echo::start().await;
    let policy = "  retry: {attempts: 3, maxRetryAfterMs: 2000, backoff: {baseMs: 1, maxMs: 1}}\n";
    let (_config, gateway) = start(&route(&[backend(&echo)], policy)).await;

    echo.script().push(Step::rate_limited("1"), 1);
    let started = Instant::now();
    let reply = gateway.chat("m", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "retried after {:?}, before retry-after",
        started.elapsed()
    );
    assert_eq!(echo.script().requests(), 2);

    echo.script().push(Step::rate_limited("30"), 1);
    let started = Instant::now();
    let reply = gateway.chat("m", &[]).await;
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.header("retry-after"), Some("30"), "the backend's retry-after reaches the client");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?} for a retry-after it cannot honour",
        started.elapsed()
    );
    assert_eq!(echo.script().requests(), 3, "not retried");
}

/// Requests spread over a priority's backends by weight.
#[tokio::test]
async fn weights_share_the_traffic() {
    let (heavy, light) = (Echo::start().await, Echo::start().await);
    let backends = [format!("{{url: '{}', weight: 3}}", heavy.url()), format!("{{url: '{}', weight: 1}}", light.url())];
    let (_config, gateway) = start(&route(&backends, "")).await;
    for _ in 0..40 {
        assert_eq!(gateway.chat("m", &[]).await.status, 200);
    }
    assert_eq!((heavy.script().requests(), light.script().requests()), (30, 10));
}

/// A failing primary is retried on the secondary, then ejected after two
/// failures in a row (traffic goes straight to the secondary, and
/// /admin/config and the metrics say so), then takes traffic again once
/// its ejection ends.
#[tokio::test]
async fn priority_failover_ejection_and_recovery() {
    let (primary, secondary) = (Echo::start().await, Echo::start().await);
    primary.script().always(Some(Step::status(503)));
    let backends =
        [format!("{{url: '{}', priority: 0}}", primary.url()), format!("{{url: '{}', priority: 1}}", secondary.url())];
    let extra = "  retry: {attempts: 2}\n  outlierDetection: {consecutiveFailures: 2, baseEjectionMs: 1500}\n";
    let (_config, gateway) = start(&route(&backends, extra)).await;

    for _ in 0..2 {
        assert_eq!(gateway.chat("m", &[]).await.status, 200);
    }
    assert_eq!((primary.script().requests(), secondary.script().requests()), (2, 2));
    for _ in 0..5 {
        assert_eq!(gateway.chat("m", &[]).await.status, 200);
    }
    assert_eq!(primary.script().requests(), 2, "ejected: no traffic");
    assert_eq!(secondary.script().requests(), 7);
    let config = gateway.admin_config().await;
    let health = &config["routes"][0]["backends"][0]["health"];
    assert!(health["ejectedForMs"].as_u64().is_some_and(|ms| ms > 0 && ms <= 1500), "{config}");
    assert_eq!(health["ejections"], 1, "{config}");
    let m = metrics(&gateway).await;
    let primary_label = format!("backend=\"{}\"", primary.url());
    assert_eq!(metric(&m, "sluice_backend_ejected", &[&primary_label]), 1.0, "{m}");
    assert_eq!(metric(&m, "sluice_backend_ejections_total", &[&primary_label]), 1.0, "{m}");

    // Healthy again, and back once the ejection ends.
    primary.script().always(None);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    for _ in 0..3 {
        assert_eq!(gateway.chat("m", &[]).await.status, 200);
    }
    assert_eq!(primary.script().completed(), 3, "the primary serves again");
    assert_eq!(secondary.script().requests(), 7);
    let config = gateway.admin_config().await;
    assert!(config["routes"][0]["backends"][0]["health"]["ejectedForMs"].is_null(), "{config}");
}

/// Every backend failing slowly, and many requests at once: the budget lets
/// a share of them be retried, not all, so retries cannot double the load
/// on a failing provider.
#[tokio::test]
async fn the_retry_budget_stops_a_retry_storm() {
    let (a, b) = (Echo::start().await, Echo::start().await);
    let extra = "  retry: {attempts: 2, budget: {percent: 20, minConcurrency: 1}}\n  outlierDetection: {consecutiveFailures: 0}\n";
    let (_config, gateway) = start(&route(&[backend(&a), backend(&b)], extra)).await;
    const REQUESTS: u64 = 40;
    let body = chat_body("m").to_string();
    // Each attempt fails after a while in flight, so requests overlap.
    let failing = [("x-echo-delay-ms", "300"), ("x-echo-status", "503")];
    let sends = (0..REQUESTS).map(|_| {
        let body = body.clone();
        let gateway = &gateway;
        async move { gateway.post("/v1/chat/completions", body, &failing).await }
    });
    let replies = futures_util::future::join_all(sends).await;
    assert!(replies.iter().all(|r| r.status == 503), "every request fails");
    let sent = a.script().requests() + b.script().requests();
    let retried = sent - REQUESTS;
    // Unbudgeted, every request would be retried: 80 sent.
    assert!((1..=REQUESTS / 4).contains(&retried), "{retried} of {REQUESTS} requests retried");
    let m = metrics(&gateway).await;
    assert_eq!(metric(&m, "sluice_upstream_retries_total", &["result=\"retried\""]), retried as f64, "{m}");
    let denied = metric(&m, "sluice_upstream_retries_total", &["result=\"budget_exhausted\""]);
    assert_eq!(denied as u64, REQUESTS - retried, "{m}");
}

/// A prompt too long for the model moves to the larger model's route: when
/// the backend says so, and when context-trim says so before any backend
/// is asked.
#[tokio::test]
async fn context_length_exceeded_falls_back_to_a_larger_model() {
    let (small, large) = (Echo::start().await, Echo::start().await);
    small.script().always(Some(Step::context_length_exceeded()));
    let trim = Plugin::new("trim", "context-trim")
        .config(json!({"models": [{"model": "trimmed", "maxInputTokens": 10}]}))
        .timeout_ms(5000);
    let yaml = documents(&[
        trim.yaml(),
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: small}}\nspec:\n  models: [small]\n  \
             backends: [{}]\n  fallbacks: [{{model: large, when: [ContextLengthExceeded]}}]\n",
            backend(&small)
        ),
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: trimmed}}\nspec:\n  models: [trimmed]\n  \
             backends: [{}]\n  plugins: [{{name: trim}}]\n  fallbacks: [{{model: large}}]\n",
            backend(&small)
        ),
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: large}}\nspec:\n  models: [large]\n  \
             backends: [{}]\n",
            backend(&large)
        ),
    ]);
    let (_config, gateway) = start(&yaml).await;

    let reply = gateway.chat("small", &[]).await;
    assert_eq!(reply.echoed()["model"], "large", "served by the larger model");
    assert_eq!((small.script().requests(), large.script().requests()), (1, 1));

    let mut body = chat_body("trimmed");
    body["messages"][0]["content"] = "a prompt much longer than ten tokens, which context-trim refuses".into();
    let reply = gateway.post("/v1/chat/completions", body.to_string(), &[]).await;
    assert_eq!(reply.echoed()["model"], "large", "{}", reply.text());
    assert_eq!(small.script().requests(), 1, "the trimmed route's backend was never asked");
    let m = metrics(&gateway).await;
    assert_eq!(
        metric(&m, "sluice_fallbacks_total", &["fallback_model=\"large\"", "condition=\"ContextLengthExceeded\""]),
        2.0,
        "{m}"
    );
}

/// A stream that breaks after its first bytes reached the client is not
/// retried (the client would get the start twice): it ends with an
/// OpenAI-shaped error event, and the other backend never sees it.
#[tokio::test]
async fn a_stream_is_not_retried_after_its_first_byte() {
    let script = Script::new();
    let broken = Echo::start_with(EchoOptions { script: script.clone(), ..Default::default() }).await;
    let healthy = Echo::start().await;
    script.always(Some(Step::ResetAfterChunks(2)));
    let backends =
        [format!("{{url: '{}', priority: 0}}", broken.url()), format!("{{url: '{}', priority: 1}}", healthy.url())];
    let extra = "  retry: {attempts: 3, retryOn: [Reset, ServerError, ConnectFailure]}\n";
    let (_config, gateway) = start(&route(&backends, extra)).await;
    let mut body = chat_body("m");
    body["stream"] = true.into();
    let streamed = gateway.client().post_streaming(&gateway.url("/v1/chat/completions"), body.to_string(), &[]).await;
    let events: Vec<String> = streamed.events().into_iter().map(|(_, data)| data).collect();
    let contents: Vec<Value> = events.iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
    assert!(contents.len() >= 2, "the first chunks arrived: {events:?}");
    let last = contents.last().unwrap();
    assert!(last["error"]["message"].is_string(), "ends with an error event: {events:?}");
    assert!(!events.iter().any(|e| e == "[DONE]"), "not a clean end: {events:?}");
    assert_eq!(broken.script().requests(), 1);
    assert_eq!(healthy.script().requests(), 0, "never restarted elsewhere");
}

/// A backend's own deadlines: no head within `firstByteMs` is a 504 (and a
/// Timeout the policy may retry); a stream that pauses longer than `idleMs`,
/// or runs past `totalMs`, ends with an error event instead of hanging on.
#[tokio::test]
async fn per_backend_timeouts() {
    let echo = Echo::start().await;
    let backends = [format!("{{url: '{}', timeouts: {{firstByteMs: 300, idleMs: 400, totalMs: 1500}}}}", echo.url())];
    let (_config, gateway) = start(&route(&backends, "")).await;

    echo.script().push(Step::Hang, 1);
    let started = Instant::now();
    let reply = gateway.chat("m", &[]).await;
    reply.assert_error(504, "upstream_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "waited {:?}, not the 300 ms first-byte timeout",
        started.elapsed()
    );

    let mut body = chat_body("m");
    body["stream"] = true.into();
    let url = gateway.url("/v1/chat/completions");
    for (what, headers) in [
        ("a pause longer than idleMs", [("x-echo-chunks", "4"), ("x-echo-chunk-delay-ms", "1000")]),
        ("a stream longer than totalMs", [("x-echo-chunks", "20"), ("x-echo-chunk-delay-ms", "200")]),
    ] {
        let started = Instant::now();
        let streamed = gateway.client().post_streaming(&url, body.to_string(), &headers).await;
        let events: Vec<String> = streamed.events().into_iter().map(|(_, data)| data).collect();
        let last: Value = events.last().and_then(|e| serde_json::from_str(e).ok()).unwrap_or_default();
        assert!(last["error"]["message"].is_string(), "{what}: ends with an error event: {events:?}");
        assert!(!events.iter().any(|e| e == "[DONE]"), "{what}: {events:?}");
        assert!(started.elapsed() < Duration::from_secs(3), "{what}: cut after {:?}", started.elapsed());
    }
    // Within its deadlines, a stream runs to its end.
    let streamed = gateway.client().post_streaming(&url, body.to_string(), &[("x-echo-chunk-delay-ms", "100")]).await;
    assert!(streamed.events().iter().any(|(_, data)| data == "[DONE]"));
}
