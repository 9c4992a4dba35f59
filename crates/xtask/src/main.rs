//! Project automation for Sluice, run as `cargo xtask <command>`.
//!
//! Everything here shells out to the same tools a developer would use
//! (`cargo`, `rustup`, `apt-get`, `oha`) and prints each command before it
//! runs, so a failure can be reproduced by hand.

mod bench;
mod cycles;
mod fuzz;
mod go;
mod gotool;
mod hakari;
mod image;
mod kube;
mod new_plugin;
mod otelcol;
mod plugins;
mod process;
mod quickstart;
mod test;
mod toolchain;

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(bin_name = "cargo xtask", about = "Sluice project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the Wasm plugins in plugins/ and copy them to plugins/dist/.
    Plugins,
    /// Install what the test suite needs, build everything and run the tests.
    Test {
        /// Extra arguments for `cargo test`, given after `--`.
        #[arg(last = true)]
        cargo_test_args: Vec<OsString>,
    },
    /// Run an echo upstream and the gateway with deploy/quickstart, and print
    /// requests to try.
    Quickstart(quickstart::Args),
    /// Benchmark Sluice side by side with Envoy (+ proxy-wasm) and nginx:
    /// added latency, throughput, CPU per request, memory.
    Bench(bench::Args),
    /// Build the sluice release binary with profile-guided optimisation,
    /// trained on the bench's Sluice systems, into target/pgo/sluice.
    Pgo(bench::pgo::Args),
    /// Build kube-apiserver, kubectl and etcd for the tests (once, into the
    /// user's cache directory) and print their directory.
    Kube,
    /// Start a Rust plugin in plugins/<name> from a template, add it to the
    /// plugins workspace and build it.
    NewPlugin(new_plugin::Args),
    /// Build the container image (a static musl binary in an image from
    /// scratch) with buildah into target/containers, write it as an OCI
    /// archive to target/image/sluice.oci.tar, and optionally push it.
    Image(image::Args),
    /// Run the fuzz targets in crates/fuzz long (libFuzzer through
    /// cargo-bolero, or random inputs) and print how many inputs each ran.
    Fuzz(fuzz::Args),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Every path below is relative to the repository root.
    env::set_current_dir(repo_root()).context("cannot enter the repository root")?;
    match cli.command {
        Task::Plugins => plugins::build(),
        Task::Test { cargo_test_args } => test::test(&cargo_test_args),
        Task::Quickstart(args) => quickstart::main(args),
        Task::Bench(args) => bench::main(args),
        Task::Pgo(args) => bench::pgo::main(args),
        Task::Kube => {
            let bin = kube::ensure()?;
            println!("{}={}", kube::BIN_DIR_ENV, bin.display());
            Ok(())
        }
        Task::NewPlugin(args) => new_plugin::main(args),
        Task::Fuzz(args) => fuzz::main(args),
        Task::Image(args) => image::main(args),
    }
}

fn repo_root() -> PathBuf {
    // crates/xtask -> repository root.
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("crates/xtask has two parents").to_path_buf()
}

/// The main workspace's target directory.
fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

/// The `sluice` binary built with `profile` ("debug" or "release").
fn sluice_binary(profile: &str) -> PathBuf {
    target_dir().join(profile).join("sluice")
}

/// The cargo that runs us, so nested builds use the same toolchain.
fn cargo() -> Command {
    let mut cmd = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // `cargo run` describes the xtask package to us in CARGO_PKG_* and
    // CARGO_MANIFEST_*. Build scripts such as ring's rerun when those change,
    // so passing them on would make every nested build and every build from
    // a plain shell invalidate each other.
    for (name, _) in env::vars_os() {
        let name_str = name.to_string_lossy();
        if name_str.starts_with("CARGO_PKG_") || name_str.starts_with("CARGO_MANIFEST_") {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// Announces a step of a task.
fn step(what: &str) {
    println!("==> {what}");
}

/// Runs `cmd` with inherited stdio; fails if it does not exit successfully.
fn run(cmd: &mut Command) -> Result<()> {
    let shown = display(cmd);
    println!("$ {shown}");
    let status = cmd.status().with_context(|| format!("cannot run `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; fails, showing stderr, if it does not
/// exit successfully.
fn output(cmd: &mut Command) -> Result<String> {
    let shown = display(cmd);
    let out = cmd.output().with_context(|| format!("cannot run `{shown}`"))?;
    if !out.status.success() {
        bail!("`{shown}` failed ({}):\n{}", out.status, String::from_utf8_lossy(&out.stderr).trim_end());
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{shown}` printed invalid UTF-8"))
}

/// A command as it would be typed (without shell quoting).
fn display(cmd: &Command) -> String {
    // Show `cargo`, not the absolute path $CARGO points at.
    let program = if env::var_os("CARGO").is_some_and(|cargo| cargo == cmd.get_program()) {
        "cargo".as_ref()
    } else {
        cmd.get_program()
    };
    std::iter::once(program).chain(cmd.get_args()).map(|part| part.to_string_lossy()).collect::<Vec<_>>().join(" ")
}

/// `cargo metadata --no-deps` for the workspace at `manifest_path`.
fn cargo_metadata(manifest_path: &str) -> Result<serde_json::Value> {
    let json =
        output(cargo().args(["metadata", "--no-deps", "--format-version", "1", "--manifest-path", manifest_path]))?;
    serde_json::from_str(&json).with_context(|| format!("cannot parse cargo metadata for {manifest_path}"))
}
