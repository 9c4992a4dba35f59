//! The workspace-hack crate (`crates/workspace-hack`, managed by
//! cargo-hakari) unifies every dependency's features as the whole
//! workspace's build does, so building only the `sluice` binary, as the
//! quickstart does, compiles the very artifacts `cargo xtask test` reuses.
//! A stale hack costs build time, not correctness; `cargo xtask test`
//! checks it is current.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::toolchain::{run_logged, sluice_cache_dir};
use crate::{cargo, run};

pub const VERSION: &str = "0.9.39";

/// cargo-hakari, installed once per machine into the user's cache.
pub fn ensure(log: &Path) -> Result<PathBuf> {
    let root = sluice_cache_dir()?.join(format!("cargo-hakari-{VERSION}"));
    let path = root.join("bin/cargo-hakari");
    let wanted = format!("cargo-hakari {VERSION}");
    let installed = Command::new(&path).args(["hakari", "--version"]).output();
    if installed.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == wanted) {
        println!("{wanted}: installed at {}", path.display());
        return Ok(path);
    }
    println!("installing {wanted} (once per machine; it takes a few minutes)");
    // Unoptimized and without debug info: it only reads the package graph.
    run_logged(
        cargo()
            .args(["install", "--locked", "--debug", "--root"])
            .arg(&root)
            .args(["--version", VERSION, "cargo-hakari"])
            .env("CARGO_PROFILE_DEV_DEBUG", "0"),
        log,
    )?;
    Ok(path)
}

/// Fails if crates/workspace-hack is not what `cargo hakari generate` makes
/// of today's manifests.
pub fn check(hakari: &Path) -> Result<()> {
    let status = Command::new(hakari)
        .args(["hakari", "generate", "--diff"])
        .status()
        .with_context(|| format!("cannot run {}", hakari.display()))?;
    if !status.success() {
        bail!("crates/workspace-hack is stale: run `{} hakari generate` and commit the result", hakari.display());
    }
    run(Command::new(hakari).args(["hakari", "verify"]))
}
