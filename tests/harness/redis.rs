//! A real Redis (Debian's `redis-server`) on a free loopback port, with no
//! persistence, for plugins' shared state. It can be killed and started
//! again on the same port, as an outage would, and serve TLS on a second
//! port with certificates of a test CA.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const READY_TIMEOUT: Duration = Duration::from_secs(10);
const INSTALL_HINT: &str = "install it with `apt-get install -y redis-server` (`cargo xtask test` does)";
const LOG_TAIL_LINES: usize = 40;

/// A running Redis, killed when dropped.
pub struct Redis {
    child: Option<Child>,
    addr: SocketAddr,
    /// The TLS port's address, if it serves one.
    tls_addr: Option<SocketAddr>,
    /// `redis-server` arguments beyond the harness's own.
    extra: Vec<String>,
    dir: TempDir,
}

impl Redis {
    /// Starts Redis on a free port; returns once it answers PING.
    pub async fn start() -> Redis {
        Redis::start_with(None).await
    }

    /// Starts Redis serving TLS too, with a certificate `ca` issued for
    /// 127.0.0.1, asking clients for a certificate of `ca` (Redis's
    /// default, `tls-auth-clients yes`).
    pub async fn start_tls(ca: &crate::tls::TestCa) -> Redis {
        Redis::start_with(Some(ca)).await
    }

    async fn start_with(ca: Option<&crate::tls::TestCa>) -> Redis {
        let dir = tempfile::Builder::new().prefix("sluice-e2e-redis").tempdir().expect("creating a Redis dir");
        let mut extra = Vec::new();
        let mut tls_addr = None;
        if let Some(ca) = ca {
            let server = ca.issue_server(&["127.0.0.1"]);
            let write = |name: &str, pem: &str| {
                let path = dir.path().join(name);
                std::fs::write(&path, pem).expect("writing a PEM");
                path.display().to_string()
            };
            let addr = free_addr();
            tls_addr = Some(addr);
            extra = vec![
                "--tls-port".into(),
                addr.port().to_string(),
                "--tls-cert-file".into(),
                write("redis.pem", &server.cert_pem),
                "--tls-key-file".into(),
                write("redis.key", &server.key_pem),
                "--tls-ca-cert-file".into(),
                write("ca.pem", &ca.pem()),
            ];
        }
        let (child, addr) = crate::start_on_free_ports("Redis", async || {
            let addr = free_addr();
            start_at(addr, dir.path(), &extra).await.map(|child| (child, addr))
        })
        .await;
        Redis { child: Some(child), addr, tls_addr, extra, dir }
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// `rediss://127.0.0.1:<TLS port>`, for a Redis started with TLS.
    pub fn tls_url(&self) -> String {
        format!("rediss://{}", self.tls_addr.expect("a Redis started with start_tls"))
    }

    /// Kills it, as a crash would: what it held is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            crate::kill(&mut child);
        }
    }

    /// Starts it again on its port, empty.
    pub async fn restart(&mut self) {
        self.kill();
        let child = start_at(self.addr, self.dir.path(), &self.extra).await.unwrap_or_else(|log| panic!("{log}"));
        self.child = Some(child);
    }

    /// A Redis command's reply as text (RESP, unparsed), e.g. `DBSIZE`.
    pub fn command(&self, args: &[&str]) -> String {
        command(self.addr, args).unwrap_or_else(|e| panic!("Redis at {}: {e}", self.addr))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{}", crate::log_tail(&self.dir.path().join("redis.log"), LOG_TAIL_LINES));
        }
    }
}

/// A free loopback address (free when asked: a race the harness's retry
/// on another port covers).
fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

async fn start_at(addr: SocketAddr, dir: &Path, extra: &[String]) -> Result<Child, String> {
    let binary =
        std::env::var_os("SLUICE_REDIS_SERVER").map_or_else(|| PathBuf::from("/usr/bin/redis-server"), PathBuf::from);
    assert!(binary.is_file(), "{} is missing: {INSTALL_HINT}", binary.display());
    let port = addr.port().to_string();
    let mut child = Command::new(&binary)
        .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    let started = Instant::now();
    while started.elapsed() < READY_TIMEOUT {
        if command(addr, &["PING"]).is_ok_and(|reply| reply.starts_with("+PONG")) {
            return Ok(child);
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = crate::log_tail(&dir.join("redis.log"), LOG_TAIL_LINES);
            // As the harness's retry on another port expects it.
            let in_use = if log.contains("Address already in use") { "address already in use; " } else { "" };
            return Err(format!("{in_use}Redis exited ({status})\n{log}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    crate::kill(&mut child);
    Err(format!("Redis did not answer within {READY_TIMEOUT:?}"))
}

/// One command over a fresh connection, its reply's first read.
fn command(addr: SocketAddr, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reply = [0u8; 4096];
    let n = stream.read(&mut reply)?;
    Ok(String::from_utf8_lossy(&reply[..n]).into_owned())
}
