//! The git commit `sluice_build_info` names: `SLUICE_GIT_COMMIT` when set (a
//! build outside a checkout, e.g. an image build), else the checkout's HEAD,
//! else `unknown`. Only this binary crate rebuilds when HEAD moves.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_GIT_COMMIT");
    let commit = std::env::var("SLUICE_GIT_COMMIT").ok().filter(|commit| !commit.is_empty());
    let commit = commit.or_else(|| git(&["rev-parse", "--short=12", "HEAD"])).unwrap_or_else(|| "unknown".into());
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = std::path::Path::new(&dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        // Name only files that exist: cargo reruns a build script whose input
        // is missing on every build, and a rerun relinks the binary (minutes
        // for a release build). The branch is a loose ref file, or a line of
        // packed-refs once git has packed it (a fresh clone has either).
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let loose = dir.join(&branch);
            let input = if loose.exists() { loose } else { dir.join("packed-refs") };
            if input.exists() {
                println!("cargo:rerun-if-changed={}", input.display());
            }
        }
    }
    println!("cargo:rustc-env=SLUICE_GIT_COMMIT={commit}");
}
