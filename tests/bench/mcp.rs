//! What the MCP gateway adds to a tool call and to a streamed notification,
//! beside the same MCP server reached directly, in one run.
//!
//! One MCP server written with the official Python SDK
//! (tests/harness/mcp_server.py: stateful, answering POSTs as SSE) and one
//! release gateway with three `MCPRoute`s in front of it: `/mcp/plain` (no
//! plugin), `/mcp/chain` (auth with an API key, then add-header) and
//! `/mcp/policy` (auth, mcp-policy allowing the consumer `weather__*`, then
//! add-header). The chain's request hooks run on every message the client
//! sends; the server's notifications pass without hooks, and the answer to
//! a call meets the response hooks (none of these plugins has one,
//! docs/mcp.md). The client is this
//! bench speaking raw Streamable HTTP JSON-RPC with a pooled hyper client
//! (HTTP/1.1, keep-alive), so that its own cost stays small beside the
//! gateway's: per target it opens one session (`initialize`, its
//! `Mcp-Session-Id`, `notifications/initialized`), then
//!
//! - `tools/call` of `echo` (`weather__echo` through the gateway), one at a
//!   time: the latency from sending the POST to reading the call's result
//!   from its SSE answer (p50, p90, p99), and the gateway's CPU per call;
//! - `tools/call` of `count` with n=200 and delay_ms=0, one at a time: the
//!   server sends 200 `notifications/progress` as fast as it can on the
//!   call's SSE stream, then the result. Per stream: the time to the first
//!   notification (the call's way in and the first message's way out), the
//!   pace from the first to the last, whose excess over direct is what the
//!   gateway adds to each further notification, the gaps between
//!   notifications as they arrive (p50, p99), the whole call's time divided
//!   by the notifications, and the gateway's CPU per notification (the
//!   call's own share, about 1/200 of a call's, included).
//!
//! The targets take turns for several rounds, and each round's figures are
//! compared with the same round's direct ones, so drift on a shared machine
//! hits every target alike; each figure is the median over rounds. The
//! server (Python, one process) is most of each call's time: the gateway's
//! part is the "added" columns. Nothing is pinned.
//!
//! `cargo bench -p sluice-tests --bench mcp` after `cargo xtask plugins`
//! and `cargo build --release -p sluice` (or `cargo xtask bench`), with the
//! MCP Python SDK in the tools venv (`cargo xtask test` and `cargo xtask
//! bench` install it).
//! `SLUICE_BENCH_QUICK=1` makes it short. Prints two tables.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Gateway, McpServer, Plugin, documents, percentile};

#[path = "cpu.rs"]
mod cpu;
use cpu::cpu_seconds;

const PROTOCOL: &str = "2025-11-25";
const API_KEY: &str = "sk-mcp-bench";
/// Progress notifications per `count` call.
const NOTIFICATIONS: usize = 200;
/// A call or stream taking longer than this has failed.
const TIMEOUT: Duration = Duration::from_secs(30);

struct Sizes {
    rounds: usize,
    /// `echo` calls per target and round.
    calls: usize,
    /// `count` streams per target and round.
    streams: usize,
}

fn sizes() -> Sizes {
    let quick = std::env::var("SLUICE_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    if quick { Sizes { rounds: 2, calls: 200, streams: 3 } } else { Sizes { rounds: 5, calls: 1000, streams: 10 } }
}

/// Where the client goes: the server itself, or a route of the gateway.
struct Target {
    name: &'static str,
    /// The route's path; `None`: the server directly.
    path: Option<&'static str>,
    /// The prefix of the server's tools as the target lists them.
    prefix: &'static str,
    authorization: bool,
}

const TARGETS: [Target; 4] = [
    Target { name: "direct to the server (baseline)", path: None, prefix: "", authorization: false },
    Target { name: "gateway, no plugin", path: Some("/mcp/plain"), prefix: "weather__", authorization: false },
    Target {
        name: "gateway, auth (API key) + add-header",
        path: Some("/mcp/chain"),
        prefix: "weather__",
        authorization: true,
    },
    Target {
        name: "gateway, auth + mcp-policy + add-header",
        path: Some("/mcp/policy"),
        prefix: "weather__",
        authorization: true,
    },
];

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A handshake-era MCP session over Streamable HTTP.
struct Session {
    client: HttpClient,
    url: hyper::Uri,
    authorization: Option<String>,
    session_id: Option<String>,
    next_id: u64,
}

/// What one request's answer held: when its result arrived, and when each
/// progress notification before it did.
struct Answer {
    result: Value,
    done: Instant,
    progress: Vec<Instant>,
}

impl Session {
    async fn open(client: &HttpClient, url: &str, authorization: bool) -> Session {
        let mut session = Session {
            client: client.clone(),
            url: url.parse().expect("an MCP URL"),
            authorization: authorization.then(|| format!("Bearer {API_KEY}")),
            session_id: None,
            next_id: 0,
        };
        let params = json!({"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "sluice-bench", "version": "1"}});
        let (response, id) = session.send("initialize", params).await;
        session.session_id = Some(
            response
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("{url}: no Mcp-Session-Id on the initialize answer"))
                .to_owned(),
        );
        let answer = read_answer(response, id).await;
        assert_eq!(answer.result["result"]["protocolVersion"], PROTOCOL, "{url}: {}", answer.result);
        let notified = session.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        assert_eq!(notified.status(), 202, "{url}: notifications/initialized");
        let _ = notified.into_body().collect().await;
        session
    }

    async fn post(&self, message: Value) -> hyper::Response<Incoming> {
        let mut request = hyper::Request::post(self.url.clone())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(id) = &self.session_id {
            request = request.header("mcp-session-id", id).header("mcp-protocol-version", PROTOCOL);
        }
        if let Some(authorization) = &self.authorization {
            request = request.header("authorization", authorization);
        }
        let request = request.body(Full::new(Bytes::from(message.to_string()))).expect("a request");
        let response = tokio::time::timeout(TIMEOUT, self.client.request(request))
            .await
            .unwrap_or_else(|_| panic!("{}: no answer within {TIMEOUT:?}", self.url))
            .unwrap_or_else(|e| panic!("{}: {e}", self.url));
        assert!(response.status().is_success(), "{}: {}", self.url, response.status());
        response
    }

    /// Sends a request; the response and the request's id.
    async fn send(&mut self, method: &str, params: Value) -> (hyper::Response<Incoming>, u64) {
        self.next_id += 1;
        let id = self.next_id;
        (self.post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await, id)
    }

    /// `tools/call`, timed from before the request is sent.
    async fn call(&mut self, tool: &str, arguments: Value) -> (Instant, Answer) {
        let started = Instant::now();
        let params = json!({"name": tool, "arguments": arguments, "_meta": {"progressToken": self.next_id + 1}});
        let (response, id) = self.send("tools/call", params).await;
        let answer = tokio::time::timeout(TIMEOUT, read_answer(response, id))
            .await
            .unwrap_or_else(|_| panic!("{}: {tool} took over {TIMEOUT:?}", self.url));
        assert!(answer.result.get("result").is_some(), "{}: {tool}: {}", self.url, answer.result);
        (started, answer)
    }
}

/// Reads an answer, JSON or SSE, up to the JSON-RPC response with `id`
/// (noting when each progress notification came), then drains the rest so
/// that the connection is reused.
async fn read_answer(response: hyper::Response<Incoming>, id: u64) -> Answer {
    let sse = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = response.into_body();
    if !sse {
        let bytes = body.collect().await.expect("a JSON answer").to_bytes();
        let result: Value = serde_json::from_slice(&bytes).expect("a JSON-RPC message");
        return Answer { result, done: Instant::now(), progress: Vec::new() };
    }
    let mut buffer: Vec<u8> = Vec::new();
    let mut data = String::new();
    let mut progress = Vec::new();
    let mut answer = None;
    while let Some(frame) = body.frame().await {
        let Ok(chunk) = frame.expect("an SSE stream").into_data() else { continue };
        buffer.extend_from_slice(&chunk);
        if answer.is_some() {
            continue;
        }
        let mut consumed = 0;
        while let Some(end) = buffer[consumed..].iter().position(|&b| b == b'\n') {
            let line = &buffer[consumed..consumed + end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            consumed += end + 1;
            if line.is_empty() {
                // An event ends.
                if data.is_empty() {
                    continue;
                }
                let message: Value = serde_json::from_str(&data).expect("a JSON-RPC message in an SSE event");
                data.clear();
                if message["method"] == "notifications/progress" {
                    progress.push(Instant::now());
                } else if message["id"] == id && (message.get("result").is_some() || message.get("error").is_some()) {
                    answer = Some((message, Instant::now()));
                    break;
                }
            } else if let Some(value) = line.strip_prefix(b"data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                let value = value.strip_prefix(b" ").unwrap_or(value);
                data.push_str(std::str::from_utf8(value).expect("UTF-8 SSE data"));
            }
        }
        buffer.drain(..consumed);
    }
    let (result, done) = answer.unwrap_or_else(|| panic!("the SSE stream ended without the answer to {id}"));
    Answer { result, done, progress }
}

/// One target's figures in one round.
#[derive(Clone, Copy, Default)]
struct Round {
    /// `echo` latency, µs: p50, p90, p99.
    call: [f64; 3],
    /// Gateway CPU per call, µs (NaN direct).
    call_cpu: f64,
    /// Median over streams of the call's time / notifications, µs.
    per_notification: f64,
    /// Median over streams of (last notification - first) / (n - 1), µs:
    /// the pace while streaming, without the call's start.
    pace: f64,
    /// Gaps between notifications, all streams pooled, µs: p50, p99.
    gap: [f64; 2],
    /// Median time to the first notification, µs.
    first: f64,
    /// Gateway CPU per notification, µs (NaN direct).
    notification_cpu: f64,
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn measure_round(session: &mut Session, target: &Target, gateway: &Gateway, sizes: &Sizes) -> Round {
    let gateway_cpu = || if target.path.is_some() { cpu_seconds(gateway) } else { f64::NAN };
    let echo = format!("{}echo", target.prefix);
    let count = format!("{}count", target.prefix);

    let cpu = gateway_cpu();
    let mut timings = Vec::with_capacity(sizes.calls);
    for _ in 0..sizes.calls {
        let (started, answer) = session.call(&echo, json!({"text": "hi"})).await;
        timings.push(answer.done - started);
    }
    let call_cpu = (gateway_cpu() - cpu) * 1e6 / sizes.calls as f64;
    timings.sort();
    let call = [0.5, 0.9, 0.99].map(|q| micros(percentile(&timings, q)));

    let cpu = gateway_cpu();
    let mut per_notification = Vec::new();
    let mut paces = Vec::new();
    let mut gaps = Vec::new();
    let mut firsts = Vec::new();
    for _ in 0..sizes.streams {
        let (started, answer) = session.call(&count, json!({"n": NOTIFICATIONS, "delay_ms": 0})).await;
        assert_eq!(answer.progress.len(), NOTIFICATIONS, "{}: progress notifications", target.name);
        per_notification.push(micros(answer.done - started) / NOTIFICATIONS as f64);
        firsts.push(micros(answer.progress[0] - started));
        paces.push(micros(answer.progress[NOTIFICATIONS - 1] - answer.progress[0]) / (NOTIFICATIONS - 1) as f64);
        gaps.extend(answer.progress.windows(2).map(|w| w[1] - w[0]));
    }
    let notification_cpu = (gateway_cpu() - cpu) * 1e6 / (sizes.streams * NOTIFICATIONS) as f64;
    gaps.sort();
    Round {
        call,
        call_cpu,
        per_notification: median(per_notification),
        pace: median(paces),
        gap: [0.5, 0.99].map(|q| micros(percentile(&gaps, q))),
        first: median(firsts),
        notification_cpu,
    }
}

fn main() {
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    tokio.block_on(run());
}

async fn run() {
    let sizes = sizes();
    let server = McpServer::start("weather").await;
    let digest: String = {
        use sha2::{Digest, Sha256};
        Sha256::digest(API_KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    };
    let plugins = [
        Plugin::new("auth", "auth").auth_phase().config(json!({"apiKeys": [{"consumer": "bench", "sha256": digest}]})),
        Plugin::new("policy", "mcp-policy")
            .config(json!({"rules": [{"consumers": ["key:bench"], "allow": ["weather__*"]}]})),
        Plugin::new("tag", "add-header").config(json!({"header": "x-team", "value": "search"})),
    ];
    let route = |name: &str, path: &str, plugins: &[&str]| {
        let chain: Vec<String> = plugins.iter().map(|p| format!("{{name: {p}}}")).collect();
        let plugins = if chain.is_empty() { String::new() } else { format!("  plugins: [{}]\n", chain.join(", ")) };
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata: {{name: {name}}}\nspec:\n  path: {path}\n  servers:\n    - {{name: weather, url: \"{}\"}}\n{plugins}",
            server.url()
        )
    };
    let mut docs: Vec<String> = plugins.iter().map(Plugin::yaml).collect();
    docs.push(route("plain", "/mcp/plain", &[]));
    docs.push(route("chain", "/mcp/chain", &["auth", "tag"]));
    docs.push(route("policy", "/mcp/policy", &["auth", "policy", "tag"]));
    let dir = ConfigDir::new();
    dir.write("mcp.yaml", &documents(&docs));
    let gateway = Gateway::start(&dir).await;
    gateway.wait_for_snapshots(Duration::from_secs(60)).await;

    // TCP_NODELAY, as the SDK's client (httpx on anyio) and the gateway set
    // it: without it a request's head and body wait out a delayed ACK (40 ms).
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
    let mut sessions = Vec::new();
    for target in &TARGETS {
        let url = match target.path {
            Some(path) => gateway.url(path),
            None => server.url(),
        };
        let mut session = Session::open(&client, &url, target.authorization).await;
        // Unmeasured: connections, upstream sessions, plugin instances.
        let echo = format!("{}echo", target.prefix);
        for _ in 0..sizes.calls / 5 {
            let (_, answer) = session.call(&echo, json!({"text": "warm"})).await;
            assert_eq!(answer.result["result"]["content"][0]["text"], "weather:warm", "{}", target.name);
        }
        let _ = session.call(&format!("{}count", target.prefix), json!({"n": NOTIFICATIONS, "delay_ms": 0})).await;
        if target.authorization {
            // The chain ran: the server sees the consumer auth named, never
            // the key. (add-header's hook runs on every message too, as the
            // access log shows, but a server gets a fixed set of headers,
            // docs/mcp.md, so its header is not among them.)
            let (_, answer) = session.call(&format!("{}headers", target.prefix), json!({})).await;
            let text = answer.result["result"]["content"][0]["text"].as_str().unwrap_or_default();
            let seen: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{}: {e}: {text}", target.name));
            assert_eq!(seen["x-sluice-consumer"], "key:bench", "{}: {seen}", target.name);
            assert!(seen.get("authorization").is_none(), "{}: the key reached the server", target.name);
        }
        sessions.push(session);
    }

    let mut rounds: Vec<Vec<Round>> = Vec::new();
    for _ in 0..sizes.rounds {
        let mut round = Vec::new();
        for (target, session) in TARGETS.iter().zip(&mut sessions) {
            round.push(measure_round(session, target, &gateway, &sizes).await);
        }
        rounds.push(round);
    }

    // Medians over rounds; "added" is paired with the same round's direct figure.
    let over_rounds = |index: usize, f: &dyn Fn(&Round) -> f64| median(rounds.iter().map(|r| f(&r[index])).collect());
    let added = |index: usize, f: &dyn Fn(&Round) -> f64| {
        let values: Vec<f64> = rounds.iter().map(|r| f(&r[index]) - f(&r[0])).collect();
        let (min, max) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        (median(values), min, max)
    };
    let cpu = |value: f64| if value.is_nan() { "(the server's)".to_owned() } else { format!("{value:.0} µs") };
    let cpu_per_notification =
        |value: f64| if value.is_nan() { "(the server's)".to_owned() } else { format!("{value:.1} µs") };
    let signed = |(median, min, max): (f64, f64, f64), digits: usize| {
        format!("{median:+.digits$} µs ({min:+.digits$} to {max:+.digits$})")
    };

    println!("#### A tool call (`tools/call` of `echo`, one at a time)\n");
    println!(
        "| target | p50 | p90 | p99 | added at p50 (min to max over rounds) | added at p99 | gateway CPU per call |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (index, target) in TARGETS.iter().enumerate() {
        let [p50, p90, p99] = [0, 1, 2].map(|q| over_rounds(index, &|r| r.call[q]));
        let (added50, added99) = if index == 0 {
            ("".to_owned(), "".to_owned())
        } else {
            (signed(added(index, &|r| r.call[0]), 0), format!("{:+.0} µs", added(index, &|r| r.call[2]).0))
        };
        println!(
            "| {} | {p50:.0} µs | {p90:.0} µs | {p99:.0} µs | {added50} | {added99} | {} |",
            target.name,
            cpu(over_rounds(index, &|r| r.call_cpu))
        );
    }

    println!(
        "\n#### A streamed notification (`tools/call` of `count`, n={NOTIFICATIONS}, delay_ms=0: {NOTIFICATIONS} progress notifications as fast as the server sends them)\n"
    );
    println!(
        "| target | first notification after | added to it | pace: (last - first) / {} | added to each notification (min to max) | gap p50 | gap p99 | call time / notification | gateway CPU per notification |",
        NOTIFICATIONS - 1
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (index, target) in TARGETS.iter().enumerate() {
        let (added_first, added_pace) = if index == 0 {
            ("".to_owned(), "".to_owned())
        } else {
            (format!("{:+.0} µs", added(index, &|r| r.first).0), signed(added(index, &|r| r.pace), 1))
        };
        println!(
            "| {} | {:.0} µs | {added_first} | {:.1} µs | {added_pace} | {:.0} µs | {:.0} µs | {:.1} µs | {} |",
            target.name,
            over_rounds(index, &|r| r.first),
            over_rounds(index, &|r| r.pace),
            over_rounds(index, &|r| r.gap[0]),
            over_rounds(index, &|r| r.gap[1]),
            over_rounds(index, &|r| r.per_notification),
            cpu_per_notification(over_rounds(index, &|r| r.notification_cpu)),
        );
    }
    println!(
        "\n{} rounds; in each, every target in turn: {} `echo` calls, then {} `count` streams, on one session each \
         (after {} calls and a stream to warm up); the median over rounds, \"added\" paired with the same round's \
         direct figure. One MCP server (the Python SDK's `MCPServer`, stateful, SSE answers); the client is raw \
         Streamable HTTP JSON-RPC over a pooled hyper client; the gateway's CPU from its threads' schedstat.",
        sizes.rounds,
        sizes.calls,
        sizes.streams,
        sizes.calls / 5
    );
}
