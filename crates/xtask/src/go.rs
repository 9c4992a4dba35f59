//! Building Go programs from the module proxy, for the tests' real
//! components (kube.rs, otelcol.rs): the same toolchain and settings for
//! each.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::output;

/// `go` from the PATH, or the standard install at /usr/local/go. `needed_for`
/// names what is built, for the error.
pub fn find_go(needed_for: &str) -> Result<PathBuf> {
    for go in [PathBuf::from("go"), PathBuf::from("/usr/local/go/bin/go")] {
        if let Ok(version) = output(Command::new(&go).arg("version")) {
            println!("{}", version.trim());
            return Ok(go);
        }
    }
    bail!("Go is needed to build {needed_for}: install Go 1.26 or later (https://go.dev/dl/)")
}

/// A `go` command for the module in `dir`: the local toolchain only,
/// dependencies resolved from go.mod, static binaries (no C compiler;
/// Kubernetes' own release builds use CGO_ENABLED=0 too), and the build
/// cache under the cache `root`.
pub fn go_command(go: &Path, dir: &Path, root: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(dir)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod -buildvcs=false")
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0")
        .env("GOCACHE", build_cache(root));
    cmd
}

/// The Go build cache for these builds: its own directory in the cache root,
/// removed once the binaries are in place. Kubernetes' build cache is several
/// GB, and nothing reuses it once the binaries are cached.
pub fn build_cache(root: &Path) -> PathBuf {
    root.join("go-build")
}
