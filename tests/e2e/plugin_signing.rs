//! Signed plugins (`spec.verify`), against the real cosign CLI, a real
//! registry (`docker-registry`) and the real gateway: what `cosign sign
//! --key` writes is verified and served; what `sluice push --sign` and
//! `sluice sign` write, `cosign verify --key` accepts; a plugin that is
//! unsigned, signed by another key, or carries a signature made for another
//! manifest is refused with its own reason, while the last good version
//! keeps serving; and the cache serves a module only under the keys that
//! verify it now.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use sluice_oci::{Reference, RegistryOptions};
use sluice_tests::{
    ConfigDir, Cosign, Echo, Gateway, Options, Plugin, Registry, Route, documents, eventually, plugin_wasm,
    sluice_binary,
};

const RELOAD: Duration = Duration::from_secs(20);

fn module(name: &str) -> Vec<u8> {
    std::fs::read(plugin_wasm(name)).expect("reading a built plugin")
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

/// Pushes `module` to `reference` with the library client, unsigned;
/// returns the manifest digest.
async fn push(module: &[u8], reference: &str) -> String {
    let scratch = tempfile::tempdir().unwrap();
    let client = sluice_oci::Registry::new(RegistryOptions::new(scratch.path())).expect("an OCI client");
    let reference: Reference = reference.parse().expect("a valid reference");
    let pushed = client.push(module.to_vec(), &reference, Default::default(), None).await.expect("pushing");
    pushed.manifest_digest
}

/// `repo@digest` of a `host/repo:tag` reference.
fn by_digest(reference: &str, digest: &str) -> String {
    let repository = reference.rsplit_once(':').map_or(reference, |(repository, _)| repository);
    format!("{repository}@{digest}")
}

/// A GatewayPlugin from `reference` that must be signed by one of `keys`
/// (each a `verify.keys` entry).
fn signed_plugin(name: &str, reference: &str, keys: Value, policy: &str) -> String {
    let yaml = Plugin::oci(name, reference).pull_policy(policy).config(json!({})).yaml();
    format!("{yaml}  verify: {}\n", json!({ "keys": keys }))
}

fn key_file(path: &Path) -> Value {
    json!({"file": path.display().to_string()})
}

fn probe_route(echo: &Echo, plugins: &[&str]) -> String {
    Route::new("chat", &["gpt-test"], &echo.url()).plugins(plugins).yaml()
}

/// Whether the `probe` plugin (rather than `chaos`) answered.
async fn probe_served(gateway: &Gateway) -> bool {
    let reply = gateway.chat("gpt-test", &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.header("x-probe-served").is_some()
}

async fn admin_error(gateway: &Gateway, plugin: &str) -> Option<String> {
    let config = gateway.admin_config().await;
    config["errors"]
        .as_array()?
        .iter()
        .find(|e| e["resource"] == format!("GatewayPlugin default/{plugin}"))
        .and_then(|e| e["message"].as_str().map(str::to_string))
}

async fn admin_digest(gateway: &Gateway, plugin: &str) -> Value {
    let config = gateway.admin_config().await;
    let plugins = config["plugins"].as_array().cloned().unwrap_or_default();
    plugins.into_iter().find(|p| p["name"] == format!("default/{plugin}")).map_or(Value::Null, |p| p["digest"].clone())
}

async fn metric(gateway: &Gateway, series: &str) -> f64 {
    let text = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    text.lines().find_map(|line| line.strip_prefix(series)?.trim().parse().ok()).unwrap_or(0.0)
}

/// Runs the `sluice` CLI with `args`, `COSIGN_PASSWORD` set if given;
/// returns stdout, panicking with the output on failure.
async fn sluice(args: &[&str], password: Option<&str>) -> String {
    let mut command = tokio::process::Command::new(sluice_binary());
    command.args(args).env("NO_COLOR", "1").env_remove("COSIGN_PASSWORD").kill_on_drop(true);
    if let Some(password) = password {
        command.env("COSIGN_PASSWORD", password);
    }
    // Decrypting cosign's key runs scrypt at N = 65536 in a debug build:
    // seconds of CPU, more on a busy machine.
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("the sluice CLI finished in time")
        .expect("running sluice");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "sluice {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// A PKCS#8 PEM P-256 key pair from a fixed scalar, written to `dir`.
fn pkcs8_key_pair(dir: &Path, seed: &str) -> (PathBuf, PathBuf) {
    use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _, LineEnding};
    use sha2::Digest;
    let secret = p256::SecretKey::from_slice(&sha2::Sha256::digest(seed.as_bytes())).expect("a valid scalar");
    let (private, public) = (dir.join(format!("{seed}.pem")), dir.join(format!("{seed}.pub")));
    std::fs::write(&private, secret.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes()).unwrap();
    std::fs::write(&public, secret.public_key().to_public_key_pem(LineEnding::LF).unwrap()).unwrap();
    (private, public)
}

/// Copies the manifest at `from` to `to` in the same repository, byte for
/// byte, as anyone with push access to the registry could.
async fn copy_manifest(registry: &Registry, repository: &str, from: &str, to: &str) {
    let client = sluice_tests::Client::http1();
    let media_type = "application/vnd.oci.image.manifest.v1+json";
    let url = |reference: &str| format!("http://{}/v2/{repository}/manifests/{reference}", registry.host());
    let get = hyper::Request::get(url(from)).header("accept", media_type).body(sluice_tests::empty()).unwrap();
    let manifest = client.send(get).await;
    assert_eq!(manifest.status, 200, "GET {from}: {}", manifest.text());
    let body = http_body_util::Full::new(Bytes::from(manifest.body.to_vec())).map_err(|never| match never {}).boxed();
    let put = hyper::Request::put(url(to)).header("content-type", media_type).body(body).unwrap();
    let stored = client.send(put).await;
    assert_eq!(stored.status, 201, "PUT {to}: {}", stored.text());
}

fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

#[tokio::test]
async fn a_plugin_signed_by_cosign_is_served_and_sluices_signatures_satisfy_cosign() {
    let registry = Registry::start();
    let echo = Echo::start().await;
    let cosign = Cosign::new();
    let team = cosign.generate_key_pair("team", "correct horse").await;
    let keys = tempfile::tempdir().unwrap();
    let (pkcs8_private, pkcs8_public) = pkcs8_key_pair(keys.path(), "release");

    // Signed by the real cosign, by digest.
    let probe = registry.reference("plugins/probe:v1");
    let digest = push(&module("probe"), &probe).await;
    cosign.sign(&team, &by_digest(&probe, &digest)).await.assert_success("cosign sign");
    cosign.verify(&team.public, &probe).await.assert_success("cosign verify of cosign's own signature");

    let dir = ConfigDir::new();
    dir.write("plugin.yaml", &signed_plugin("probe", &probe, json!([key_file(&team.public)]), "IfNotPresent"));
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let gateway = Gateway::start_with(&dir, Options::default()).await;
    assert_eq!(admin_error(&gateway, "probe").await, None);
    assert!(probe_served(&gateway).await, "the cosign-signed plugin is served");
    assert!(metric(&gateway, r#"sluice_oci_pulls_total{result="pulled"}"#).await >= 1.0);
    drop(gateway);

    // `sluice push --sign` with cosign's own encrypted key: cosign accepts it.
    let chaos = registry.reference("plugins/chaos:v1");
    let wasm = plugin_wasm("chaos").display().to_string();
    let key = team.private.display().to_string();
    let out = sluice(&["push", &wasm, &chaos, "--sign", &key], Some(&team.password)).await;
    assert!(out.contains(&format!("signature {}", registry.reference("plugins/chaos:sha256-"))), "{out}");
    cosign.verify(&team.public, &chaos).await.assert_success("cosign verify of `sluice push --sign`");

    // With a plain PKCS#8 key: cosign accepts it too, under that key only.
    let add_header = registry.reference("plugins/add-header:v1");
    let wasm = plugin_wasm("add-header").display().to_string();
    let key = pkcs8_private.display().to_string();
    sluice(&["push", &wasm, &add_header, "--sign", &key], None).await;
    cosign.verify(&pkcs8_public, &add_header).await.assert_success("cosign verify of a PKCS#8-signed push");
    let other_key = cosign.verify(&team.public, &add_header).await;
    assert!(!other_key.success, "cosign accepted another key's signature:\n{}", other_key.stderr);

    // `sluice sign` adds a signature next to cosign's: both keys verify.
    let key = pkcs8_private.display().to_string();
    sluice(&["sign", &probe, "--key", &key], None).await;
    cosign.verify(&pkcs8_public, &probe).await.assert_success("cosign verify of `sluice sign`");
    cosign.verify(&team.public, &probe).await.assert_success("cosign's own signature is kept");
    // And `sluice pull --verify-key` reads them the way the gateway does.
    let scratch = tempfile::tempdir().unwrap();
    let output = scratch.path().join("m.wasm").display().to_string();
    let public = pkcs8_public.display().to_string();
    sluice(&["pull", &probe, "-o", &output, "--verify-key", &public], None).await;
    assert_eq!(std::fs::read(&output).unwrap(), module("probe"));
}

#[tokio::test]
async fn unsigned_wrongly_signed_and_misdirected_plugins_are_refused_each_for_its_reason() {
    let registry = Registry::start();
    let echo = Echo::start().await;
    let cosign = Cosign::new();
    let team = cosign.generate_key_pair("team", "pw-team").await;
    let stranger = cosign.generate_key_pair("stranger", "pw-stranger").await;

    // No signature at all.
    let unsigned = registry.reference("plugins/unsigned:v1");
    let unsigned_digest = push(&module("probe"), &unsigned).await;
    // Signed, but by a key the plugin does not list.
    let wrong_key = registry.reference("plugins/wrong-key:v1");
    let digest = push(&module("probe"), &wrong_key).await;
    cosign.sign(&stranger, &by_digest(&wrong_key, &digest)).await.assert_success("cosign sign");
    // A valid signature by the right key, made for another artifact and
    // copied onto this one's signature tag.
    let repository = "plugins/copied";
    let genuine = registry.reference(&format!("{repository}:genuine"));
    let genuine_digest = push(&module("add-header"), &genuine).await;
    cosign.sign(&team, &by_digest(&genuine, &genuine_digest)).await.assert_success("cosign sign");
    let copied = registry.reference(&format!("{repository}:v1"));
    let copied_digest = push(&module("probe"), &copied).await;
    copy_manifest(&registry, repository, &signature_tag(&genuine_digest), &signature_tag(&copied_digest)).await;
    // Any of two keys: only the second one signed it.
    let second_key = registry.reference("plugins/second-key:v1");
    let digest = push(&module("probe"), &second_key).await;
    cosign.sign(&team, &by_digest(&second_key, &digest)).await.assert_success("cosign sign");

    let dir = ConfigDir::new();
    let team_key = || json!([key_file(&team.public)]);
    dir.write(
        "plugins.yaml",
        &documents(&[
            signed_plugin("unsigned", &unsigned, team_key(), "IfNotPresent"),
            signed_plugin("wrong-key", &wrong_key, team_key(), "IfNotPresent"),
            signed_plugin("copied", &copied, team_key(), "IfNotPresent"),
            signed_plugin(
                "probe",
                &second_key,
                json!([key_file(&stranger.public), {"pem": std::fs::read_to_string(&team.public).unwrap()}]),
                "IfNotPresent",
            ),
        ]),
    );
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let gateway = Gateway::start_with(&dir, Options::default()).await;

    let error = admin_error(&gateway, "unsigned").await.expect("the unsigned plugin is refused");
    assert!(error.contains("no cosign signature") && error.contains(&signature_tag(&unsigned_digest)), "{error}");
    let error = admin_error(&gateway, "wrong-key").await.expect("the wrongly signed plugin is refused");
    assert!(error.contains("no signature verifies under the configured keys"), "{error}");
    let error = admin_error(&gateway, "copied").await.expect("the copied signature is refused");
    assert!(error.contains("the signatures are for another manifest") && error.contains(&genuine_digest), "{error}");
    for refused in ["unsigned", "wrong-key", "copied"] {
        assert_eq!(admin_digest(&gateway, refused).await, Value::Null, "{refused} was loaded");
    }
    assert_eq!(metric(&gateway, r#"sluice_oci_pulls_total{result="signature_refused"}"#).await, 3.0);
    // The second of two keys verifies: served.
    assert_eq!(admin_error(&gateway, "probe").await, None);
    assert!(probe_served(&gateway).await, "a plugin signed by the second of its keys is served");
    assert!(gateway.wait_for_log("no cosign signature").await, "the refusal is logged");
}

#[tokio::test]
async fn a_tag_moved_to_an_unsigned_manifest_is_refused_and_the_last_good_version_keeps_serving() {
    let registry = Registry::start();
    let echo = Echo::start().await;
    let cosign = Cosign::new();
    let team = cosign.generate_key_pair("team", "pw").await;
    let reference = registry.reference("plugins/probe:stable");
    let good = push(&module("probe"), &reference).await;
    cosign.sign(&team, &by_digest(&reference, &good)).await.assert_success("cosign sign");

    let dir = ConfigDir::new();
    dir.write("plugin.yaml", &signed_plugin("probe", &reference, json!([key_file(&team.public)]), "Always"));
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let options = Options { args: vec!["--oci-resync-seconds".into(), "1".into()], ..Options::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    assert!(probe_served(&gateway).await);
    let good_module = sha256(&module("probe"));
    assert_eq!(admin_digest(&gateway, "probe").await, good_module);

    // The tag moves to another manifest nobody signed.
    let moved = push(&module("chaos"), &reference).await;
    let error = eventually("the moved tag to be refused", RELOAD, async || admin_error(&gateway, "probe").await).await;
    assert!(error.contains("no cosign signature") && error.contains(&signature_tag(&moved)), "{error}");
    assert!(error.contains(&format!("still serving the last good version {good_module}")), "{error}");
    for _ in 0..5 {
        assert!(probe_served(&gateway).await, "the last good version stopped serving");
    }

    // Now the moved tag is signed with a key the plugin does not list.
    let stranger = cosign.generate_key_pair("stranger", "pw2").await;
    cosign.sign(&stranger, &by_digest(&reference, &moved)).await.assert_success("cosign sign");
    eventually("the wrong key to be reported", RELOAD, async || {
        let error = admin_error(&gateway, "probe").await?;
        error.contains("no signature verifies under the configured keys").then_some(())
    })
    .await;
    assert!(probe_served(&gateway).await, "the last good version stopped serving");

    // Signed with the plugin's key: the new version is served.
    cosign.sign(&team, &by_digest(&reference, &moved)).await.assert_success("cosign sign");
    let chaos_module = sha256(&module("chaos"));
    eventually("the signed new version to be served", RELOAD, async || {
        (admin_digest(&gateway, "probe").await == chaos_module).then_some(())
    })
    .await;
    assert!(!probe_served(&gateway).await);
}

#[tokio::test]
async fn the_cache_serves_a_module_only_under_keys_that_verify_it_now() {
    let mut registry = Registry::start();
    let echo = Echo::start().await;
    let cosign = Cosign::new();
    let team = cosign.generate_key_pair("team", "pw").await;
    let other = cosign.generate_key_pair("other", "pw").await;
    let reference = registry.reference("plugins/probe:v1");
    let digest = push(&module("probe"), &reference).await;
    cosign.sign(&team, &by_digest(&reference, &digest)).await.assert_success("cosign sign");
    let oci_cache = tempfile::tempdir().unwrap();
    let options = Options { oci_cache_dir: Some(oci_cache.path().to_path_buf()), ..Options::default() };

    let dir = ConfigDir::new();
    let with_key = |key: &Path| signed_plugin("probe", &reference, json!([key_file(key)]), "IfNotPresent");
    dir.write("plugin.yaml", &with_key(&team.public));
    dir.write("route.yaml", &probe_route(&echo, &["probe"]));
    let gateway = Gateway::start_with(&dir, options.clone()).await;
    assert!(probe_served(&gateway).await);
    drop(gateway);

    // The registry is gone. Under the same key the cached signature verifies
    // again, and the cached module is served.
    registry.kill();
    let gateway = Gateway::start_with(&dir, options.clone()).await;
    assert_eq!(admin_error(&gateway, "probe").await, None);
    assert!(probe_served(&gateway).await, "the cached, verified module is served with the registry down");
    drop(gateway);

    // Under another key nothing in the cache verifies, and the registry
    // cannot be asked: the module is not served.
    dir.write("plugin.yaml", &with_key(&other.public));
    // Not ready: a registry that may come back is waited for.
    let gateway = Gateway::start_live(&dir, options.clone()).await;
    let error =
        eventually("the cached module to be refused", RELOAD, async || admin_error(&gateway, "probe").await).await;
    assert!(error.contains("unreachable"), "{error}");
    assert_eq!(admin_digest(&gateway, "probe").await, Value::Null);
    let refusal = "the cached module's signature does not verify under the current keys";
    assert!(gateway.wait_for_log(refusal).await, "the refusal is logged");
    drop(gateway);

    // Without a signature record the cache serves nothing under a key either.
    let records = oci_cache.path().join("signatures/sha256");
    for entry in std::fs::read_dir(&records).expect("the cache keeps signature records") {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }
    dir.write("plugin.yaml", &with_key(&team.public));
    let gateway = Gateway::start_live(&dir, options).await;
    let error =
        eventually("the unproven cached module to be refused", RELOAD, async || admin_error(&gateway, "probe").await)
            .await;
    assert!(error.contains("unreachable"), "{error}");
    assert_eq!(admin_digest(&gateway, "probe").await, Value::Null, "a module without its signature record was served");
}

/// The `status` condition `type_` of a resource, as (status, reason).
fn condition(object: &Value, type_: &str) -> Option<(String, String)> {
    let conditions = object["status"]["conditions"].as_array()?;
    let found = conditions.iter().find(|c| c["type"] == type_)?;
    Some((found["status"].as_str()?.to_string(), found["reason"].as_str()?.to_string()))
}

#[tokio::test]
async fn in_kubernetes_a_key_from_a_secret_verifies_and_refusals_show_in_status() {
    let (cluster, ns) = crate::kubernetes::cluster_with_namespace("signing").await;
    let registry = Registry::start();
    let echo = Echo::start().await;
    let cosign = Cosign::new();
    let team = cosign.generate_key_pair("team", "pw").await;
    let stranger = cosign.generate_key_pair("stranger", "pw").await;
    let v1 = registry.reference("plugins/p:v1");
    let digest = push(&module("probe"), &v1).await;
    cosign.sign(&team, &by_digest(&v1, &digest)).await.assert_success("cosign sign");
    let v2 = registry.reference("plugins/p:v2");
    let unsigned = push(&module("chaos"), &v2).await;
    let gateway = Gateway::start_kubernetes(cluster.kubeconfig(), &ns, "replica-a", Options::default()).await;

    let secret = |public: &Path| {
        let pem: String = std::fs::read_to_string(public).unwrap().lines().map(|l| format!("    {l}\n")).collect();
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: cosign\n  namespace: {ns}\nstringData:\n  cosign.pub: |\n{pem}"
        )
    };
    let plugin = |reference: &str| {
        format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: GatewayPlugin\nmetadata:\n  name: p\n  namespace: {ns}\nspec:\n  \
             source:\n    oci: {reference}\n  config: {{}}\n  verify:\n    keys:\n    - secretRef: {{name: cosign, key: cosign.pub}}\n"
        )
    };
    cluster.apply(&secret(&team.public)).await;
    cluster.apply(&plugin(&v1)).await;
    cluster
        .apply(&format!(
            "apiVersion: sluice.dev/v1alpha1\nkind: AIModelRoute\nmetadata:\n  name: chat\n  namespace: {ns}\nspec:\n  \
             models: [gpt-signed]\n  backends:\n  - url: {}\n  plugins:\n  - name: p\n",
            echo.url()
        ))
        .await;
    let probe_module = sha256(&module("probe"));
    let status = async |what: &str, check: &dyn Fn(&Value) -> bool| {
        eventually(what, Duration::from_secs(60), async || {
            let out = cluster.kubectl_ok(&["get", "gatewayplugin", "p", "-n", &ns, "-o", "json"]).await;
            let object: Value = serde_json::from_str(&out).expect("kubectl get -o json");
            let current = object["status"]["observedGeneration"] == object["metadata"]["generation"];
            (current && check(&object)).then_some(object)
        })
        .await
    };
    status("v1 Ready under the Secret's key", &|p| {
        condition(p, "Ready") == Some(("True".into(), "Loaded".into())) && p["status"]["digest"] == probe_module
    })
    .await;
    let probed = async || gateway.chat("gpt-signed", &[]).await.header("x-probe-served").is_some();
    // The route may be applied a moment after the plugin's status says Ready.
    eventually("the signed plugin to serve", Duration::from_secs(60), async || probed().await.then_some(())).await;

    // The Secret now holds another key: v1 is no longer verified, and the
    // module already loaded keeps serving.
    cluster.apply(&secret(&stranger.public)).await;
    let refused =
        status("SignatureInvalid", &|p| condition(p, "Ready").is_some_and(|c| c.1 == "SignatureInvalid")).await;
    assert_eq!(condition(&refused, "Ready").unwrap().0, "False");
    assert_eq!(refused["status"]["digest"], probe_module, "the last good module is the one served");
    assert!(probed().await, "the last good version still serves");

    // Back to the team's key, and repointed to an unsigned manifest.
    cluster.apply(&secret(&team.public)).await;
    cluster.apply(&plugin(&v2)).await;
    let refused =
        status("SignatureMissing", &|p| condition(p, "Ready").is_some_and(|c| c.1 == "SignatureMissing")).await;
    let message = refused["status"]["conditions"].to_string();
    assert!(message.contains(&signature_tag(&unsigned)), "{message}");
    assert!(probed().await, "the last good version still serves");
}
