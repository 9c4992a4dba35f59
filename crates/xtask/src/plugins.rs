//! `cargo xtask plugins`: build the guest workspace and the examples, and
//! publish them to plugins/dist/, where the quickstart config and the tests
//! load them.
//!
//! - First-party plugins (the plugins/ workspace) become `<package>.wasm`.
//!   They are built for wasm32-unknown-unknown and made components here:
//!   they use nothing but the host interface, and without the WASI that
//!   Rust's wasip2 std imports, a fresh instance's p99 is about a quarter
//!   lower (6 core instances to make instead of 20; tests/bench/README.md,
//!   "What one plugin costs, alone"). A package that needs WASI says so with
//!   `[package.metadata.sluice] wasi = true` and is built for wasm32-wasip2.
//! - The decorator-lite examples in plugins/examples/{rust,python,js,c}
//!   become `example-<language>.wasm`, and the per-consumer counter on
//!   shared state in plugins/examples/python-counter becomes
//!   `example-python-counter.wasm`. The Python, JavaScript and C builds
//!   are skipped when a hash of their inputs (sources, WIT, tool versions)
//!   matches the one recorded beside the published file; cargo decides for
//!   Rust.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};

use crate::toolchain::{self, GuestTools, absolute};
use crate::{cargo, cargo_metadata, run, step, target_dir};

const MANIFEST: &str = "plugins/Cargo.toml";
const DIST: &str = "plugins/dist";
const WIT: &str = "wit";
const EXAMPLES: &str = "plugins/examples";

pub fn build() -> Result<()> {
    toolchain::ensure_wasm_targets(&[toolchain::CORE_WASM_TARGET, toolchain::WASM_TARGET])?;
    let tools = toolchain::guest_tools()?;
    let target_dir = build_first_party(&[])?;
    build_examples(&tools, &target_dir)
}

/// Builds only the named first-party plugins (Rust, so the wasm targets
/// are all they need) and publishes them: what the quickstart serves.
pub fn build_only(packages: &[&str]) -> Result<()> {
    toolchain::ensure_wasm_targets(&[toolchain::CORE_WASM_TARGET, toolchain::WASM_TARGET])?;
    build_first_party(packages).map(drop)
}

/// A plugin of the plugins/ workspace.
struct FirstParty {
    name: String,
    /// The file stem of its cdylib.
    lib_name: String,
    /// Built for wasm32-wasip2 as a component, rather than as a core module.
    wasi: bool,
}

impl FirstParty {
    fn target(&self) -> &'static str {
        if self.wasi { toolchain::WASM_TARGET } else { toolchain::CORE_WASM_TARGET }
    }
}

/// Builds the plugins/ workspace's plugins (or only `packages`, if any are
/// named) and publishes each; returns the workspace's target directory.
fn build_first_party(packages: &[&str]) -> Result<PathBuf> {
    let metadata = cargo_metadata(MANIFEST)?;
    let target_dir =
        PathBuf::from(metadata["target_directory"].as_str().context("cargo metadata has no target_directory")?);
    let mut plugins = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let Some(lib_name) = cdylib_name(package) else {
            continue;
        };
        let name = package["name"].as_str().context("package without a name")?.to_string();
        if packages.is_empty() || packages.contains(&name.as_str()) {
            let wasi = package["metadata"]["sluice"]["wasi"].as_bool().unwrap_or(false);
            plugins.push(FirstParty { name, lib_name, wasi });
        }
    }
    if plugins.is_empty() {
        bail!("{MANIFEST} has no cdylib packages: nothing to build");
    }
    if let Some(missing) = packages.iter().find(|name| !plugins.iter().any(|plugin| plugin.name == **name)) {
        bail!("{MANIFEST} has no plugin (cdylib package) named {missing}");
    }

    step("Building the plugins (plugins/)");
    for target in [toolchain::CORE_WASM_TARGET, toolchain::WASM_TARGET] {
        let mut build = cargo();
        build.args(["build", "--release", "--target", target, "--manifest-path", MANIFEST]);
        let mut any = false;
        for plugin in plugins.iter().filter(|plugin| plugin.target() == target) {
            build.args(["--package", &plugin.name]);
            any = true;
        }
        if any {
            run(&mut build)?;
        }
    }

    step(&format!("Publishing plugins to {DIST}/"));
    fs::create_dir_all(DIST).with_context(|| format!("cannot create {DIST}"))?;
    for plugin in &plugins {
        let built = target_dir.join(plugin.target()).join("release").join(format!("{}.wasm", plugin.lib_name));
        let bytes = fs::read(&built).with_context(|| format!("cannot read {}", built.display()))?;
        let component = if plugin.wasi {
            bytes
        } else {
            componentize(&bytes).with_context(|| format!("cannot make {} a component", built.display()))?
        };
        let dest = Path::new(DIST).join(format!("{}.wasm", plugin.name));
        let changed = publish(&component, &dest)?;
        report(&dest, if changed { "updated" } else { "" })?;
    }
    Ok(target_dir)
}

/// The component of a core module that wit-bindgen built: its imports and
/// exports are described in the module's `component-type` custom section.
fn componentize(module: &[u8]) -> Result<Vec<u8>> {
    wit_component::ComponentEncoder::default().module(module)?.validate(true).encode()
}

/// Builds the four decorator-lite examples and the Python counter. The Rust
/// one shares the guest workspace's target directory (and so its compiled
/// dependencies); the others run side by side, each logging to
/// target/tools/logs.
fn build_examples(tools: &GuestTools, target_dir: &Path) -> Result<()> {
    step(&format!("Building the examples ({EXAMPLES}/)"));
    let manifest = format!("{EXAMPLES}/rust/Cargo.toml");
    run(cargo()
        .args(["build", "--release", "--locked", "--target", toolchain::WASM_TARGET, "--manifest-path", &manifest])
        .arg("--target-dir")
        .arg(target_dir))?;
    let built = target_dir.join(toolchain::WASM_TARGET).join("release/example_decorator_lite.wasm");
    let rust = Path::new(DIST).join("example-rust.wasm");
    let changed = publish(&fs::read(&built).with_context(|| format!("cannot read {}", built.display()))?, &rust)?;

    let examples = [
        python_example(tools, "python", "plugin"),
        python_example(tools, "python-counter", "stateful-plugin"),
        js_example(),
        js_fetch_example(),
        c_example(tools)?,
    ];
    let results: Vec<Result<&'static str>> = thread::scope(|scope| {
        let handles: Vec<_> = examples.iter().map(|example| scope.spawn(|| example.build(tools))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a build thread panicked")))).collect()
    });
    report(&rust, if changed { "updated" } else { "" })?;
    for (example, result) in examples.iter().zip(results) {
        report(&example.dest(), result?)?;
    }
    Ok(())
}

/// An example built by an external tool, and what goes into its input hash.
struct Example {
    /// The published name, `example-<language>` (or `example-<dir>`).
    name: String,
    /// Files and directories (all files in them, recursively) it is built from.
    inputs: Vec<PathBuf>,
    /// Tool versions and flags, part of the input hash too.
    settings: String,
    /// The build, given the path to write the component to.
    command: Box<dyn Fn(&Path) -> Command + Sync>,
}

impl Example {
    fn dest(&self) -> PathBuf {
        Path::new(DIST).join(format!("{}.wasm", self.name))
    }

    fn stamp(&self) -> PathBuf {
        Path::new(DIST).join(format!(".{}.inputs", self.name))
    }

    /// Builds unless the inputs are unchanged; returns a note for the report.
    fn build(&self, tools: &GuestTools) -> Result<&'static str> {
        let hash = self.input_hash(tools)?;
        if self.dest().exists() && fs::read_to_string(self.stamp()).is_ok_and(|s| s.trim() == hash) {
            return Ok("");
        }
        let log = target_dir().join("tools/logs").join(format!("{}.log", self.name));
        let partial = absolute(&PathBuf::from(format!("{}.partial", self.dest().display())))?;
        let mut cmd = (self.command)(&partial);
        // A fresh log per build: only this build's output is shown on failure.
        fs::write(&log, "").with_context(|| format!("cannot create {}", log.display()))?;
        toolchain::run_logged(&mut cmd, &log)?;
        fs::rename(&partial, self.dest()).with_context(|| format!("cannot replace {}", self.dest().display()))?;
        fs::write(self.stamp(), hash)?;
        Ok("built")
    }

    fn input_hash(&self, tools: &GuestTools) -> Result<String> {
        let mut hasher = Sha256::new();
        hasher.update(format!("{}\n{}\n{}\n", self.name, self.settings, tools.versions));
        let mut files = Vec::new();
        for input in &self.inputs {
            collect_files(input, &mut files)?;
        }
        files.sort();
        for file in files {
            let bytes = fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            hasher.update(format!("{}\n{}\n", file.display(), bytes.len()));
            hasher.update(bytes);
        }
        Ok(hex::encode(hasher.finalize()))
    }
}

/// The Python example in plugins/examples/<dir>/app.py, built for `world`:
/// componentize-py binds every import of the world, so each is built for the
/// smallest one it needs.
fn python_example(tools: &GuestTools, dir: &str, world: &'static str) -> Example {
    let name = format!("example-{dir}");
    let dir = Path::new(EXAMPLES).join(dir);
    let componentize_py = tools.componentize_py.clone();
    Example {
        name,
        inputs: vec![dir.join("app.py"), WIT.into()],
        // `--stub-wasi`: the component imports no WASI at all.
        settings: format!("-w {world} componentize --stub-wasi app"),
        command: Box::new(move |out| {
            let mut cmd = Command::new(&componentize_py);
            cmd.args(["-d", WIT, "-w", world, "componentize", "--stub-wasi", "-p"])
                .arg(&dir)
                .arg("app")
                .arg("-o")
                .arg(out);
            cmd
        }),
    }
}

fn js_example() -> Example {
    let dir = Path::new(toolchain::JS_EXAMPLE_DIR);
    let build = dir.join("build.mjs");
    Example {
        name: "example-js".into(),
        inputs: ["decorator-lite.js", "build.mjs", "package-lock.json"]
            .map(|f| dir.join(f))
            .into_iter()
            .chain([WIT.into()])
            .collect(),
        settings: String::new(),
        command: Box::new(move |out| {
            let mut cmd = Command::new("node");
            cmd.arg(&build).arg(out);
            cmd
        }),
    }
}

/// plugins/examples/js-fetch: `fetch()` under the `outbound-plugin` world,
/// built with the componentize-js installed for the JavaScript example.
fn js_fetch_example() -> Example {
    let dir = Path::new(EXAMPLES).join("js-fetch");
    let build = dir.join("build.mjs");
    let lock = Path::new(toolchain::JS_EXAMPLE_DIR).join("package-lock.json");
    Example {
        name: "example-js-fetch".into(),
        inputs: vec![dir.join("fetch-check.js"), build.clone(), lock, WIT.into()],
        settings: String::new(),
        command: Box::new(move |out| {
            let mut cmd = Command::new("node");
            cmd.arg(&build).arg(out);
            cmd
        }),
    }
}

fn c_example(tools: &GuestTools) -> Result<Example> {
    let dir = Path::new(EXAMPLES).join("c");
    let gen_dir = absolute(&target_dir().join("tools/c-gen"))?;
    let vars = [
        ("WIT_BINDGEN", tools.wit_bindgen.clone()),
        ("WASM_TOOLS", tools.wasm_tools.clone()),
        ("ADAPTER", tools.adapter.clone()),
        ("GEN", gen_dir),
    ];
    Ok(Example {
        name: "example-c".into(),
        inputs: vec![dir.join("decorator-lite.c"), dir.join("Makefile"), tools.adapter.clone(), WIT.into()],
        settings: String::new(),
        command: Box::new(move |out| {
            // -B: the input hash already said this must be rebuilt.
            let mut cmd = Command::new("make");
            cmd.arg("-B").arg("-C").arg(&dir);
            for (name, value) in &vars {
                cmd.arg(format!("{name}={}", value.display()));
            }
            cmd.arg(format!("OUT={}", out.display()));
            cmd
        }),
    })
}

/// Adds `path` if it is a file, or the files under it if it is a directory.
fn collect_files(path: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    if path.is_dir() {
        for entry in fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))? {
            collect_files(&entry?.path(), files)?;
        }
    } else {
        files.push(path.to_path_buf());
    }
    Ok(())
}

/// Prints a published plugin's path, size and digest.
fn report(dest: &Path, note: &str) -> Result<()> {
    let bytes = fs::read(dest).with_context(|| format!("cannot read {}", dest.display()))?;
    println!(
        "  {:<42} {:>9.1} KiB  sha256:{}{}",
        dest.display(),
        bytes.len() as f64 / 1024.0,
        hex::encode(Sha256::digest(&bytes)),
        if note.is_empty() { String::new() } else { format!("  ({note})") },
    );
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

/// Writes `bytes` to `dest` unless `dest` already has them, so an
/// unchanged plugin keeps its mtime. Returns whether it wrote.
fn publish(bytes: &[u8], dest: &Path) -> Result<bool> {
    if fs::read(dest).is_ok_and(|current| current == bytes) {
        return Ok(false);
    }
    // Write then rename: a running gateway never sees a half-written module.
    let partial = PathBuf::from(format!("{}.partial", dest.display()));
    fs::write(&partial, bytes).with_context(|| format!("cannot write {}", partial.display()))?;
    fs::rename(&partial, dest).with_context(|| format!("cannot replace {}", dest.display()))?;
    Ok(true)
}
