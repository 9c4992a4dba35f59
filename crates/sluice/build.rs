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
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{branch}");
        }
        println!("cargo:rerun-if-changed={dir}/packed-refs");
    }
    println!("cargo:rustc-env=SLUICE_GIT_COMMIT={commit}");
}
