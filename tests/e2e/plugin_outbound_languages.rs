//! Outbound HTTP from a guest language's ordinary client: the JavaScript
//! example plugins/examples/js-fetch (built into
//! plugins/dist/example-js-fetch.wasm) calls a checker with `fetch()`,
//! under componentize-js, through `wasi:http/outgoing-handler` and the
//! GatewayPlugin's `spec.egress` grant. A real HTTP server plays the
//! checker. One gateway: a JavaScript component takes seconds to compile,
//! and the copies beside the first reuse its compiled module.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::plugin_support::served;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Reply, Route, documents, eventually, plugin_wasm};
use tokio::net::TcpListener;

/// How long compiling the component may take on a busy 2-core machine.
const COMPILE: Duration = Duration::from_secs(240);
/// A reload that compiles nothing.
const RELOAD: Duration = Duration::from_secs(60);
/// Each plugin call's deadline: instantiating JavaScript is milliseconds,
/// more on a machine busy compiling.
const DEADLINE_MS: u32 = 5000;

/// The checker: a real HTTP/1.1 server on loopback, counting requests.
struct Checker {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
}

impl Checker {
    async fn start() -> Checker {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let counter = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        answer(request)
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Checker { addr, seen }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }
}

/// `/check` approves, naming the path the plugin said it checks; `/deny`
/// denies; `/long` answers more than a header should carry.
async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let asked = request.headers().get("x-path").and_then(|v| v.to_str().ok()).unwrap_or("-").to_string();
    let (status, body) = match request.uri().path() {
        "/check" => (200, format!("ok {asked}\n")),
        "/deny" => (200, "deny\n".to_string()),
        "/long" => (202, format!("  {}\n", "a".repeat(100))),
        _ => (404, String::new()),
    };
    Ok(Response::builder().status(status).body(Full::new(Bytes::from(body))).unwrap())
}

fn fetch_check(name: &str, url: &str) -> Plugin {
    Plugin::at(name, plugin_wasm("example-js-fetch")).config(json!({"url": url})).timeout_ms(DEADLINE_MS)
}

fn grant(origin: &str) -> Value {
    json!({"destinations": [{"url": origin}]})
}

async fn chat(gateway: &Gateway, model: &str) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    gateway.post("/v1/chat/completions", body.to_string(), &[]).await
}

/// What the upstream received as `x-checked`.
fn checked(reply: &Reply) -> String {
    let echoed = reply.echoed();
    echoed["headers"]["x-checked"].as_str().unwrap_or_else(|| panic!("no x-checked header: {echoed}")).to_string()
}

/// A metric's value from the gateway's /metrics, if it has it.
async fn metric(gateway: &Gateway, name: &str) -> Option<f64> {
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    let line = metrics.lines().find(|line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))?;
    line.rsplit(' ').next()?.parse().ok()
}

/// Waits until plugin `name` no longer waits for its snapshot; how it
/// starts its instances then (`snapshot`, or `configure` if none could be
/// made).
async fn snapshotted(gateway: &Gateway, name: &str) -> String {
    let name = format!("default/{name}");
    eventually(&format!("the snapshot of {name}"), COMPILE, async || {
        let admin = gateway.admin_config().await;
        let plugin = admin["plugins"].as_array()?.iter().find(|p| p["name"] == name)?.clone();
        let start = plugin["instancesStartFrom"].as_str()?;
        (start != "configure-until-snapshot").then(|| start.to_string())
    })
    .await
}

/// The median time of 20 requests for `model`, each checked by `check`.
async fn median(gateway: &Gateway, model: &str, check: impl Fn(&Reply)) -> Duration {
    let mut took = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let reply = chat(gateway, model).await;
        took.push(started.elapsed());
        check(&reply);
    }
    took.sort();
    took[took.len() / 2]
}

#[tokio::test]
async fn javascript_fetch_reaches_only_its_grant() {
    let echo = Echo::start().await;
    let checker = Checker::start().await;
    let elsewhere = Checker::start().await;
    let origin = checker.origin();
    let url = |path: &str| format!("{origin}{path}");
    let route = |name: &str| Route::new(name, &[name], &echo.url()).plugins(&[name]).yaml();

    // A plain route first, then the plugin: compiling it takes longer than
    // the harness waits for readiness. The copies loaded next reuse it.
    let dir = ConfigDir::new();
    dir.write("plain.yaml", &Route::new("plain", &["plain"], &echo.url()).yaml());
    let gateway = Gateway::start(&dir).await;
    let mut plugins = vec![
        fetch_check("checked", &url("/check")).egress(grant(&origin)).yaml(),
        // An instance that serves request after request runs its event loop
        // again each time.
        fetch_check("reused", &url("/check")).egress(grant(&origin)).reused(2).yaml(),
    ];
    let loading = Instant::now();
    dir.write("plugins.yaml", &documents(&plugins));
    dir.write("routes.yaml", &documents(&[route("checked"), route("reused")]));
    served(&gateway, &["default/checked", "default/plain", "default/reused"], COMPILE).await;
    let loaded = loading.elapsed();

    // The checker's answer reaches the upstream as a header.
    let before = checker.seen();
    let reply = chat(&gateway, "checked").await;
    assert_eq!(checked(&reply), "200 ok /v1/chat/completions", "{}", gateway.log());
    assert_eq!(checker.seen(), before + 1);

    // The engine's event loop and its WASI imports leave `configure`
    // snapshottable: instances start from the snapshot, not configured
    // each (making it compiles the component twice more).
    let snapshotting = Instant::now();
    let start = snapshotted(&gateway, "checked").await;
    let snapshot_took = snapshotting.elapsed();
    assert_eq!(start, "snapshot", "{}", gateway.log());

    // What it costs, for the README: printed, never asserted. Medians of 20
    // requests (`reused` makes a snapshot only if it needs many instances),
    // before the copies below make their snapshots.
    let ok = |reply: &Reply| assert_eq!(checked(reply), "200 ok /v1/chat/completions");
    let plain = median(&gateway, "plain", |reply| assert_eq!(reply.status, 200)).await;
    let per_request = median(&gateway, "checked", ok).await;
    let reused = median(&gateway, "reused", ok).await;
    let compiled = metric(&gateway, "sluice_plugin_compile_duration_seconds_sum").await.unwrap_or(0.0);
    println!(
        "js-fetch: served {loaded:.1?} after its config was written (compiling: {compiled:.1} s, 0 if cached); \
         snapshot made {snapshot_took:.1?} later; per request, median: plain route {plain:.1?}, \
         PerRequest {per_request:.1?}, Reused {reused:.1?}",
    );

    plugins.extend([
        fetch_check("denied", &url("/deny")).egress(grant(&origin)).yaml(),
        fetch_check("long", &url("/long")).egress(grant(&origin)).yaml(),
        // The same component without a grant, and granted another port
        // than the one it calls.
        fetch_check("ungranted", &url("/check")).yaml(),
        fetch_check("elsewhere", &url("/check")).egress(grant(&elsewhere.origin())).yaml(),
    ]);
    let names = ["checked", "reused", "denied", "long", "ungranted", "elsewhere"];
    dir.write("plugins.yaml", &documents(&plugins));
    dir.write("routes.yaml", &documents(&names.map(route)));
    let expected =
        ["default/checked", "default/denied", "default/elsewhere", "default/long", "default/plain", "default/reused"];
    let admin = served(&gateway, &expected, RELOAD).await;

    // Trimmed, and at most 64 bytes of it.
    assert_eq!(checked(&chat(&gateway, "long").await), format!("202 {}", "a".repeat(64)));
    // `deny` refuses the request, and the upstream never sees it.
    let upstream_before = echo.script().requests();
    let denied = chat(&gateway, "denied").await;
    assert_eq!(denied.status, 403, "{}", denied.text());
    assert_eq!(echo.script().requests(), upstream_before);

    // Without `spec.egress`, the component is refused at load, saying why.
    let refused = crate::plugin_support::errors_about(&admin, "GatewayPlugin default/ungranted");
    let refused = refused.first().unwrap_or_else(|| panic!("no error about the ungranted plugin: {admin}")).to_string();
    assert!(refused.contains("wasi:http/outgoing-handler") && refused.contains("spec.egress"), "{refused}");
    chat(&gateway, "ungranted").await.assert_error(404, "model_not_found");

    // Granted another port: the host refuses the call, nothing reaches
    // either server, and `fetch` rejects, which the plugin reports.
    let (before, elsewhere_before) = (checker.seen(), elsewhere.seen());
    let error = checked(&chat(&gateway, "elsewhere").await);
    assert_eq!(error, "error NetworkError when attempting to fetch resource");
    assert_eq!((checker.seen(), elsewhere.seen()), (before, elsewhere_before));
    let denied = "sluice_plugin_outbound_calls_total{namespace=\"default\",plugin=\"elsewhere\",\
                  destination=\"other\",result=\"denied\"}";
    assert_eq!(metric(&gateway, denied).await, Some(1.0));
}
