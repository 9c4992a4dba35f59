//! Registries that lie, and artifacts built to hurt: digests that name paths,
//! bodies larger than declared, decompression bombs, credentials offered to
//! the wrong host. Against the real `sluice` binary and the `sluice-oci`
//! library; the real registry (Debian's `docker-registry`) wherever it will
//! store the artifact, and [`Liar`], a small HTTP server on loopback that
//! serves whatever a test tells it to, where it will not.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::{Value, json};
use sha2::Digest as _;
use sluice_oci::{Credentials, OciError, Origin, PullCredentials, PullPolicy, Reference, RegistryOptions};
use sluice_tests::Registry;
use tempfile::TempDir;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const CNCF_CONFIG: &str = "application/vnd.wasm.config.v0+json";

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn plugin() -> Vec<u8> {
    std::fs::read(sluice_tests::plugin_wasm("add-header")).expect("reading add-header.wasm")
}

/// One request as the liar saw it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

/// What the liar answers: a status, headers, and a body given whole or as
/// `len` repetitions of one byte (streamed, so a huge one costs no memory).
/// With `hide_length` the body has no Content-Length and ends when the
/// connection closes, so only a client that counts as it reads can stop it.
/// With `needs`, only a request with that `Authorization` gets the answer;
/// others get a 401 with the challenge.
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Body,
    hide_length: bool,
    needs: Option<(String, String)>,
}

#[derive(Clone)]
enum Body {
    Bytes(Arc<Vec<u8>>),
    Repeat { byte: u8, len: u64 },
}

impl Answer {
    fn json(media_type: &str, body: Vec<u8>) -> Answer {
        let digest = sha256(&body);
        Answer {
            status: 200,
            headers: vec![("Content-Type".into(), media_type.into()), ("Docker-Content-Digest".into(), digest)],
            body: Body::Bytes(Arc::new(body)),
            hide_length: false,
            needs: None,
        }
    }

    fn blob(body: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            headers: vec![("Content-Type".into(), "application/octet-stream".into())],
            body: Body::Bytes(Arc::new(body)),
            hide_length: false,
            needs: None,
        }
    }

    fn status(status: u16) -> Answer {
        Answer { status, headers: Vec::new(), body: Body::Bytes(Arc::new(Vec::new())), hide_length: false, needs: None }
    }

    /// `len` bytes of `byte` with status `status` and content type `media_type`.
    fn huge(status: u16, media_type: &str, len: u64, hide_length: bool) -> Answer {
        Answer {
            status,
            headers: vec![("Content-Type".into(), media_type.into())],
            body: Body::Repeat { byte: b' ', len },
            hide_length,
            needs: None,
        }
    }

    /// This answer only for `authorization`; `challenge` for anyone else.
    fn needing(self, authorization: &str, challenge: &str) -> Answer {
        Answer { needs: Some((authorization.into(), challenge.into())), ..self }
    }

    /// 401 with a `WWW-Authenticate` challenge.
    fn challenge(challenge: &str) -> Answer {
        Answer {
            status: 401,
            headers: vec![("WWW-Authenticate".into(), challenge.into())],
            body: Body::Bytes(Arc::new(br#"{"errors":[{"code":"UNAUTHORIZED","message":"log in"}]}"#.to_vec())),
            hide_length: false,
            needs: None,
        }
    }
}

/// A registry that serves what it is told: `answers` by exact request path
/// (or the path without its query), 200 on `/v2/`, 404 elsewhere. Records
/// every request, with its headers, and how many body bytes it sent per path.
struct Liar {
    addr: SocketAddr,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    sent: Arc<Mutex<HashMap<String, u64>>>,
}

impl Liar {
    fn start() -> Liar {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the liar");
        let addr = listener.local_addr().unwrap();
        let answers: Arc<Mutex<HashMap<String, Answer>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sent: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
        let (answers_in, seen_in, sent_in) = (answers.clone(), seen.clone(), sent.clone());
        // Detached: it dies with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (answers, seen, sent) = (answers_in.clone(), seen_in.clone(), sent_in.clone());
                std::thread::spawn(move || serve(stream, &answers, &seen, &sent));
            }
        });
        Liar { addr, answers, seen, sent }
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }

    fn answer(&self, path: &str, answer: Answer) {
        self.answers.lock().insert(path.to_string(), answer);
    }

    /// Serves `manifest` (JSON) for `repository:tag` and for its digest.
    fn manifest(&self, repository: &str, tag: &str, media_type: &str, manifest: &Value) -> String {
        self.manifest_needing(repository, tag, media_type, manifest, None)
    }

    /// [`Liar::manifest`], only for requests with `needs`' authorization.
    fn manifest_needing(
        &self,
        repository: &str,
        tag: &str,
        media_type: &str,
        manifest: &Value,
        needs: Option<(&str, &str)>,
    ) -> String {
        let guard = |answer: Answer| match needs {
            Some((authorization, challenge)) => answer.needing(authorization, challenge),
            None => answer,
        };
        let body = serde_json::to_vec(manifest).unwrap();
        let digest = sha256(&body);
        self.answer(&format!("/v2/{repository}/manifests/{tag}"), guard(Answer::json(media_type, body.clone())));
        self.answer(&format!("/v2/{repository}/manifests/{digest}"), guard(Answer::json(media_type, body)));
        digest
    }

    fn blob(&self, repository: &str, bytes: Vec<u8>) -> String {
        let digest = sha256(&bytes);
        self.answer(&format!("/v2/{repository}/blobs/{digest}"), Answer::blob(bytes));
        digest
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    /// Body bytes written so far for requests to `path` (query excluded).
    fn sent(&self, path: &str) -> u64 {
        self.sent.lock().get(path).copied().unwrap_or(0)
    }
}

fn serve(
    stream: TcpStream,
    answers: &Mutex<HashMap<String, Answer>>,
    seen: &Mutex<Vec<Seen>>,
    sent: &Mutex<HashMap<String, u64>>,
) {
    let mut reader = BufReader::new(stream.try_clone().expect("cloning a stream"));
    let mut stream = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, path) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let authorization = headers.get("authorization").cloned();
        seen.lock().push(Seen { method: method.clone(), path: path.clone(), headers });
        let bare = path.split('?').next().unwrap_or_default().to_string();
        let answer = {
            let answers = answers.lock();
            match answers.get(&path).or_else(|| answers.get(&bare)) {
                Some(answer) => answer.clone(),
                None if path == "/v2/" => Answer::status(200),
                None => Answer::status(404),
            }
        };
        let answer = match &answer.needs {
            Some((needed, challenge)) if authorization.as_ref() != Some(needed) => Answer::challenge(challenge),
            _ => answer,
        };
        let len = match &answer.body {
            Body::Bytes(bytes) => bytes.len() as u64,
            Body::Repeat { len, .. } => *len,
        };
        let mut head = format!("HTTP/1.1 {} X\r\n", answer.status);
        if answer.hide_length {
            head.push_str("Connection: close\r\n");
        } else {
            head.push_str(&format!("Content-Length: {len}\r\n"));
        }
        for (name, value) in &answer.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method != "HEAD" {
            let count = |n: usize| *sent.lock().entry(bare.clone()).or_default() += n as u64;
            let written = match &answer.body {
                Body::Bytes(bytes) => stream.write_all(bytes).map(|()| count(bytes.len())),
                Body::Repeat { byte, len } => {
                    let chunk = vec![*byte; 64 * 1024];
                    let mut left = *len;
                    let mut result = Ok(());
                    while left > 0 && result.is_ok() {
                        let n = left.min(chunk.len() as u64) as usize;
                        result = stream.write_all(&chunk[..n]).map(|()| count(n));
                        left -= n as u64;
                    }
                    result
                }
            };
            // The client hung up part way: that is what a limit looks like.
            if written.is_err() {
                return;
            }
        }
        if answer.hide_length {
            return;
        }
    }
}

/// Runs `sluice ARGS` with `cache` as its OCI cache and no ambient docker config.
fn sluice(scratch: &Path, cache: &Path, args: &[&str]) -> Output {
    let docker_config = scratch.join("docker-config");
    std::fs::create_dir_all(&docker_config).unwrap();
    Command::new(sluice_tests::sluice_binary())
        .args(args)
        .env("SLUICE_OCI_CACHE_DIR", cache)
        .env("DOCKER_CONFIG", &docker_config)
        .env("NO_COLOR", "1")
        .output()
        .expect("running sluice")
}

fn options(cache: &Path) -> RegistryOptions {
    std::fs::create_dir_all(cache).unwrap();
    let mut options = RegistryOptions::new(cache);
    let none = cache.join("no-docker-config.json");
    std::fs::write(&none, "{}").unwrap();
    options.credentials = Credentials { docker_config: Some(none), ..Credentials::default() };
    options
}

fn cncf_manifest(config: &str, config_size: usize, layer: &str, layer_size: usize) -> Value {
    json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": CNCF_CONFIG, "digest": config, "size": config_size},
        "layers": [{"mediaType": "application/wasm", "digest": layer, "size": layer_size}],
    })
}

/// A file outside the cache that a lying digest names, by absolute path and
/// by a path relative to the cache's blob directory.
struct Planted {
    path: std::path::PathBuf,
    content: Vec<u8>,
}

impl Planted {
    fn new(dir: &Path) -> Planted {
        let path = dir.join("precious.txt");
        let content = b"not yours to read or delete".to_vec();
        std::fs::write(&path, &content).unwrap();
        Planted { path, content }
    }

    fn assert_untouched(&self, what: &str) {
        let now = std::fs::read(&self.path).unwrap_or_else(|e| panic!("{what}: {} is gone: {e}", self.path.display()));
        assert_eq!(now, self.content, "{what}: {} was changed", self.path.display());
    }
}

#[tokio::test]
async fn a_layer_digest_naming_a_path_is_refused_and_the_file_it_names_is_left_alone() {
    let liar = Liar::start();
    let scratch = TempDir::new().unwrap();
    let planted = Planted::new(scratch.path());
    let cache = scratch.path().join("cache");
    let config = serde_json::to_vec(&json!({"architecture": "wasm", "os": "wasip2"})).unwrap();
    let config_digest = liar.blob("evil/plugin", config.clone());
    // From <cache>/blobs/sha256/ up to the scratch dir, and the absolute path.
    let relative = "sha256:../../../precious.txt".to_string();
    let absolute = format!("sha256:{}", planted.path.display());
    let oci = sluice_oci::Registry::new(options(&cache)).unwrap();
    for (tag, digest) in [("relative", &relative), ("absolute", &absolute)] {
        liar.manifest("evil/plugin", tag, OCI_MANIFEST, &cncf_manifest(&config_digest, config.len(), digest, 10));
        let reference = format!("{}/evil/plugin:{tag}", liar.host());
        // The library first, then the binary.
        let error = oci.pull(&reference.parse().unwrap(), PullPolicy::Always, None).await.unwrap_err();
        planted.assert_untouched(tag);
        assert!(error.to_string().contains("64 lowercase hex digits"), "{tag}: {error}");
        let output = sluice(scratch.path(), &cache, &["pull", &reference, "-o", "/dev/null"]);
        let stderr = text(&output.stderr);
        planted.assert_untouched(tag);
        assert!(!output.status.success(), "{tag}: the pull succeeded");
        assert!(stderr.contains("64 lowercase hex digits"), "{tag}: the error does not say why: {stderr}");
    }
    // The same with the config digest, and through the library.
    liar.manifest("evil/plugin", "config", OCI_MANIFEST, &cncf_manifest(&absolute, 10, &config_digest, config.len()));
    let reference: Reference = format!("{}/evil/plugin:config", liar.host()).parse().unwrap();
    let error = oci.pull(&reference, PullPolicy::Always, None).await.unwrap_err();
    assert!(error.to_string().contains("64 lowercase hex digits"), "{error}");
    planted.assert_untouched("config digest");
    let fetched: Vec<String> = liar.seen().iter().map(|s| s.path.clone()).filter(|p| p.contains("precious")).collect();
    assert!(fetched.is_empty(), "a lying digest reached a URL: {fetched:?}");
}

#[tokio::test]
async fn an_index_entry_naming_a_path_is_refused() {
    let liar = Liar::start();
    let scratch = TempDir::new().unwrap();
    let planted = Planted::new(scratch.path());
    let cache = scratch.path().join("cache");
    let index = json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": format!("sha256:{}", planted.path.display()), "size": 10,
                       "platform": {"os": "wasip2", "architecture": "wasm"}}],
    });
    liar.manifest("evil/index", "v1", OCI_INDEX, &index);
    let reference = format!("{}/evil/index:v1", liar.host());
    let oci = sluice_oci::Registry::new(options(&cache)).unwrap();
    let error = oci.pull(&reference.parse().unwrap(), PullPolicy::Always, None).await.unwrap_err();
    planted.assert_untouched("index entry, library");
    assert!(error.to_string().contains("64 lowercase hex digits"), "{error}");
    let output = sluice(scratch.path(), &cache, &["pull", &reference, "-o", "/dev/null"]);
    assert!(!output.status.success(), "the pull succeeded");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("64 lowercase hex digits"), "{stderr}");
    planted.assert_untouched("index entry");
}

#[tokio::test]
async fn a_tampered_cache_record_cannot_name_a_file_outside_the_cache() {
    // A real registry and a real pull, then a record on disk edited to
    // point elsewhere, as a hostile co-tenant of the cache directory might.
    let registry = Registry::start();
    let scratch = TempDir::new().unwrap();
    let planted = Planted::new(scratch.path());
    let cache = scratch.path().join("cache");
    let oci = sluice_oci::Registry::new(options(&cache)).unwrap();
    let tag: Reference = registry.reference("plugins/cached:v1").parse().unwrap();
    let pushed = oci.push(plugin(), &tag, BTreeMap::new(), None).await.unwrap();
    oci.pull(&tag, PullPolicy::Always, None).await.unwrap();
    let hex = pushed.manifest_digest.trim_start_matches("sha256:");
    let record_path = cache.join("manifests/sha256").join(format!("{hex}.json"));
    let mut record: Value = serde_json::from_slice(&std::fs::read(&record_path).unwrap()).unwrap();
    record["module_digest"] = json!(format!("sha256:{}", planted.path.display()));
    std::fs::write(&record_path, serde_json::to_vec(&record).unwrap()).unwrap();
    std::fs::remove_dir_all(cache.join("refs")).ok();

    let by_digest = tag.with_digest(&pushed.manifest_digest);
    let fresh = sluice_oci::Registry::new(options(&cache)).unwrap();
    // Served again from the registry, not from the file the record names.
    let pulled = fresh.pull(&by_digest, PullPolicy::IfNotPresent, None).await.unwrap();
    assert!(pulled.module == plugin(), "the module came from somewhere else");
    planted.assert_untouched("tampered record");
}

/// Asserts that no request to the liar carried credentials.
fn assert_not_offered(liar: &Liar, what: &str) {
    let offered: Vec<Seen> = liar.seen().into_iter().filter(|s| s.headers.contains_key("authorization")).collect();
    assert!(offered.is_empty(), "{what}: credentials were offered to {}: {offered:?}", liar.host());
}

/// A credential that names no registry (a `username:password` file) must not
/// be offered to whatever host a plugin reference names: docker's
/// `config.json` binds each credential to a host, and so must every shape.
#[tokio::test]
async fn credentials_are_offered_only_to_the_registry_they_are_for() {
    let liar = Liar::start();
    // The liar asks everyone to log in, as a phishing registry would.
    let challenge = Answer::challenge("Basic realm=\"liar\"");
    liar.answer("/v2/", challenge.clone());
    liar.answer("/v2/evil/plugin/manifests/v1", challenge);
    let private = Registry::start_with_basic_auth("ci", "s3cret-for-the-private-registry");
    let scratch = TempDir::new().unwrap();
    let cache = scratch.path().join("cache");
    let userpass = scratch.path().join("userpass");
    std::fs::write(&userpass, "ci:s3cret-for-the-private-registry\n").unwrap();
    let docker = scratch.path().join("docker.json");
    let auth = json!({"auths": {private.host(): {"username": "ci", "password": "s3cret-for-the-private-registry"}}});
    std::fs::write(&docker, auth.to_string()).unwrap();
    let evil = format!("{}/evil/plugin:v1", liar.host());

    // The library with the bare file: refused up front, never offered.
    let mut bare = options(&cache);
    bare.credentials.credentials_file = Some(userpass.clone());
    match sluice_oci::Registry::new(bare) {
        Err(error) => assert!(error.to_string().contains("--credentials-registry"), "{error}"),
        Ok(oci) => assert!(oci.pull(&evil.parse().unwrap(), PullPolicy::Always, None).await.is_err()),
    }
    assert_not_offered(&liar, "the library with a username:password file");

    // The binary, with each shape.
    let (userpass, docker) = (userpass.to_str().unwrap(), docker.to_str().unwrap());
    let tries: [&[&str]; 4] = [
        &["--credentials-file", userpass],
        &["--credentials-file", userpass, "--credentials-registry", &private.host()],
        &["--credentials-file", docker],
        &["--docker-config", docker],
    ];
    for flags in tries {
        let mut args = vec!["pull", evil.as_str(), "-o", "/dev/null"];
        args.extend_from_slice(flags);
        let output = sluice(scratch.path(), &cache, &args);
        assert!(!output.status.success(), "{flags:?}: the liar's pull succeeded");
        assert_not_offered(&liar, &format!("{flags:?}"));
    }

    // A bare file with no registry named is refused, saying what to do.
    let output = sluice(scratch.path(), &cache, &["pull", &evil, "-o", "/dev/null", "--credentials-file", userpass]);
    let stderr = text(&output.stderr);
    assert!(stderr.contains("--credentials-registry"), "{stderr}");
    // Bound to the private registry, the same file opens it.
    let target = private.reference("private/filter:v1");
    let mut options = options(&scratch.path().join("push-cache"));
    options.credentials.credentials_file = Some(docker.into());
    let oci = sluice_oci::Registry::new(options).unwrap();
    oci.push(plugin(), &target.parse().unwrap(), BTreeMap::new(), None).await.unwrap();
    let bound = ["--credentials-file", userpass, "--credentials-registry", &private.host()];
    let mut args = vec!["pull", target.as_str(), "-o", "/dev/null"];
    args.extend_from_slice(&bound);
    let output = sluice(scratch.path(), &cache, &args);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

/// A private registry holding one module, pushed by its owner, and the
/// gateway's shared cache (no credentials of its own) that pulled it with
/// the owner's pull Secret.
struct PulledWithASecret {
    registry: Registry,
    module: Vec<u8>,
    tag: Reference,
    pushed: sluice_oci::Pushed,
    oci: sluice_oci::Registry,
    secret: PullCredentials,
    _scratch: TempDir,
}

async fn pulled_with_a_secret() -> PulledWithASecret {
    let registry = Registry::start_with_basic_auth("tenant-a", "a-secret");
    let scratch = TempDir::new().unwrap();
    let module = plugin();
    let tag: Reference = registry.reference("private/filter:v1").parse().unwrap();
    // Pushed by tenant A's CI, with a docker config for that registry alone.
    let docker = scratch.path().join("docker.json");
    let auth = json!({"auths": {registry.host(): {"username": "tenant-a", "password": "a-secret"}}});
    std::fs::write(&docker, auth.to_string()).unwrap();
    let mut push_options = options(&scratch.path().join("push-cache"));
    push_options.credentials.credentials_file = Some(docker);
    let pusher = sluice_oci::Registry::new(push_options).unwrap();
    let pushed = pusher.push(module.clone(), &tag, BTreeMap::new(), None).await.unwrap();

    let oci = sluice_oci::Registry::new(options(&scratch.path().join("cache"))).unwrap();
    let secret = PullCredentials::Basic { username: "tenant-a".into(), password: "a-secret".into() };
    let first = oci.pull_as(&tag, PullPolicy::IfNotPresent, None, Some(&secret)).await.unwrap();
    assert!(first.origin == Origin::Registry && first.module == module);
    PulledWithASecret { registry, module, tag, pushed, oci, secret, _scratch: scratch }
}

/// A module pulled with one namespace's pull Secret is served from the
/// shared cache only to callers that prove access to it, as kubelet does for
/// `IfNotPresent` images (KEP-2535): the Secret's holder is served without a
/// request, anyone else is refused, by tag or by digest, registry up or down.
#[tokio::test]
async fn a_module_pulled_with_a_pull_secret_is_served_from_the_cache_only_to_holders_of_it() {
    let PulledWithASecret { mut registry, module, tag, pushed, oci, secret, _scratch } = pulled_with_a_secret().await;
    let by_digest = tag.with_digest(&pushed.manifest_digest);
    let wrong = PullCredentials::Basic { username: "tenant-a".into(), password: "a guess".into() };

    // The Secret's holder: from the cache, without asking the registry again.
    let requests = registry.access_log().lines().count();
    for reference in [&tag, &by_digest] {
        let again = oci.pull_as(reference, PullPolicy::IfNotPresent, None, Some(&secret)).await.unwrap();
        assert_eq!(again.origin, Origin::Cache, "{reference}");
    }
    assert_eq!(registry.access_log().lines().count(), requests, "the Secret's holder was checked again");

    // Another namespace, with no Secret or a wrong one: refused.
    for (who, credentials) in [("no secret", None), ("a wrong secret", Some(&wrong))] {
        for reference in [&tag, &by_digest] {
            match oci.pull_as(reference, PullPolicy::IfNotPresent, None, credentials).await {
                Err(OciError::Unauthorized { .. }) => {}
                Ok(pulled) => panic!("{who}: {reference} was served ({:?})", pulled.origin),
                Err(other) => panic!("{who}: {reference}: {other}"),
            }
        }
    }

    // With the registry down, only the Secret's holder gets the cached copy.
    registry.kill();
    let stale = oci.pull_as(&tag, PullPolicy::Always, None, Some(&secret)).await.unwrap();
    assert!(stale.origin == Origin::StaleCache && stale.module == module);
    for reference in [&tag, &by_digest] {
        let error = oci.pull_as(reference, PullPolicy::IfNotPresent, None, None).await.unwrap_err();
        assert!(error.is_transient(), "{reference}: {error}");
    }
}

/// Knowing a private module's digest is no key to it: a manifest on a
/// registry another tenant controls may name the private layer, and the
/// layer must then come from that registry, not from the shared cache.
#[tokio::test]
async fn a_manifest_naming_a_private_layer_does_not_unlock_the_cached_copy() {
    let private = pulled_with_a_secret().await;
    let (module, pushed, oci) = (&private.module, &private.pushed, &private.oci);
    let liar = Liar::start();
    let config = serde_json::to_vec(&json!({"architecture": "wasm", "os": "wasip2"})).unwrap();
    let config_digest = liar.blob("copy/filter", config.clone());
    let manifest = cncf_manifest(&config_digest, config.len(), &pushed.layer_digest, module.len());
    liar.manifest("copy/filter", "v1", OCI_MANIFEST, &manifest);
    let copy: Reference = format!("{}/copy/filter:v1", liar.host()).parse().unwrap();
    match oci.pull_as(&copy, PullPolicy::IfNotPresent, None, None).await {
        Ok(_) => panic!("a manifest naming the private layer's digest unlocked the cached module"),
        Err(error) => assert!(matches!(error, OciError::NotFound { .. }), "{error}"),
    }
    let layer = format!("/v2/copy/filter/blobs/{}", pushed.layer_digest);
    assert!(
        liar.seen().iter().any(|s| s.method == "GET" && s.path == layer),
        "the layer was not asked of the registry that named it"
    );
}

/// The token login most registries use (Bearer, with a token service the
/// registry names): the credential goes to the token service only, the
/// token to the registry, and the login is remembered across pulls.
#[tokio::test]
async fn a_bearer_token_login_works_and_is_remembered() {
    let liar = Liar::start();
    let challenge = format!("Bearer realm=\"http://{}/token\",service=\"liar-registry\"", liar.host());
    liar.answer("/v2/", Answer::challenge(&challenge));
    let token = Answer::json("application/json", br#"{"token": "t0ken", "expires_in": 300}"#.to_vec());
    liar.answer("/token", token);
    let module = plugin();
    let config = serde_json::to_vec(&json!({"architecture": "wasm", "os": "wasip2"})).unwrap();
    let needs = ("Bearer t0ken", challenge.as_str());
    let (config_digest, layer_digest) = (sha256(&config), sha256(&module));
    for (digest, bytes) in [(&config_digest, config.clone()), (&layer_digest, module.clone())] {
        let answer = Answer::blob(bytes).needing(needs.0, needs.1);
        liar.answer(&format!("/v2/private/plugin/blobs/{digest}"), answer);
    }
    let manifest = cncf_manifest(&config_digest, config.len(), &layer_digest, module.len());
    liar.manifest_needing("private/plugin", "v1", OCI_MANIFEST, &manifest, Some(needs));

    let scratch = TempDir::new().unwrap();
    let docker = scratch.path().join("docker.json");
    std::fs::write(&docker, json!({"auths": {liar.host(): {"username": "u", "password": "pw"}}}).to_string()).unwrap();
    let mut options = options(&scratch.path().join("cache"));
    options.credentials.credentials_file = Some(docker);
    let oci = sluice_oci::Registry::new(options).unwrap();
    let reference: Reference = format!("{}/private/plugin:v1", liar.host()).parse().unwrap();
    for _ in 0..2 {
        let pulled = oci.pull(&reference, PullPolicy::Always, None).await.unwrap();
        assert!(pulled.module == module);
    }
    let seen = liar.seen();
    let logins: Vec<&Seen> = seen.iter().filter(|s| s.path.starts_with("/token")).collect();
    assert_eq!(logins.len(), 1, "one login for both pulls: {logins:?}");
    assert!(logins[0].path.contains("scope=repository%3Aprivate%2Fplugin%3Apull"), "{}", logins[0].path);
    assert!(logins[0].path.contains("service=liar-registry"), "{}", logins[0].path);
    let basic = format!("Basic {}", base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "u:pw"));
    assert_eq!(logins[0].headers.get("authorization"), Some(&basic), "the token service gets the credential");
    for request in seen.iter().filter(|s| s.path.starts_with("/v2/private/")) {
        let authorization = request.headers.get("authorization").map(String::as_str);
        assert!(matches!(authorization, None | Some("Bearer t0ken")), "{request:?}");
    }
}

/// Far more than any body limit below.
const HUGE: u64 = 64 << 20;
/// Below HUGE, above any limit plus what loopback socket buffers hold: a
/// client that stops reading at its limit leaves the liar short of this.
const STOPPED_EARLY: u64 = 32 << 20;

/// Manifests and indexes are capped at 4 MiB (the limit of distribution's
/// own manifest PUT), checked on Content-Length and again while streaming.
#[tokio::test]
async fn a_huge_manifest_or_index_is_refused_at_the_manifest_limit() {
    let liar = Liar::start();
    let scratch = TempDir::new().unwrap();
    let cache = scratch.path().join("cache");
    liar.answer("/v2/bomb/declared/manifests/v1", Answer::huge(200, OCI_MANIFEST, HUGE, false));
    liar.answer("/v2/bomb/streamed/manifests/v1", Answer::huge(200, OCI_MANIFEST, HUGE, true));
    // An index whose Wasm entry is the bomb.
    let entry = format!("sha256:{}", "e".repeat(64));
    let index = json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{"mediaType": OCI_MANIFEST, "digest": entry, "size": 1000,
                       "platform": {"os": "wasip2", "architecture": "wasm"}}],
    });
    liar.manifest("bomb/index", "v1", OCI_INDEX, &index);
    let entry_path = format!("/v2/bomb/index/manifests/{entry}");
    liar.answer(&entry_path, Answer::huge(200, OCI_MANIFEST, HUGE, true));

    let oci = sluice_oci::Registry::new(options(&cache)).unwrap();
    for repository in ["bomb/declared", "bomb/streamed", "bomb/index"] {
        let reference: Reference = format!("{}/{repository}:v1", liar.host()).parse().unwrap();
        let error = oci.pull(&reference, PullPolicy::Always, None).await.unwrap_err();
        assert!(error.to_string().contains("over the limit of 4194304 bytes"), "{repository}: {error}");
    }
    for path in ["/v2/bomb/declared/manifests/v1", "/v2/bomb/streamed/manifests/v1", entry_path.as_str()] {
        let sent = liar.sent(path);
        assert!(sent < STOPPED_EARLY, "{path}: the client read on to {sent} bytes");
    }
    // The binary says the same.
    let output = sluice(scratch.path(), &cache, &["pull", &format!("{}/bomb/streamed:v1", liar.host())]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("over the limit of 4194304 bytes"), "{}", text(&output.stderr));
}

/// A token response is capped at 1 MiB: the registry picks the token realm.
#[tokio::test]
async fn a_huge_token_response_is_refused_at_the_token_limit() {
    let liar = Liar::start();
    let realm = format!("http://{}/token", liar.host());
    let challenge = Answer::challenge(&format!("Bearer realm=\"{realm}\",service=\"liar\""));
    liar.answer("/v2/", challenge.clone());
    liar.answer("/v2/bomb/token/manifests/v1", challenge);
    liar.answer("/token", Answer::huge(200, "application/json", HUGE, true));
    let scratch = TempDir::new().unwrap();
    let oci = sluice_oci::Registry::new(options(&scratch.path().join("cache"))).unwrap();
    let token: Reference = format!("{}/bomb/token:v1", liar.host()).parse().unwrap();
    let error = oci.pull(&token, PullPolicy::Always, None).await.unwrap_err();
    assert!(error.to_string().contains("over the limit of 1048576 bytes"), "{error}");
    let sent = liar.sent("/token");
    assert!(sent < STOPPED_EARLY, "the token response was read on to {sent} bytes");
}

/// An error status does not make a body small: only its start is read.
#[tokio::test]
async fn a_huge_error_body_is_not_read_to_its_end() {
    let liar = Liar::start();
    liar.answer("/v2/bomb/error/manifests/v1", Answer::huge(404, "application/json", HUGE, true));
    let scratch = TempDir::new().unwrap();
    let oci = sluice_oci::Registry::new(options(&scratch.path().join("cache"))).unwrap();
    let missing: Reference = format!("{}/bomb/error:v1", liar.host()).parse().unwrap();
    let error = oci.pull(&missing, PullPolicy::Always, None).await.unwrap_err();
    assert!(matches!(error, OciError::NotFound { .. }), "{error}");
    let sent = liar.sent("/v2/bomb/error/manifests/v1");
    assert!(sent < STOPPED_EARLY, "the error body was read on to {sent} bytes");
}

/// A plugin with `spec.verify` reads its signature manifest under bounds of
/// its own (security.md SG4): the manifest 256 KiB, 32 layers, a payload
/// 64 KiB whatever its descriptor declares. A registry that sends more is
/// refused, naming the bound, before the module is fetched, and the client
/// stops reading.
#[tokio::test]
async fn a_huge_or_crowded_signature_manifest_or_a_huge_payload_is_refused_at_its_bound() {
    use p256::pkcs8::{EncodePublicKey as _, LineEnding};
    const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
    let liar = Liar::start();
    let scratch = TempDir::new().unwrap();
    let oci = sluice_oci::Registry::new(options(&scratch.path().join("cache"))).unwrap();
    let secret = p256::SecretKey::from_slice(&sha2::Sha256::digest(b"sg4")).unwrap();
    let public = secret.public_key().to_public_key_pem(LineEnding::LF).unwrap();
    let keys = sluice_oci::PublicKeys::from_pems(&[public]).unwrap();
    let module = plugin();
    let config = serde_json::to_vec(&json!({"architecture": "wasm", "os": "wasip2"})).unwrap();
    let signature_layer = |digest: &str, size: u64| {
        json!({"mediaType": SIMPLE_SIGNING, "digest": digest, "size": size,
               "annotations": {"dev.cosignproject.cosign/signature": "MEUCIQ=="}})
    };
    let signature_manifest = |layers: Vec<Value>| {
        json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
               "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                          "digest": format!("sha256:{}", "c".repeat(64)), "size": 2},
               "layers": layers})
    };

    for (repository, expected) in [
        ("sig/huge", "over the limit of 262144 bytes"),
        ("sig/crowded", "has 33 layers, more than the 32 read"),
        ("sig/payload", "over the limit of 65536 bytes"),
    ] {
        let layer = liar.blob(repository, module.clone());
        let config_digest = liar.blob(repository, config.clone());
        let manifest = cncf_manifest(&config_digest, config.len(), &layer, module.len());
        let digest = liar.manifest(repository, "v1", OCI_MANIFEST, &manifest);
        let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
        let tag_path = format!("/v2/{repository}/manifests/{tag}");
        let payload_digest = format!("sha256:{}", "d".repeat(64));
        let payload_path = format!("/v2/{repository}/blobs/{payload_digest}");
        match repository {
            "sig/huge" => liar.answer(&tag_path, Answer::huge(200, OCI_MANIFEST, HUGE, true)),
            "sig/crowded" => {
                let layers = (0..33).map(|_| signature_layer(&payload_digest, 100)).collect();
                liar.manifest(repository, &tag, OCI_MANIFEST, &signature_manifest(layers));
            }
            _ => {
                // Declares 100 bytes, sends 64 MiB without a length.
                liar.manifest(
                    repository,
                    &tag,
                    OCI_MANIFEST,
                    &signature_manifest(vec![signature_layer(&payload_digest, 100)]),
                );
                liar.answer(&payload_path, Answer::huge(200, "application/octet-stream", HUGE, true));
            }
        }
        let reference: Reference = format!("{}/{repository}:v1", liar.host()).parse().unwrap();
        let error = oci.pull_verified(&reference, PullPolicy::Always, None, None, Some(&keys)).await.unwrap_err();
        assert!(error.to_string().contains(expected), "{repository}: {error}");
        for path in [&tag_path, &payload_path] {
            assert!(liar.sent(path) < STOPPED_EARLY, "{repository}: the client read on to {} bytes", liar.sent(path));
        }
        let module_path = format!("/v2/{repository}/blobs/{layer}");
        assert!(
            !liar.seen().iter().any(|s| s.method == "GET" && s.path == module_path),
            "{repository}: the module was fetched before its signature was refused"
        );
    }
}
