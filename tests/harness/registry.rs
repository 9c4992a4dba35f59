//! A real OCI registry (CNCF distribution, Debian's `docker-registry`) on a
//! free loopback port with its own storage, for pull/push tests.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

const READY_TIMEOUT: Duration = Duration::from_secs(20);
const INSTALL_HINT: &str = "install it with `apt-get install -y docker-registry` (or set SLUICE_DOCKER_REGISTRY)";

/// A running registry, stopped when dropped. Its storage outlives
/// [`Registry::kill`], so [`Registry::restart`] brings the same content back.
pub struct Registry {
    child: Option<Child>,
    addr: SocketAddr,
    dir: TempDir,
    basic_auth: Option<(String, String)>,
}

impl Registry {
    /// An anonymous registry: anyone may pull and push.
    pub fn start() -> Registry {
        Registry::launch(None)
    }

    /// A registry that demands HTTP basic auth (an htpasswd file, bcrypt).
    pub fn start_with_basic_auth(username: &str, password: &str) -> Registry {
        Registry::launch(Some((username.to_string(), password.to_string())))
    }

    fn launch(basic_auth: Option<(String, String)>) -> Registry {
        let dir = tempfile::Builder::new().prefix("sluice-e2e-registry").tempdir().expect("creating a registry dir");
        if let Some((username, password)) = &basic_auth {
            // Cost 4, the minimum: the registry checks it on every request.
            let hash = bcrypt::hash(password, 4).expect("hashing the password");
            std::fs::write(dir.path().join("htpasswd"), format!("{username}:{hash}\n")).expect("writing htpasswd");
        }
        let mut registry = Registry { child: None, addr: free_port(), dir, basic_auth };
        // A port found free may be taken before the registry binds it.
        for _ in 0..3 {
            match registry.spawn() {
                Ok(()) => return registry,
                Err(log) if log.contains("address already in use") => registry.addr = free_port(),
                Err(log) => panic!("the registry did not start; its log:\n{log}"),
            }
        }
        panic!("no free port for the registry after 3 attempts");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let config = self.dir.path().join("config.yml");
        std::fs::write(&config, self.config_yaml()).expect("writing the registry config");
        let binary = std::env::var_os("SLUICE_DOCKER_REGISTRY")
            .map_or_else(|| PathBuf::from("/usr/bin/docker-registry"), PathBuf::from);
        assert!(binary.is_file(), "{} is missing: {INSTALL_HINT}", binary.display());
        // Appending: a restarted registry adds to the same logs.
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.path().join(name))
                .expect("opening a registry log")
        };
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(open("access.log"))
            .stderr(open("registry.log"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}: {INSTALL_HINT}", binary.display()));
        self.child = Some(child);
        self.wait_ready()
    }

    fn config_yaml(&self) -> String {
        let storage = self.dir.path().join("storage");
        let auth = match &self.basic_auth {
            Some(_) => format!(
                "auth:\n  htpasswd:\n    realm: sluice-test\n    path: {}\n",
                self.dir.path().join("htpasswd").display()
            ),
            None => String::new(),
        };
        format!(
            "version: 0.1\n\
             log:\n  level: info\n  formatter: text\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {}\n  secret: sluice-e2e\n\
             {auth}",
            storage.display(),
            self.addr
        )
    }

    /// Any HTTP answer from /v2/ (401 included, with auth on) means ready.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(format!("(exited with {status})\n{}", self.log()));
            }
            if http_get_status(self.addr, "/v2/").is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Err(format!("(not ready after {READY_TIMEOUT:?})\n{}", self.log()))
    }

    /// `127.0.0.1:<port>`, the registry part of a reference.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// `<host>/<repository_and_tag>`, e.g. `reference("plugins/x:v1")`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("{}/{repository_and_tag}", self.host())
    }

    pub fn basic_auth(&self) -> Option<(&str, &str)> {
        self.basic_auth.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// Where the registry keeps its blobs and manifests.
    pub fn storage_dir(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Stops the registry at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the registry again on the same port and storage.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn() {
            panic!("the registry did not restart; its log:\n{log}");
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(None)))
    }

    /// The access log: one line per request, `"METHOD /path HTTP/1.1" status`.
    pub fn access_log(&self) -> String {
        read(&self.dir.path().join("access.log"))
    }

    /// How many requests so far had `method` and a path containing `path_part`.
    pub fn requests(&self, method: &str, path_part: &str) -> usize {
        let prefix = format!("\"{method} ");
        self.access_log()
            .lines()
            .filter_map(|line| line.split_once(&prefix).map(|(_, rest)| rest))
            .filter(|rest| rest.split(' ').next().is_some_and(|path| path.contains(path_part)))
            .count()
    }

    /// The registry's own log (errors, warnings).
    pub fn log(&self) -> String {
        read(&self.dir.path().join("registry.log"))
    }

    /// Whether `path` (no auth) answers `status`, e.g. a manifest's presence.
    pub fn http_status(&self, path: &str) -> Option<u16> {
        http_get_status(self.addr, path)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- registry log ---\n{}--- end of registry log ---", self.log());
        }
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address")
}

/// A bare HTTP/1.0 GET: the harness needs a status code, not a client.
fn http_get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 32];
    let read = stream.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..read]).ok()?;
    line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
}
