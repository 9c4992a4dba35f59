//! What the streaming guardrail costs: streams of 10 chunks 20 ms apart from
//! the echo upstream (whose answer quotes the prompt: ten short sentences),
//! one at a time, through the gateway to a route with no plugin and to
//! routes with the `guardrail` plugin checking the answer against an
//! OpenAI-moderation-compatible server in this process (it answers at once,
//! not flagged), in sentence windows and in 200-character windows, and one
//! checking only the prompt.
//!
//! For each: the time to the first event carrying text (median and p99) and what
//! it adds over the plain route, the whole stream's time, the checks per
//! stream (counted by the checker) and the gateway's CPU per stream.
//!
//! `cargo bench -p sluice-tests --bench guardrail` after `cargo xtask
//! plugins` and `cargo build --release -p sluice` (or `cargo xtask bench`).
//! `SLUICE_BENCH_QUICK=1` makes it short. Prints a table.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, documents, percentile};
use tokio::net::TcpListener;

#[path = "cpu.rs"]
mod cpu;
use cpu::cpu_seconds;

const CHUNKS: u32 = 10;
const CHUNK_DELAY_MS: u64 = 20;

/// A moderation endpoint that flags nothing, counting its calls.
async fn checker() -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let counter = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_| {
                    counter.fetch_add(1, Ordering::Relaxed);
                    async {
                        let body = r#"{"id":"modr-1","model":"m","results":[{"flagged":false,"categories":{}}]}"#;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(body.as_bytes()))))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    (addr, calls)
}

struct Measured {
    first: Vec<Duration>,
    whole: Vec<Duration>,
    cpu_us: f64,
    checks: f64,
}

async fn streams(gateway: &Gateway, model: &str, calls: &AtomicU64, n: usize) -> Measured {
    let prompt: String = (1..=10).map(|i| format!("Sentence number {i} is short. ")).collect();
    let body = json!({"model": model, "stream": true, "messages": [{"role": "user", "content": prompt}]}).to_string();
    let chunks = CHUNKS.to_string();
    let delay = CHUNK_DELAY_MS.to_string();
    let headers = [("x-echo-chunks", chunks.as_str()), ("x-echo-chunk-delay-ms", delay.as_str())];
    let url = gateway.url("/v1/chat/completions");
    let once = async || {
        let started = Instant::now();
        let streamed = gateway.client().post_streaming(&url, body.clone(), &headers).await;
        assert_eq!(streamed.status, 200, "{model}");
        let events = streamed.events();
        // The first event carrying text: a role-only or empty delta is not.
        let has_text = |data: &str| {
            let chunk: serde_json::Value = serde_json::from_str(data).unwrap_or_default();
            chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|text| !text.is_empty())
        };
        let first = events.iter().find(|(_, data)| has_text(data)).map(|(at, _)| *at);
        let first = first.unwrap_or_else(|| panic!("{model}: no content event in {events:?}"));
        assert_eq!(events.last().map(|(_, d)| d.as_str()), Some("[DONE]"), "{model}");
        (first - started, started.elapsed())
    };
    for _ in 0..n.div_ceil(10) {
        once().await;
    }
    let (cpu, checked) = (cpu_seconds(gateway), calls.load(Ordering::Relaxed));
    let (mut first, mut whole) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (f, w) = once().await;
        first.push(f);
        whole.push(w);
    }
    first.sort();
    whole.sort();
    let cpu_us = (cpu_seconds(gateway) - cpu) * 1e6 / n as f64;
    let checks = (calls.load(Ordering::Relaxed) - checked) as f64 / n as f64;
    Measured { first, whole, cpu_us, checks }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let quick = std::env::var("SLUICE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let n = if quick { 40 } else { 300 };
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    tokio.block_on(async {
        let echo = Echo::start().await;
        let (addr, calls) = checker().await;
        let moderation = json!({"openaiModeration": {"url": format!("http://{addr}/v1/moderations"), "model": "m"}});
        let guard = |name: &str, config: serde_json::Value| {
            let grant = json!({"destinations": [{"url": format!("http://{addr}")}]});
            Plugin::new(name, "guardrail").config(config).egress(grant).timeout_ms(2000).yaml()
        };
        let response_only = |window: serde_json::Value| {
            json!({"provider": moderation, "checkRequest": false, "window": window})
        };
        let plugins = [
            guard("sentences", response_only(json!({"sentences": 1}))),
            guard("chars", response_only(json!({"chars": 200}))),
            guard("prompt", json!({"provider": moderation, "checkResponse": false})),
        ];
        let routes = [
            Route::new("plain", &["plain"], &echo.url()).yaml(),
            Route::new("sentences", &["sentences"], &echo.url()).plugins(&["sentences"]).yaml(),
            Route::new("chars", &["chars"], &echo.url()).plugins(&["chars"]).yaml(),
            Route::new("prompt", &["prompt"], &echo.url()).plugins(&["prompt"]).yaml(),
        ];
        let dir = ConfigDir::new();
        dir.write("plugins.yaml", &documents(&plugins));
        dir.write("routes.yaml", &documents(&routes));
        let gateway = Gateway::start(&dir).await;
        gateway.wait_for_snapshots(Duration::from_secs(60)).await;

        let cases = [
            ("no plugin", "plain"),
            ("guardrail on the answer, sentence windows", "sentences"),
            ("guardrail on the answer, 200-character windows", "chars"),
            ("guardrail on the prompt only", "prompt"),
        ];
        println!(
            "| route | first event with text, p50 | p99 | added at p50 | whole stream p50 | checks per stream | gateway CPU per stream |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        let mut plain = None;
        for (name, model) in cases {
            let m = streams(&gateway, model, &calls, n).await;
            let p50 = percentile(&m.first, 0.5);
            let base = *plain.get_or_insert(p50);
            println!(
                "| {name} | {:.2} ms | {:.2} ms | {:+.2} ms | {:.1} ms | {:.1} | {:.0} µs |",
                ms(p50),
                ms(percentile(&m.first, 0.99)),
                ms(p50) - ms(base),
                ms(percentile(&m.whole, 0.5)),
                m.checks,
                m.cpu_us,
            );
        }
        println!(
            "\n{n} streams per route, one at a time, each {CHUNKS} chunks {CHUNK_DELAY_MS} ms apart; the checker answers at once."
        );
    });
}
