//! `cargo xtask test`, and the idempotent setup steps it shares with the
//! other tasks. Each check is cheap, so a warm run only pays for cargo's own
//! up-to-date checks.

use std::ffi::OsString;
use std::process::Command;

use anyhow::Result;

use crate::{cargo, output, plugins, run, step};

/// The target the plugins are built for.
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// Debian packages the test suite needs beyond the Rust toolchain. None yet;
/// add one here (e.g. "curl") and `cargo xtask test` installs it once.
const DEBIAN_PACKAGES: &[&str] = &[];

pub fn test(cargo_test_args: &[OsString]) -> Result<()> {
    step("Setup: toolchain and system packages");
    ensure_debian_packages(DEBIAN_PACKAGES)?;
    // `plugins::build` also ensures the wasm target.
    plugins::build()?;

    // The end-to-end tests run the real binary from target/debug/sluice.
    step("Building the sluice binary");
    run(cargo().args(["build", "--package", "sluice"]))?;

    // The plugins' own unit tests run natively; the guest workspace is separate.
    step("Running the plugins' unit tests");
    run(cargo().args(["test", "--manifest-path", "plugins/Cargo.toml", "--workspace"]))?;

    step("Running the test suite");
    run(cargo().args(["test", "--workspace"]).args(cargo_test_args))
}

/// Adds the wasm target to the active toolchain unless it is already there.
pub fn ensure_wasm_target() -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|line| line.trim() == WASM_TARGET) {
        println!("rustup target {WASM_TARGET}: installed");
        return Ok(());
    }
    run(Command::new("rustup").args(["target", "add", WASM_TARGET]))
}

/// Installs whichever of `packages` are missing, with one `apt-get update`.
fn ensure_debian_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|package| !debian_package_installed(package)).collect();
    if missing.is_empty() {
        if !packages.is_empty() {
            println!("Debian packages {}: installed", packages.join(", "));
        }
        return Ok(());
    }
    run(apt_get()?.arg("update"))?;
    run(apt_get()?.args(["install", "-y", "--no-install-recommends"]).args(&missing))
}

fn debian_package_installed(package: &str) -> bool {
    // `dpkg -s` also succeeds for removed packages whose config remains, so
    // look at the status line too.
    Command::new("dpkg").args(["-s", package]).output().is_ok_and(|out| {
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).lines().any(|line| line == "Status: install ok installed")
    })
}

/// `apt-get`, through sudo unless we are root already.
fn apt_get() -> Result<Command> {
    let uid = output(Command::new("id").arg("-u"))?;
    let mut cmd = if uid.trim() == "0" {
        Command::new("apt-get")
    } else {
        let mut sudo = Command::new("sudo");
        // sudo drops the environment; keep apt non-interactive explicitly.
        sudo.args(["DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        sudo
    };
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    Ok(cmd)
}
