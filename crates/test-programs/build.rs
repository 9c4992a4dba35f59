//! Builds the plugins the unit tests load from the guest workspace in
//! `plugins/`, into its own target directory, and makes components of the
//! core modules. This is `cargo xtask plugins` for a few Rust plugins, with
//! nothing beyond rustup's targets, so that `cargo test` works from a clone.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (package, library name, target): the plugins the unit tests load.
const PROGRAMS: &[(&str, &str, &str)] = &[
    ("add-header", "add_header", "wasm32-unknown-unknown"),
    ("deny", "deny", "wasm32-unknown-unknown"),
    ("prompt-decorator", "prompt_decorator", "wasm32-unknown-unknown"),
    ("context-trim", "context_trim", "wasm32-unknown-unknown"),
    ("prompt-guard", "prompt_guard", "wasm32-unknown-unknown"),
    ("chaos", "chaos", "wasm32-unknown-unknown"),
    ("probe", "probe", "wasm32-unknown-unknown"),
    ("stateful", "stateful", "wasm32-unknown-unknown"),
    ("token-quota", "token_quota", "wasm32-unknown-unknown"),
    ("caller", "caller", "wasm32-unknown-unknown"),
    ("mcp-policy", "mcp_policy", "wasm32-unknown-unknown"),
    ("hostile", "hostile", "wasm32-wasip2"),
];

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let plugins = root.join("plugins");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for input in [
        "Cargo.toml",
        "Cargo.lock",
        "sdk",
        "add-header",
        "deny",
        "prompt-decorator",
        "context-trim",
        "prompt-guard",
        "token-quota",
        "mcp-policy",
        "testing",
    ] {
        println!("cargo:rerun-if-changed={}", plugins.join(input).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("wit").display());

    // The same release build `cargo xtask plugins` runs, in its own target
    // directory: building a subset of the guest workspace into plugins/target
    // would resolve features differently and overwrite what xtask published.
    let target_dir = plugins.join("target/test-programs");
    let mut all = Vec::new();
    for target in ["wasm32-unknown-unknown", "wasm32-wasip2"] {
        let mut cargo = cargo();
        cargo.args(["build", "--release", "--target", target, "--manifest-path"]);
        cargo.arg(plugins.join("Cargo.toml")).arg("--target-dir").arg(&target_dir);
        for (package, _, _) in PROGRAMS.iter().filter(|(_, _, t)| *t == target) {
            cargo.args(["--package", package]);
        }
        let output = cargo.output().unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let hint = if stderr.contains("target may not be installed") {
                format!("\n\nadd the target with: rustup target add {target}")
            } else {
                String::new()
            };
            panic!("building the test plugins for {target} failed:\n{stderr}{hint}");
        }
    }
    for (package, lib, target) in PROGRAMS {
        let built = target_dir.join(target).join("release").join(format!("{lib}.wasm"));
        let bytes = std::fs::read(&built).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
        // wasm32-wasip2 builds a component; a core module from
        // wasm32-unknown-unknown carries its WIT in a custom section.
        let component = if *target == "wasm32-wasip2" {
            bytes
        } else {
            wit_component::ComponentEncoder::default()
                .module(&bytes)
                .and_then(|encoder| encoder.validate(true).encode())
                .unwrap_or_else(|e| panic!("cannot make {} a component: {e:#}", built.display()))
        };
        let path = out.join(format!("{package}.wasm"));
        std::fs::write(&path, component).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        all.push(format!("    ({package:?}, {:?}),\n", path.display().to_string()));
    }
    let consts = format!(
        "/// (package, path of its component), for each plugin built.\npub const PROGRAMS: &[(&str, &str)] = &[\n{}];\n",
        all.concat()
    );
    std::fs::write(out.join("programs.rs"), consts).expect("cannot write programs.rs");
}

/// The cargo that runs this build, without what it set for this crate's
/// compilation: another package's flags, or clippy standing in for rustc.
fn cargo() -> Command {
    let mut cargo = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "CARGO_TARGET_DIR"] {
        cargo.env_remove(var);
    }
    cargo
}
