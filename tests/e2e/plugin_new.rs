//! `sluice plugin new` as a plugin author outside this repository uses it.
//! For each language: a project in a temporary directory, built by its own
//! Makefile with the toolchains `cargo xtask test` installs, served by the
//! real gateway with each hook's effect checked, then checked again by the
//! project's own local test (`make test`). Each prints how long it took
//! from `new` to serving.
//!
//! And the WIT package `sluice:plugin` through a real registry with wkg:
//! published from wit/, fetched back into a fresh project the way its
//! README says, compared with wit/, and built against.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    ConfigDir, Echo, Gateway, Options, Plugin, Registry, Route, documents, eventually, shared_cache_dir,
};

const NAME: &str = "tenant-tag";
const HEADER: &str = "x-tenant-tag";
const SYSTEM: &str = "Answer in one line. \"Quoted\" ünïcödé ✓";
/// A build may compile a toolchain's dependencies (Rust's, the first time
/// on a machine) while the rest of the suite runs beside it.
const BUILD: Duration = Duration::from_secs(600);
/// Compiling a Python or JavaScript component takes seconds alone, and
/// much longer on a busy 2-core machine.
const COMPILE: Duration = Duration::from_secs(240);
/// Each hook's deadline: it covers instantiation.
const DEADLINE_MS: u32 = 5000;

#[tokio::test]
async fn rust() {
    new_build_serve("rust").await;
}

#[tokio::test]
async fn python() {
    new_build_serve("python").await;
}

#[tokio::test]
async fn js() {
    new_build_serve("js").await;
}

#[tokio::test]
async fn c() {
    new_build_serve("c").await;
}

/// `sluice plugin new` refuses a bad name and an existing directory, and
/// writes nothing then.
#[tokio::test]
async fn new_refuses_bad_names_and_existing_directories() {
    let scratch = tempfile::tempdir().unwrap();
    let (ok, output) = sluice(&["plugin", "new", "Tenant_Tag", "--lang", "rust"], scratch.path()).await;
    assert!(!ok && output.contains("is not a plugin name"), "{output}");
    let (ok, output) = sluice(&["plugin", "new", NAME, "--lang", "go"], scratch.path()).await;
    assert!(!ok && output.contains("invalid value 'go'"), "{output}");
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0, "a refused `new` wrote something");

    std::fs::create_dir(scratch.path().join(NAME)).unwrap();
    let (ok, output) = sluice(&["plugin", "new", NAME, "--lang", "c"], scratch.path()).await;
    assert!(!ok && output.contains("exists already"), "{output}");
    assert_eq!(
        std::fs::read_dir(scratch.path().join(NAME)).unwrap().count(),
        0,
        "it wrote into the existing directory"
    );
}

/// Writes, builds and serves a `lang` project, checks every hook, runs its
/// local test, and prints how long it took.
async fn new_build_serve(lang: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let project = scratch.path().join(NAME);
    let started = Instant::now();
    let (ok, output) =
        sluice(&["plugin", "new", NAME, "--lang", lang, "--dir", project.to_str().unwrap()], scratch.path()).await;
    assert!(ok, "sluice plugin new failed: {output}");
    for file in ["README.md", "Makefile", "test.sh", "wit/plugin.wit", "wit/deps/http.wit", "config/tenant-tag.yaml"] {
        assert!(project.join(file).is_file(), "{lang}: the project has no {file}");
    }

    make(&project, &[], &[]).await;
    let built = started.elapsed();
    let wasm = project.join(format!("{NAME}.wasm"));
    assert!(wasm.is_file(), "{lang}: make wrote no {}", wasm.display());
    if lang == "c" {
        // The adapter the binary carries is the one `cargo xtask` takes
        // from the wasmtime version's crate for the C example.
        let adapter = "wasi_snapshot_preview1.reactor.wasm";
        let xtask = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tools").join(adapter);
        let xtask =
            std::fs::read(&xtask).unwrap_or_else(|e| panic!("{}: {e}: run `cargo xtask test`", xtask.display()));
        assert!(std::fs::read(project.join(adapter)).unwrap() == xtask, "crates/sluice/templates/c/{adapter} is stale");
    }

    // A plain route first, then the plugin: compiling a Python or
    // JavaScript component takes longer than the harness waits for
    // readiness.
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    dir.write("plain.yaml", &Route::new("plain", &["plain"], &echo.url()).yaml());
    // Compiling a Python or JavaScript component while the rest of the
    // suite runs can take longer than the gateway's default minute.
    let options = Options { args: vec!["--plugin-load-timeout-seconds".into(), "300".into()], ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    let plugin = |name: &str, config: Value| Plugin::at(name, wasm.clone()).config(config).timeout_ms(DEADLINE_MS);
    dir.write("plugins.yaml", &plugin(NAME, json!({"value": "search", "system": SYSTEM})).yaml());
    dir.write("routes.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&[NAME]).yaml());
    let first = eventually(&format!("{lang}: the plugin to serve"), COMPILE, async || {
        let reply = gateway.chat("gpt-test", &[]).await;
        if reply.status != 200 {
            let admin = gateway.admin_config().await;
            assert_eq!(admin["errors"], json!([]), "{lang}: the plugin did not load");
        }
        (reply.status == 200).then_some(reply)
    })
    .await;
    let serving = started.elapsed();
    println!(
        "plugin new {lang}: built {:.1} s and serving {:.1} s after `sluice plugin new`",
        built.as_secs_f64(),
        serving.as_secs_f64()
    );

    // The request hook: the header, the system message.
    let echoed = first.echoed();
    assert_eq!(echoed["headers"][HEADER], "search", "{lang}: the upstream got no {HEADER}: {echoed}");
    assert_eq!(
        echoed["messages"],
        json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]),
        "{lang}: the system message was not put first: {echoed}"
    );
    // The response-head and response-body hooks.
    assert_eq!(first.header(HEADER), Some("search"), "{lang}: no {HEADER} on the response");
    let body = first.json();
    assert_eq!(body["sluice_plugin"], NAME, "{lang}: the body was not marked: {body}");
    assert_eq!(body["object"], "chat.completion", "{lang}: the rest of the body changed: {body}");
    // A body without messages: the plugin's own 400.
    let reply =
        gateway.post("/v1/chat/completions", json!({"model": "gpt-test", "messages": "hi"}).to_string(), &[]).await;
    reply.assert_error(400, "invalid_messages");
    streams_marked(&gateway, lang).await;
    // The response-end hook logs through the host.
    assert!(gateway.wait_for_log("tenant-tag: response ended").await, "{lang}: no response-end log line");
    refuses_a_config_without_value(&dir, &gateway, lang, &wasm).await;

    runs_its_local_test(&project, lang).await;
}

/// Each event of a streamed reply is marked by the chunk hook, and the
/// stream still ends with `[DONE]`.
async fn streams_marked(gateway: &Gateway, lang: &str) {
    let body = json!({"model": "gpt-test", "stream": true, "messages": [{"role": "user", "content": "hello"}]});
    let streamed = gateway
        .client()
        .post_streaming(&gateway.url("/v1/chat/completions"), body.to_string(), &[("x-echo-chunks", "4")])
        .await;
    assert_eq!(streamed.status, 200, "{lang}: a streamed request");
    assert_eq!(streamed.headers.get(HEADER).map(|v| v.to_str().unwrap()), Some("search"), "{lang}");
    let events = streamed.events();
    let (last, chunks) = events.split_last().expect("at least one event");
    assert_eq!(last.1, "[DONE]", "{lang}: the stream did not end with [DONE]");
    assert!(chunks.len() >= 4, "{lang}: {} events", chunks.len());
    let mut content = String::new();
    for (_, data) in chunks {
        let chunk: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{lang}: an event ({e}): {data}"));
        assert_eq!(chunk["sluice_plugin"], NAME, "{lang}: an event was not marked: {data}");
        content += chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default();
    }
    let echoed: Value =
        serde_json::from_str(&content).unwrap_or_else(|e| panic!("{lang}: streamed content ({e}): {content}"));
    assert_eq!(echoed["headers"][HEADER], "search", "{lang}: {echoed}");
}

/// A config without `value` is rejected by `configure`, with its message,
/// and the route through it is not served; the good one still is.
async fn refuses_a_config_without_value(dir: &ConfigDir, gateway: &Gateway, lang: &str, wasm: &Path) {
    let broken = Plugin::at("broken", wasm.to_path_buf()).config(json!({})).timeout_ms(DEADLINE_MS);
    let route = Route::new("broken", &["broken"], "http://127.0.0.1:9/v1").plugins(&["broken"]);
    dir.write("broken.yaml", &documents(&[broken.yaml(), route.yaml()]));
    let message = eventually(&format!("{lang}: the broken config to be reported"), COMPILE, async || {
        let admin = gateway.admin_config().await;
        let errors = admin["errors"].as_array()?.clone();
        errors
            .iter()
            .find(|e| e["resource"].as_str().is_some_and(|r| r.contains("GatewayPlugin default/broken")))
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
    })
    .await;
    assert!(message.contains(r#"tenant-tag: the config needs a string "value""#), "{lang}: {message}");
    gateway.chat("broken", &[]).await.assert_error(404, "model_not_found");
    assert_eq!(gateway.chat("gpt-test", &[]).await.status, 200, "{lang}: the good plugin stopped serving");
}

/// `make test`: the project's test.sh, with the binary under test, free
/// ports, and the suite's compiled-plugin cache.
async fn runs_its_local_test(project: &Path, lang: &str) {
    let sluice = sluice_tests::sluice_binary();
    let cache = shared_cache_dir();
    let (echo, listen, admin) = (free_addr(), free_addr(), free_addr());
    let env = [
        ("SLUICE", sluice.as_os_str()),
        ("SLUICE_CACHE_DIR", cache.as_os_str()),
        ("ECHO_ADDR", echo.as_os_str()),
        ("LISTEN", listen.as_os_str()),
        ("ADMIN", admin.as_os_str()),
    ];
    let output = make(project, &["test"], &env).await;
    for check in
        ["request hook", "response-head hook", "response-body hook", "response-chunk hook", "response-end hook"]
    {
        assert!(output.contains(&format!("ok - {check}")), "{lang}: make test did not check the {check}:\n{output}");
    }
    assert!(output.contains("PASS: tenant-tag"), "{lang}: make test did not pass:\n{output}");
}

#[tokio::test]
async fn the_wit_package_goes_through_a_registry_with_wkg() {
    let registry = Registry::start();
    let scratch = tempfile::tempdir().unwrap();
    // Not wkg.toml: that is the name of the manifest wkg looks for in the
    // directories above the project.
    let config = scratch.path().join("wkg-config.toml");
    // The `sluice` namespace in this registry, over plain HTTP, under wit/:
    // sluice:plugin@0.3.2 is wit/sluice/plugin:0.3.2 there.
    std::fs::write(
        &config,
        format!(
            "[namespace_registries.sluice]\nregistry = \"sluice\"\n\
             metadata = {{ preferredProtocol = \"oci\", oci = {{ registry = \"{}\", namespacePrefix = \"wit/\" }} }}\n\n\
             [registry.sluice.oci]\nprotocol = \"http\"\n",
            registry.host()
        ),
    )
    .unwrap();
    let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit").canonicalize().unwrap();
    let version = wit_version(&wit);

    // Publish: wit/ encoded as a WIT package by wasm-tools (which reads
    // wit/deps/ as it is: one file per WASI package), then `wkg publish`.
    let package = scratch.path().join("sluice-plugin.wasm");
    let mut encode = tool(&wasm_tools(), &["component", "wit"]);
    encode.arg(&wit).arg("--wasm").arg("-o").arg(&package);
    run(encode, scratch.path(), "wasm-tools component wit --wasm").await;
    let mut publish = wkg(&["publish", "--config"], &config, &scratch.path().join("publisher-cache"));
    publish.arg(package);
    let published = run(publish, scratch.path(), "wkg publish").await;
    assert!(published.contains(&format!("Published sluice:plugin@{version}")), "{published}");
    assert_eq!(registry.requests("PUT", &format!("/v2/wit/sluice/plugin/manifests/{version}")), 1);

    // Fetch: a fresh project, whose wit/ becomes a world including Sluice's,
    // fetched with its own empty cache, as its README says.
    let project = scratch.path().join(NAME);
    let (ok, output) =
        sluice(&["plugin", "new", NAME, "--lang", "c", "--dir", project.to_str().unwrap()], scratch.path()).await;
    assert!(ok, "{output}");
    let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
    assert!(readme.contains("wkg fetch"), "the README does not say how to fetch the WIT");
    std::fs::remove_dir_all(project.join("wit")).unwrap();
    std::fs::create_dir(project.join("wit")).unwrap();
    let world = format!("package local:deps;\n\nworld deps {{\n    include sluice:plugin/plugin@{version};\n}}\n");
    std::fs::write(project.join("wit/world.wit"), world).unwrap();
    let fetch = wkg(&["fetch", "--config"], &config, &scratch.path().join("author-cache"));
    run(fetch, &project, "wkg fetch").await;
    let fetched_wit = project.join(format!("wit/deps/sluice-plugin-{version}/package.wit"));
    let fetched = std::fs::read_to_string(&fetched_wit).unwrap_or_else(|e| panic!("{}: {e}", fetched_wit.display()));
    assert!(std::fs::read_to_string(project.join("wkg.lock")).unwrap().contains("sluice:plugin"));

    // The same package: wit/'s main package as wasm-tools prints it, docs
    // and all, is what was fetched; and so is what `wkg get` downloads.
    let ours = main_package(&print_wit(&wit, scratch.path()).await);
    assert!(ours.contains("interface filter") && ours.contains("world plugin"), "{ours}");
    assert_eq!(fetched.trim_end(), ours.trim_end(), "the fetched package differs from wit/");
    let got = scratch.path().join("got.wasm");
    let mut get = wkg(&["get", "--config"], &config, &scratch.path().join("get-cache"));
    get.arg("-o").arg(&got).arg(format!("sluice:plugin@{version}"));
    run(get, scratch.path(), "wkg get").await;
    assert_eq!(main_package(&print_wit(&got, scratch.path()).await).trim_end(), ours.trim_end());

    // Built against the fetched WIT, by the world's full name, the plugin
    // serves.
    let world = format!("WORLD=sluice:plugin/plugin@{version}");
    make(&project, &[world.as_str()], &[]).await;
    let echo = Echo::start().await;
    let dir = ConfigDir::new();
    let plugin = Plugin::at(NAME, project.join(format!("{NAME}.wasm"))).config(json!({"value": "from-wkg"}));
    let route = Route::new("chat", &["gpt-test"], &echo.url()).plugins(&[NAME]);
    dir.write("config.yaml", &documents(&[plugin.yaml(), route.yaml()]));
    let gateway = Gateway::start(&dir).await;
    let reply = gateway.chat("gpt-test", &[]).await;
    assert_eq!(reply.echoed()["headers"][HEADER], "from-wkg");
    assert_eq!(reply.json()["sluice_plugin"], NAME);
}

/// The WIT of the first package `wasm-tools component wit` prints: the main
/// one, before the dependencies it prints nested (`package wasi:io@… {`).
fn main_package(printed: &str) -> String {
    let end = printed.find("\npackage ").map_or(printed.len(), |at| at + 1);
    printed[..end].to_owned()
}

async fn print_wit(path: &Path, cwd: &Path) -> String {
    let mut print = tool(&wasm_tools(), &["component", "wit"]);
    print.arg(path);
    run(print, cwd, "wasm-tools component wit").await
}

/// `0.3.2`, from wit/plugin.wit's `package sluice:plugin@0.3.2;`.
fn wit_version(wit: &Path) -> String {
    let text = std::fs::read_to_string(wit.join("plugin.wit")).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("package sluice:plugin@")).expect("a package line");
    line.trim_end_matches(';').to_owned()
}

/// `make` in `project`, with the toolchains `cargo xtask test` installs;
/// returns its output, and fails with it if make does.
async fn make(project: &Path, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> String {
    let venv = venv();
    let mut command = tokio::process::Command::new("make");
    command.arg("--no-print-directory").args(args);
    command
        .env("WASM_TOOLS", venv.join("bin/wasm-tools"))
        .env("COMPONENTIZE_PY", venv.join("bin/componentize-py"))
        .env("WIT_BINDGEN", cached_tool("wit-bindgen-cli-0.63.0/bin/wit-bindgen"))
        // npm ci from the cache `cargo xtask` filled installing the same
        // package-lock.json for plugins/examples/js.
        .env("NPM", "npm --prefer-offline")
        // The Rust project's dependencies, compiled once per checkout.
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugin-new/cargo"))
        .envs(env.iter().copied());
    // Loopback requests from test.sh must not go to a proxy.
    for proxy in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"] {
        command.env_remove(proxy);
    }
    run(command, project, &format!("make {}", args.join(" "))).await
}

/// Runs `command` in `cwd` within [`BUILD`]; its stdout and stderr, or a
/// failure that shows them.
async fn run(mut command: tokio::process::Command, cwd: &Path, what: &str) -> String {
    command.current_dir(cwd).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let output = tokio::time::timeout(BUILD, command.output())
        .await
        .unwrap_or_else(|_| panic!("`{what}` in {} took over {BUILD:?}", cwd.display()))
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "`{what}` in {} failed ({}):\n{text}", cwd.display(), output.status);
    text
}

/// The sluice binary under test with `args`, in `cwd`: whether it
/// succeeded, and what it printed.
async fn sluice(args: &[&str], cwd: &Path) -> (bool, String) {
    let output = tokio::process::Command::new(sluice_tests::sluice_binary())
        .args(args)
        .current_dir(cwd)
        .env("RUST_BACKTRACE", "0")
        .output()
        .await
        .expect("running sluice");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

fn tool(path: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(path);
    command.args(args);
    command
}

/// `wkg SUBCOMMAND --config CONFIG --cache CACHE`, the rest to add.
fn wkg(subcommand: &[&str], config: &Path, cache: &Path) -> tokio::process::Command {
    let mut command = tool(&cached_tool("wkg-0.16.1/bin/wkg"), subcommand);
    command.arg(config).arg("--cache").arg(cache);
    command
}

/// The tools venv (`$SLUICE_TOOLS_VENV`, else target/tools/venv).
fn venv() -> PathBuf {
    let python = sluice_tests::tools_python();
    python.parent().and_then(Path::parent).expect("venv/bin/python").to_path_buf()
}

fn wasm_tools() -> PathBuf {
    venv().join("bin/wasm-tools")
}

/// A tool `cargo xtask` installs once per machine into `<cache>/sluice/`.
fn cached_tool(relative: &str) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME or XDG_CACHE_HOME is set")).join(".cache")
    });
    let path = cache.join("sluice").join(relative);
    assert!(path.is_file(), "{} is missing: run `cargo xtask test`, which installs it", path.display());
    path
}

/// A loopback address free now, for a process the test starts.
fn free_addr() -> OsString {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address").to_string().into()
}
