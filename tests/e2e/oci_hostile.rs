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
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sha2::Digest as _;
use sluice_oci::{Credentials, PullPolicy, Reference, RegistryOptions};
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
#[derive(Clone)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Body,
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
        }
    }

    fn blob(body: Vec<u8>) -> Answer {
        Answer {
            status: 200,
            headers: vec![("Content-Type".into(), "application/octet-stream".into())],
            body: Body::Bytes(Arc::new(body)),
        }
    }

    fn status(status: u16) -> Answer {
        Answer { status, headers: Vec::new(), body: Body::Bytes(Arc::new(Vec::new())) }
    }
}

/// A registry that serves what it is told: `answers` by exact request path,
/// 200 on `/v2/`, 404 elsewhere. Records every request, with its headers.
struct Liar {
    addr: SocketAddr,
    answers: Arc<Mutex<HashMap<String, Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Liar {
    fn start() -> Liar {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the liar");
        let addr = listener.local_addr().unwrap();
        let answers: Arc<Mutex<HashMap<String, Answer>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (answers_in, seen_in) = (answers.clone(), seen.clone());
        // Detached: it dies with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (answers, seen) = (answers_in.clone(), seen_in.clone());
                std::thread::spawn(move || serve(stream, &answers, &seen));
            }
        });
        Liar { addr, answers, seen }
    }

    fn host(&self) -> String {
        self.addr.to_string()
    }

    fn answer(&self, path: &str, answer: Answer) {
        self.answers.lock().unwrap().insert(path.to_string(), answer);
    }

    /// Serves `manifest` (JSON) for `repository:tag` and for its digest.
    fn manifest(&self, repository: &str, tag: &str, media_type: &str, manifest: &Value) -> String {
        let body = serde_json::to_vec(manifest).unwrap();
        let digest = sha256(&body);
        self.answer(&format!("/v2/{repository}/manifests/{tag}"), Answer::json(media_type, body.clone()));
        self.answer(&format!("/v2/{repository}/manifests/{digest}"), Answer::json(media_type, body));
        digest
    }

    fn blob(&self, repository: &str, bytes: Vec<u8>) -> String {
        let digest = sha256(&bytes);
        self.answer(&format!("/v2/{repository}/blobs/{digest}"), Answer::blob(bytes));
        digest
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, answers: &Mutex<HashMap<String, Answer>>, seen: &Mutex<Vec<Seen>>) {
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
        seen.lock().unwrap().push(Seen { method: method.clone(), path: path.clone(), headers });
        let answer = match answers.lock().unwrap().get(&path) {
            Some(answer) => answer.clone(),
            None if path == "/v2/" => Answer::status(200),
            None => Answer::status(404),
        };
        let len = match &answer.body {
            Body::Bytes(bytes) => bytes.len() as u64,
            Body::Repeat { len, .. } => *len,
        };
        let mut head = format!("HTTP/1.1 {} X\r\nContent-Length: {len}\r\n", answer.status);
        for (name, value) in &answer.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        if stream.write_all(head.as_bytes()).is_err() {
            return;
        }
        if method != "HEAD" {
            let written = match &answer.body {
                Body::Bytes(bytes) => stream.write_all(bytes),
                Body::Repeat { byte, len } => {
                    let chunk = vec![*byte; 64 * 1024];
                    let mut left = *len;
                    let mut result = Ok(());
                    while left > 0 && result.is_ok() {
                        let n = left.min(chunk.len() as u64) as usize;
                        result = stream.write_all(&chunk[..n]);
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
    options.credentials = Credentials { docker_config: Some(none), credentials_file: None };
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
