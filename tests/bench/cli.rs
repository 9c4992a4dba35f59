//! What the commands a plugin author and a CI job run cost: peak RSS and
//! wall time of `sluice push`, `pull`, `inspect` and `--help` against the
//! real `docker-registry`, beside `skopeo` (Go), the independent client the
//! OCI tests already use, doing the same reads.
//!
//! `cargo bench -p sluice-tests --bench cli` after `cargo xtask plugins`
//! (or `cargo xtask bench`). Prints a table: median wall time and the
//! largest peak RSS over the runs (from `wait4`'s rusage, so nothing polls).

// `wait4`, the one call here that needs `unsafe`; its blocks say why each is sound.
#![allow(unsafe_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_tests::{Registry, plugin_wasm, sluice_binary};

const RUNS: usize = 5;

fn main() {
    let registry = Registry::start();
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let sluice = sluice_binary();
    let sluice = sluice.to_str().expect("a UTF-8 path");
    let module = plugin_wasm("example-rust");
    let module = module.to_str().expect("a UTF-8 path");
    let pushed = registry.reference("bench/cli:v1");
    let missing = registry.reference("bench/cli:missing");
    let out = scratch.path().join("pulled.wasm");
    let out = out.to_str().expect("a UTF-8 path");
    let cache = scratch.path().join("oci-cache");
    let cache = cache.to_str().expect("a UTF-8 path");
    let skopeo_ref = format!("docker://{pushed}");
    let skopeo_missing = format!("docker://{missing}");

    // Pushed once first, so every read below finds it.
    measure(&[sluice, "push", module, &pushed, "--oci-cache-dir", cache], &[]);

    let cases: Vec<Case> = vec![
        ("sluice --help", vec![sluice, "--help"], vec![]),
        (
            "sluice push (2nd time: blobs exist)",
            vec![sluice, "push", module, &pushed, "--oci-cache-dir", cache],
            vec![],
        ),
        ("sluice pull", vec![sluice, "pull", &pushed, "-o", out, "--oci-cache-dir", cache], vec![]),
        ("sluice inspect", vec![sluice, "inspect", &pushed, "--oci-cache-dir", cache], vec![]),
        ("sluice pull, missing tag", vec![sluice, "pull", &missing, "-o", out, "--oci-cache-dir", cache], vec![]),
        (
            "sluice pull, missing tag, RUST_BACKTRACE=1",
            vec![sluice, "pull", &missing, "-o", out, "--oci-cache-dir", cache],
            vec![("RUST_BACKTRACE", "1")],
        ),
        ("skopeo inspect", vec!["skopeo", "inspect", "--tls-verify=false", "--raw", &skopeo_ref], vec![]),
        (
            "skopeo inspect, missing tag",
            vec!["skopeo", "inspect", "--tls-verify=false", "--raw", &skopeo_missing],
            vec![],
        ),
    ];
    println!("| command | median wall time ({RUNS} runs) | peak RSS (largest of {RUNS}) |\n|---|---|---|");
    for (name, argv, env) in &cases {
        let mut times = Vec::new();
        let mut peak = 0;
        for _ in 0..RUNS {
            let (elapsed, rss) = measure(argv, env);
            times.push(elapsed);
            peak = peak.max(rss);
        }
        times.sort();
        println!("| {name} | {:.1} ms | {:.1} MiB |", times[RUNS / 2].as_secs_f64() * 1e3, peak as f64 / 1024.0);
    }
    println!(
        "\nThe module is the Rust example plugin, {} KiB.",
        std::fs::metadata(module).map_or(0, |m| m.len() / 1024)
    );
}

/// A row of the table: its name, the command line, and environment to add.
type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>);

/// Runs `argv` to the end; returns its wall time and peak RSS in KiB.
/// Every environment variable that turns on backtraces is removed unless
/// `env` sets it, so the figures do not depend on the caller's shell.
fn measure(argv: &[&str], env: &[(&str, &str)]) -> (Duration, u64) {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let started = Instant::now();
    // Reaped by `wait4` below, which std's `Child::wait` cannot replace: it
    // does not return the rusage.
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {}: {e}", argv[0]));
    let (status, rss) = wait4(child.id());
    let elapsed = started.elapsed();
    let expect_failure = argv.iter().any(|arg| arg.ends_with(":missing"));
    assert_eq!(status == 0, !expect_failure, "`{}` exited with {status}", argv.join(" "));
    (elapsed, rss)
}

/// Reaps `pid` with `wait4`: its exit status and its own peak RSS (KiB),
/// which `getrusage(RUSAGE_CHILDREN)` would mix with earlier children.
fn wait4(pid: u32) -> (i32, u64) {
    let mut status = 0;
    // SAFETY: rusage is plain data, zeroed is a valid value; wait4 writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child, not yet reaped (its `Child` is dropped
    // without waiting, which neither kills nor reaps it).
    let reaped = unsafe { libc::wait4(pid as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(reaped, pid as libc::pid_t, "wait4 failed: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    (code, usage.ru_maxrss as u64)
}
