//! The container image users run (`cargo xtask image`, the shape of the
//! repository's Containerfile), run with podman as Kubernetes runs it: a
//! read-only root filesystem, the image's own non-root user, no
//! capabilities, the cache on a volume. It serves a plugin pulled from a
//! real registry, restarts onto its cache, serves the quickstart, and once
//! pushed is what deploy/kubernetes names by digest through a kustomize
//! overlay.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_tests::{
    Client, ConfigDir, Container, Echo, Plugin, Podman, Registry, Reply, Route, chat_body, empty, plugin_wasm,
};

/// The image's user: distroless's `nonroot`, and the uid
/// deploy/kubernetes/deployment.yaml's securityContext runs as.
const UID: u32 = 65532;

/// The unpacked image may be this large. The static binary is nearly all of
/// it (wasmtime with Cranelift, kube, rustls, hyper: 54 MiB with symbols,
/// debug info stripped); CA certificates add 0.2 MiB. The bound catches a
/// base image slipping in (Debian slim alone is 75 MiB) or the release
/// profile's line tables left in (153 MiB more), not ordinary growth.
const MAX_IMAGE_BYTES: u64 = 80 * 1024 * 1024;

/// From `podman run` to /readyz answering 200, with one plugin pulled and
/// compiled into an empty cache on a busy 2-core machine.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

/// Options every gateway container here runs with, as the Deployment's
/// securityContext has them: the root filesystem read-only with no tmpfs
/// of podman's on /tmp (Kubernetes mounts none), no capabilities, no
/// privilege escalation. No `--user`: the image's own.
fn hardened() -> Vec<String> {
    ["--read-only", "--read-only-tmpfs=false", "--cap-drop", "all", "--security-opt", "no-new-privileges"]
        .into_iter()
        .chain(["--env", "RUST_LOG=info", "--env", "SLUICE_LOG_FORMAT=text", "--env", "NO_COLOR=1"])
        .map(String::from)
        .collect()
}

/// A gateway in a container, on host networking.
struct ContainerGateway {
    container: Container,
    listen: SocketAddr,
    admin: SocketAddr,
    /// From `podman run` to /readyz answering 200.
    ready_after: Duration,
    client: Client,
}

impl ContainerGateway {
    /// `sluice run --config CONFIG` in a container named `name` with
    /// `options` (mounts), on free ports; waits until the probes listener's
    /// /readyz answers 200.
    async fn start(podman: &Podman, name: &str, options: &[String], config: &str) -> ContainerGateway {
        let client = Client::http1();
        for attempt in 0..3 {
            let (listen, admin, probes) = (free_port(), free_port(), free_port());
            let args: Vec<String> = vec![
                "run".into(),
                "--config".into(),
                config.into(),
                format!("--listen={listen}"),
                format!("--admin={admin}"),
                format!("--probes={probes}"),
            ];
            let options: Vec<String> = hardened().into_iter().chain(options.iter().cloned()).collect();
            let started = Instant::now();
            let container = podman.start(&format!("{name}-{attempt}"), &options, &args).await;
            let readyz = format!("http://{probes}/readyz");
            loop {
                let request = hyper::Request::get(&readyz).body(empty()).expect("a valid GET request");
                if let Ok(reply) = client.try_send(request).await
                    && reply.status == 200
                {
                    let ready_after = started.elapsed();
                    return ContainerGateway { container, listen, admin, ready_after, client };
                }
                if !container.is_running().await {
                    let logs = container.logs().await;
                    if logs.contains("Address already in use") {
                        break;
                    }
                    panic!("the gateway's container exited before it was ready:\n{logs}");
                }
                assert!(
                    started.elapsed() < READY_TIMEOUT,
                    "not ready after {READY_TIMEOUT:?}:\n{}",
                    container.logs().await
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("no free ports for the gateway's container after 3 attempts");
    }

    async fn chat(&self, body: &Value, headers: &[(&str, &str)]) -> Reply {
        self.client.post(&format!("http://{}/v1/chat/completions", self.listen), body.to_string(), headers).await
    }

    /// The value of one sample on the admin listener's /metrics (0 if
    /// absent), e.g. `sluice_plugin_compiles_total{result="compiled"}`.
    async fn metric(&self, sample: &str) -> f64 {
        let reply = self.client.get(&format!("http://{}/metrics", self.admin)).await;
        assert_eq!(reply.status, 200, "/metrics: {}", reply.text());
        let text = reply.text();
        let value = text.lines().find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '));
        value.map_or(0.0, |v| v.trim().parse().unwrap_or_else(|e| panic!("{sample} {v}: {e}")))
    }
}

/// A config directory the container's user may read (a temporary
/// directory is root's alone).
fn readable(dir: &Path) {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod the config dir");
}

/// Pushes plugins/dist/NAME.wasm to `reference` with the library client.
async fn push_plugin(name: &str, reference: &str) {
    let module = std::fs::read(plugin_wasm(name)).expect("reading a built plugin");
    let scratch = tempfile::tempdir().expect("a scratch dir");
    let reference: sluice_oci::Reference = reference.parse().expect("a valid reference");
    let client = sluice_oci::Registry::new(sluice_oci::RegistryOptions::new(scratch.path().join("cache")))
        .expect("an OCI client");
    client.push(module, &reference, BTreeMap::new(), None).await.expect("pushing the plugin");
}

#[tokio::test]
async fn the_image_runs_as_its_own_user_has_no_shell_and_stays_small() {
    let podman = Podman::load().await;
    let image = podman.inspect_image().await;
    let config = &image["Config"];
    assert_eq!(config["User"], format!("{UID}:{UID}"), "{config}");
    assert_eq!(config["Entrypoint"], json!(["/sluice"]), "{config}");
    assert!(config["Volumes"].get("/var/cache/sluice").is_some(), "{config}");
    for port in ["8080/tcp", "9901/tcp", "9902/tcp", "9903/tcp"] {
        assert!(config["ExposedPorts"].get(port).is_some(), "{port} is not exposed: {config}");
    }
    assert!(
        config["Env"].as_array().is_some_and(|env| env.contains(&json!("XDG_CACHE_HOME=/var/cache"))),
        "the default caches are not on the volume: {config}"
    );
    let labels = &image["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "sluice", "{labels}");
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"), "{labels}");
    assert!(labels["org.opencontainers.image.revision"].as_str().is_some_and(|r| !r.is_empty()), "{labels}");

    let size = image["Size"].as_u64().expect("the image has a size");
    println!(
        "image {}: {:.1} MiB unpacked, {:.1} MiB as the OCI archive",
        podman.image(),
        size as f64 / 1048576.0,
        std::fs::metadata(podman.archive()).expect("the archive").len() as f64 / 1048576.0
    );
    assert!(size <= MAX_IMAGE_BYTES, "the image is {size} bytes, over {MAX_IMAGE_BYTES}");

    // The binary alone is the image: it runs, static, read-only, as the
    // image's user.
    let version = podman.ok(&["run", "--rm", "--read-only", podman.image(), "--version"]).await;
    assert_eq!(version.trim(), format!("sluice {}", env!("CARGO_PKG_VERSION")));

    // Nothing else to run: no shell, no busybox.
    for shell in ["/bin/sh", "/bin/bash", "/bin/busybox"] {
        let output = podman.output(&["run", "--rm", "--entrypoint", shell, podman.image(), "-c", "id"]).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{shell} ran in the image: {}", String::from_utf8_lossy(&output.stdout));
        assert!(stderr.contains("no such file or directory"), "{shell}: {stderr}");
    }
}

#[tokio::test]
async fn the_image_serves_a_plugin_from_a_registry_and_restarts_onto_its_cache_volume() {
    let podman = Podman::load().await;
    let mut registry = Registry::start();
    let echo = Echo::start().await;
    let reference = registry.reference("plugins/add-header:v1");
    push_plugin("add-header", &reference).await;

    let dir = ConfigDir::new();
    readable(dir.path());
    let plugin = Plugin::oci("add-header", &reference).config(json!({"header": "x-team", "value": "image"}));
    dir.write("plugin.yaml", &plugin.yaml());
    dir.write("route.yaml", &Route::new("chat", &["gpt-test"], &echo.url()).plugins(&["add-header"]).yaml());

    // A named volume, as the Deployment's emptyDir: podman makes it from the
    // image's /var/cache/sluice, owner included.
    podman.ok(&["volume", "create", "cache"]).await;
    let mounts: Vec<String> = vec![
        "--volume".into(),
        format!("{}:/etc/sluice:ro", dir.path().display()),
        "--volume".into(),
        "cache:/var/cache/sluice".into(),
    ];
    let gateway = ContainerGateway::start(&podman, "gateway", &mounts, "/etc/sluice").await;
    println!("start to ready (plugin pulled and compiled, empty cache): {:?}", gateway.ready_after);

    let pid = gateway.container.pid().await;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading the gateway's status");
    let uids = status.lines().find_map(|line| line.strip_prefix("Uid:")).expect("a Uid line");
    assert_eq!(uids.split_whitespace().collect::<Vec<_>>(), vec![UID.to_string(); 4], "{status}");
    // The user owns its cache directory and nothing above it.
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    for (path, owner) in [("var", 0), ("var/cache", 0), ("var/cache/sluice", UID), ("sluice", 0)] {
        let meta = std::fs::metadata(root.join(path)).unwrap_or_else(|e| panic!("/{path} in the container: {e}"));
        assert_eq!(meta.uid(), owner, "the owner of /{path}");
    }

    let reply = gateway.chat(&chat_body("gpt-test"), &[]).await;
    assert_eq!(reply.echoed()["headers"]["x-team"], "image", "the plugin from the registry ran");
    assert_eq!(gateway.metric("sluice_plugin_compiles_total{result=\"compiled\"}").await, 1.0);

    // What it wrote is on the volume, as its user, and nowhere else (the
    // root filesystem is read-only).
    let volume = podman.ok(&["volume", "inspect", "--format", "{{.Mountpoint}}", "cache"]).await;
    let volume = PathBuf::from(volume.trim());
    for leaf in ["compiled", "oci"] {
        let meta = std::fs::metadata(volume.join(leaf)).unwrap_or_else(|e| panic!("{leaf} on the volume: {e}"));
        assert_eq!((meta.uid(), meta.gid()), (UID, UID), "{leaf}");
    }
    let compiled: Vec<_> = std::fs::read_dir(volume.join("compiled")).expect("the compiled cache").collect();
    assert_eq!(compiled.len(), 1, "one compiled plugin: {compiled:?}");

    // SIGTERM: a clean exit, as on a rollout.
    assert_eq!(gateway.container.stop(40).await, 0, "{}", gateway.container.logs().await);
    drop(gateway);

    // A new container on the same volume, the registry gone: the module
    // comes from the volume's OCI cache and the compiled code from its
    // compile cache.
    registry.kill();
    let gateway = ContainerGateway::start(&podman, "restarted", &mounts, "/etc/sluice").await;
    println!("start to ready (restart onto the cache volume, registry down): {:?}", gateway.ready_after);
    let reply = gateway.chat(&chat_body("gpt-test"), &[]).await;
    assert_eq!(reply.echoed()["headers"]["x-team"], "image", "the plugin ran, from the volume");
    assert_eq!(gateway.metric("sluice_plugin_compiles_total{result=\"cache_hit\"}").await, 1.0);
    assert_eq!(gateway.metric("sluice_plugin_compiles_total{result=\"compiled\"}").await, 0.0);
}

#[tokio::test]
async fn the_image_serves_the_quickstart() {
    let podman = Podman::load().await;
    let root = repo_root();

    // The quickstart's upstream, `sluice echo-upstream`, from the image too.
    let upstream = free_port();
    let echo_args = ["echo-upstream".to_string(), format!("--listen={upstream}")];
    let _echo = podman.start("echo", &hardened(), &echo_args).await;

    // deploy/quickstart as `cargo xtask quickstart --upstream` serves it: the
    // same files, the backend at our upstream. Mounted where the plugins'
    // relative paths (../../plugins/dist/) find plugins/dist.
    let scratch = tempfile::Builder::new().prefix("sluice-e2e-quickstart").tempdir().expect("a temp dir");
    let config = scratch.path().join("quickstart");
    std::fs::create_dir(&config).expect("creating the config copy");
    for entry in std::fs::read_dir(root.join("deploy/quickstart")).expect("reading deploy/quickstart") {
        let path = entry.expect("a directory entry").path();
        let text = std::fs::read_to_string(&path).expect("reading a quickstart file");
        let text = text.replace("http://127.0.0.1:9000", &format!("http://{upstream}"));
        std::fs::write(config.join(path.file_name().expect("a file name")), text).expect("writing the copy");
    }
    readable(&config);
    let routes = std::fs::read_to_string(config.join("routes.yaml")).expect("the routes");
    assert!(routes.contains(&upstream.to_string()), "the quickstart's backend moved:\n{routes}");
    let mounts: Vec<String> = vec![
        "--volume".into(),
        format!("{}:/quickstart/deploy/quickstart:ro", config.display()),
        "--volume".into(),
        format!("{}:/quickstart/plugins/dist:ro", root.join("plugins/dist").display()),
        // The cache on a tmpfs this time, made the user's (`U`).
        "--tmpfs".into(),
        "/var/cache/sluice:rw,nosuid,size=256m,U".into(),
    ];
    let gateway = ContainerGateway::start(&podman, "quickstart", &mounts, "/quickstart/deploy/quickstart").await;
    println!("quickstart: start to ready: {:?}", gateway.ready_after);
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello"}]});

    // README's three requests.
    let reply = gateway.chat(&body, &[]).await;
    assert_eq!(reply.header("x-sluice-plugin"), Some("add-header"), "{}", reply.text());
    let echoed = reply.echoed();
    assert_eq!(echoed["headers"]["x-team"], "search", "{echoed}");
    assert_eq!(echoed["body"]["user"], "team-search", "{echoed}");

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let url = format!("http://{}/v1/chat/completions", gateway.listen);
    let stream = gateway.client.post_streaming(&url, streamed.to_string(), &[]).await;
    assert_eq!(stream.status, 200);
    let events = stream.events();
    assert_eq!(events.last().map(|(_, data)| data.as_str()), Some("[DONE]"), "{events:?}");
    assert!(events.len() > 2, "{events:?}");

    let denied = gateway.chat(&body, &[("x-tenant", "blocked")]).await;
    assert_eq!(denied.status, 403, "{}", denied.text());
    assert!(denied.text().contains("tenant is not allowed"), "{}", denied.text());
}

#[tokio::test]
async fn the_pushed_image_is_what_the_kustomized_deployment_and_the_chart_name_by_digest() {
    let podman = Podman::load().await;
    let registry = Registry::start();
    let repository = registry.reference("sluice-dev/sluice");
    let scratch = tempfile::tempdir().expect("a temp dir");
    let digest_file = scratch.path().join("digest");

    // As `cargo xtask image --push REF` does, with podman.
    let destination = format!("docker://{repository}:test");
    let digest_arg = digest_file.to_string_lossy();
    podman
        .ok(&["push", "--quiet", "--tls-verify=false", "--digestfile", &digest_arg, podman.image(), &destination])
        .await;
    let digest = std::fs::read_to_string(&digest_file).expect("podman wrote the digest").trim().to_string();
    assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");

    // The deployment's image, by digest, through an overlay.
    let kubectl = sluice_tests::kubectl_binary();
    let base = kustomize(&kubectl, &root_kubernetes()).await;
    let base_image = images(&base);
    assert_eq!(base_image.len(), 1, "one image in deploy/kubernetes: {base_image:?}");
    let name = base_image[0].rsplit_once(':').map_or(base_image[0].as_str(), |(name, _)| name).to_string();
    let overlay = scratch.path().join("overlay");
    std::fs::create_dir(&overlay).expect("the overlay dir");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\nimages:\n  - \
             name: {name}\n    newName: {repository}\n    digest: {digest}\n",
            relative_to_root(&overlay, &root_kubernetes())
        ),
    )
    .expect("writing the overlay");
    let rendered = kustomize(&kubectl, &overlay).await;
    let pinned = format!("{repository}@{digest}");
    assert_eq!(images(&rendered), vec![pinned.clone()], "the overlay's images");

    // The chart names the same reference from its image values.
    let values = format!("image:\n  repository: {repository}\n  tag: test\n  digest: {digest}\n");
    let chart = sluice_tests::Helm::new().template("sluice", "sluice-system", &values, &[]).await;
    assert!(chart.success, "helm template: {}", chart.stderr);
    assert_eq!(images(&chart.stdout), vec![pinned.clone()], "the chart's images");

    // The registry serves that reference, as an independent client sees it:
    // the manifest hashes to the digest and names our image's config.
    let raw = skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{pinned}")]).await;
    let manifest_digest = {
        use sha2::Digest as _;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(raw.as_bytes())))
    };
    assert_eq!(manifest_digest, digest, "the registry's manifest for {pinned}");
    let config = skopeo(&["inspect", "--config", "--tls-verify=false", &format!("docker://{pinned}")]).await;
    let config: Value = serde_json::from_str(&config).expect("the image config is JSON");
    assert_eq!(config["config"]["User"], format!("{UID}:{UID}"), "{config}");
    assert_eq!(config["config"]["Entrypoint"], json!(["/sluice"]), "{config}");
    let local = podman.inspect_image().await;
    assert_eq!(config["rootfs"]["diff_ids"], local["RootFS"]["Layers"], "the pushed layers are the image's");
}

/// `target` (absolute) as a path relative to `dir`, by way of `/`:
/// kustomize refuses absolute resource paths.
fn relative_to_root(dir: &Path, target: &Path) -> String {
    let up = dir.components().filter(|c| matches!(c, std::path::Component::Normal(_))).count();
    let target = target.strip_prefix("/").expect("an absolute path");
    format!("{}{}", "../".repeat(up), target.display())
}

fn root_kubernetes() -> PathBuf {
    repo_root().join("deploy/kubernetes")
}

async fn kustomize(kubectl: &Path, dir: &Path) -> String {
    let output = tokio::process::Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .await
        .expect("running kubectl kustomize");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl kustomize {}: {stderr}", dir.display());
    String::from_utf8(output.stdout).expect("kustomize prints UTF-8")
}

/// Every `image:` a rendered set of resources names.
fn images(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|line| line.trim_start().trim_start_matches("- ").strip_prefix("image: "))
        .map(|image| image.trim().trim_matches('"').to_string())
        .collect()
}

async fn skopeo(args: &[&str]) -> String {
    let output = tokio::process::Command::new("skopeo")
        .args(args)
        .output()
        .await
        .expect("running skopeo (apt-get install skopeo)");
    assert!(output.status.success(), "skopeo {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("skopeo prints UTF-8")
}
