//! `cargo xtask test`: install what the suite needs, check the code's shape
//! (format, lints, no import cycles), build once, and run every test.

use std::ffi::OsString;
use std::thread;

use anyhow::Result;

use crate::toolchain::{self, C_TOOLCHAIN_PACKAGES, TOOLS_VENV_ENV, absolute, tools_venv};
use crate::{cargo, cycles, gotool, hakari, kube, otelcol, plugins, run, step};

/// Debian packages the test suite needs beyond the Rust toolchain and the
/// guest toolchains: an OCI registry and an independent client for the OCI
/// tests, Prometheus to scrape the gateway's /metrics, and Redis for plugins'
/// shared state. The tests run their own Prometheus and Redis on free ports,
/// so the packages' services (started where systemd runs; denied by
/// policy-rc.d in containers) are no matter.
const TEST_PACKAGES: &[&str] = &["docker-registry", "skopeo", "prometheus", "redis-server"];

/// The workspace's features, unified by crates/workspace-hack as the
/// quickstart's build of the binary alone has them: either build reuses
/// what the other compiled.
const UNIFIED: [&str; 2] = ["--features", "sluice/workspace-hack"];

pub fn test(cargo_test_args: &[OsString]) -> Result<()> {
    step("Checks: formatting and import cycles");
    run(cargo().args(["fmt", "--all", "--check"]))?;
    cycles::check()?;

    step("Setup: toolchain and system packages");
    let packages: Vec<&str> = C_TOOLCHAIN_PACKAGES.iter().chain(TEST_PACKAGES).copied().collect();
    toolchain::ensure_debian_packages(&packages)?;
    // `plugins::build` also ensures the wasm target and the guest tools.
    plugins::build()?;

    // The end-to-end tests run the real binary from target/debug/sluice.
    // One build for it and the tests: `cargo build -p sluice` alone resolves
    // features without the dev-dependencies, so `cargo test` would then
    // compile wasmtime, kube, hyper and 140 other crates a second time.
    step("Building the sluice binary and the tests");
    run(cargo().args(["build", "--workspace", "--all-targets"]).args(UNIFIED))?;

    // Clippy after the build: it reuses the build scripts' output, and a
    // lint never hides a compile error behind its own.
    step("Lints: clippy");
    run(cargo().args(["clippy", "--workspace", "--all-targets"]).args(UNIFIED).args(["--", "-D", "warnings"]))?;

    // The plugins' own unit tests run natively; the guest workspace is separate.
    step("Running the plugins' unit tests");
    run(cargo().args(["test", "--manifest-path", "plugins/Cargo.toml", "--workspace"]))?;

    // A real kube-apiserver, kubectl and etcd for the Kubernetes tests, and
    // an OpenTelemetry Collector for the tracing tests. Both are Go builds,
    // cached per machine; side by side, one's downloads and linking overlap
    // the other's compiling.
    // cargo-hakari, to check the workspace-hack crate, installs beside them.
    let hakari_log = absolute(&crate::target_dir().join("tools/logs/cargo-hakari.log"))?;
    // Helm and cosign, for the chart's and the signatures' tests, likewise.
    let (kube_bin, otelcol_bin, hakari, helm, cosign) = thread::scope(|scope| {
        let kube = scope.spawn(kube::ensure);
        let otelcol = scope.spawn(otelcol::ensure);
        let hakari = scope.spawn(|| hakari::ensure(&hakari_log));
        let helm = scope.spawn(|| gotool::HELM.ensure());
        let cosign = scope.spawn(|| gotool::COSIGN.ensure());
        (kube.join(), otelcol.join(), hakari.join(), helm.join(), cosign.join())
    });
    let panicked = || anyhow::anyhow!("a setup thread panicked");
    let kube_bin = kube_bin.map_err(|_| panicked())??;
    let otelcol_bin = otelcol_bin.map_err(|_| panicked())??;
    let hakari = hakari.map_err(|_| panicked())??;
    let helm = helm.map_err(|_| panicked())??;
    let cosign = cosign.map_err(|_| panicked())??;

    step("Checks: the workspace-hack crate is current");
    hakari::check(&hakari)?;

    // The container image tests/e2e/image.rs runs: the release musl build
    // is cargo's (nothing to do when warm), the image made again only when
    // the binary changed.
    let image_archive = crate::image::build()?;

    step("Running the test suite");
    let venv = absolute(&tools_venv())?;
    println!("{TOOLS_VENV_ENV}={}", venv.display());
    println!("{}={}", kube::BIN_DIR_ENV, kube_bin.display());
    println!("{}={}", otelcol::BIN_ENV, otelcol_bin.display());
    println!("{}={}", gotool::HELM.env, helm.display());
    println!("{}={}", gotool::COSIGN.env, cosign.display());
    run(cargo()
        .args(["test", "--workspace"])
        .args(UNIFIED)
        .args(cargo_test_args)
        .env(TOOLS_VENV_ENV, venv)
        .env(kube::BIN_DIR_ENV, kube_bin)
        .env(otelcol::BIN_ENV, otelcol_bin)
        .env(gotool::HELM.env, helm)
        .env(gotool::COSIGN.env, cosign)
        .env(crate::image::ARCHIVE_ENV, image_archive))
}
