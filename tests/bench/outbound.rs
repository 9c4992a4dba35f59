//! What a plugin's outbound call and a routing decision cost through the
//! gateway, beyond the network: one release gateway whose route runs the
//! `caller` test plugin (plugins/testing/caller), driven one request at a
//! time, each case measured in the gateway's CPU time per request and the
//! client's median and p99 latency:
//!
//! - the plugin doing nothing (the baseline);
//! - the plugin calling a small HTTP server on loopback (`GET /ok`, 16
//!   bytes) through `wasi:http` and the grant's checks; beside it, the same
//!   call made directly from the bench with a pooled hyper client, so the
//!   difference is what the gateway's plumbing (guest client, wasi-http,
//!   grant, pool, trace and metrics) adds to the network's part;
//! - the plugin routing the request to another model of its route, and to
//!   a model of another route of the namespace (a hop: that route's chain,
//!   here none, and backends).
//!
//! `cargo bench -p sluice-tests --bench outbound` after `cargo xtask
//! plugins` and `cargo build --release -p sluice` (or `cargo xtask bench`).
//! `SLUICE_BENCH_QUICK=1` makes it short. Prints a table.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use serde_json::json;
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Route, documents, percentile};
use tokio::net::TcpListener;

#[path = "cpu.rs"]
mod cpu;
use cpu::cpu_seconds;

/// A server answering every request with 16 bytes, on loopback.
async fn origin() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"{\"ok\":true,\"n\":1}"))))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
            });
        }
    });
    addr
}

struct Measured {
    cpu_us: f64,
    median: Duration,
    p99: Duration,
}

/// `requests` requests one after another (after a warm-up), timed by the
/// client, and the gateway's CPU time over them.
async fn measure(gateway: &Gateway, model: &str, headers: &[(&str, &str)], requests: usize) -> Measured {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for _ in 0..requests / 10 {
        let reply = gateway.post("/v1/chat/completions", body.clone(), headers).await;
        assert_eq!(reply.status, 200, "{model} {headers:?}: {}", reply.text());
    }
    let cpu = cpu_seconds(gateway);
    let mut timings = Vec::with_capacity(requests);
    for _ in 0..requests {
        let started = Instant::now();
        let reply = gateway.post("/v1/chat/completions", body.clone(), headers).await;
        timings.push(started.elapsed());
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let cpu_us = (cpu_seconds(gateway) - cpu) * 1e6 / requests as f64;
    timings.sort();
    Measured { cpu_us, median: percentile(&timings, 0.5), p99: percentile(&timings, 0.99) }
}

/// The same call as the plugin makes, from the bench: a pooled client.
async fn direct(url: &str, requests: usize) -> Measured {
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri: hyper::Uri = url.parse().unwrap();
    let mut timings = Vec::with_capacity(requests);
    for i in 0..requests + requests / 10 {
        let started = Instant::now();
        let response = client.get(uri.clone()).await.unwrap();
        let _ = response.into_body().collect().await.unwrap();
        if i >= requests / 10 {
            timings.push(started.elapsed());
        }
    }
    timings.sort();
    Measured { cpu_us: f64::NAN, median: percentile(&timings, 0.5), p99: percentile(&timings, 0.99) }
}

fn main() {
    let quick = std::env::var_os("SLUICE_BENCH_QUICK").is_some();
    let requests = if quick { 300 } else { 2000 };
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    tokio.block_on(async {
        let echo = Echo::start().await;
        let origin = origin().await;
        let grant = json!({"destinations": [{"url": format!("http://{origin}")}]});
        let dir = ConfigDir::new();
        dir.write("plugins.yaml", &Plugin::new("caller", "caller").timeout_ms(2000).egress(grant).yaml());
        let routes = [
            Route::new("bench", &["bench", "bench-alt"], &echo.url()).plugins(&["caller"]).yaml(),
            Route::new("other", &["other"], &echo.url()).yaml(),
        ];
        dir.write("routes.yaml", &documents(&routes));
        let gateway = Gateway::start(&dir).await;
        gateway.wait_for_snapshots(Duration::from_secs(60)).await;

        let url = format!("http://{origin}/ok");
        let cases: [(&str, Vec<(&str, &str)>); 4] = [
            ("the plugin, doing nothing (baseline)", vec![]),
            ("the plugin making one outbound call", vec![("x-call", url.as_str())]),
            ("routing to another model of the route", vec![("x-route-model", "bench-alt")]),
            ("routing to a model of another route", vec![("x-route-model", "other")]),
        ];
        // Rounds of every case in turn, so drift on a shared machine hits
        // each case alike; each figure is the median over rounds.
        let rounds = if quick { 1 } else { 5 };
        let mut results: Vec<Vec<Measured>> = cases.iter().map(|_| Vec::new()).collect();
        for _ in 0..rounds {
            for ((_, headers), results) in cases.iter().zip(&mut results) {
                results.push(measure(&gateway, "bench", headers, requests).await);
            }
        }
        let median = |values: &mut Vec<f64>| {
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        let summary: Vec<(f64, f64, f64)> = results
            .iter()
            .map(|rounds| {
                let cpu = median(&mut rounds.iter().map(|m| m.cpu_us).collect());
                let p50 = median(&mut rounds.iter().map(|m| m.median.as_secs_f64() * 1e6).collect());
                let p99 = median(&mut rounds.iter().map(|m| m.p99.as_secs_f64() * 1e6).collect());
                (cpu, p50, p99)
            })
            .collect();
        println!("| case | gateway CPU per request | median latency | p99 latency | over the baseline (CPU, median) |");
        println!("|---|---:|---:|---:|---:|");
        let (cpu0, p500, _) = summary[0];
        for ((name, _), (cpu, p50, p99)) in cases.iter().zip(&summary) {
            println!(
                "| {name} | {cpu:.1} µs | {p50:.0} µs | {p99:.0} µs | {:+.1} µs, {:+.0} µs |",
                cpu - cpu0,
                p50 - p500
            );
        }
        let d = direct(&url, requests).await;
        println!(
            "| the same call made directly (pooled hyper client in the bench) | (in the bench) | {:.0} µs | {:.0} µs | |",
            d.median.as_secs_f64() * 1e6,
            d.p99.as_secs_f64() * 1e6
        );
        println!(
            "\n{rounds} rounds of {requests} requests per case, one at a time, each after {} to warm up; the median over rounds; the gateway's CPU from its threads' schedstat.",
            requests / 10
        );
    });
}
