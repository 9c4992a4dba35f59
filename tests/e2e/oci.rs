//! Plugins in OCI registries: a real registry (Debian's `docker-registry`),
//! the real `sluice` binary and the `sluice-oci` library, and the `oras`
//! Python client as an independent implementation on the other side.
//!
//! Needs /usr/bin/docker-registry and a venv with `oras==0.2.43`
//! (`$SLUICE_TOOLS_VENV`, else `target/tools/venv`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Instant;

use serde_json::{Value, json};
use sha2::Digest as _;
use sluice_oci::{Credentials, Format, OciError, Origin, PullPolicy, Pulled, Reference, RegistryOptions};
use sluice_tests::Registry;
use tempfile::TempDir;

const CNCF_CONFIG: &str = "application/vnd.wasm.config.v0+json";
const ISTIO_LAYER: &str = "application/vnd.module.wasm.content.layer.v1+wasm";

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&sha2::Sha256::digest(bytes)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A real plugin component, read once so a concurrent plugins/dist rebuild
/// cannot change it under the test.
fn plugin() -> Vec<u8> {
    std::fs::read(sluice_tests::plugin_wasm("add-header")).expect("reading add-header.wasm")
}

/// `component` plus a custom section: still a valid component, with other
/// bytes and so another digest. `len` bytes of non-repeating filler.
fn variant(component: &[u8], name: &str, len: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            out.push(if n == 0 { byte } else { byte | 0x80 });
            if n == 0 {
                return;
            }
        }
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let filler: Vec<u8> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(&filler);
    let mut out = component.to_vec();
    out.push(0);
    leb(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

fn options(cache: &Path) -> RegistryOptions {
    let mut options = RegistryOptions::new(cache);
    // Hermetic: never the docker config of whoever runs the tests.
    options.credentials =
        Credentials { docker_config: Some(cache.join("no-docker-config.json")), ..Credentials::default() };
    let _ = std::fs::write(cache.join("no-docker-config.json"), "{}");
    options
}

fn client(cache: &Path) -> sluice_oci::Registry {
    std::fs::create_dir_all(cache).unwrap();
    sluice_oci::Registry::new(options(cache)).expect("creating the OCI client")
}

fn reference(registry: &Registry, repository_and_tag: &str) -> Reference {
    registry.reference(repository_and_tag).parse().expect("a valid reference")
}

async fn push(client: &sluice_oci::Registry, module: &[u8], reference: &Reference) -> sluice_oci::Pushed {
    client.push(module.to_vec(), reference, BTreeMap::new(), None).await.expect("pushing")
}

/// Runs `sluice ARGS` with a private cache and no ambient docker config.
fn sluice(scratch: &Path, args: &[&str]) -> Output {
    let docker_config = scratch.join("docker-config");
    std::fs::create_dir_all(&docker_config).unwrap();
    Command::new(sluice_tests::sluice_binary())
        .args(args)
        .env("SLUICE_OCI_CACHE_DIR", scratch.join("cli-cache"))
        .env("DOCKER_CONFIG", &docker_config)
        .env("NO_COLOR", "1")
        .output()
        .expect("running sluice")
}

fn text(output: &[u8]) -> String {
    String::from_utf8_lossy(output).into_owned()
}

/// `key value` lines printed by `sluice push`.
fn field(stdout: &str, key: &str) -> String {
    stdout
        .lines()
        .find_map(|line| line.strip_prefix(key).map(|rest| rest.trim().to_string()))
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{stdout}"))
}

/// Operations done with the oras Python SDK: the other, independent client.
const ORAS_SCRIPT: &str = r#"
import hashlib, json, sys
import oras.provider

spec = json.loads(sys.argv[1])
target = spec["target"]
reg = oras.provider.Registry(hostname=target.split("/")[0], insecure=True)

def descriptor(path, media_type):
    data = open(path, "rb").read()
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(), "size": len(data)}

def put_manifest(ref, body, media_type):
    container = reg.get_container(ref)
    r = reg.do_request(f"{reg.prefix}://{container.manifest_url()}", "PUT", headers={"Content-Type": media_type}, data=body)
    if r.status_code not in (200, 201):
        sys.exit(f"manifest PUT {r.status_code}: {r.text}")
    return {"digest": "sha256:" + hashlib.sha256(body).hexdigest(), "size": len(body), "mediaType": media_type}

op = spec["op"]
if op == "push":
    config = spec.get("config")
    reg.push(target=target, files=[f"{p}:{m}" for p, m in spec["files"]],
             manifest_config=f"{config[0]}:{config[1]}" if config else None,
             disable_path_validation=True, quiet=True)
elif op == "raw":
    container = reg.get_container(target)
    config = descriptor(*spec["config"])
    layers = [descriptor(p, m) for p, m in spec["layers"]]
    for (path, _), d in zip([spec["config"]] + spec["layers"], [config] + layers):
        reg._check_200_response(reg.upload_blob(path, container, d))
    manifest = {"schemaVersion": 2, "mediaType": spec["manifestMediaType"], "config": config, "layers": layers}
    print(json.dumps(put_manifest(target, json.dumps(manifest).encode(), spec["manifestMediaType"])))
elif op == "index":
    entries = []
    for entry in spec["entries"]:
        container = reg.get_container(entry["ref"])
        r = reg.do_request(f"{reg.prefix}://{container.manifest_url()}", "GET",
                           headers={"Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"})
        reg._check_200_response(r)
        entries.append({"mediaType": r.headers["Content-Type"], "digest": "sha256:" + hashlib.sha256(r.content).hexdigest(),
                        "size": len(r.content), "platform": entry["platform"]})
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}
    print(json.dumps(put_manifest(target, json.dumps(index).encode(), index["mediaType"])))
elif op == "pull":
    print(json.dumps(reg.pull(target=target, outdir=spec["outdir"])))
elif op == "manifest":
    print(json.dumps(reg.get_manifest(reg.get_container(target))))
else:
    sys.exit(f"unknown op {op}")
"#;

/// Runs one oras operation; returns its JSON output, if any.
fn oras(spec: Value) -> Value {
    let output = Command::new(sluice_tests::tools_python())
        .arg("-c")
        .arg(ORAS_SCRIPT)
        .arg(spec.to_string())
        .output()
        .expect("running python");
    assert!(output.status.success(), "oras {spec}: {}\n{}", text(&output.stderr), text(&output.stdout));
    let stdout = text(&output.stdout);
    if stdout.trim().is_empty() { Value::Null } else { serde_json::from_str(stdout.trim()).expect("oras printed JSON") }
}

/// Standard base64, as `docker login` stores `user:password`.
fn base64(text: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_string()
}

/// A tar.gz holding `plugin.wasm` (and a neighbour), made by Python's tarfile.
fn image_layer(dir: &Path, module: &[u8]) -> String {
    let wasm = write(dir, "plugin.wasm", module);
    let extra = write(dir, "runtime-config.json", b"{\"type\":\"HttpFilter\"}");
    let layer = dir.join("layer.tar.gz");
    let script = "import sys, tarfile\nwith tarfile.open(sys.argv[1], 'w:gz') as t:\n    t.add(sys.argv[3], arcname='runtime-config.json')\n    t.add(sys.argv[2], arcname='plugin.wasm')\n";
    let status = Command::new(sluice_tests::tools_python())
        .args(["-c", script])
        .arg(&layer)
        .arg(&wasm)
        .arg(&extra)
        .status()
        .unwrap();
    assert!(status.success());
    layer.to_str().unwrap().to_string()
}

#[tokio::test]
async fn cli_push_pull_and_inspect_round_trip() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let module = plugin();
    let file = write(scratch.path(), "add-header.wasm", &module);
    let target = registry.reference("plugins/add-header:v1");

    let started = Instant::now();
    let output = sluice(
        scratch.path(),
        &[
            "push",
            &file,
            &target,
            "--annotation",
            "org.opencontainers.image.source=https://example.com/p",
            "--annotation",
            "team=gw",
        ],
    );
    let push_time = started.elapsed();
    assert!(output.status.success(), "push failed: {}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let manifest_digest = field(&stdout, "manifest");
    assert_eq!(field(&stdout, "layer"), sha256(&module), "the layer digest is the module's sha256");
    assert!(field(&stdout, "pinned").ends_with(&format!("plugins/add-header@{manifest_digest}")), "{stdout}");

    let pulled_file = scratch.path().join("pulled.wasm");
    let started = Instant::now();
    let output = sluice(scratch.path(), &["pull", &target, "-o", pulled_file.to_str().unwrap()]);
    let pull_time = started.elapsed();
    assert!(output.status.success(), "pull failed: {}", text(&output.stderr));
    assert!(std::fs::read(&pulled_file).unwrap() == module, "pulled bytes differ from pushed ones");
    eprintln!("CLI, {} byte module: push {push_time:?}, pull {pull_time:?} (process start included)", module.len());

    // Pull to stdout, by digest.
    let by_digest = format!("{}/plugins/add-header@{manifest_digest}", registry.host());
    let output = sluice(scratch.path(), &["pull", &by_digest]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(output.stdout == module, "stdout pull differs");

    let output = sluice(scratch.path(), &["inspect", &target, "--json"]);
    assert!(output.status.success(), "inspect failed: {}", text(&output.stderr));
    let inspection: Value = serde_json::from_slice(&output.stdout).expect("inspect --json prints JSON");
    assert_eq!(inspection["manifestDigest"], manifest_digest);
    assert_eq!(inspection["manifestMediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(inspection["format"], "cncf-wasm");
    assert_eq!(inspection["config"]["mediaType"], CNCF_CONFIG);
    assert_eq!(inspection["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(inspection["layers"][0]["size"], module.len());
    assert_eq!(inspection["annotations"]["team"], "gw");
    assert_eq!(inspection["moduleDigest"], sha256(&module));
    let config = &inspection["configJson"];
    assert_eq!((config["architecture"].as_str(), config["os"].as_str()), (Some("wasm"), Some("wasip2")));
    assert_eq!(config["layerDigests"], json!([sha256(&module)]));
    // The config's component description matches the module's own imports and exports.
    let exports = &inspection["component"]["exports"];
    assert!(exports.as_array().is_some_and(|e| !e.is_empty()), "no exports: {inspection}");
    assert_eq!(&config["component"]["exports"], exports);
    assert_eq!(config["component"]["imports"], inspection["component"]["imports"]);

    let output = sluice(scratch.path(), &["inspect", &target]);
    assert!(output.status.success());
    let human = text(&output.stdout);
    assert!(human.contains("cncf-wasm") && human.contains("annotation  team=gw"), "{human}");
}

#[tokio::test]
async fn a_moved_tag_is_followed_under_always_but_not_under_if_not_present() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));
    let first = plugin();
    let second = variant(&first, "sluice-test-v2", 100);
    let tag = reference(&registry, "plugins/moving:stable");

    let pushed_first = push(&oci, &first, &tag).await;
    let pulled = oci.pull(&tag, PullPolicy::IfNotPresent, None).await.unwrap();
    assert_eq!((pulled.origin, &pulled.manifest_digest), (Origin::Registry, &pushed_first.manifest_digest));

    let pushed_second = push(&oci, &second, &tag).await;
    assert_ne!(pushed_first.manifest_digest, pushed_second.manifest_digest);

    let manifest_gets = registry.requests("GET", "/manifests/stable");
    let cached = oci.pull(&tag, PullPolicy::IfNotPresent, None).await.unwrap();
    assert_eq!(cached.origin, Origin::Cache);
    assert!(cached.module == first, "IfNotPresent must keep the module the tag resolved to before");
    assert_eq!(registry.requests("GET", "/manifests/stable"), manifest_gets, "IfNotPresent asked the registry");

    let fresh = oci.pull(&tag, PullPolicy::Always, None).await.unwrap();
    assert_eq!(fresh.origin, Origin::Registry);
    assert_eq!(fresh.manifest_digest, pushed_second.manifest_digest);
    assert!(fresh.module == second, "Always must follow the tag to its new digest");
    assert_eq!(fresh.module_digest, sha256(&second));

    // The new mapping is remembered; the old digest stays pullable offline.
    assert!(oci.pull(&tag, PullPolicy::IfNotPresent, None).await.unwrap().module == second);
    let old = tag.with_digest(&pushed_first.manifest_digest);
    let old_pull = oci.pull(&old, PullPolicy::Always, None).await.unwrap();
    assert_eq!(old_pull.origin, Origin::Cache, "a digest reference is immutable: no need to ask");
    assert!(old_pull.module == first);
}

#[tokio::test]
async fn a_sha256_pin_mismatch_is_refused_naming_both_digests() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));
    let module = plugin();
    let tag = reference(&registry, "plugins/pinned:v1");
    push(&oci, &module, &tag).await;

    let wrong = sha256(b"some other module");
    let error = oci.pull(&tag, PullPolicy::Always, Some(&wrong)).await.unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, OciError::DigestMismatch { .. }), "{message}");
    assert!(message.contains(&wrong) && message.contains(&sha256(&module)), "{message}");
    // Cached or not, the pin is checked.
    let error = oci.pull(&tag, PullPolicy::IfNotPresent, Some(&wrong)).await.unwrap_err();
    assert!(matches!(error, OciError::DigestMismatch { .. }), "{error}");

    let right = sha256(&module);
    let bare_hex = right.trim_start_matches("sha256:");
    assert!(oci.pull(&tag, PullPolicy::Always, Some(bare_hex)).await.unwrap().module == module);

    let output = sluice(scratch.path(), &["pull", &tag.to_string(), "-o", "/dev/null", "--expected-sha256", &wrong]);
    assert!(!output.status.success(), "the CLI accepted a wrong pin");
    let stderr = text(&output.stderr);
    assert!(stderr.contains(&wrong) && stderr.contains(&right), "{stderr}");
}

#[tokio::test]
async fn oras_pushed_cncf_and_istio_artifacts_load_in_sluice() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));
    let module = plugin();
    let wasm = write(scratch.path(), "plugin.wasm", &module);
    let config = write(scratch.path(), "config.json", b"{\"architecture\":\"wasm\",\"os\":\"wasip2\"}");

    let cncf = registry.reference("oras/cncf:v1");
    oras(json!({"op": "push", "target": cncf, "files": [[wasm, "application/wasm"]], "config": [config, CNCF_CONFIG]}));
    let istio = registry.reference("oras/istio:v1");
    oras(json!({"op": "push", "target": istio, "files": [[wasm, ISTIO_LAYER]]}));

    for (target, format) in [(cncf, Format::CncfWasm), (istio, Format::IstioWasm)] {
        let pulled = oci.pull(&target.parse().unwrap(), PullPolicy::Always, None).await.unwrap();
        assert_eq!(pulled.format, format, "{target}");
        assert!(pulled.module == module, "{target}: bytes differ");
        assert_eq!(pulled.module_digest, sha256(&module));
    }
}

#[tokio::test]
async fn an_image_whose_tar_layer_holds_plugin_wasm_is_accepted() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));
    let module = plugin();
    let layer = image_layer(scratch.path(), &module);
    let layer_digest = sha256(&std::fs::read(&layer).unwrap());
    let config = write(
        scratch.path(),
        "image-config.json",
        b"{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]}}",
    );

    // Docker's media types, as `docker build` would produce.
    let target = registry.reference("images/docker:v1");
    oras(json!({
        "op": "raw", "target": target,
        "manifestMediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": [config, "application/vnd.docker.container.image.v1+json"],
        "layers": [[layer, "application/vnd.docker.image.rootfs.diff.tar.gzip"]],
    }));
    let pulled = oci.pull(&target.parse().unwrap(), PullPolicy::Always, None).await.unwrap();
    assert_eq!(pulled.format, Format::ImageTar);
    assert!(pulled.module == module, "plugin.wasm differs from the module put in the tar");
    assert_eq!(
        (pulled.module_digest.as_str(), pulled.layer_digest.as_str()),
        (sha256(&module).as_str(), layer_digest.as_str())
    );

    // And OCI's media types.
    let target = registry.reference("images/oci:v1");
    oras(json!({
        "op": "raw", "target": target,
        "manifestMediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": [config, "application/vnd.oci.image.config.v1+json"],
        "layers": [[layer, "application/vnd.oci.image.layer.v1.tar+gzip"]],
    }));
    let pulled = oci.pull(&target.parse().unwrap(), PullPolicy::Always, None).await.unwrap();
    assert!(pulled.module == module && pulled.format == Format::ImageTar);
}

#[tokio::test]
async fn artifacts_that_are_not_wasm_plugins_are_refused_with_their_media_types() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));

    let readme = write(scratch.path(), "README.md", b"# not a plugin\n");
    let config = write(scratch.path(), "acme.json", b"{}");
    let target = registry.reference("other/docs:v1");
    oras(
        json!({"op": "push", "target": target, "files": [[readme, "text/markdown"]], "config": [config, "application/vnd.acme.config.v1+json"]}),
    );
    let error = oci.pull(&target.parse().unwrap(), PullPolicy::Always, None).await.unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, OciError::UnsupportedFormat { .. }), "{message}");
    assert!(message.contains("text/markdown") && message.contains("application/vnd.acme.config.v1+json"), "{message}");

    // A Wasm layer holding a core module, not a component.
    let core = write(scratch.path(), "core.wasm", b"\0asm\x01\0\0\0");
    let target = registry.reference("other/core:v1");
    oras(
        json!({"op": "push", "target": target, "files": [[core, "application/wasm"]], "config": [config, CNCF_CONFIG]}),
    );
    let error = oci.pull(&target.parse().unwrap(), PullPolicy::Always, None).await.unwrap_err();
    assert!(matches!(error, OciError::NotAComponent(_)), "{error}");
    assert!(error.to_string().contains("core WebAssembly module"), "{error}");

    // The CLI says the same.
    let output = sluice(scratch.path(), &["pull", &registry.reference("other/docs:v1"), "-o", "/dev/null"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("text/markdown"), "{}", text(&output.stderr));
}

#[tokio::test]
async fn push_refuses_files_that_are_not_components() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let core = write(scratch.path(), "core.wasm", b"\0asm\x01\0\0\0");
    let script = write(scratch.path(), "script.sh", b"#!/bin/sh\necho hi\n");
    for (file, expected) in [(&core, "core WebAssembly module"), (&script, "not a WebAssembly component")] {
        let output = sluice(scratch.path(), &["push", file, &registry.reference("refused/x:v1")]);
        assert!(!output.status.success(), "{file} was pushed");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(expected), "{file}: {stderr}");
    }
    assert_eq!(registry.requests("PUT", "/manifests/"), 0, "a manifest was uploaded");
    assert_eq!(registry.requests("POST", "/blobs/uploads"), 0, "an upload was started");
}

#[tokio::test]
async fn basic_auth_credentials_are_used_and_bad_ones_are_unauthorized() {
    let registry = Registry::start_with_basic_auth("plugin-ci", "correct horse");
    let scratch = TempDir::new().unwrap();
    let module = plugin();
    let target = reference(&registry, "private/filter:v1");

    let with_credentials = |name: &str, credentials: Credentials| {
        let cache = scratch.path().join(format!("cache-{name}"));
        std::fs::create_dir_all(&cache).unwrap();
        let mut options = options(&cache);
        options.credentials = credentials;
        sluice_oci::Registry::new(options).unwrap()
    };
    // A username:password file names no registry: it is bound to this one.
    let bound = |file: String| Credentials {
        credentials_file: Some(file.into()),
        registries: vec![registry.host()],
        ..Credentials::default()
    };
    let password_file = write(scratch.path(), "userpass", b"plugin-ci:correct horse\n");
    let good = with_credentials("good", bound(password_file));
    push(&good, &module, &target).await;
    assert!(good.pull(&target, PullPolicy::Always, None).await.unwrap().module == module);

    let wrong_file = write(scratch.path(), "wrong", b"plugin-ci:battery staple\n");
    let wrong = with_credentials("wrong", bound(wrong_file));
    let anonymous = with_credentials(
        "anonymous",
        Credentials { docker_config: Some(scratch.path().join("none.json")), ..Credentials::default() },
    );
    std::fs::write(scratch.path().join("none.json"), "{}").unwrap();
    for (who, oci) in [("wrong password", &wrong), ("anonymous", &anonymous)] {
        let error = oci.pull(&target, PullPolicy::Always, None).await.unwrap_err();
        assert!(matches!(error, OciError::Unauthorized { .. }), "{who}: {error}");
        assert!(!error.is_transient(), "{who}: an auth failure is not worth retrying");
        let error = oci.push(module.clone(), &target, BTreeMap::new(), None).await.unwrap_err();
        assert!(matches!(error, OciError::Unauthorized { .. }), "{who} push: {error}");
    }

    // The CLI with a docker config.json, as `docker login` writes it.
    let docker_dir = scratch.path().join("docker-login");
    std::fs::create_dir_all(&docker_dir).unwrap();
    let auth = base64("plugin-ci:correct horse");
    let docker_config =
        write(&docker_dir, "config.json", json!({"auths": {registry.host(): {"auth": auth}}}).to_string().as_bytes());
    let output =
        sluice(scratch.path(), &["pull", &target.to_string(), "-o", "/dev/null", "--docker-config", &docker_config]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = sluice(scratch.path(), &["pull", &target.to_string(), "-o", "/dev/null"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("not authorized"), "{}", text(&output.stderr));
}

#[tokio::test]
async fn an_oversized_module_is_refused_and_not_cached() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let module = plugin();
    let target = reference(&registry, "big/filter:v1");
    push(&client(&scratch.path().join("pusher")), &module, &target).await;

    let cache = scratch.path().join("small");
    std::fs::create_dir_all(&cache).unwrap();
    let mut limited = options(&cache);
    limited.max_module_bytes = module.len() as u64 - 1;
    let oci = sluice_oci::Registry::new(limited).unwrap();
    let blob_gets = registry.requests("GET", "/blobs/");
    match oci.pull(&target, PullPolicy::Always, None).await {
        Err(OciError::TooLarge { size, max }) => {
            assert_eq!((size, max), (module.len() as u64, module.len() as u64 - 1))
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(registry.requests("GET", "/blobs/"), blob_gets, "refused on the descriptor size, before downloading");
    assert_eq!(std::fs::read_dir(cache.join("blobs/sha256")).unwrap().count(), 0, "nothing cached");
}

#[tokio::test]
async fn a_restart_with_the_registry_down_serves_the_cached_module() {
    let mut registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let cache = scratch.path().join("cache");
    let module = plugin();
    let tag = reference(&registry, "plugins/steady:v1");
    push(&client(&cache), &module, &tag).await;
    let first = client(&cache).pull(&tag, PullPolicy::Always, None).await.unwrap();
    assert_eq!(first.origin, Origin::Registry);

    registry.kill();
    // A new process: nothing in memory, only the disk cache.
    let restarted = client(&cache);
    let stale = restarted.pull(&tag, PullPolicy::Always, None).await.unwrap();
    assert_eq!(stale.origin, Origin::StaleCache);
    assert!(stale.module == module && stale.manifest_digest == first.manifest_digest);
    let cached = restarted.pull(&tag, PullPolicy::IfNotPresent, None).await.unwrap();
    assert_eq!(cached.origin, Origin::Cache);

    // Something never pulled cannot be served: a transient error, to retry.
    let unknown = reference(&registry, "plugins/never:v1");
    let error = restarted.pull(&unknown, PullPolicy::IfNotPresent, None).await.unwrap_err();
    assert!(error.is_transient(), "{error}");
    assert!(matches!(error, OciError::Unreachable { .. }), "{error}");

    registry.restart();
    let back = restarted.pull(&tag, PullPolicy::Always, None).await.unwrap();
    assert_eq!(back.origin, Origin::Registry);
}

#[tokio::test]
async fn concurrent_pulls_download_each_blob_once() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let module = variant(&plugin(), "sluice-test-bulk", 4 << 20);
    let tag = reference(&registry, "plugins/popular:v1");
    let pushed = push(&client(&scratch.path().join("pusher")), &module, &tag).await;
    let by_digest = tag.with_digest(&pushed.manifest_digest);

    let oci = client(&scratch.path().join("cache"));
    let pulls = (0..8).map(|i| {
        let (oci, reference) = (oci.clone(), if i % 2 == 0 { tag.clone() } else { by_digest.clone() });
        tokio::spawn(async move { oci.pull(&reference, PullPolicy::Always, None).await })
    });
    let results: Vec<Pulled> =
        futures_util::future::join_all(pulls).await.into_iter().map(|r| r.unwrap().unwrap()).collect();
    assert!(results.iter().all(|p| p.module == module), "a pull returned other bytes");
    let blob = format!("/blobs/{}", pushed.layer_digest);
    assert_eq!(registry.requests("GET", &blob), 1, "8 concurrent pulls fetched the blob more than once");
}

#[tokio::test]
async fn a_tampered_blob_in_the_registry_is_refused() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let module = plugin();
    let tag = reference(&registry, "plugins/tampered:v1");
    let pushed = push(&client(&scratch.path().join("pusher")), &module, &tag).await;

    // Flip one byte in the registry's own copy (distribution's on-disk layout).
    let hex = pushed.layer_digest.trim_start_matches("sha256:");
    let data = registry.storage_dir().join(format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]));
    let mut bytes = std::fs::read(&data).unwrap_or_else(|e| panic!("{}: {e}", data.display()));
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();

    let cache = scratch.path().join("cache");
    let error = client(&cache).pull(&tag, PullPolicy::Always, None).await.unwrap_err();
    match &error {
        OciError::DigestMismatch { expected, actual, .. } => {
            assert_eq!(expected, &pushed.layer_digest);
            assert_eq!(actual, &sha256(&bytes));
        }
        other => panic!("expected DigestMismatch, got {other}"),
    }
    assert_eq!(std::fs::read_dir(cache.join("blobs/sha256")).unwrap().count(), 0, "tampered bytes were cached");
}

#[tokio::test]
async fn sluice_pushed_artifacts_pull_byte_equal_with_oras() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let module = plugin();
    let file = write(scratch.path(), "add-header.wasm", &module);
    let target = registry.reference("plugins/interop:v1");
    let output = sluice(scratch.path(), &["push", &file, &target]);
    assert!(output.status.success(), "{}", text(&output.stderr));

    let manifest = oras(json!({"op": "manifest", "target": target}));
    assert_eq!(manifest["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(manifest["config"]["mediaType"], CNCF_CONFIG);
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");

    let outdir = scratch.path().join("oras-out");
    std::fs::create_dir_all(&outdir).unwrap();
    let files = oras(json!({"op": "pull", "target": target, "outdir": outdir}));
    let files = files.as_array().expect("oras lists the pulled files");
    assert_eq!(files.len(), 1, "{files:?}");
    let pulled = std::fs::read(files[0].as_str().unwrap()).unwrap();
    assert!(pulled == module, "oras pulled other bytes than sluice pushed");
}

#[tokio::test]
async fn an_index_resolves_to_its_wasm_entry() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));
    let module = plugin();
    let wasm_ref = reference(&registry, "multi/filter:wasm");
    push(&oci, &module, &wasm_ref).await;
    let linux = write(scratch.path(), "binary", b"\x7fELF not really");
    let config = write(scratch.path(), "config.json", b"{}");
    let linux_ref = registry.reference("multi/filter:linux");
    oras(
        json!({"op": "push", "target": linux_ref, "files": [[linux, "application/vnd.oci.image.layer.v1.tar"]], "config": [config, "application/vnd.oci.image.config.v1+json"]}),
    );

    let index_ref = registry.reference("multi/filter:v1");
    let index = oras(json!({"op": "index", "target": index_ref, "entries": [
        {"ref": linux_ref, "platform": {"os": "linux", "architecture": "amd64"}},
        {"ref": wasm_ref.to_string(), "platform": {"os": "wasip2", "architecture": "wasm"}},
    ]}));
    let pulled = oci.pull(&index_ref.parse().unwrap(), PullPolicy::Always, None).await.unwrap();
    assert!(pulled.module == module, "the index resolved to the wrong entry");
    assert_eq!(pulled.manifest_digest, index["digest"].as_str().unwrap(), "the digest reported is the index's");
}

#[tokio::test]
async fn large_module_push_and_pull_times() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    // About the size of a componentize-py plugin.
    let module = variant(&plugin(), "sluice-test-large", 18 << 20);
    let tag = reference(&registry, "plugins/large:v1");
    let oci = client(&scratch.path().join("cache"));

    let started = Instant::now();
    let pushed = push(&oci, &module, &tag).await;
    let push_time = started.elapsed();
    let started = Instant::now();
    let pulled = oci.pull(&tag, PullPolicy::Always, None).await.unwrap();
    let pull_time = started.elapsed();
    let started = Instant::now();
    let cached = oci.pull(&tag, PullPolicy::IfNotPresent, None).await.unwrap();
    let cached_time = started.elapsed();
    assert!(pulled.module == module && cached.module == module);
    assert_eq!((pulled.origin, cached.origin), (Origin::Registry, Origin::Cache));
    assert_eq!(pushed.layer_digest, sha256(&module));
    eprintln!(
        "library, {:.1} MB module: push {push_time:?}, pull {pull_time:?}, cached pull {cached_time:?}",
        module.len() as f64 / 1e6
    );
}

/// The pin a pull accepts is the pin the plugin runtime accepts at load, in
/// every layout: for an image tar, the digest of plugin.wasm, not of the layer.
#[tokio::test]
async fn a_pin_means_the_module_digest_at_pull_and_at_load_in_every_layout() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let oci = client(&scratch.path().join("cache"));
    let module = plugin();
    let layer = image_layer(scratch.path(), &module);
    let layer_digest = sha256(&std::fs::read(&layer).unwrap());
    let config = write(scratch.path(), "image-config.json", b"{\"architecture\":\"amd64\",\"os\":\"linux\"}");
    let image = registry.reference("pins/image:v1");
    oras(json!({
        "op": "raw", "target": image,
        "manifestMediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": [config, "application/vnd.oci.image.config.v1+json"],
        "layers": [[layer, "application/vnd.oci.image.layer.v1.tar+gzip"]],
    }));
    let cncf = reference(&registry, "pins/cncf:v1");
    push(&oci, &module, &cncf).await;

    let runtime =
        sluice_runtime::Runtime::new(sluice_runtime::RuntimeConfig { max_instances: 10, ..Default::default() })
            .expect("a plugin runtime");
    let cases = [
        (image.clone(), sha256(&module), "image tar, module digest"),
        (image.clone(), layer_digest.clone(), "image tar, layer digest"),
        (cncf.to_string(), sha256(&module), "cncf, module (= layer) digest"),
        (cncf.to_string(), sha256(b"something else"), "cncf, another digest"),
    ];
    for (target, pin, what) in cases {
        let pulled = oci.pull(&target.parse().unwrap(), PullPolicy::Always, Some(&pin)).await;
        // The gateway hands the declaration's pin (bare hex) to the runtime.
        let loaded = runtime.load(module.clone(), Some(pin.trim_start_matches("sha256:"))).await;
        assert_eq!(
            pulled.is_ok(),
            loaded.is_ok(),
            "{what}: pull says {:?}, load says {:?}",
            pulled.as_ref().map(|p| &p.module_digest).map_err(ToString::to_string),
            loaded.as_ref().map(|_| ()).map_err(ToString::to_string)
        );
        if let Err(error) = pulled
            && pin == layer_digest
        {
            assert!(error.to_string().contains(&sha256(&module)), "{what}: name the module digest: {error}");
        }
    }
}

/// Image layers built to hurt, by Python's tarfile: each is a small blob in
/// a real registry that unpacks to far more than a plugin needs.
const TAR_BOMB_SCRIPT: &str = r#"
import io, sys, tarfile
kind, path, module = sys.argv[1], sys.argv[2], open(sys.argv[3], "rb").read()

class Zeros:
    def __init__(self, n): self.left = n
    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)

def add(t, name, data, size=None, pax=None):
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    if pax: info.pax_headers = pax
    t.addfile(info, io.BytesIO(data) if size is None else data)

if kind == "padding":
    # 256 MiB of zeros before plugin.wasm: about 256 KiB gzipped.
    with tarfile.open(path, "w:gz", compresslevel=1) as t:
        add(t, "padding", Zeros(256 << 20), size=256 << 20)
        add(t, "plugin.wasm", module)
elif kind == "pax":
    # An 8 MiB PAX record on plugin.wasm itself, in a plain tar.
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as t:
        add(t, "plugin.wasm", module, pax={"comment": "x" * (8 << 20)})
elif kind == "longname":
    # An 8 MiB GNU long name before plugin.wasm.
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as t:
        add(t, "d/" * (4 << 20) + "f", b"x")
        add(t, "plugin.wasm", module)
"#;

/// Decompression bombs in an image layer: the unpacked tar is capped (the
/// module limit plus a little room), and so are PAX and GNU long-name
/// entries (1 MiB, as Go's archive/tar), while the layer streams.
#[tokio::test]
async fn decompression_bombs_in_an_image_layer_are_refused() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let cache = scratch.path().join("cache");
    let oci = client(&cache);
    let wasm = write(scratch.path(), "plugin.wasm", &plugin());
    let config = write(scratch.path(), "image-config.json", b"{\"architecture\":\"amd64\",\"os\":\"linux\"}");
    let cases = [
        ("padding", "application/vnd.oci.image.layer.v1.tar+gzip", "decompressed image layer"),
        ("pax", "application/vnd.oci.image.layer.v1.tar", "PAX header"),
        ("longname", "application/vnd.oci.image.layer.v1.tar+gzip", "GNU long name"),
    ];
    let mut accepted = Vec::new();
    for (kind, media_type, what) in cases {
        let layer = scratch.path().join(format!("{kind}.tar"));
        let status = Command::new(sluice_tests::tools_python())
            .args(["-c", TAR_BOMB_SCRIPT, kind])
            .arg(&layer)
            .arg(&wasm)
            .status()
            .unwrap();
        assert!(status.success(), "building the {kind} layer");
        let size = std::fs::metadata(&layer).unwrap().len();
        assert!(size < 16 << 20, "{kind}: the layer itself is small ({size} bytes)");
        let target = registry.reference(&format!("bombs/{kind}:v1"));
        oras(json!({
            "op": "raw", "target": target,
            "manifestMediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": [config, "application/vnd.oci.image.config.v1+json"],
            "layers": [[layer, media_type]],
        }));
        match oci.pull(&target.parse().unwrap(), PullPolicy::Always, None).await {
            Ok(pulled) => accepted.push(format!("{kind} ({} byte module)", pulled.module.len())),
            Err(error) => {
                let message = error.to_string();
                assert!(message.contains(what) && message.contains("over the limit of"), "{kind}: {message}");
            }
        }
    }
    assert!(accepted.is_empty(), "bombs accepted: {accepted:?}");
    assert_eq!(std::fs::read_dir(cache.join("blobs/sha256")).unwrap().count(), 0, "a bomb's module was cached");
}

/// A missing artifact is an everyday answer, not a crash: one `Error:` line
/// with the cause chain, exit code 1, and no backtrace even where the shell
/// sets RUST_BACKTRACE (symbolising one took a failed pull to 130 MiB).
#[tokio::test]
async fn a_failed_pull_prints_the_cause_without_a_backtrace() {
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let missing = registry.reference("plugins/nothing-here:v1");
    let out = scratch.path().join("out.wasm");
    let output = Command::new(sluice_tests::sluice_binary())
        .args(["pull", &missing, "-o", out.to_str().unwrap()])
        .env("SLUICE_OCI_CACHE_DIR", scratch.path().join("cli-cache"))
        .env("DOCKER_CONFIG", scratch.path())
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("running sluice");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let error_lines: Vec<&str> = stderr.lines().filter(|line| line.starts_with("Error: ")).collect();
    assert_eq!(error_lines.len(), 1, "{stderr}");
    assert!(error_lines[0].contains("nothing-here"), "the error names the artifact: {stderr}");
    assert!(!stderr.contains("backtrace"), "no backtrace for an ordinary error: {stderr}");
    assert!(!out.exists(), "nothing written for a failed pull");
}
