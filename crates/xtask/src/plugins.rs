//! `cargo xtask plugins`: build the guest workspace and publish its modules
//! to plugins/dist/, where the quickstart config and the tests load them.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::{cargo, cargo_metadata, run, setup, step};

const MANIFEST: &str = "plugins/Cargo.toml";
const DIST: &str = "plugins/dist";

pub fn build() -> Result<()> {
    setup::ensure_wasm_target()?;

    step("Building the plugins (plugins/)");
    run(cargo().args([
        "build",
        "--release",
        "--target",
        setup::WASM_TARGET,
        "--manifest-path",
        MANIFEST,
        "--workspace",
    ]))?;

    let metadata = cargo_metadata(MANIFEST)?;
    let target_dir = metadata["target_directory"].as_str().context("cargo metadata has no target_directory")?;
    let release_dir = Path::new(target_dir).join(setup::WASM_TARGET).join("release");

    step(&format!("Copying plugins to {DIST}/"));
    fs::create_dir_all(DIST).with_context(|| format!("cannot create {DIST}"))?;
    let mut copied = 0;
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let Some(lib_name) = cdylib_name(package) else {
            continue;
        };
        let name = package["name"].as_str().context("package without a name")?;
        let built = release_dir.join(format!("{lib_name}.wasm"));
        let dest = Path::new(DIST).join(format!("{name}.wasm"));
        let changed = publish(&built, &dest)?;
        let bytes = fs::read(&dest).with_context(|| format!("cannot read {}", dest.display()))?;
        println!(
            "  {:<32} {:>8.1} KiB  sha256:{}{}",
            dest.display(),
            bytes.len() as f64 / 1024.0,
            hex::encode(Sha256::digest(&bytes)),
            if changed { "  (updated)" } else { "" },
        );
        copied += 1;
    }
    if copied == 0 {
        bail!("{MANIFEST} has no cdylib packages: nothing to copy");
    }
    Ok(())
}

/// The file stem cargo gives a package's cdylib, if it has one.
fn cdylib_name(package: &serde_json::Value) -> Option<String> {
    let target = package["targets"]
        .as_array()?
        .iter()
        .find(|target| target["kind"].as_array().is_some_and(|kinds| kinds.iter().any(|kind| kind == "cdylib")))?;
    // Cargo names the artifact after the lib target, with `-` as `_`.
    Some(target["name"].as_str()?.replace('-', "_"))
}

/// Copies `built` to `dest` unless `dest` already has the same bytes, so an
/// unchanged plugin keeps its mtime. Returns whether it copied.
fn publish(built: &Path, dest: &Path) -> Result<bool> {
    let bytes = fs::read(built).with_context(|| format!("cannot read {}", built.display()))?;
    if fs::read(dest).is_ok_and(|current| current == bytes) {
        return Ok(false);
    }
    // Write then rename: a running gateway never sees a half-written module.
    let partial = PathBuf::from(format!("{}.partial", dest.display()));
    fs::write(&partial, &bytes).with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, dest).with_context(|| format!("cannot replace {}", dest.display()))?;
    Ok(true)
}
