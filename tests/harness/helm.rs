//! Helm, for the tests of the chart in deploy/helm/sluice: the real `helm`
//! binary, with its cache, config and data directories in a temporary
//! directory of its own, so nothing of whoever runs the tests (repositories,
//! plugins, registry logins) changes what it does.
//!
//! `cargo xtask test` builds the binary from the Go module proxy once per
//! machine (crates/xtask/src/gotool.rs, `gotool::HELM`) and passes its path
//! in `SLUICE_HELM_BIN`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tempfile::TempDir;
use tokio::io::AsyncWriteExt as _;

/// Set by `cargo xtask test`.
const BIN_ENV: &str = "SLUICE_HELM_BIN";
/// The binary crates/xtask/src/gotool.rs builds, under the cache directory
/// (keep in sync: `HELM`'s name and version there).
const CACHE_PATH: &str = "sluice/helm/helm-v3.22.0/bin/helm";
const BUILD_HINT: &str = "run `cargo xtask test` (it builds Helm from the Go module proxy, once)";

/// The `helm` binary: `$SLUICE_HELM_BIN`, else where `cargo xtask test`
/// builds it. Panics, saying how to build it, if it is missing.
pub fn helm_binary() -> PathBuf {
    crate::cached_tool(BIN_ENV, CACHE_PATH, BUILD_HINT)
}

/// The chart, deploy/helm/sluice.
pub fn helm_chart() -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/sluice");
    path.canonicalize().unwrap_or_else(|e| panic!("the chart {}: {e}", path.display()))
}

/// What a `helm` run printed.
#[derive(Debug)]
pub struct HelmOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `helm` with directories of its own.
pub struct Helm {
    binary: PathBuf,
    home: TempDir,
}

impl Default for Helm {
    fn default() -> Self {
        Helm::new()
    }
}

impl Helm {
    pub fn new() -> Helm {
        let binary = helm_binary();
        let home = tempfile::Builder::new().prefix("sluice-e2e-helm").tempdir().expect("creating a helm home");
        Helm { binary, home }
    }

    /// A `helm` command with `args`, its cache, config and data in this
    /// harness's directory, no kubeconfig but one the caller passes with
    /// `--kubeconfig`, and no stdin.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.binary);
        let dir = self.home.path();
        cmd.args(args)
            .env("HELM_CACHE_HOME", dir.join("cache"))
            .env("HELM_CONFIG_HOME", dir.join("config"))
            .env("HELM_DATA_HOME", dir.join("data"))
            // An install must name its cluster: never the runner's own.
            .env("KUBECONFIG", dir.join("no-kubeconfig"))
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("HELM_NAMESPACE")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `helm args`, with `stdin` on its standard input if given.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> HelmOutput {
        let mut cmd = self.command(args);
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("running {}: {e}", self.binary.display()));
        if let Some(text) = stdin {
            let mut pipe = child.stdin.take().expect("piped stdin");
            pipe.write_all(text.as_bytes()).await.expect("writing to helm's stdin");
        }
        let out = child.wait_with_output().await.expect("running helm");
        HelmOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `helm args`; panics with its output unless it exits 0; returns
    /// its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        self.ok_with_stdin(args, None).await
    }

    /// As [`Helm::ok`], with `stdin` (e.g. a values file given as `-f -`).
    pub async fn ok_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(args, stdin).await;
        assert!(
            out.success,
            "`helm {}` failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
            args.join(" "),
            out.stdout,
            out.stderr
        );
        out.stdout
    }

    /// `helm template RELEASE <chart> --namespace NAMESPACE` with the values
    /// in `values` (YAML, as `-f -`) and `args`: the rendered manifests.
    pub async fn template(&self, release: &str, namespace: &str, values: &str, args: &[&str]) -> HelmOutput {
        let chart = helm_chart();
        let mut all = vec!["template", release, chart.to_str().expect("a UTF-8 path"), "--namespace", namespace];
        all.extend_from_slice(&["-f", "-"]);
        all.extend_from_slice(args);
        self.run(&all, Some(values)).await
    }
}
