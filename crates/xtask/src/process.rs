//! Running sluice processes for `quickstart` and `bench`: start, wait until
//! ready, stop.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::display;

/// A child process, killed when dropped so that no error path leaves one
/// holding a port.
pub struct Running {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Running {
    /// Starts `cmd` with its stdout and stderr going to `log`.
    pub fn spawn(name: &'static str, mut cmd: Command, log: &Path) -> Result<Self> {
        let file = File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            // The logs go to a file, not a terminal.
            .env("NO_COLOR", "1");
        // It stays in our process group, so a Ctrl-C that kills us before we
        // handle it stops it too.
        println!("$ {}  > {}", display(&cmd), log.display());
        let child = cmd.spawn().with_context(|| format!("cannot start {name}"))?;
        Ok(Self { name, child, log: log.to_path_buf() })
    }

    /// Fails, showing the end of its log, if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// Stops it as an operator would, with SIGTERM, and waits up to
    /// `timeout` for it to exit; fails unless it exits successfully.
    pub fn terminate(&mut self, timeout: Duration) -> Result<()> {
        signal("TERM", self.child.id());
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait()? {
                Some(status) if status.success() => return Ok(()),
                Some(status) => bail!(
                    "{} exited {status} on SIGTERM; last lines of {}:\n{}",
                    self.name,
                    self.log.display(),
                    log_tail(&self.log, 20)
                ),
                None if Instant::now() > deadline => bail!("{} did not exit within {timeout:?} of SIGTERM", self.name),
                None => thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// Sends signal `name` (TERM, KILL) to `pid`.
pub fn signal(name: &str, pid: u32) {
    // Errors mean it has exited already.
    let _ = Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status();
}

impl Drop for Running {
    fn drop(&mut self) {
        // Errors mean it has exited already.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prints, from a background thread, each line appended to `log` from now
/// on that `show` picks.
pub fn follow_log(log: &Path, show: impl Fn(&str) -> bool + Send + 'static) {
    let log = log.to_path_buf();
    let mut from = fs::metadata(&log).map_or(0, |m| m.len());
    thread::spawn(move || {
        let mut pending = String::new();
        loop {
            thread::sleep(Duration::from_millis(200));
            let Ok(mut file) = File::open(&log) else { continue };
            let mut new = Vec::new();
            if std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(from)).is_err()
                || file.read_to_end(&mut new).is_err()
            {
                continue;
            }
            from += new.len() as u64;
            pending.push_str(&String::from_utf8_lossy(&new));
            while let Some(end) = pending.find('\n') {
                let line: String = pending.drain(..=end).collect();
                if show(&line) {
                    print!("  gateway: {line}");
                }
            }
        }
    });
}

fn log_tail(log: &Path, lines: usize) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until `addr` accepts TCP connections, failing early if any of
/// `processes` exits.
pub fn wait_for_listener(addr: SocketAddr, processes: &mut [&mut Running], timeout: Duration) -> Result<()> {
    wait_until(&format!("{addr} to accept connections"), processes, timeout, || {
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok()
    })
}

/// Waits until `GET http://{admin}/readyz` answers 200, failing early if any
/// of `processes` exits.
pub fn wait_for_ready(admin: SocketAddr, processes: &mut [&mut Running], timeout: Duration) -> Result<()> {
    wait_until(&format!("http://{admin}/readyz to answer 200"), processes, timeout, || {
        http_get_status(admin, "/readyz").is_ok_and(|status| status == 200)
    })
}

fn wait_until(
    what: &str,
    processes: &mut [&mut Running],
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    println!("waiting for {what}");
    let start = Instant::now();
    loop {
        for process in processes.iter_mut() {
            process.check_alive()?;
        }
        if ready() {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("gave up after {timeout:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// A bare HTTP/1.1 GET, returning the status code. Enough for a readiness
/// probe without an HTTP client dependency.
fn http_get_status(addr: SocketAddr, path: &str) -> Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    // "HTTP/1.1 200 OK": the status is the second word of the first line.
    let mut head = [0u8; 64];
    let len = stream.read(&mut head)?;
    let head = String::from_utf8_lossy(&head[..len]);
    let status = head.split_whitespace().nth(1).context("empty HTTP response")?;
    Ok(status.parse()?)
}

/// A loopback address with a port that is free right now.
pub fn free_local_addr() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A channel that receives a message on Ctrl-C (SIGINT) or SIGTERM.
pub fn shutdown_signal() -> Result<mpsc::Receiver<()>> {
    use tokio::signal::unix::{SignalKind, signal};

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Register the handlers before returning, so an early signal is caught
    // rather than killing us with the children still running.
    let (mut interrupt, mut terminate) = {
        let _context = runtime.enter();
        (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?)
    };
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        runtime.block_on(async {
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        });
        let _ = tx.send(());
    });
    Ok(rx)
}
