//! `cargo xtask bench`: the latency the gateway adds, measured with `oha` at a
//! fixed request rate against the echo upstream directly and through the
//! gateway; then the runtime micro-benchmark, if present.

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::process::{self, Running};
use crate::{cargo, cargo_metadata, display, output, plugins, run, sluice_binary, step};

/// The newest oha that builds with our toolchain (1.16 needs rustc 1.88).
const OHA_VERSION: &str = "1.16.0";
const CONFIG_TEMPLATE: &str = "tests/bench/latency-config.yaml.tmpl";
const REQUEST_BODY: &str = "tests/bench/chat-request.json";
const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(clap::Args)]
pub struct Args {
    /// Requests per second, the same for both targets.
    #[arg(long, default_value_t = 200)]
    rate: u32,
    /// How long to measure each target, e.g. 15s or 1m.
    #[arg(long, default_value = "15s")]
    duration: String,
    /// Concurrent connections.
    #[arg(long, default_value_t = 8)]
    connections: u32,
}

pub fn main(args: Args) -> Result<()> {
    ensure_oha()?;
    plugins::build()?;
    step("Building the sluice binary (release)");
    run(cargo().args(["build", "--release", "--package", "sluice"]))?;

    let workdir = tempfile::tempdir()?;
    let upstream_addr = process::free_local_addr()?;
    let listen_addr = process::free_local_addr()?;
    let admin_addr = process::free_local_addr()?;
    let config_dir = workdir.path().join("config");
    fs::create_dir(&config_dir)?;
    render_config(&config_dir.join("latency.yaml"), upstream_addr)?;

    step("Starting the echo upstream and the gateway (release)");
    let sluice = sluice_binary("release");
    let mut upstream_cmd = Command::new(&sluice);
    upstream_cmd.args(["echo-upstream", "--listen", &upstream_addr.to_string()]);
    let mut gateway_cmd = Command::new(&sluice);
    gateway_cmd
        .arg("run")
        .arg("--config")
        .arg(&config_dir)
        .args(["--listen", &listen_addr.to_string()])
        .args(["--admin", &admin_addr.to_string()])
        .arg("--cache-dir")
        .arg(workdir.path().join("cache"));
    for cmd in [&mut upstream_cmd, &mut gateway_cmd] {
        // Measure the proxy, not per-request logging.
        cmd.env("RUST_LOG", "warn");
    }
    let mut upstream = Running::spawn("echo upstream", upstream_cmd, &workdir.path().join("upstream.log"))?;
    let mut gateway = Running::spawn("gateway", gateway_cmd, &workdir.path().join("gateway.log"))?;
    process::wait_for_listener(upstream_addr, &mut [&mut upstream, &mut gateway], READY_TIMEOUT)?;
    process::wait_for_ready(admin_addr, &mut [&mut upstream, &mut gateway], READY_TIMEOUT)?;

    let direct_url = format!("http://{upstream_addr}/v1/chat/completions");
    let gateway_url = format!("http://{listen_addr}/v1/chat/completions");
    step(&format!(
        "Measuring: {} req/s for {} over {} connections, direct then through the gateway",
        args.rate, args.duration, args.connections
    ));
    let direct = measure(&args, &direct_url)?;
    let through_gateway = measure(&args, &gateway_url)?;
    // Both must still be up, or the numbers describe a failure.
    upstream.check_alive()?;
    gateway.check_alive()?;
    drop((gateway, upstream));

    print_table(&args, &direct, &through_gateway);

    run_runtime_bench()
}

fn ensure_oha() -> Result<()> {
    if let Ok(version) = output(Command::new("oha").arg("--version")) {
        println!("{}: installed", version.trim());
        return Ok(());
    }
    step(&format!("Installing oha {OHA_VERSION} (takes a few minutes, once)"));
    run(cargo().args(["install", "oha", "--locked", "--version", OHA_VERSION]))
}

/// Writes the config template with this run's upstream and plugin paths.
fn render_config(dest: &Path, upstream: SocketAddr) -> Result<()> {
    let template = fs::read_to_string(CONFIG_TEMPLATE).with_context(|| format!("cannot read {CONFIG_TEMPLATE}"))?;
    let dist = fs::canonicalize("plugins/dist").context("plugins/dist is missing")?;
    let yaml = template
        .replace("${UPSTREAM_URL}", &format!("http://{upstream}/v1"))
        .replace("${PLUGINS_DIST}", &dist.display().to_string());
    if let Some(at) = yaml.find("${") {
        let rest = &yaml[at..];
        let placeholder = &rest[..rest.find('}').map_or(rest.len(), |end| end + 1)];
        bail!("{CONFIG_TEMPLATE} has an unknown placeholder {placeholder}");
    }
    fs::write(dest, yaml).with_context(|| format!("cannot write {}", dest.display()))
}

/// What one oha run measured. Latencies in seconds.
struct Measurement {
    requests_per_sec: f64,
    p50: f64,
    p90: f64,
    p99: f64,
}

fn measure(args: &Args, url: &str) -> Result<Measurement> {
    let oha = |duration: &str| {
        let mut cmd = Command::new("oha");
        cmd.args(["--no-tui", "--output-format", "json"])
            .args(["-q", &args.rate.to_string()])
            .args(["-c", &args.connections.to_string()])
            .args(["-z", duration])
            // Let requests in flight at the deadline finish rather than
            // count as errors.
            .arg("-w")
            // Time each request from when it was due, not when it was sent,
            // so a stall is not hidden by the requests it delayed.
            .arg("--latency-correction")
            .args(["-m", "POST", "-T", "application/json", "-D", REQUEST_BODY])
            .arg(url);
        cmd
    };
    // Warm up connections, the plugin's first instantiation and caches.
    let warmup = output(&mut oha("2s"))?;
    parse_oha(&warmup).with_context(|| format!("warm-up against {url}"))?;

    let mut measured = oha(&args.duration);
    println!("$ {}", display(&measured));
    let report = output(&mut measured)?;
    parse_oha(&report).with_context(|| format!("measuring {url}"))
}

/// Reads oha's JSON report, refusing one with failed requests.
fn parse_oha(report: &str) -> Result<Measurement> {
    let report: Value = serde_json::from_str(report).context("cannot parse oha's JSON output")?;
    let statuses = &report["statusCodeDistribution"];
    let errors = &report["errorDistribution"];
    let only_200 = statuses
        .as_object()
        .is_some_and(|statuses| !statuses.is_empty() && statuses.keys().all(|status| status == "200"));
    if !only_200 || errors.as_object().is_some_and(|errors| !errors.is_empty()) {
        bail!("not every request succeeded: status codes {statuses}, errors {errors}");
    }
    let number = |value: &Value, what: &str| value.as_f64().with_context(|| format!("oha's report has no {what}"));
    let percentiles = &report["latencyPercentiles"];
    Ok(Measurement {
        requests_per_sec: number(&report["summary"]["requestsPerSec"], "summary.requestsPerSec")?,
        p50: number(&percentiles["p50"], "latencyPercentiles.p50")?,
        p90: number(&percentiles["p90"], "latencyPercentiles.p90")?,
        p99: number(&percentiles["p99"], "latencyPercentiles.p99")?,
    })
}

fn print_table(args: &Args, direct: &Measurement, through_gateway: &Measurement) {
    let ms = |seconds: f64| format!("{:.3}", seconds * 1000.0);
    println!();
    println!("Latency at {} req/s, {} connections, {} per target (ms):", args.rate, args.connections, args.duration);
    println!("{:<22} {:>8} {:>9} {:>9} {:>9}", "", "req/s", "p50", "p90", "p99");
    for (name, m) in [("direct to upstream", direct), ("through the gateway", through_gateway)] {
        println!("{:<22} {:>8.1} {:>9} {:>9} {:>9}", name, m.requests_per_sec, ms(m.p50), ms(m.p90), ms(m.p99));
    }
    println!(
        "{:<22} {:>8} {:>9} {:>9} {:>9}",
        "added by the gateway",
        "",
        ms(through_gateway.p50 - direct.p50),
        "",
        ms(through_gateway.p99 - direct.p99)
    );
    println!("(oha, the upstream and the gateway share this machine's cores.)");
}

/// The criterion micro-benchmark of plugin instantiate + call, when the test
/// crate declares it.
fn run_runtime_bench() -> Result<()> {
    let metadata = cargo_metadata("Cargo.toml")?;
    let declared = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|package| package["name"] == "sluice-tests")
        .flat_map(|package| package["targets"].as_array().into_iter().flatten())
        .any(|target| {
            target["name"] == "runtime"
                && target["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|k| k == "bench"))
        });
    if !declared {
        println!("\nNo `runtime` bench in sluice-tests; skipping the micro-benchmark.");
        return Ok(());
    }
    step("Runtime micro-benchmark (instantiate + call)");
    run(cargo().args(["bench", "--package", "sluice-tests", "--bench", "runtime"]))
}
