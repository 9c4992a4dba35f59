//! 1 vs 1,000 concurrent streams through a route with add-header and
//! prompt-decorator to the echo upstream, each 20 chunks 100 ms apart
//! (`x-echo-chunks`, `x-echo-chunk-delay-ms`): time to the first event and
//! to the end of each stream, failed streams, and what the gateway process
//! used for the 1,000 (RSS peak over idle, CPU time from /proc/PID/stat).
//!
//! Each stream is its own HTTP/1.1 connection (a hyper client connection
//! per stream, no pool), so 1,000 streams are 1,000 client connections and
//! 1,000 upstream ones. The 1,000 start spread evenly over one second, open
//! loop, timed from their scheduled start (connecting included); with 2 s
//! streams they all overlap.
//!
//! `cargo bench -p sluice-tests --bench streams` after `cargo xtask plugins`
//! and `cargo build --release -p sluice` (or `cargo xtask bench`).
//! `SLUICE_BENCH_QUICK=1` runs 100 concurrent streams instead. Prints tables.

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_tests::{
    ConfigDir, Echo, Gateway, Options, Plugin, Route, percentile, rss_bytes_of, stream_on_own_connection,
};

const MODEL: &str = "gpt-bench";
const SYSTEM_PROMPT: &str = "You are a helpful assistant.";
const CHUNKS: u32 = 20;
const CHUNK_DELAY_MS: u64 = 100;
/// The concurrent streams start spread over this long.
const RAMP: Duration = Duration::from_secs(1);
/// A stream taking longer than this has failed (it should take ~2 s).
const TIMEOUT: Duration = Duration::from_secs(30);
/// Flags for the gateway, above the 1,000 streams (each holds a client
/// connection, an upstream one and an in-flight slot). Its defaults are
/// 4096 connections and 1024 requests in flight.
const GATEWAY_FLAGS: &[&str] = &["--max-connections", "8192", "--max-in-flight-requests", "4096"];

fn main() {
    raise_open_files_limit();
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(measure());
}

/// (single streams one after another, concurrent streams).
fn sizes() -> (usize, usize) {
    let quick = std::env::var("SLUICE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    if quick { (3, 100) } else { (5, 1000) }
}

/// What one stream took, from its scheduled start.
struct Stream {
    first_event: Duration,
    whole: Duration,
}

async fn measure() {
    let (singles, concurrent) = sizes();
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let plugins = [
        Plugin::new("add-header", "add-header").config(json!({"header": "x-team", "value": "search"})),
        Plugin::new("prompt-decorator", "prompt-decorator")
            .config(json!({"prepend": [{"role": "system", "content": SYSTEM_PROMPT}]})),
    ];
    let route = Route::new("bench", &[MODEL], &echo.url()).plugins(&["add-header", "prompt-decorator"]);
    let docs: Vec<String> = plugins.iter().map(Plugin::yaml).chain([route.yaml()]).collect();
    dir.write("config.yaml", &docs.join("---\n"));
    let options = Options { args: GATEWAY_FLAGS.iter().map(|s| s.to_string()).collect(), ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    gateway.wait_for_snapshots(Duration::from_secs(60)).await;
    let pid = gateway.pid();
    let addr: SocketAddr = gateway.url("").trim_start_matches("http://").parse().expect("the gateway's address");

    let mut single = Vec::new();
    let mut single_failures = Vec::new();
    for _ in 0..singles {
        match stream(addr, Instant::now(), &Open::default()).await {
            Ok(s) => single.push(s),
            Err(e) => single_failures.push(e),
        }
    }

    let rss_idle = rss_bytes_of(pid);
    let sampling = Arc::new(AtomicBool::new(true));
    let rss_peak = Arc::new(AtomicU64::new(rss_idle));
    let sampler = tokio::spawn({
        let (sampling, rss_peak) = (sampling.clone(), rss_peak.clone());
        async move {
            while sampling.load(Ordering::Relaxed) {
                rss_peak.fetch_max(rss_bytes_of(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });
    let cpu_before = gateway.cpu_seconds();
    let open = Arc::new(Open::default());
    let start = Instant::now() + Duration::from_millis(10);
    let mut streams = tokio::task::JoinSet::new();
    for i in 0..concurrent {
        let scheduled = start + RAMP * i as u32 / concurrent as u32;
        let open = open.clone();
        streams.spawn(async move {
            tokio::time::sleep_until(scheduled.into()).await;
            stream(addr, scheduled, &open).await
        });
    }
    let results = streams.join_all().await;
    let cpu = gateway.cpu_seconds() - cpu_before;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.expect("the RSS sampler");
    let rss_peak = rss_peak.load(Ordering::Relaxed);
    let (mut many, mut many_failures) = (Vec::new(), Vec::new());
    for result in results {
        match result {
            Ok(s) => many.push(s),
            Err(e) => many_failures.push(e),
        }
    }

    println!(
        "Streams of {CHUNKS} chunks {CHUNK_DELAY_MS} ms apart (~{:.1} s) through add-header + prompt-decorator; \
         one HTTP/1.1 connection each; gateway flags: {}\n",
        (CHUNKS as u64 * CHUNK_DELAY_MS) as f64 / 1000.0,
        GATEWAY_FLAGS.join(" ")
    );
    println!("| streams | failed | most open at once | first event p50 | p99 | whole stream p50 | p99 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    row(&format!("1 ({singles}× one after another)"), &mut single, single_failures.len(), 1);
    row(
        &format!("{concurrent} concurrent (started over {:.0} s)", RAMP.as_secs_f64()),
        &mut many,
        many_failures.len(),
        open.most.load(Ordering::Relaxed),
    );
    println!("\n| gateway process, {concurrent} concurrent streams | total | per stream |");
    println!("|---|---:|---:|");
    let added = rss_peak.saturating_sub(rss_idle);
    println!(
        "| RSS peak over idle ({:.1} MiB idle) | {:.1} MiB | {:.1} KiB |",
        mib(rss_idle),
        mib(added),
        added as f64 / 1024.0 / concurrent as f64
    );
    println!("| CPU time (utime + stime) | {:.2} s | {:.0} µs |", cpu, cpu * 1e6 / concurrent as f64);
    report_failures("1 stream", &single_failures);
    report_failures(&format!("{concurrent} concurrent streams"), &many_failures);
    drop(gateway);
    drop(echo);
}

/// How many streams are open (response head received, end not yet), and
/// the most there were at once.
#[derive(Default)]
struct Open {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// One streamed chat request on a connection of its own, its work checked.
async fn stream(addr: SocketAddr, scheduled: Instant, open: &Open) -> Result<Stream, String> {
    match tokio::time::timeout(TIMEOUT, stream_inner(addr, scheduled, open)).await {
        Ok(result) => result,
        Err(_) => Err(format!("not done within {TIMEOUT:?}")),
    }
}

async fn stream_inner(addr: SocketAddr, scheduled: Instant, open: &Open) -> Result<Stream, String> {
    let response = stream_on_own_connection(addr, MODEL, CHUNKS, CHUNK_DELAY_MS).await?;
    let (head, mut body) = response.into_parts();
    if head.status != 200 {
        let text = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        return Err(format!("{}: {}", head.status, String::from_utf8_lossy(&text)));
    }
    let now_open = open.now.fetch_add(1, Ordering::Relaxed) + 1;
    open.most.fetch_max(now_open, Ordering::Relaxed);
    let mut text = String::new();
    let mut first_event = None;
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("reading the body: {e}"))?;
            if let Ok(data) = frame.into_data() {
                text.push_str(std::str::from_utf8(&data).map_err(|e| format!("not UTF-8: {e}"))?);
                if first_event.is_none() && text.contains("\n\n") {
                    first_event = Some(scheduled.elapsed());
                }
            }
        }
        Ok::<_, String>(())
    };
    let read = read.await;
    open.now.fetch_sub(1, Ordering::Relaxed);
    read?;
    let whole = scheduled.elapsed();
    check_stream(&text)?;
    Ok(Stream { first_event: first_event.ok_or("no event")?, whole })
}

/// The stream ends with [DONE], and its content (the echo of what arrived
/// upstream) shows the chain's work.
fn check_stream(text: &str) -> Result<(), String> {
    let events: Vec<&str> = text.split_terminator("\n\n").map(|e| e.strip_prefix("data: ").unwrap_or(e)).collect();
    if events.last() != Some(&"[DONE]") {
        return Err(format!("the stream did not end with [DONE]: {text:?}"));
    }
    let mut content = String::new();
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).map_err(|e| format!("event {event:?}: {e}"))?;
        content.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
    }
    let seen: Value = serde_json::from_str(&content).map_err(|e| format!("content {content:?}: {e}"))?;
    let decorated = seen["messages"][0] == json!({"role": "system", "content": SYSTEM_PROMPT})
        && seen["headers"]["x-team"] == "search";
    if decorated { Ok(()) } else { Err(format!("not decorated: {seen}")) }
}

fn row(name: &str, streams: &mut [Stream], failed: usize, most_open: usize) {
    let mut first: Vec<Duration> = streams.iter().map(|s| s.first_event).collect();
    let mut whole: Vec<Duration> = streams.iter().map(|s| s.whole).collect();
    if first.is_empty() {
        println!("| {name} | {failed} | {most_open} | - | - | - | - |");
        return;
    }
    first.sort();
    whole.sort();
    println!(
        "| {name} | {failed} | {most_open} | {} | {} | {} | {} |",
        ms(percentile(&first, 0.5)),
        ms(percentile(&first, 0.99)),
        ms(percentile(&whole, 0.5)),
        ms(percentile(&whole, 0.99)),
    );
}

/// Every distinct failure, with how often it happened.
fn report_failures(what: &str, failures: &[String]) {
    if failures.is_empty() {
        return;
    }
    let mut counts = BTreeMap::<&str, usize>::new();
    for failure in failures {
        *counts.entry(failure.as_str()).or_default() += 1;
    }
    println!("\nFailed ({what}):");
    for (failure, count) in counts {
        println!("- {count}×: {failure}");
    }
}

/// 1,000 streams need ~2,000 descriptors here (client and echo ends) and
/// as many in the gateway, which inherits the limit: raise the soft limit
/// to the hard one.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
