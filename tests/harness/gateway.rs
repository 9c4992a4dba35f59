//! The `sluice run` process under test.

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;
use tempfile::TempDir;

use crate::config::ConfigDir;
use crate::http::{Client, Reply, chat_body, empty};

/// How long a gateway may take to serve its first config: compiling plugins
/// into an empty cache on a busy 2-core machine takes a while.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How a gateway is started, beyond its config dir.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Extra environment variables, e.g. for a backend's `apiKeyEnv`.
    pub env: Vec<(String, String)>,
    /// `--max-body-bytes`; the gateway's default if unset.
    pub max_body_bytes: Option<usize>,
    /// `--cache-dir`; the cache shared by all tests if unset.
    pub cache_dir: Option<PathBuf>,
    /// `--oci-cache-dir`; a fresh one per gateway if unset.
    pub oci_cache_dir: Option<PathBuf>,
    /// More command-line arguments for `sluice run`.
    pub args: Vec<String>,
}

/// A running gateway on free loopback ports, killed when dropped.
pub struct Gateway {
    child: Child,
    listen: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
    client: Client,
    _scratch: TempDir,
}

impl Gateway {
    pub async fn start(config: &ConfigDir) -> Gateway {
        Gateway::start_with(config, Options::default()).await
    }

    /// Starts `sluice run` and waits until /readyz answers 200.
    pub async fn start_with(config: &ConfigDir, options: Options) -> Gateway {
        let source = vec!["--config".into(), config.path().as_os_str().to_owned()];
        Gateway::start_source(source, options).await
    }

    /// Starts `sluice run --kubernetes`, watching `namespace` only, with its
    /// Leases there too, as replica `replica`.
    pub async fn start_kubernetes(
        kubeconfig: &std::path::Path,
        namespace: &str,
        replica: &str,
        options: Options,
    ) -> Gateway {
        let source =
            ["--kubernetes", "--watch-namespace", namespace, "--lease-namespace", namespace, "--replica-name", replica]
                .into_iter()
                .map(std::ffi::OsString::from)
                .chain(["--kubeconfig".into(), kubeconfig.as_os_str().to_owned()])
                .collect();
        // The tests' upstreams listen on loopback, which a gateway on
        // Kubernetes refuses by default; a test may set its own.
        let mut options = options;
        options.env.insert(0, ("SLUICE_ALLOW_BACKEND_CIDR".into(), "127.0.0.0/8".into()));
        Gateway::start_source(source, options).await
    }

    /// Starts `sluice run` and waits only until it is alive (/healthz
    /// answers), whatever /readyz says.
    pub async fn start_live(config: &ConfigDir, options: Options) -> Gateway {
        let source = vec!["--config".into(), config.path().as_os_str().to_owned()];
        Gateway::start_until(source, options, "/healthz").await
    }

    async fn start_source(source: Vec<std::ffi::OsString>, options: Options) -> Gateway {
        Gateway::start_until(source, options, "/readyz").await
    }

    async fn start_until(source: Vec<std::ffi::OsString>, options: Options, probe: &str) -> Gateway {
        // A free port found here may be taken by another test before the
        // gateway binds it; then try again with fresh ports.
        for _ in 0..3 {
            let mut gateway = Gateway::spawn(&source, &options);
            match gateway.wait_for(probe).await {
                Ok(()) => return gateway,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("the gateway did not become ready; its log:\n{log}"),
            }
        }
        panic!("no free ports for the gateway after 3 attempts");
    }

    fn spawn(source: &[std::ffi::OsString], options: &Options) -> Gateway {
        let scratch = tempfile::Builder::new().prefix("sluice-e2e-gateway").tempdir().expect("creating a scratch dir");
        let log = scratch.path().join("gateway.log");
        let stderr = std::fs::File::create(&log).expect("creating the gateway log");
        let (listen, admin) = (free_port(), free_port());
        let cache_dir = options.cache_dir.clone().unwrap_or_else(crate::shared_cache_dir);

        let mut command = Command::new(crate::sluice_binary());
        command
            .arg("run")
            .args(source)
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--admin")
            .arg(admin.to_string())
            .arg("--cache-dir")
            .arg(&cache_dir);
        if let Some(bytes) = options.max_body_bytes {
            command.arg("--max-body-bytes").arg(bytes.to_string());
        }
        let oci_cache_dir = options.oci_cache_dir.clone().unwrap_or_else(|| scratch.path().join("oci"));
        command.arg("--oci-cache-dir").arg(oci_cache_dir).args(&options.args);
        // Plain, predictable log lines for tests to search.
        // Text unless a test asks for JSON (SLUICE_LOG_FORMAT in its env).
        command.env("RUST_LOG", "info").env("NO_COLOR", "1").env("SLUICE_LOG_FORMAT", "text");
        // No registry credentials from whoever runs the tests.
        command.env("DOCKER_CONFIG", scratch.path().join("docker-config"));
        command.envs(options.env.iter().map(|(k, v)| (k, v)));
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", crate::sluice_binary().display()));
        Gateway { child, listen, admin, log, client: Client::http1(), _scratch: scratch }
    }

    /// Polls an admin probe until it answers 200; on failure returns the log.
    async fn wait_for(&mut self, probe: &str) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = self.admin_url(probe);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("(exited with {status})\n{}", self.log()));
            }
            let request = hyper::Request::get(&url).body(empty()).expect("a valid GET request");
            if let Ok(reply) = self.client.try_send(request).await
                && reply.status == 200
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(format!("(not ready after {READY_TIMEOUT:?})\n{}", self.log()))
    }

    /// The status /readyz answers now.
    pub async fn readyz(&self) -> u16 {
        self.client.get(&self.admin_url("/readyz")).await.status.as_u16()
    }

    /// The data plane URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    /// The admin listener's address (it serves /metrics).
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// The admin listener URL of `path`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// POSTs a chat request for `model` with `headers`.
    pub async fn chat(&self, model: &str, headers: &[(&str, &str)]) -> Reply {
        self.post("/v1/chat/completions", chat_body(model).to_string(), headers).await
    }

    pub async fn post(&self, path: &str, body: impl Into<Bytes>, headers: &[(&str, &str)]) -> Reply {
        self.client.post(&self.url(path), body, headers).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.client.get(&self.url(path)).await
    }

    /// GET /admin/config.
    pub async fn admin_config(&self) -> Value {
        let reply = self.client.get(&self.admin_url("/admin/config")).await;
        assert_eq!(reply.status, 200, "/admin/config: {}", reply.text());
        reply.json()
    }

    /// Waits (up to 5 s) until the log holds `text`: the gateway writes its
    /// log from a thread of its own, in batches.
    pub async fn wait_for_log(&self, text: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.log().contains(text) {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// Everything the gateway has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }

    /// Resident memory of the gateway process, from /proc.
    pub fn rss_bytes(&self) -> u64 {
        crate::rss_bytes_of(self.pid())
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU time the gateway has used (utime + stime, all threads), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("reading /proc");
        // The command name may hold spaces and parentheses: split after the last ')'.
        let fields: Vec<&str> = stat[stat.rfind(')').expect("/proc/PID/stat") + 1..].split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        // SAFETY: sysconf has no preconditions.
        ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Waits until no plugin is still having its snapshot made (see
    /// `instancesStartFrom` in /admin/config).
    pub async fn wait_for_snapshots(&self, within: std::time::Duration) {
        crate::eventually("plugin snapshots to be made", within, async || {
            let config = self.admin_config().await;
            let plugins = config["plugins"].as_array().cloned().unwrap_or_default();
            plugins.iter().all(|p| p["instancesStartFrom"] != "configure-until-snapshot").then_some(())
        })
        .await
    }

    /// The names of the gateway's threads, from /proc.
    pub fn thread_names(&self) -> Vec<String> {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.child.id())).expect("reading /proc");
        tasks
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim_end().to_string())
            .collect()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Asks the gateway to shut down, as Kubernetes does (SIGTERM).
    pub fn terminate(&self) {
        let status = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM failed");
    }

    /// Waits up to `timeout` for the process to exit, and says how it did.
    pub async fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failing test shows what the gateway said.
        if std::thread::panicking() {
            eprintln!("--- gateway log ---\n{}--- end of gateway log ---", self.log());
        }
    }
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}
