//! A real Kubernetes API server for the end-to-end tests: `kube-apiserver`,
//! `kubectl` and `etcd`, built from source with Go through the module proxy
//! (no binary downloads), once per machine, into the user's cache directory.
//!
//! `go install k8s.io/kubernetes/cmd/kube-apiserver@…` is refused because
//! Kubernetes' go.mod replaces its staging modules (`k8s.io/api`,
//! `k8s.io/client-go`, …) with local directories. So we generate a wrapper
//! module that requires `k8s.io/kubernetes` and replaces each staging module
//! with its published `v0.Y.Z`, the list read from that release's go.mod.
//! etcd gets its own wrapper module, a `main` that calls `etcdmain.Main`, so
//! that its dependency versions do not move the API server's.
//!
//! The binaries land in `<cache>/sluice/kube/<versions>/bin/`; a build writes
//! them to a staging directory first and renames them in, so an interrupted
//! build is never taken for a finished one. Go's output goes to a log file
//! next to them.

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::toolchain::run_logged;
use crate::{go, output, step};

/// The Kubernetes release the API server and kubectl are built from; the
/// gateway's k8s-openapi feature (`v1_34`) must match its minor version.
pub const KUBERNETES_VERSION: &str = "v1.34.4";

/// The etcd server. Kubernetes 1.34 is built and tested against etcd 3.6.
pub const ETCD_VERSION: &str = "v3.6.16";

/// The environment variable that gives the tests the binaries' directory.
/// tests/harness/kube.rs reads it, and falls back to `<cache_root>/bin`.
pub const BIN_DIR_ENV: &str = "SLUICE_KUBE_BIN_DIR";

const BINARIES: &[&str] = &["kube-apiserver", "kubectl", "etcd"];

/// The Go packages of the Kubernetes binaries, built by one `go build` so
/// that the packages they share compile once.
const KUBERNETES_PACKAGES: &[&str] = &["k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kubectl"];

/// `<cache>/sluice/kube/kubernetes-v1.34.4-etcd-v3.6.16`, where `<cache>` is
/// `$XDG_CACHE_HOME` or `~/.cache`. tests/harness/kube.rs computes the same.
pub fn cache_root() -> Result<PathBuf> {
    let cache = crate::toolchain::sluice_cache_dir()?;
    Ok(cache.join("kube").join(format!("kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}")))
}

/// Builds `kube-apiserver`, `kubectl` and `etcd` unless they are in the
/// cache already, and returns their directory.
pub fn ensure() -> Result<PathBuf> {
    step(&format!("Setup: Kubernetes {KUBERNETES_VERSION} API server and kubectl, etcd {ETCD_VERSION}"));
    let root = cache_root()?;
    let bin = root.join("bin");
    if BINARIES.iter().all(|name| bin.join(name).is_file()) {
        println!("kube-apiserver, kubectl, etcd: built in {}", bin.display());
        return Ok(bin);
    }
    let go = go::find_go("the Kubernetes API server and etcd")?;
    println!("building them with {} (once per machine; it takes several minutes)", go.display());
    let started = Instant::now();
    let src = root.join("src");
    fs::create_dir_all(&src).with_context(|| format!("cannot create {}", src.display()))?;
    // A staging directory per build, so concurrent builds do not mix.
    let staging = root.join(format!("bin.tmp-{}", std::process::id()));
    fs::remove_dir_all(&staging).ok();
    fs::create_dir_all(&staging)?;

    // The two builds are independent: running them side by side overlaps
    // one's downloads and linking with the other's compiling.
    let (kubernetes, etcd) = thread::scope(|scope| {
        let kubernetes = scope.spawn(|| build_kubernetes(&go, &src.join("kubernetes"), &staging, &root));
        let etcd = scope.spawn(|| build_etcd(&go, &src.join("etcd"), &staging, &root));
        (kubernetes.join(), etcd.join())
    });
    for result in [kubernetes, etcd] {
        let result = result.map_err(|_| anyhow::anyhow!("a build thread panicked")).and_then(|built| built);
        if result.is_err() {
            fs::remove_dir_all(&staging).ok();
        }
        result?;
    }

    fs::create_dir_all(&bin)?;
    for name in BINARIES {
        let built = staging.join(name);
        fs::rename(&built, bin.join(name)).with_context(|| format!("cannot move {} into place", built.display()))?;
    }
    fs::remove_dir_all(&staging).ok();
    fs::remove_dir_all(go::build_cache(&root)).ok();
    println!("built kube-apiserver, kubectl and etcd in {:.0?} into {}", started.elapsed(), bin.display());
    Ok(bin)
}

/// `go build -trimpath`: no local paths in the binaries.
const BUILD_FLAGS: &[&str] = &["build", "-trimpath"];

/// The linker flags: no symbol table or DWARF (smaller binaries, and
/// faster linking), plus `extra`.
fn ldflags(extra: &str) -> String {
    format!("-ldflags=-s -w{extra}")
}

/// The version Kubernetes' own build stamps into its binaries (see its
/// hack/lib/version.sh), which `kubectl version` and `/version` report;
/// unset, it is `v0.0.0-master`.
fn kubernetes_version_ldflags() -> String {
    let mut parts = KUBERNETES_VERSION.trim_start_matches('v').split('.');
    let (major, minor) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let mut flags = String::new();
    for package in ["k8s.io/client-go/pkg/version", "k8s.io/component-base/version"] {
        for (key, value) in
            [("gitVersion", KUBERNETES_VERSION), ("gitMajor", major), ("gitMinor", minor), ("gitTreeState", "clean")]
        {
            flags.push_str(&format!(" -X {package}.{key}={value}"));
        }
    }
    flags
}

fn build_kubernetes(go: &Path, module: &Path, staging: &Path, root: &Path) -> Result<()> {
    let log = root.join("kubernetes-build.log");
    fs::create_dir_all(module)?;
    // Kubernetes' go.mod, for its Go version and its list of staging modules.
    let download = output(
        go::go_command(go, module, root)
            .env("GOFLAGS", "-mod=mod")
            .args(["mod", "download", "-json"])
            .arg(format!("k8s.io/kubernetes@{KUBERNETES_VERSION}")),
    )?;
    let info: serde_json::Value = serde_json::from_str(&download).context("cannot parse `go mod download -json`")?;
    let go_mod_path = info["GoMod"].as_str().context("`go mod download -json` gave no GoMod")?;
    let upstream = fs::read_to_string(go_mod_path).with_context(|| format!("cannot read {go_mod_path}"))?;
    fs::write(module.join("go.mod"), wrapper_go_mod(&upstream)?)?;
    fs::write(
        module.join("tools.go"),
        format!(
            "//go:build tools\n\n\
             // The binaries `go build` makes; this file lets `go mod tidy` see them.\n\
             package tools\n\nimport (\n{})\n",
            KUBERNETES_PACKAGES.iter().map(|package| format!("\t_ \"{package}\"\n")).collect::<String>()
        ),
    )?;
    let started = Instant::now();
    run_logged(go::go_command(go, module, root).args(["mod", "tidy"]), &log)?;
    println!("kubernetes: `go mod tidy` took {:.0?}", started.elapsed());
    let started = Instant::now();
    // `-o DIR/` with several packages writes one binary per package.
    run_logged(
        go::go_command(go, module, root)
            .args(BUILD_FLAGS)
            .arg(ldflags(&kubernetes_version_ldflags()))
            .arg("-o")
            .arg(format!("{}/", staging.display()))
            .args(KUBERNETES_PACKAGES),
        &log,
    )?;
    println!("kubernetes: `go build` took {:.0?}", started.elapsed());
    Ok(())
}

/// The wrapper's go.mod: requires `k8s.io/kubernetes` and replaces each of
/// its `k8s.io/X => ./staging/src/k8s.io/X` with the published `k8s.io/X v0.Y.Z`.
fn wrapper_go_mod(upstream: &str) -> Result<String> {
    let staging_version = KUBERNETES_VERSION.replacen("v1.", "v0.", 1);
    let go_version = upstream
        .lines()
        .find_map(|line| line.strip_prefix("go "))
        .context("Kubernetes' go.mod has no go directive")?
        .trim();
    let mut replaces = String::new();
    for line in upstream.lines() {
        // Inside `replace ( … )` or as `replace X => Y`.
        let line = line.trim().trim_start_matches("replace").trim();
        if let Some((module, target)) = line.split_once("=>")
            && target.trim().starts_with("./staging/")
        {
            replaces.push_str(&format!("\t{} => {} {staging_version}\n", module.trim(), module.trim()));
        }
    }
    if replaces.lines().count() < 20 {
        bail!("found only {} staging modules in Kubernetes' go.mod:\n{replaces}", replaces.lines().count());
    }
    Ok(format!(
        "// Generated by `cargo xtask`: Kubernetes' binaries built from the module proxy.\n\
         module sluice.local/kubernetes\n\n\
         go {go_version}\n\n\
         require k8s.io/kubernetes {KUBERNETES_VERSION}\n\n\
         replace (\n{replaces})\n"
    ))
}

fn build_etcd(go: &Path, module: &Path, staging: &Path, root: &Path) -> Result<()> {
    let log = root.join("etcd-build.log");
    fs::create_dir_all(module)?;
    fs::write(
        module.join("go.mod"),
        format!(
            "// Generated by `cargo xtask`: etcd built from the module proxy.\n\
             module sluice.local/etcd\n\n\
             go 1.24\n\n\
             require go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
        ),
    )?;
    fs::write(
        module.join("main.go"),
        "// etcd's own main, as in go.etcd.io/etcd/v3.\n\
         package main\n\n\
         import (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\n\
         func main() {\n\tetcdmain.Main(os.Args)\n}\n",
    )?;
    let started = Instant::now();
    run_logged(go::go_command(go, module, root).args(["mod", "tidy"]), &log)?;
    println!("etcd: `go mod tidy` took {:.0?}", started.elapsed());
    let started = Instant::now();
    run_logged(
        go::go_command(go, module, root)
            .args(BUILD_FLAGS)
            .arg(ldflags(""))
            .arg("-o")
            .arg(staging.join("etcd"))
            .arg("."),
        &log,
    )?;
    println!("etcd: `go build` took {:.0?}", started.elapsed());
    Ok(())
}
