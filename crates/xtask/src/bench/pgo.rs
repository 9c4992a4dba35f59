//! `cargo xtask pgo`: the sluice release binary built with profile-guided
//! optimisation, trained on the bench's Sluice systems.
//!
//! On the 2-vCPU VMs here a gateway sleeps between requests and its caches
//! go cold, so a request at a fixed rate costs several times what it costs
//! at saturation, most of it fetching code and data again: at 500 req/s the
//! plain hop spent 80–134 µs of user time on each against 17 at
//! saturation, nginx (less code) 22–36 against 8.5. Laying the code out by
//! a profile (hot code together, cold code apart, inlining where it runs)
//! cuts what each request touches.
//!
//! Three steps, each printed: a release build that counts what runs
//! (`-Cprofile-generate`, target/pgo/generate); the training, that build
//! serving the bench's load through the systems of `--systems` (at
//! saturation, at a fixed rate, with the small and the large body, and
//! streams) and stopped with SIGTERM so that it writes its profile; then the
//! profile merged and the release build made with it (`-Cprofile-use`,
//! target/pgo/use), copied to target/pgo/sluice. Measure it against the
//! plain release build with `cargo xtask bench --sluice-binary`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::oha::Load;
use super::setup::{self, Tools};
use super::systems::{DIRECT, Kind, System};
use super::{Bench, BodySize, Upstreams, check_work, request_body, selected_systems, wait_for_snapshots};
use crate::toolchain::{self, absolute};
use crate::{cargo, output, run, step, target_dir};

/// How long a stopped system may take to exit (it drains nothing: the
/// training's load has ended).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args)]
pub struct Args {
    /// The systems to train on: a route with no plugin, the first-party
    /// chain in both isolation modes, and JWT auth. Leaving some of the
    /// bench's systems out shows whether the profile carries over to them.
    #[arg(
        long,
        value_delimiter = ',',
        default_values_t = ["sluice-plain", "sluice-chain", "sluice-chain-reused", "sluice-jwt-reused"].map(String::from)
    )]
    systems: Vec<String>,
    /// Each training load's length (saturation, then a fixed rate, per body).
    #[arg(long, default_value = "4s")]
    duration: String,
    /// The fixed rate of the training's open-loop load.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
    /// The core the trained build is pinned to, as in the bench.
    #[arg(long, default_value_t = 0)]
    gateway_core: u32,
    /// The core oha and the upstream are pinned to.
    #[arg(long, default_value_t = 1)]
    load_core: u32,
}

pub fn main(args: Args) -> Result<()> {
    let binary = build(&args)?;
    println!("\nThe profile-guided build: {}", binary.display());
    println!("Measure it beside the plain release build (a copy of each, outside target/):");
    println!("  cargo xtask bench --sluice-binary <copy> --systems …");
    Ok(())
}

/// Builds, trains and rebuilds; returns target/pgo/sluice.
fn build(args: &Args) -> Result<PathBuf> {
    // `direct` always comes along; it has nothing to train.
    let systems: Vec<&System> =
        selected_systems(&args.systems)?.into_iter().filter(|system| system.name != DIRECT).collect();
    if let Some(other) =
        systems.iter().find(|system| !matches!(system.kind, Kind::Sluice(..) | Kind::SluiceObserved(..)))
    {
        bail!("{} is not a Sluice system: only Sluice is trained", other.name);
    }
    if systems.is_empty() {
        bail!("--systems names no Sluice system to train on");
    }
    let profdata = toolchain::llvm_profdata()?;
    let pgo_dir = absolute(&target_dir().join("pgo"))?;
    let raw = pgo_dir.join("profiles");
    // Profiles of an earlier tree would be merged in with this one's.
    if raw.exists() {
        fs::remove_dir_all(&raw).with_context(|| format!("cannot empty {}", raw.display()))?;
    }
    fs::create_dir_all(&raw)?;

    step("Building sluice (release) instrumented to count what runs");
    let instrumented = release_build(&pgo_dir.join("generate"), &format!("-Cprofile-generate={}", raw.display()))?;
    let mut tools = setup::prepare_sluice_side(instrumented)?;
    let workdir = tempfile::tempdir()?;
    // An empty plugin cache: the plugins are compiled in training, so the
    // compiler's path is trained too, then loaded from the cache.
    tools.sluice_cache = workdir.path().join("compiled");
    train(args, &tools, &systems, workdir.path())?;

    step("Merging the profile");
    let mut raws = Vec::new();
    for entry in fs::read_dir(&raw)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "profraw") {
            raws.push(path);
        }
    }
    if raws.is_empty() {
        bail!("the training wrote no profile into {}", raw.display());
    }
    let merged = raw.join("merged.profdata");
    run(Command::new(&profdata).arg("merge").arg("-o").arg(&merged).args(&raws))?;
    check_trained(&profdata, &merged)?;
    // Named by its content: cargo tracks the flags, not the file they name,
    // so a new profile under the same name would leave every dependency
    // built with the old one.
    let bytes = fs::read(&merged)?;
    let named = pgo_dir.join(format!("sluice-{}.profdata", &hex::encode(Sha256::digest(&bytes))[..16]));
    // Earlier profiles (tens of MB each) serve no build any more.
    for entry in fs::read_dir(&pgo_dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if name.starts_with("sluice-") && name.ends_with(".profdata") {
            fs::remove_file(&path)?;
        }
    }
    fs::rename(&merged, &named)?;

    step("Building sluice (release) with the profile");
    let optimised = release_build(&pgo_dir.join("use"), &format!("-Cprofile-use={}", named.display()))?;
    let out = pgo_dir.join("sluice");
    fs::copy(&optimised, &out).with_context(|| format!("cannot copy the build to {}", out.display()))?;
    Ok(out)
}

/// `cargo build --release --package sluice` into `target_dir` with `flag`
/// added to RUSTFLAGS. With `--target` given, RUSTFLAGS reaches only what
/// runs on the target, not build scripts and proc macros.
fn release_build(target_dir: &Path, flag: &str) -> Result<PathBuf> {
    let host = toolchain::host_triple()?;
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(given) if !given.trim().is_empty() => format!("{given} {flag}"),
        _ => flag.to_owned(),
    };
    println!("RUSTFLAGS={rustflags}");
    run(cargo()
        .args(["build", "--release", "--package", "sluice", "--target", &host])
        .arg("--target-dir")
        .arg(target_dir)
        .env("RUSTFLAGS", rustflags))?;
    absolute(&target_dir.join(host).join("release/sluice"))
}

/// Each system started fresh with the instrumented build: checked, loaded
/// closed loop then at a fixed rate with each body, sent streams, stopped.
fn train(args: &Args, tools: &Tools, systems: &[&System], workdir: &Path) -> Result<()> {
    let mut upstreams = Upstreams::start(tools, workdir, args.load_core)?;
    let bodies = [request_body(BodySize::Small, workdir)?, request_body(BodySize::Large, workdir)?];
    for system in systems {
        step(&format!("Training on {}", system.name));
        let dir = workdir.join(system.name);
        fs::create_dir(&dir)?;
        let mut gateway = system.start(tools, &dir, upstreams.addr, args.gateway_core, 1)?;
        let url = format!("http://{}/v1/chat/completions", gateway.addr);
        let benches =
            bodies.each_ref().map(|body| Bench { tools, body, upstream: upstreams.addr, load_core: args.load_core });
        benches[0].wait_until_served(system, &mut gateway)?;
        wait_for_snapshots(system, &mut gateway)?;
        for bench in &benches {
            let body = bench.body;
            check_work(system, &body.json, &gateway)?;
            for load in [Load::closed(64, &args.duration), Load::fixed(args.rate, 16, &args.duration)] {
                let measured = bench.oha(system, &url, load)?;
                println!("  {} ok, {} failed ({})", measured.ok, measured.failed, body.describe);
                if measured.ok == 0 {
                    bail!("{}: no request was served in training", system.name);
                }
            }
            bench.stream_probe(system, &gateway)?;
        }
        gateway.check_alive()?;
        gateway.stop(STOP_TIMEOUT)?;
        upstreams.check_alive()?;
    }
    Ok(())
}

/// Fails unless the profile counted the request path: a build that was
/// killed rather than stopped, or a profile of another binary, would
/// otherwise make a build that is no faster and say nothing.
fn check_trained(profdata: &Path, merged: &Path) -> Result<()> {
    let shown =
        output(Command::new(profdata).args(["show", "--counts", "--function=sluice_gateway5proxy5proxy"]).arg(merged))?;
    match hottest_block(&shown) {
        Some(count) if count > 0 => {
            println!("the request path (sluice_gateway::proxy::proxy) counted {count} at its hottest block");
            Ok(())
        }
        _ => bail!("the profile never counts sluice_gateway::proxy::proxy:\n{shown}"),
    }
}

/// The largest block count in `llvm-profdata show --counts`: a "Block
/// counts: [0, 352875, …]" line per function shown.
fn hottest_block(shown: &str) -> Option<u64> {
    shown
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Block counts: ["))
        .flat_map(|counts| counts.trim_end_matches(']').split(','))
        .filter_map(|count| count.trim().parse::<u64>().ok())
        .max()
}

#[cfg(test)]
mod tests {
    use super::hottest_block;

    #[test]
    fn the_hottest_block_is_read_from_llvm_profdata_show() {
        // As LLVM 22's llvm-profdata printed it for a trained build.
        let shown = "Counters:\n  sluice.f2fc-cgu.0;_ZN14sluice_gateway5proxy5proxy28_$u7b$$u7b$closure$u7d$$u7d$17hc378E:\n    \
                     Hash: 0x0a53ce697149748c\n    Counters: 6\n    Block counts: [0, 352875, 1411500, 627, 0, 0]\n  \
                     sluice.f2fc-cgu.0;_ZN14sluice_gateway5proxy5proxy17h00E:\n    Hash: 0x01\n    Counters: 1\n    \
                     Block counts: [2000000]\nInstrumentation level: IR\nFunctions shown: 2\nMaximum function count: 497200875\n";
        assert_eq!(hottest_block(shown), Some(2_000_000));
        // Matched, but never run.
        assert_eq!(hottest_block("Counters:\n  f:\n    Block counts: [0, 0]\nFunctions shown: 1\n"), Some(0));
        // Nothing matched: the summary's counts are not the function's.
        assert_eq!(hottest_block("Counters:\nFunctions shown: 0\nMaximum function count: 497200875\n"), None);
    }
}
