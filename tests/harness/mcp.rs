//! MCP servers written with the official MCP Python SDK, and its client, for the MCP gateway tests.
//!
//! [`McpServer`] runs harness/mcp_server.py: the SDK's `MCPServer` over
//! Streamable HTTP at `http://127.0.0.1:<port>/mcp`, with tools that name the
//! server in their answers (`echo`, `add`, `count`, `sleep`, `whoami`,
//! `headers`, `big`, `interrupt`, `fail`), a prompt and resources; the
//! script's doc says what each does, and which protocol eras it speaks.
//! [`mcp_client`] runs harness/mcp_client.py, the SDK's `ClientSession` over
//! its Streamable HTTP transport, through one scenario (`list`, `call`,
//! `progress`, `cancel`, `prompts`, `resources`, `sequence`, `session-out`),
//! and returns the JSON object it prints; the script's doc says what each
//! prints.
//!
//! [`HostileMcpServer`] runs harness/mcp_hostile.py, a hostile server on
//! Python's standard library alone (huge listings, endless streams,
//! malformed JSON-RPC, silence), for tests/e2e/mcp_hostile.rs.
//!
//! All run on the tools venv's python ([`crate::tools_python`]), where
//! `cargo xtask test` installs the pinned `mcp` (`PYTHON_TOOLS` in
//! crates/xtask/src/toolchain.rs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::AsyncWriteExt;

/// Importing the SDK (pydantic, starlette, uvicorn) takes a second or two,
/// more on a busy machine.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// A client run's default bound: connecting, and a scenario of short calls.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
const INSTALL_HINT: &str = "run `cargo xtask test`: it installs the MCP Python SDK into the tools venv (or pip \
                            install the `mcp` version in PYTHON_TOOLS, crates/xtask/src/toolchain.rs)";
const LOG_TAIL_LINES: usize = 40;
const PROXY_VARIABLES: [&str; 6] = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"];

/// How to run an [`McpServer`].
#[derive(Clone, Debug, Default)]
pub struct McpServerOptions {
    /// The SDK's `stateless_http`: no Mcp-Session-Id in the handshake era.
    pub stateless: bool,
    /// The SDK's `json_response`: one JSON body per POST instead of an SSE
    /// stream (so no progress or log notifications reach the client).
    pub json: bool,
    /// Keeps the SSE events of the handshake era's streams, so that a client
    /// resumes a closed one (GET with Last-Event-ID); the `interrupt` tool
    /// closes its own mid-call.
    pub resumable: bool,
    /// The port to listen on; `None` for one the kernel picks.
    pub port: Option<u16>,
    /// Extra environment, e.g. `MCP_CANCEL_LOG`: a file that gets a line
    /// `cancelled` whenever a `sleep` call is cancelled.
    pub env: Vec<(String, String)>,
}

/// A running MCP server, killed when dropped.
pub struct McpServer {
    name: String,
    options: McpServerOptions,
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl McpServer {
    /// Starts a stateful, SSE-answering server named `name` on a free port;
    /// returns once it accepts connections.
    pub async fn start(name: &str) -> McpServer {
        McpServer::start_with(name, McpServerOptions::default()).await
    }

    /// Starts a server named `name` as `options` say.
    pub async fn start_with(name: &str, options: McpServerOptions) -> McpServer {
        let dir = tempfile::Builder::new().prefix("sluice-e2e-mcp").tempdir().expect("creating an MCP server dir");
        let (child, port) = start_at(name, &options, options.port.unwrap_or(0), dir.path()).await;
        McpServer { name: name.to_owned(), options, child: Some(child), port, dir }
    }

    /// `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// The port it listens on (the same across [`McpServer::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The id of its current process (`whoami` answers it too).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills it, as an outage would: connections to its port are refused
    /// until [`McpServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::kill(&mut child);
        }
    }

    /// Starts it again on its port, as a new process: the sessions of the
    /// old one are gone.
    pub async fn restart(&mut self) {
        self.kill();
        let (child, _) = start_at(&self.name, &self.options, self.port, self.dir.path()).await;
        self.child = Some(child);
    }

    /// Its stdout and stderr so far, across restarts: SDK warnings and any
    /// traceback.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mcp.log")).unwrap_or_default()
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{}", crate::log_tail(&self.dir.path().join("mcp.log"), LOG_TAIL_LINES));
        }
    }
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("harness").join(name)
}

/// Starts mcp_server.py on `port` (0: the kernel picks) and waits for its
/// `READY <port>` line; returns the process and its port.
async fn start_at(name: &str, options: &McpServerOptions, port: u16, dir: &Path) -> (Child, u16) {
    let python = crate::tools_python();
    let script = script("mcp_server.py");
    let log_path = dir.join("mcp.log");
    // Appended across restarts; only what this start writes is searched.
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path).expect("opening the MCP log");
    let offset = log.metadata().map(|m| m.len() as usize).unwrap_or(0);
    let mut command = Command::new(&python);
    command.arg(&script).args(["--name", name, "--port", &port.to_string()]);
    if options.stateless {
        command.arg("--stateless");
    }
    if options.json {
        command.arg("--json");
    }
    if options.resumable {
        command.arg("--resumable");
    }
    let mut child = command
        .envs(options.env.iter().map(|(k, v)| (k, v)))
        // Its lines as they happen, for a failing test's log tail.
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning a log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
    let started = Instant::now();
    while started.elapsed() < READY_TIMEOUT {
        let text = std::fs::read_to_string(&log_path).unwrap_or_default();
        let ready = text.get(offset..).unwrap_or_default().lines().find_map(|line| line.strip_prefix("READY "));
        if let Some(port) = ready.and_then(|port| port.trim().parse().ok()) {
            return (child, port);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = crate::log_tail(&log_path, LOG_TAIL_LINES);
            let hint = if log.contains("No module named") { format!("{INSTALL_HINT}; ") } else { String::new() };
            panic!("{hint}the MCP server {name} exited ({status})\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::kill(&mut child);
    panic!(
        "the MCP server {name} was not ready within {READY_TIMEOUT:?}\n{}",
        crate::log_tail(&log_path, LOG_TAIL_LINES)
    );
}

/// How to run [`mcp_client`].
#[derive(Clone, Debug, Default)]
pub struct McpClientOptions {
    /// HTTP headers on every request, e.g. `("Authorization", "Bearer t")`.
    pub headers: Vec<(String, String)>,
    /// `--protocol`: `auto` (the SDK's default: `server/discover`, falling
    /// back to `initialize`), `legacy` (`initialize` only), a handshake-era
    /// version such as `2025-06-18`, or `2026-07-28`; `None` for `auto`.
    pub protocol: Option<String>,
    /// `--alternate`: every HTTP request alternates between the URL and this
    /// one (their scheme, host and port; the path stays the URL's).
    pub alternate: Option<String>,
    /// What the client reads on stdin (the `sequence` scenario's steps).
    pub stdin: Option<String>,
    /// The bound on the whole run; `None` for 60 s.
    pub timeout: Option<Duration>,
}

/// Runs mcp_client.py against `url` with `args` (a scenario, its arguments
/// and any further options, e.g. `["call", "echo", r#"{"text":"hi"}"#]`, or
/// `"--trace"`); returns the JSON object it prints. Panics, with its stderr,
/// if it fails to connect or takes too long.
pub async fn mcp_client(url: &str, args: &[&str], opts: &McpClientOptions) -> serde_json::Value {
    try_mcp_client(url, args, opts).await.unwrap_or_else(|failure| panic!("{failure}"))
}

/// [`mcp_client`], for a run that is expected to fail: `Err` says why (its
/// stderr names the exceptions, and the status of each HTTP request made).
pub async fn try_mcp_client(url: &str, args: &[&str], opts: &McpClientOptions) -> Result<serde_json::Value, String> {
    let stderr_file = tempfile::NamedTempFile::new().expect("creating a file for the client's stderr");
    let mut command = tokio::process::Command::new(crate::tools_python());
    command.arg(script("mcp_client.py")).arg(url).args(args);
    for (name, value) in &opts.headers {
        command.arg("--header").arg(format!("{name}: {value}"));
    }
    if let Some(protocol) = &opts.protocol {
        command.args(["--protocol", protocol]);
    }
    if let Some(alternate) = &opts.alternate {
        command.args(["--alternate", alternate]);
    }
    // Straight to loopback, whatever proxy the machine has (the client's
    // HTTP client ignores the environment too).
    for proxy in PROXY_VARIABLES {
        command.env_remove(proxy);
    }
    command
        .env("NO_PROXY", "*")
        .stdin(if opts.stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(stderr_file.reopen().expect("reopening the client's stderr file"))
        .kill_on_drop(true);
    let what = format!("mcp_client.py {url} {}", args.join(" "));
    let timeout = opts.timeout.unwrap_or(CLIENT_TIMEOUT);
    let run = async {
        let mut child = command.spawn().unwrap_or_else(|e| panic!("starting {what}: {e}"));
        if let (Some(input), Some(mut stdin)) = (&opts.stdin, child.stdin.take()) {
            stdin.write_all(input.as_bytes()).await.unwrap_or_else(|e| panic!("writing to {what}: {e}"));
            // Closing it ends the client's read.
            drop(stdin);
        }
        child.wait_with_output().await.unwrap_or_else(|e| panic!("waiting for {what}: {e}"))
    };
    // On timeout `run` is dropped, which kills the client (kill_on_drop).
    let output = tokio::time::timeout(timeout, run).await;
    let stderr = std::fs::read_to_string(stderr_file.path()).unwrap_or_default();
    let output = match output {
        Ok(output) => output,
        Err(_) => return Err(format!("{what} took over {timeout:?}, killed\n--- stderr ---\n{stderr}")),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = format!("--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    if !output.status.success() {
        let hint = if stderr.contains("No module named") { format!("{INSTALL_HINT}; ") } else { String::new() };
        return Err(format!("{hint}{what} failed ({})\n{report}", output.status));
    }
    serde_json::from_str(stdout.trim()).map_err(|e| format!("{what} printed no JSON object ({e})\n{report}"))
}

/// A running hostile MCP server (harness/mcp_hostile.py, Python's standard
/// library only), killed when dropped: `initialize` answered properly,
/// then `tools/list` misbehaving as its `listing` mode says and each
/// `tools/call` as its tool's name says (the script's doc lists both).
pub struct HostileMcpServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl HostileMcpServer {
    /// Starts one named `name` whose `tools/list` behaves as `listing`
    /// (`normal`, `huge`, `endless-cursor`, `trickle`, `slow-head`,
    /// `not-json`, `poison`).
    pub async fn start(name: &str, listing: &str) -> HostileMcpServer {
        HostileMcpServer::start_with(name, &["--listing", listing]).await
    }

    /// Starts one named `name` with more of the script's options, e.g.
    /// `["--initialize", "trickle"]`.
    pub async fn start_with(name: &str, args: &[&str]) -> HostileMcpServer {
        let dir = tempfile::Builder::new().prefix("sluice-e2e-mcp-hostile").tempdir().expect("creating a dir");
        let log_path = dir.path().join("mcp.log");
        let log = std::fs::File::create(&log_path).expect("creating the hostile MCP server's log");
        let python = crate::tools_python();
        let script = script("mcp_hostile.py");
        let mut child = Command::new(&python)
            .arg(&script)
            .args(["--name", name])
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cloning a log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(port) =
                text.lines().find_map(|line| line.strip_prefix("READY ")).and_then(|p| p.trim().parse().ok())
            {
                return HostileMcpServer { child: Some(child), port, dir };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "the hostile MCP server {name} exited ({status})\n{}",
                    crate::log_tail(&log_path, LOG_TAIL_LINES)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        crate::kill(&mut child);
        panic!("the hostile MCP server {name} was not ready within {READY_TIMEOUT:?}");
    }

    /// `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    /// What it has seen so far (GET /stats): `requests` by method, `calls`
    /// by tool, `open_streams` now, `closed_streams` (streams and held
    /// requests whose client, the gateway, went away), `flood_bytes`.
    pub async fn stats(&self) -> serde_json::Value {
        let reply = crate::Client::http1().get(&format!("http://127.0.0.1:{}/stats", self.port)).await;
        assert_eq!(reply.status, 200, "GET /stats: {}", reply.text());
        reply.json()
    }

    /// Its stdout and stderr so far (any traceback).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mcp.log")).unwrap_or_default()
    }
}

impl Drop for HostileMcpServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::kill(&mut child);
        }
        if std::thread::panicking() {
            eprintln!("{}", crate::log_tail(&self.dir.path().join("mcp.log"), LOG_TAIL_LINES));
        }
    }
}
