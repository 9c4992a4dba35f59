//! End-to-end test harness: the real `sluice` binary as a child process, the
//! real plugins from plugins/dist, an echo upstream in-process, real HTTP.
//!
//! Build what the tests need with `cargo xtask test`, or by hand:
//! `cargo build -p sluice && cargo xtask plugins`.

mod config;
mod cosign;
mod echo;
mod gateway;
mod helm;
mod http;
mod kube;
mod mcp;
mod otelcol;
mod podman;
mod presidio;
mod prometheus;
mod redis;
mod registry;
mod tls;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use config::{Backend, ConfigDir, Plugin, Route, documents};
pub use cosign::{Cosign, CosignKeyPair, CosignRun};
pub use echo::Echo;
pub use gateway::{Gateway, Options};
pub use helm::{Helm, HelmOutput, helm_binary, helm_chart};
pub use http::{Client, Reply, Streamed, chat_body, empty, sse_events, stream_on_own_connection};
pub use kube::{KubeCluster, kubectl_binary};
pub use mcp::*;
pub use otelcol::{Collector, MetricPoint, Span};
pub use podman::{Container, IMAGE_ARCHIVE_ENV, Podman};
pub use presidio::Presidio;
pub use prometheus::{Prometheus, Sample};
pub use redis::Redis;
pub use registry::Registry;
pub use sluice_echo::{EchoOptions, Script, Step};
pub use tls::{Handshake, Issued, TestCa, TlsOptions, TlsUpstream};

const BUILD_HINT: &str = "run `cargo xtask test` (it builds target/debug/sluice and plugins/dist)";

/// The target profile directory the test executable was built into, e.g.
/// target/debug: test executables live in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    exe.parent().and_then(Path::parent).expect("the test executable lives in target/<profile>/deps").to_path_buf()
}

/// The `sluice` binary built by `cargo build -p sluice`, next to the tests.
pub fn sluice_binary() -> PathBuf {
    let path = profile_dir().join(format!("sluice{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} is missing: {BUILD_HINT}", path.display());
    path
}

/// VmRSS of process `pid`, in bytes (0 once it is gone).
pub fn rss_bytes_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status.lines().find_map(|line| line.strip_prefix("VmRSS:"));
    kib.and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).unwrap_or(0) * 1024
}

/// Nearest-rank percentile of sorted samples, for benches.
pub fn percentile(sorted: &[std::time::Duration], p: f64) -> std::time::Duration {
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// The absolute path of a built plugin, plugins/dist/<name>.wasm.
pub fn plugin_wasm(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist").join(format!("{name}.wasm"));
    path.canonicalize().unwrap_or_else(|e| panic!("plugin {name}: {}: {e}: {BUILD_HINT}", path.display()))
}

/// Compiled plugins, cached across tests and runs: only the first gateway
/// to load a plugin build pays for compiling it.
pub fn shared_cache_dir() -> PathBuf {
    let target = profile_dir().parent().expect("target/<profile> has a parent").to_path_buf();
    target.join("e2e-cache")
}

/// Polls `probe` every 50 ms until it returns `Some`, and returns that;
/// panics naming `what` if `within` passes first.
pub async fn eventually<T>(what: &str, within: Duration, mut probe: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills a child process and reaps it (an error means it had exited).
pub(crate) fn kill(child: &mut std::process::Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// The last `lines` lines of the log at `path`, framed for a failure message.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    let tail = &all[all.len().saturating_sub(lines)..];
    format!("--- last {} lines of {} ---\n{}\n--- end ---", tail.len(), path.display(), tail.join("\n"))
}

/// Starts a process on ports found free, again with fresh ones if another
/// process took one first (3 tries). `attempt` returns what it started, or
/// the log of a failed start, its process killed.
pub(crate) async fn start_on_free_ports<T>(what: &str, mut attempt: impl AsyncFnMut() -> Result<T, String>) -> T {
    let mut last_log = String::new();
    for _ in 0..3 {
        match attempt().await {
            Ok(started) => return started,
            Err(log) if log.contains("address already in use") => last_log = log,
            Err(log) => panic!("{what} did not start; {log}"),
        }
    }
    panic!("no free ports for {what} after 3 attempts; {last_log}");
}

/// A tool `cargo xtask` builds once per machine: the path in the
/// environment variable `env` (which `cargo xtask test` sets), else
/// `cache_path` under the cache directory; panics with `hint` if missing.
pub(crate) fn cached_tool(env: &str, cache_path: &str, hint: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| user_cache_dir().join(cache_path));
    assert!(path.is_file(), "{} is missing: {hint}", path.display());
    path
}

/// `$XDG_CACHE_HOME` or `~/.cache`, where `cargo xtask` keeps the tools it
/// builds once per machine (crates/xtask/src/toolchain.rs computes the same).
pub(crate) fn user_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME or XDG_CACHE_HOME is set")).join(".cache")
    })
}

/// The tools venv's python (`$SLUICE_TOOLS_VENV`, else target/tools/venv),
/// with the pinned tools `cargo xtask test` installs: `oras`, and the
/// official `openai` and `anthropic` SDKs.
pub fn tools_python() -> PathBuf {
    let venv = std::env::var_os("SLUICE_TOOLS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools/venv"));
    let python = venv.join("bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run `cargo xtask test`, or create it with `python3 -m venv target/tools/venv` and pip \
         install the versions in PYTHON_TOOLS (crates/xtask/src/toolchain.rs)",
        python.display()
    );
    python
}

/// Runs `script` with the tools venv's python and `args`, straight to
/// loopback whatever proxy the machine has, within `timeout`; fails unless
/// it succeeds and prints `ok CHECK` for each of `checks`. Returns its
/// stdout.
pub async fn run_sdk_script(
    script: &str,
    args: &[&str],
    env: &[(&str, &str)],
    checks: &[&str],
    timeout: Duration,
) -> String {
    let mut command = tokio::process::Command::new(tools_python());
    command.arg("-c").arg(script).args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    for proxy in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        command.env_remove(proxy);
    }
    command.env("NO_PROXY", "*").envs(env.iter().copied()).kill_on_drop(true);
    let output = tokio::time::timeout(timeout, command.output())
        .await
        .expect("the SDK script finished in time")
        .expect("running the venv's python");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let report = format!("--- stdout ---\n{stdout}--- stderr ---\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the SDK script failed ({}):\n{report}", output.status);
    for check in checks {
        assert!(stdout.lines().any(|line| line == format!("ok {check}")), "no `ok {check}`:\n{report}");
    }
    stdout
}
