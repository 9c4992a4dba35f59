//! Routing and resilience scenarios through the real binary, each on fresh
//! echo upstreams scripted to fail: requests the clients sent, attempts the
//! backends received, retries (and retries the budget refused), requests
//! that failed, backend ejections, and the clients' latency. Prints a table.
//!
//! `cargo bench -p sluice-tests --bench resilience` after `cargo build
//! --release -p sluice` (or with `--profile dev` against target/debug).
//! Latencies are the scripted failures' (timeouts, backoffs, retry-after),
//! not the gateway's own cost: see the other benches for that.

use std::time::{Duration, Instant};

use sluice_echo::Step;
use sluice_tests::{ConfigDir, Echo, Gateway, chat_body, percentile};

/// Requests per scenario, and how many are in flight at once.
const REQUESTS: usize = 200;
const CONCURRENCY: usize = 8;

struct Scenario {
    name: &'static str,
    /// Route spec lines after `backends`, given the backends' URLs.
    spec: &'static str,
    /// How the first backend misbehaves, or that nothing listens there.
    first: Option<Step>,
    first_refuses: bool,
    /// Request headers (the echo's delay knob).
    headers: &'static [(&'static str, &'static str)],
}

fn scenarios() -> Vec<Scenario> {
    let slow_503: &'static [(&str, &str)] = &[("x-echo-delay-ms", "50"), ("x-echo-status", "503")];
    vec![
        Scenario { name: "healthy", spec: "", first: None, first_refuses: false, headers: &[] },
        Scenario {
            name: "A refuses connections, no retry policy",
            spec: "",
            first: None,
            first_refuses: true,
            headers: &[],
        },
        Scenario {
            name: "A 503, no retry policy",
            spec: "",
            first: Some(Step::status(503)),
            first_refuses: false,
            headers: &[],
        },
        Scenario {
            name: "A 503, retry",
            spec: "  retry: {attempts: 2}\n",
            first: Some(Step::status(503)),
            first_refuses: false,
            headers: &[],
        },
        Scenario {
            name: "A 429 retry-after 0, retry",
            spec: "  retry: {attempts: 2}\n",
            first: Some(Step::rate_limited("0")),
            first_refuses: false,
            headers: &[],
        },
        Scenario {
            name: "A hangs, retry on Timeout (200 ms per try)",
            spec: "  retry: {attempts: 2, retryOn: [Timeout], perTryTimeoutMs: 200}\n",
            first: Some(Step::Hang),
            first_refuses: false,
            headers: &[],
        },
        Scenario {
            name: "both 503 after 50 ms, 3 attempts, budget 20%",
            spec: "  retry: {attempts: 3}\n  outlierDetection: {consecutiveFailures: 0}\n",
            first: None,
            first_refuses: false,
            headers: slow_503,
        },
        Scenario {
            name: "both 503 after 50 ms, 3 attempts, budget 100%",
            spec: "  retry: {attempts: 3, budget: {percent: 100}}\n  outlierDetection: {consecutiveFailures: 0}\n",
            first: None,
            first_refuses: false,
            headers: slow_503,
        },
    ]
}

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(async {
        println!(
            "| scenario | requests | attempts upstream | retried | refused by budget | failed | ejections | p50 ms | p99 ms |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for scenario in scenarios() {
            run(scenario).await;
        }
    });
}

async fn run(scenario: Scenario) {
    let (a, b) = (Echo::start().await, Echo::start().await);
    a.script().always(scenario.first.clone());
    let first = if scenario.first_refuses { format!("http://127.0.0.1:{}/v1", closed_port()) } else { a.url() };
    let second = b.url();
    let yaml = format!(
        "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata: {{name: chat}}\nspec:\n  models: [m]\n  \
         backends: [{{url: '{first}'}}, {{url: '{second}'}}]\n{}",
        scenario.spec
    );
    let dir = ConfigDir::new();
    dir.write("routes.yaml", &yaml);
    let gateway = Gateway::start(&dir).await;
    let body = chat_body("m").to_string();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = (0..CONCURRENCY).map(|_| {
        let (gateway, body, next, headers) = (&gateway, &body, &next, scenario.headers);
        async move {
            let mut seen = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < REQUESTS {
                let started = Instant::now();
                let reply = gateway.post("/v1/chat/completions", body.clone(), headers).await;
                seen.push((started.elapsed(), reply.status.as_u16()));
            }
            seen
        }
    });
    let results: Vec<(Duration, u16)> = futures_util::future::join_all(workers).await.into_iter().flatten().collect();
    let mut latencies: Vec<Duration> = results.iter().map(|(d, _)| *d).collect();
    latencies.sort();
    let failed = results.iter().filter(|(_, status)| *status != 200).count();
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    let sum = |name: &str, label: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            // An empty float sum is -0.
            .fold(0.0, |sum, value| sum + value)
    };
    let attempts = a.script().requests() + b.script().requests();
    // A backend nothing listens on receives nothing: its attempts are the
    // gateway's.
    let upstream = sum("sluice_upstream_duration_seconds_count", "route=");
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.1} | {:.1} |",
        scenario.name,
        results.len(),
        if scenario.first_refuses { format!("{upstream} ({attempts} reached an echo)") } else { attempts.to_string() },
        sum("sluice_upstream_retries_total", "result=\"retried\""),
        sum("sluice_upstream_retries_total", "result=\"budget_exhausted\""),
        failed,
        sum("sluice_backend_ejections_total", "route="),
        percentile(&latencies, 0.50).as_secs_f64() * 1000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
    );
}

fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(1)
}
