//! Single Go commands the tests run, built from the module proxy with
//! `go install <package>@<version>` (no binary downloads), once per machine,
//! into the user's cache directory: Helm for the chart's tests, cosign for
//! the signature interop tests.
//!
//! Unlike kube.rs and otelcol.rs no wrapper module is needed: these modules
//! have no `replace` directives, so `go install` resolves their own go.mod.
//! As there: the binary is installed into a staging directory and renamed
//! into place, Go's output goes to a log file, and the build cache is
//! removed afterwards.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::toolchain::run_logged;
use crate::{go, step};

/// A Go command built from one module at one version.
pub struct GoTool {
    /// The binary's name, and its cache directory's.
    pub name: &'static str,
    /// The package `go install` builds.
    pub package: &'static str,
    pub version: &'static str,
    /// `-X` linker flags, for the version the tool reports about itself.
    pub ldflags: &'static str,
    /// The environment variable that gives the tests the binary's path.
    /// The tests' harness falls back to [`GoTool::binary`]'s path under the
    /// cache directory, which it computes the same way.
    pub env: &'static str,
}

pub const HELM: GoTool = GoTool {
    name: "helm",
    package: "helm.sh/helm/v3/cmd/helm",
    version: "v3.22.0",
    ldflags: "-X helm.sh/helm/v3/internal/version.version=v3.22.0",
    env: "SLUICE_HELM_BIN",
};

pub const COSIGN: GoTool = GoTool {
    name: "cosign",
    package: "github.com/sigstore/cosign/v2/cmd/cosign",
    version: "v2.6.5",
    ldflags: "-X sigs.k8s.io/release-utils/version.gitVersion=v2.6.5",
    env: "SLUICE_COSIGN_BIN",
};

impl GoTool {
    /// `<cache>/sluice/<name>/<name>-<version>`.
    pub fn cache_root(&self) -> Result<PathBuf> {
        let cache = crate::toolchain::sluice_cache_dir()?;
        Ok(cache.join(self.name).join(format!("{}-{}", self.name, self.version)))
    }

    /// `<cache_root>/bin/<name>`.
    pub fn binary(&self) -> Result<PathBuf> {
        Ok(self.cache_root()?.join("bin").join(self.name))
    }

    /// Builds the tool unless the cache holds it, and returns its path.
    pub fn ensure(&self) -> Result<PathBuf> {
        step(&format!("Setup: {} {}", self.name, self.version));
        let root = self.cache_root()?;
        let binary = self.binary()?;
        if binary.is_file() {
            println!("{}: built at {}", self.name, binary.display());
            return Ok(binary);
        }
        let go = go::find_go(self.name)?;
        println!("building it with {} (once per machine; it takes a few minutes)", go.display());
        let started = Instant::now();
        // `go install pkg@version` runs outside any module; an empty
        // directory keeps a go.mod above the cache from being read.
        let work = root.join("src");
        fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
        let staging = root.join(format!("bin.tmp-{}", std::process::id()));
        fs::remove_dir_all(&staging).ok();
        fs::create_dir_all(&staging)?;
        let log = root.join(format!("{}-build.log", self.name));
        let built = run_logged(
            go::go_command(&go, &work, &root)
                // `-mod=mod` is refused for `pkg@version`.
                .env("GOFLAGS", "-buildvcs=false")
                .env("GOBIN", &staging)
                .args(["install", "-trimpath"])
                .arg(format!("-ldflags=-s -w {}", self.ldflags))
                .arg(format!("{}@{}", self.package, self.version)),
            &log,
        );
        if built.is_err() {
            fs::remove_dir_all(&staging).ok();
        }
        built?;
        fs::create_dir_all(root.join("bin"))?;
        fs::rename(staging.join(self.name), &binary)
            .with_context(|| format!("cannot move {} into place", binary.display()))?;
        fs::remove_dir_all(&staging).ok();
        fs::remove_dir_all(go::build_cache(&root)).ok();
        println!("built {} in {:.0?} into {}", self.name, started.elapsed(), binary.display());
        Ok(binary)
    }
}
