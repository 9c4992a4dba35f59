//! Isolation: memory (docs/security.md).

use std::time::Duration;

use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, eventually};

const MIB: usize = 1 << 20;

/// A GatewayPlugin in `namespace` (the harness's `Plugin` has none).
fn plugin(namespace: &str, name: &str, wasm: &str, config: Value, extra: &str) -> String {
    let file = Value::from(sluice_tests::plugin_wasm(wasm).to_string_lossy());
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata:\n  name: {name}\n  namespace: {namespace}\n\
         spec:\n  source:\n    file: {file}\n  config: {config}\n  failurePolicy: Closed\n{extra}"
    )
}

/// An AIModelRoute in `namespace` serving `model` from `url` through `plugins`.
fn route(namespace: &str, model: &str, url: &str, plugins: &[&str]) -> String {
    let mut spec = format!("  models: [{model}]\n  backends:\n    - url: {}\n", Value::from(url));
    if !plugins.is_empty() {
        spec += "  plugins:\n";
        for name in plugins {
            spec += &format!("    - name: {name}\n");
        }
    }
    format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: route-{model}\n  namespace: {namespace}\n\
         spec:\n{spec}"
    )
}

/// The value of the metric line starting with `prefix`, if any.
fn metric(metrics: &str, prefix: &str) -> Option<f64> {
    metrics.lines().find(|line| line.starts_with(prefix))?.rsplit(' ').next()?.parse().ok()
}

/// Tenants' `Reused` plugins grow their memory to the limit in `configure`
/// and keep it in their idle instances. Before, the first one took the
/// whole guest memory budget and every other plugin route, of every tenant,
/// answered 503 while /readyz stayed ready. Now each namespace holds at
/// most its share, idle instances give their memory back (least recently
/// used first) when a live request needs it, a plugin that cannot
/// `configure` within its share is refused at load with a reason, and what
/// each namespace holds and was refused shows in /metrics
/// (docs/security.md, T6).
#[tokio::test]
async fn idle_plugins_holding_guest_memory_do_not_starve_other_tenants() {
    let echo = Echo::start().await;
    let hog = json!({"growInConfigure": true});
    let reused = "  isolation: Reused\n  maxReusedInstances: 4\n  maxMemoryMiB: 64\n";
    let mut docs = Vec::new();
    for tenant in ["a1", "a2", "a3", "a4"] {
        let namespace = format!("tenant-{tenant}");
        docs.push(plugin(&namespace, "hog", "hostile", hog.clone(), reused));
        docs.push(route(&namespace, &format!("hog-{tenant}"), &echo.url(), &["hog"]));
    }
    // Needs 40 MiB in `configure`, more than one plugin's share of 64 MiB
    // (half, by default).
    let big = json!({"allocateInConfigureMiB": 40});
    docs.push(plugin("tenant-c", "big", "hostile", big, "  maxMemoryMiB: 64\n"));
    docs.push(plugin("tenant-b", "add", "add-header", json!({"header": "x-b", "value": "1"}), ""));
    docs.push(route("tenant-b", "b-model", &echo.url(), &["add"]));
    let dir = ConfigDir::new();
    dir.write("config.yaml", &docs.join("---\n"));
    let args = ["--max-guest-memory-bytes", &(64 * MIB).to_string(), "--max-ready-wait-seconds", "0"];
    let options = Options { args: args.iter().map(|a| a.to_string()).collect(), ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;

    // Tenant B's plugin route is served, each request by a fresh instance.
    for i in 0..10 {
        let reply = gateway.chat("b-model", &[]).await;
        assert_eq!(reply.status, 200, "request {i} of tenant B: {}\n{}", reply.text(), gateway.log());
        assert_eq!(reply.echoed()["headers"]["x-b"], "1", "tenant B's plugin ran");
    }
    // And so are the hogs' own routes, by their idle instances or new ones.
    for tenant in ["a1", "a2", "a3", "a4"] {
        let reply = gateway.chat(&format!("hog-{tenant}"), &[]).await;
        assert_eq!(reply.status, 200, "hog-{tenant}: {}", reply.text());
    }
    assert_eq!(gateway.readyz().await, 200);

    // The plugin that cannot configure within its share is refused at load.
    let admin = gateway.admin_config().await;
    let errors = admin["errors"].to_string();
    assert!(errors.contains("tenant-c/big") && errors.contains("share"), "the big plugin's refusal: {errors}");

    // What each tenant holds, and what was refused it, shows in /metrics.
    let metrics = eventually("guest memory metrics", Duration::from_secs(5), async || {
        let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
        metric(&metrics, "sluice_plugin_guest_memory_refusals_total{").map(|_| metrics)
    })
    .await;
    let held = metric(&metrics, "sluice_plugin_guest_memory_bytes{namespace=\"tenant-a1\"}");
    assert!(held.is_some_and(|bytes| bytes <= 32.0 * MIB as f64), "tenant-a1 holds {held:?}");
    let budget = metric(&metrics, "sluice_plugin_guest_memory_budget_bytes");
    assert_eq!(budget, Some(64.0 * MIB as f64));
    let refused = metrics
        .lines()
        .any(|line| line.starts_with("sluice_plugin_guest_memory_refusals_total{") && line.contains("tenant-a1"));
    assert!(refused, "tenant-a1's growth past its share is counted: {metrics}");
    let evicted = metric(&metrics, "sluice_plugin_guest_memory_evictions_total");
    assert!(evicted.is_some_and(|n| n >= 1.0), "idle instances gave their memory back: {metrics}");
}

/// An upstream on a loopback port that answers every request with the head
/// of a `len`-byte JSON body, sends `sent` bytes of it, then stalls until
/// the connection is dropped.
async fn stalling_upstream(len: usize, sent: usize) -> std::net::SocketAddr {
    use futures_util::StreamExt as _;
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let service =
                hyper::service::service_fn(move |_request: hyper::Request<hyper::body::Incoming>| async move {
                    let chunk = bytes::Bytes::from(vec![b' '; 64 << 10]);
                    let frames = futures_util::stream::iter((0..sent / chunk.len()).map(move |_| chunk.clone()))
                        .map(|data| Ok::<_, std::convert::Infallible>(Frame::data(data)))
                        .chain(futures_util::stream::pending());
                    let body = http_body_util::StreamBody::new(frames);
                    let response = hyper::Response::builder()
                        .header("content-type", "application/json")
                        .header("content-length", len.to_string())
                        .body(body)
                        .unwrap();
                    Ok::<_, std::convert::Infallible>(response)
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

/// A tenant's backend sends large bodies and stalls, to many requests at
/// once, through a plain route and an Anthropic-translated one. Before,
/// each response held its bytes (a 1 MiB copy to read usage from, the whole
/// body to translate) with no budget shared between them: 200 such
/// requests took the gateway from 139 to 990 MiB of RSS. Now responses hold
/// at most `--max-buffered-response-bytes` together (503s past it, or usage
/// left unread), the gateway's RSS stays within a bound derived from it,
/// and another tenant is served meanwhile (docs/security.md, B1).
#[tokio::test]
async fn stalling_backends_cannot_make_responses_hold_unbounded_memory() {
    const REQUESTS: usize = 80;
    let echo = Echo::start().await;
    // 3 MiB, under --max-body-bytes, for the translated route to hold
    // whole; 960 KiB, under the 1 MiB copy read for usage, for the plain one.
    let stall = format!("http://{}", stalling_upstream(8 * MIB, 3 * MIB).await);
    let stall_plain = format!("http://{}", stalling_upstream(8 * MIB, 960 << 10).await);
    let dir = ConfigDir::new();
    dir.write("anthropic-key", "sk-ant-e2e");
    let anthropic = format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: translated\n  namespace: tenant-a\n\
         spec:\n  models: [translated]\n  backends:\n    - url: {stall}\n      provider: anthropic\n      \
         apiKeyFile: anthropic-key\n      model: claude-sonnet-4-5\n"
    );
    let docs = [route("tenant-a", "plain", &stall_plain, &[]), anthropic, route("tenant-b", "other", &echo.url(), &[])];
    dir.write("config.yaml", &docs.join("---\n"));
    let budget = 32 * MIB;
    let args = ["--max-buffered-response-bytes", &budget.to_string(), "--upstream-idle-timeout-seconds", "8"];
    let options = Options { args: args.iter().map(|a| a.to_string()).collect(), ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    assert_eq!(gateway.chat("other", &[]).await.status, 200);
    let before = gateway.rss_bytes();

    let attack = async {
        let addr = gateway.url("").trim_start_matches("http://").to_string();
        let requests = (0..REQUESTS).flat_map(|_| ["plain", "translated"]).map(|model| raw_post(addr.clone(), model));
        futures_util::future::join_all(requests).await
    };
    let watch = async {
        let mut peak = 0;
        let mut other = Vec::new();
        // While the upstream stalls (it is cut off after 8 s idle).
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            peak = peak.max(gateway.rss_bytes());
            other.push(gateway.chat("other", &[]).await.status.as_u16());
        }
        (peak, other)
    };
    let (statuses, (peak, other)) = tokio::join!(attack, watch);
    let grown = peak.saturating_sub(before) as usize;
    let refused = statuses.iter().filter(|s| **s == Some(503)).count();
    eprintln!("RSS {} MiB -> peak {} MiB; {refused} of {} requests refused", before >> 20, peak >> 20, statuses.len());
    assert!(other.iter().all(|s| *s == 200), "the other tenant was not served meanwhile: {other:?}");
    // The budget, plus what hyper's connection buffers and the allocator's
    // slack hold for 160 connections; before, 400+ MiB.
    let bound = budget + 120 * MIB;
    assert!(grown <= bound, "RSS grew by {} MiB, over {} MiB", grown >> 20, bound >> 20);
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    assert!(
        metric(&metrics, "sluice_response_buffer_refusals_total{").is_some(),
        "the budget's exhaustion shows in /metrics"
    );
}

/// POSTs a chat request for `model` on a connection of its own and reads
/// the reply to its end (or until it is cut); its status, if one came.
async fn raw_post(addr: String, model: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = sluice_tests::chat_body(model).to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.ok()?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.ok()?;
    stream.write_all(body.as_bytes()).await.ok()?;
    let mut first = Vec::new();
    let mut buf = vec![0; 64 << 10];
    let read_all = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) if first.len() < 12 => first.extend_from_slice(&buf[..n]),
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(20), read_all).await;
    std::str::from_utf8(first.get(9..12)?).ok()?.parse().ok()
}
