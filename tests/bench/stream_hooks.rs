//! What a per-chunk hook adds to a stream's first event: 100 streams a
//! second, open loop, each 10 chunks 20 ms apart from the echo upstream
//! (`x-echo-chunks`, `x-echo-chunk-delay-ms`), straight to the echo and
//! through the gateway to three models: one with no plugin, and two with
//! response-guard (its `example.yaml` config, a `response-chunk` hook on
//! every event), `Reused` and `PerRequest` (restored after each stream).
//!
//! Pinned as `cargo xtask bench` pins its systems: the gateway (one
//! serving thread, as a process started on one core runs) on core 0, this
//! process (the clients and the echo) on core 1, so what the gateway adds is
//! not the clients' turn on its core. `SLUICE_BENCH_UNPINNED=1` leaves both
//! to the scheduler, as before 2026-12-06.
//!
//! The targets take turns, a few seconds each, for several rounds; in each
//! round the time to the first event at p50 and p99 is compared with the
//! same round's straight-to-echo figure, so drift between rounds cancels.
//! Prints the median (min–max) over rounds of what each target adds.
//!
//! `cargo bench -p sluice-tests --bench stream_hooks` after `cargo xtask
//! plugins` and `cargo build --release -p sluice` (or `cargo xtask bench`).
//! `SLUICE_BENCH_QUICK=1`: 2 rounds of 2 s; `SLUICE_BENCH_GATEWAY_LOG=<file>`
//! keeps the gateway's log (its access lines time each stream inside it).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Plugin, Route, percentile, stream_on_own_connection};

#[path = "example_config.rs"]
mod example_config;
use example_config::example_config;

const CHUNKS: u32 = 10;
const CHUNK_DELAY_MS: u64 = 20;
const PER_SECOND: u32 = 100;
/// A stream taking longer than this has failed (it should take ~0.2 s).
const TIMEOUT: Duration = Duration::from_secs(10);

/// (rounds, seconds of streams per target and round).
fn sizes() -> (usize, u64) {
    let quick = std::env::var("SLUICE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    if quick { (2, 2) } else { (5, 5) }
}

/// Where a stream goes: the echo itself, or the gateway for a model.
#[derive(Clone, Copy)]
struct Target {
    name: &'static str,
    model: &'static str,
    through_gateway: bool,
}

const TARGETS: [Target; 4] = [
    Target { name: "straight to the echo", model: "direct", through_gateway: false },
    Target { name: "no plugin", model: "plain", through_gateway: true },
    Target { name: "response-guard, `Reused`", model: "guard-reused", through_gateway: true },
    Target { name: "response-guard, `PerRequest` (the default)", model: "guard-per-request", through_gateway: true },
];

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    tokio.block_on(measure());
}

async fn measure() {
    let (rounds, seconds) = sizes();
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let config = example_config(&root.join("plugins/response-guard/example.yaml"));
    let plugins = [
        Plugin::new("guard-reused", "response-guard").config(config.clone()).reused(16),
        Plugin::new("guard-per-request", "response-guard").config(config),
    ];
    let routes = [
        Route::new("plain", &["plain"], &echo.url()),
        Route::new("guard-reused", &["guard-reused"], &echo.url()).plugins(&["guard-reused"]),
        Route::new("guard-per-request", &["guard-per-request"], &echo.url()).plugins(&["guard-per-request"]),
    ];
    let docs: Vec<String> = plugins.iter().map(Plugin::yaml).chain(routes.iter().map(Route::yaml)).collect();
    dir.write("config.yaml", &docs.join("---\n"));
    let pinned = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
        && !std::env::var("SLUICE_BENCH_UNPINNED").is_ok_and(|v| !v.is_empty() && v != "0");
    let options = Options {
        args: if pinned { vec!["--worker-threads".into(), "1".into()] } else { vec![] },
        ..Default::default()
    };
    let gateway = Gateway::start_with(&dir, options).await;
    gateway.wait_for_snapshots(Duration::from_secs(60)).await;
    if pinned {
        pin_all_threads(gateway.pid(), 0);
        pin_all_threads(std::process::id(), 1);
    }
    let gateway_addr: SocketAddr = gateway.url("").trim_start_matches("http://").parse().expect("an address");

    // Each round: every target in turn, its first events' p50 and p99.
    let mut by_round: Vec<Vec<(Duration, Duration)>> = Vec::new();
    let mut failures = Vec::new();
    // A second of each, unmeasured: connections, instances, caches.
    for target in TARGETS {
        let addr = if target.through_gateway { gateway_addr } else { echo.addr() };
        paced(addr, target.model, 1).await;
    }
    for _ in 0..rounds {
        let mut round = Vec::new();
        for target in TARGETS {
            let addr = if target.through_gateway { gateway_addr } else { echo.addr() };
            let (mut firsts, failed) = paced(addr, target.model, seconds).await;
            failures.extend(failed.into_iter().map(|e| format!("{}: {e}", target.name)));
            firsts.sort();
            let p = |q| if firsts.is_empty() { Duration::ZERO } else { percentile(&firsts, q) };
            round.push((p(0.5), p(0.99)));
        }
        by_round.push(round);
    }

    println!(
        "{PER_SECOND} streams a second for {seconds} s per target and round, {rounds} rounds, each stream {CHUNKS} \
         chunks {CHUNK_DELAY_MS} ms apart on a connection of its own; time to the first event. {}\n",
        if pinned {
            "The gateway (one serving thread) on core 0, the clients and the echo on core 1."
        } else {
            "Unpinned: the gateway, the clients and the echo share the cores."
        }
    );
    println!("| target | first event p50 / p99 (ms) | added p50 (ms) | added p99 (ms) |");
    println!("|---|---:|---:|---:|");
    for (index, target) in TARGETS.iter().enumerate() {
        let p50: Vec<f64> = by_round.iter().map(|r| ms(r[index].0)).collect();
        let p99: Vec<f64> = by_round.iter().map(|r| ms(r[index].1)).collect();
        if index == 0 {
            println!("| {} | {} / {} | — | — |", target.name, spread(&p50), spread(&p99));
            continue;
        }
        let added = |q: fn(&(Duration, Duration)) -> Duration| -> Vec<f64> {
            by_round.iter().map(|r| ms(q(&r[index])) - ms(q(&r[0]))).collect()
        };
        println!(
            "| {} | {} / {} | {} | {} |",
            target.name,
            spread(&p50),
            spread(&p99),
            spread(&added(|r| r.0)),
            spread(&added(|r| r.1))
        );
    }
    println!("\nEach cell: the median over rounds (min–max); added: minus the same round's straight-to-echo figure.");
    if !failures.is_empty() {
        println!("\nFailed streams: {}; the first: {}", failures.len(), failures[0]);
    }
    // What the gateway itself timed: from a request's arrival to the first
    // byte of its body going out, the upstream's first event included. The
    // client's view above adds the clients' and the host's own delays.
    // The log writer flushes every 50 ms: the last streams' lines first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = gateway.log();
    println!("\nInside the gateway, every stream of every round (its access log's `time_to_first_token_ms`):\n");
    println!("| target | streams | time to first byte p50 / p99 (ms) | over no plugin p50 / p99 (ms) |");
    println!("|---|---:|---:|---:|");
    let inside: Vec<Vec<Duration>> = TARGETS[1..].iter().map(|target| first_bytes_logged(&log, target.model)).collect();
    // The harness's nearest-rank percentile, in ms; NaN for no streams.
    let at = |values: &[Duration], q| if values.is_empty() { f64::NAN } else { ms(percentile(values, q)) };
    let (plain50, plain99) = (at(&inside[0], 0.5), at(&inside[0], 0.99));
    for (target, values) in TARGETS[1..].iter().zip(&inside) {
        let (p50, p99) = (at(values, 0.5), at(values, 0.99));
        println!(
            "| {} | {} | {p50:.3} / {p99:.3} | {:+.3} / {:+.3} |",
            target.name,
            values.len(),
            p50 - plain50,
            p99 - plain99
        );
    }
    if let Some(path) = std::env::var_os("SLUICE_BENCH_GATEWAY_LOG") {
        std::fs::write(&path, &log).expect("writing the gateway's log");
    }
    drop(gateway);
    drop(echo);
}

/// `PER_SECOND` streams a second to `addr` for `seconds`, open loop: the
/// first-event times of those that succeeded, and the failures.
async fn paced(addr: SocketAddr, model: &'static str, seconds: u64) -> (Vec<Duration>, Vec<String>) {
    let count = PER_SECOND as u64 * seconds;
    let start = Instant::now() + Duration::from_millis(10);
    let mut streams = tokio::task::JoinSet::new();
    for i in 0..count {
        let scheduled = start + Duration::from_secs(1) * i as u32 / PER_SECOND;
        streams.spawn(async move {
            tokio::time::sleep_until(scheduled.into()).await;
            match tokio::time::timeout(TIMEOUT, stream(addr, model, scheduled)).await {
                Ok(result) => result,
                Err(_) => Err(format!("not done within {TIMEOUT:?}")),
            }
        });
    }
    let (mut firsts, mut failures) = (Vec::new(), Vec::new());
    for result in streams.join_all().await {
        match result {
            Ok(first) => firsts.push(first),
            Err(e) => failures.push(e),
        }
    }
    (firsts, failures)
}

/// One streamed chat request on a connection of its own: the time from its
/// scheduled start to its first event, once it has ended with `[DONE]`.
async fn stream(addr: SocketAddr, model: &str, scheduled: Instant) -> Result<Duration, String> {
    let response = stream_on_own_connection(addr, model, CHUNKS, CHUNK_DELAY_MS).await?;
    let (head, mut body) = response.into_parts();
    if head.status != 200 {
        return Err(format!("status {}", head.status));
    }
    let (mut text, mut first_event) = (String::new(), None);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading the body: {e}"))?;
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
            if first_event.is_none() && text.contains("\n\n") {
                first_event = Some(scheduled.elapsed());
            }
        }
    }
    if !text.trim_end().ends_with("data: [DONE]") {
        return Err(format!("the stream did not end with [DONE]: {text:?}"));
    }
    first_event.ok_or_else(|| "no event".to_string())
}

/// The `time_to_first_token_ms` of the access lines for `model`, sorted.
fn first_bytes_logged(log: &str, model: &str) -> Vec<Duration> {
    let wanted = format!(" model=\"{model}\" ");
    let mut values: Vec<Duration> = log
        .lines()
        .filter(|line| line.contains("sluice::access") && line.contains(&wanted))
        .filter_map(|line| line.split(" time_to_first_token_ms=").nth(1)?.split(' ').next()?.parse::<f64>().ok())
        .filter_map(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok())
        .collect();
    values.sort();
    values
}

/// Every thread of process `pid` onto `core` (`taskset -a -p`).
fn pin_all_threads(pid: u32, core: usize) {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &core.to_string(), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("running taskset");
    assert!(status.success(), "taskset -a -p -c {core} {pid}: {status}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The median (min–max) of `values`, in ms.
fn spread(values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    format!("{median:.2} ({:.2}–{:.2})", sorted[0], sorted[sorted.len() - 1])
}
