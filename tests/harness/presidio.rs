//! Microsoft Presidio's analyzer, the real `presidio-analyzer` package from
//! PyPI, behind its REST API (`POST /analyze`, `GET /health`) on a free
//! loopback port, for tests of plugins that send text to it.
//!
//! The package has no server and no spaCy model (the analyzer's image
//! downloads one from GitHub): harness/presidio_server.py serves the
//! image's API over an engine built as the image builds it, with a blank
//! spaCy pipeline for its NLP engine. So every pattern recognizer answers
//! as in production (e-mail addresses, phone numbers, cards, IBANs, IP
//! addresses, SSNs, ...), and the NER ones (PERSON, LOCATION, ...) find
//! nothing. `cargo xtask test` installs the pinned package into the tools
//! venv (`PYTHON_TOOLS` in crates/xtask/src/toolchain.rs).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Importing presidio and spaCy takes seconds, more on a busy machine.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const INSTALL_HINT: &str = "run `cargo xtask test`: it installs presidio-analyzer into the tools venv (or pip install \
                            the presidio-analyzer and spacy versions in PYTHON_TOOLS, crates/xtask/src/toolchain.rs)";
const LOG_TAIL_LINES: usize = 40;
/// What the analyzer's `/health` answers.
const HEALTHY: &str = "Presidio Analyzer service is up";

/// A running analyzer, killed when dropped.
pub struct Presidio {
    child: Child,
    addr: SocketAddr,
    dir: TempDir,
}

impl Presidio {
    /// Starts the analyzer on a free port; returns once `/health` answers.
    pub async fn start() -> Presidio {
        let python = crate::tools_python();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("harness/presidio_server.py");
        let dir = tempfile::Builder::new().prefix("sluice-e2e-presidio").tempdir().expect("creating a Presidio dir");
        let (child, addr) = crate::start_on_free_ports("Presidio", async || {
            let addr = free_addr();
            start_at(&python, &script, addr, dir.path()).await.map(|child| (child, addr))
        })
        .await;
        Presidio { child, addr, dir }
    }

    /// `http://127.0.0.1:<port>/analyze`.
    pub fn url(&self) -> String {
        format!("{}/analyze", self.origin())
    }

    /// `http://127.0.0.1:<port>`, for an egress grant.
    pub fn origin(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server's log so far: one line per request, and any traceback.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("presidio.log")).unwrap_or_default()
    }
}

impl Drop for Presidio {
    fn drop(&mut self) {
        crate::kill(&mut self.child);
        if std::thread::panicking() {
            eprintln!("{}", crate::log_tail(&self.dir.path().join("presidio.log"), LOG_TAIL_LINES));
        }
    }
}

/// A free loopback address (free when asked: a race the retry on another
/// port covers).
fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

async fn start_at(python: &Path, script: &Path, addr: SocketAddr, dir: &Path) -> Result<Child, String> {
    let log_path = dir.join("presidio.log");
    let log = std::fs::File::create(&log_path).expect("creating the Presidio log");
    let mut child = Command::new(python)
        .arg(script)
        .arg(addr.port().to_string())
        // Its log lines as they happen, for a failing test's log tail.
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning a log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
    let started = Instant::now();
    while started.elapsed() < READY_TIMEOUT {
        if health(addr).is_ok_and(|body| body.ends_with(HEALTHY)) {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = crate::log_tail(&log_path, LOG_TAIL_LINES);
            // As the harness's retry on another port expects it.
            let in_use = if log.contains("Address already in use") { "address already in use; " } else { "" };
            let hint = if log.contains("No module named") { format!("{INSTALL_HINT}; ") } else { String::new() };
            return Err(format!("{in_use}{hint}the Presidio server exited ({status})\n{log}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    crate::kill(&mut child);
    Err(format!(
        "the Presidio server did not answer within {READY_TIMEOUT:?}\n{}",
        crate::log_tail(&log_path, LOG_TAIL_LINES)
    ))
}

/// `GET /health` over a fresh connection: the whole response, if any.
fn health(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("GET /health HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}
