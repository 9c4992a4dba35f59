//! A real Kubernetes API server for the tests, started the way
//! controller-runtime's envtest does it: `etcd` and `kube-apiserver` as child
//! processes on free loopback ports, with their data, certificates and logs
//! in a temporary directory, and `kubectl` to drive them.
//!
//! `cargo xtask test` builds the three binaries from source once per machine
//! (crates/xtask/src/kube.rs) and passes their directory in
//! `SLUICE_KUBE_BIN_DIR`; `cargo xtask kube` builds them alone.
//!
//! There is no controller manager: namespace deletion and ownerReference
//! garbage collection do not run, so tests isolate by namespace rather than
//! clean up.
//!
//! The processes never outlive the test binary: they are killed when their
//! [`KubeCluster`] is dropped, when the process exits (an `atexit` hook, for
//! [`KubeCluster::shared`]), and otherwise by the kernel: each is started
//! with `PR_SET_PDEATHSIG`, from one thread that lives as long as the process
//! (the signal follows the thread that forked, not the process, and each
//! test runs on a thread of its own).

// Calls that need `unsafe`, each block with a SAFETY: comment saying why
// it is sound (clippy::undocumented_unsafe_blocks checks there is one).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{self, Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Set by `cargo xtask test`.
const BIN_DIR_ENV: &str = "SLUICE_KUBE_BIN_DIR";
/// The cache directory crates/xtask/src/kube.rs builds into (keep in sync:
/// `KUBERNETES_VERSION` and `ETCD_VERSION` there).
const CACHE_SUBDIR: &str = "sluice/kube/kubernetes-v1.34.4-etcd-v3.6.16/bin";
const BUILD_HINT: &str = "run `cargo xtask test` or `cargo xtask kube` (it builds them from source, once)";

const READY_TIMEOUT: Duration = Duration::from_secs(90);
const LOG_TAIL_LINES: usize = 60;

/// etcd and kube-apiserver, running until dropped.
pub struct KubeCluster {
    dir: TempDir,
    bin: PathBuf,
    etcd: Mutex<Option<Child>>,
    apiserver: Mutex<Option<Child>>,
    etcd_port: AtomicU16,
    api_port: AtomicU16,
    /// user -> bearer token.
    tokens: BTreeMap<&'static str, String>,
    /// The admin kubeconfig, written once the API server has made its CA.
    kubeconfig: PathBuf,
    /// A TLS client trusting the API server's CA, for /readyz.
    tls: OnceLock<Arc<rustls::ClientConfig>>,
    /// Whether a panic message has shown the logs already.
    logs_shown: AtomicBool,
}

impl KubeCluster {
    /// A token user in group `system:masters`: every permission, whatever
    /// RBAC says. [`KubeCluster::kubeconfig`] and [`KubeCluster::kubectl`]
    /// use it.
    pub const ADMIN: &str = "admin";
    /// A token user in no group (but `system:authenticated`), so with no
    /// permission until RBAC grants some: for least-privilege tests.
    pub const GATEWAY: &str = "sluice-gateway";

    /// etcd + kube-apiserver on free loopback ports in a temp dir; returns
    /// once /readyz is ok. Panics with the tail of the logs if they fail to
    /// start.
    pub async fn start() -> KubeCluster {
        let started = Instant::now();
        let bin = bin_dir();
        let dir = tempfile::Builder::new().prefix("sluice-kube").tempdir().expect("creating the cluster dir");
        let tokens: BTreeMap<&'static str, String> =
            [(Self::ADMIN, random_hex(16)), (Self::GATEWAY, random_hex(16))].into_iter().collect();
        // token,user,uid[,"group,group"]
        let token_file = format!(
            "{},{admin},{admin},\"system:masters\"\n{},{gateway},{gateway}\n",
            tokens[Self::ADMIN],
            tokens[Self::GATEWAY],
            admin = Self::ADMIN,
            gateway = Self::GATEWAY
        );
        write(&dir.path().join("tokens.csv"), &token_file);
        // The service account token signing key, and its public half.
        let (private, public) = service_account_key_pair();
        write(&dir.path().join("service-account.key"), &private);
        write(&dir.path().join("service-account.pub"), &public);

        let cluster = KubeCluster {
            bin,
            etcd: Mutex::new(None),
            apiserver: Mutex::new(None),
            etcd_port: AtomicU16::new(0),
            api_port: AtomicU16::new(0),
            tokens,
            kubeconfig: dir.path().join("kubeconfig"),
            tls: OnceLock::new(),
            logs_shown: AtomicBool::new(false),
            dir,
        };
        // A port found free may be taken before the process binds it.
        let etcd_started = Instant::now();
        for attempt in 1..=3 {
            cluster.etcd_port.store(free_port(), Ordering::Relaxed);
            match cluster.launch_etcd().await {
                Ok(()) => break,
                Err(log) if log.contains("address already in use") && attempt < 3 => {}
                Err(log) => cluster.fail(&format!("etcd did not start: {log}")),
            }
        }
        let etcd_ready = etcd_started.elapsed();
        for attempt in 1..=3 {
            cluster.api_port.store(free_port(), Ordering::Relaxed);
            match cluster.launch_apiserver().await {
                Ok(()) => break,
                Err(log) if log.contains("address already in use") && attempt < 3 => {
                    // It names the old port.
                    let _ = std::fs::remove_file(&cluster.kubeconfig);
                }
                Err(log) => cluster.fail(&format!("kube-apiserver did not start: {log}\n{}", cluster.etcd_log_tail())),
            }
        }
        eprintln!("kube: cluster ready at {} in {:.2?} (etcd {etcd_ready:.2?})", cluster.server(), started.elapsed());
        cluster
    }

    /// One cluster per test binary, shared by its tests (which isolate by
    /// namespace): started on first use, killed when the process exits.
    pub async fn shared() -> &'static KubeCluster {
        static SHARED: tokio::sync::OnceCell<KubeCluster> = tokio::sync::OnceCell::const_new();
        extern "C" fn stop_shared() {
            if let Some(cluster) = SHARED.get() {
                cluster.kill_all();
                let _ = std::fs::remove_dir_all(cluster.dir.path());
            }
        }
        SHARED
            .get_or_init(|| async {
                let cluster = KubeCluster::start().await;
                // SAFETY: registers a plain function with no preconditions.
                unsafe { libc::atexit(stop_shared) };
                cluster
            })
            .await
    }

    /// The admin kubeconfig (user `admin`, group `system:masters`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:PORT`.
    pub fn server(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port.load(Ordering::Relaxed))
    }

    /// The API server's CA certificate (PEM), which the kubeconfigs trust.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The bearer token of `user` ([`KubeCluster::ADMIN`] or [`KubeCluster::GATEWAY`]).
    pub fn token(&self, user: &str) -> &str {
        self.tokens.get(user).unwrap_or_else(|| panic!("no token user {user:?}; there are {:?}", self.tokens.keys()))
    }

    /// Writes, and returns, a kubeconfig that authenticates as token user
    /// `user` ([`KubeCluster::ADMIN`] or [`KubeCluster::GATEWAY`]).
    pub fn token_kubeconfig(&self, user: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{user}"));
        write(&path, &self.kubeconfig_yaml(user));
        path
    }

    /// `kubectl` with `--kubeconfig` set to the admin kubeconfig, and a
    /// discovery cache of this cluster's own.
    pub fn kubectl(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs kubectl with `args`; panics with its stdout and stderr unless it
    /// exits 0; returns stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = self.kubectl_result(args).await;
        assert!(ok, "`kubectl {}` failed\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}", args.join(" "));
        stdout
    }

    /// Runs kubectl with `args`; returns (success, stdout, stderr).
    pub async fn kubectl_result(&self, args: &[&str]) -> (bool, String, String) {
        let out = self.kubectl().args(args).output().await.expect("running kubectl");
        (out.status.success(), lossy(&out.stdout), lossy(&out.stderr))
    }

    /// `kubectl apply -f -` with `yaml` on stdin; panics on failure; returns
    /// stdout.
    pub async fn apply(&self, yaml: &str) -> String {
        let mut child = self
            .kubectl()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running kubectl apply");
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin.write_all(yaml.as_bytes()).await.expect("writing to kubectl apply");
        drop(stdin);
        let out = child.wait_with_output().await.expect("running kubectl apply");
        let (stdout, stderr) = (lossy(&out.stdout), lossy(&out.stderr));
        assert!(
            out.status.success(),
            "`kubectl apply` failed\n--- input ---\n{yaml}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        );
        stdout
    }

    /// Kills the API server (SIGKILL) and starts it again on the same port,
    /// with the same etcd and certificates; returns once it is ready. (Not
    /// on [`KubeCluster::shared`], whose other users would see it go away.)
    pub async fn restart_apiserver(&self) {
        self.stop_apiserver().await;
        self.start_apiserver().await;
    }

    /// Kills the API server (SIGKILL), as a crash would; etcd keeps running.
    pub async fn stop_apiserver(&self) {
        kill(&mut lock(&self.apiserver));
    }

    /// Starts the API server again after [`KubeCluster::stop_apiserver`], on
    /// the same port; returns once it is ready.
    pub async fn start_apiserver(&self) {
        // It may have exited on its own.
        let _ = exited(&self.apiserver);
        assert!(lock(&self.apiserver).is_none(), "kube-apiserver is running already");
        let started = Instant::now();
        if let Err(log) = self.launch_apiserver().await {
            self.fail(&format!("kube-apiserver did not restart: {log}\n{}", self.etcd_log_tail()));
        }
        eprintln!("kube: kube-apiserver ready again in {:.2?}", started.elapsed());
    }

    /// The directory with the logs (`etcd.log`, `kube-apiserver.log`), the
    /// etcd data and the certificates.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The API server's log so far (all its runs).
    pub fn apiserver_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }
}

// Starting and stopping the processes.
impl KubeCluster {
    /// Starts etcd on `etcd_port` and waits until it is healthy; on failure,
    /// the end of its log.
    async fn launch_etcd(&self) -> Result<(), String> {
        let port = self.etcd_port.load(Ordering::Relaxed);
        let peer = free_port();
        let data = self.dir.path().join("etcd");
        // A failed attempt may have left a member with other URLs.
        let _ = std::fs::remove_dir_all(&data);
        let mut cmd = Command::new(self.bin.join("etcd"));
        cmd.arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{port}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{port}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
            // Test data need not survive a power cut.
            .arg("--unsafe-no-fsync")
            // A lone member elects itself after an election timeout: 100 ms
            // rather than 1 s (and ticks of 10 ms, a fifth of it at most).
            .arg("--heartbeat-interval=10")
            .arg("--election-timeout=100");
        *lock(&self.etcd) = Some(self.spawn(cmd, "etcd.log"));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = exited(&self.etcd) {
                return Err(format!("etcd exited ({status})\n{}", self.etcd_log_tail()));
            }
            // Healthy, and ours: not another etcd that got the port first.
            if http_status(port, "/health").await == Some(200)
                && std::fs::read_to_string(self.dir.path().join("etcd.log"))
                    .is_ok_and(|log| log.contains(&format!("\"address\":\"127.0.0.1:{port}\"")))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("etcd not healthy after {READY_TIMEOUT:?}\n{}", self.etcd_log_tail()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts kube-apiserver on `api_port` and waits until /readyz is ok;
    /// on failure, the end of its log. The first launch also writes the CA
    /// and the admin kubeconfig.
    async fn launch_apiserver(&self) -> Result<(), String> {
        let port = self.api_port.load(Ordering::Relaxed);
        let dir = self.dir.path();
        let etcd = self.etcd_port.load(Ordering::Relaxed);
        let mut cmd = Command::new(self.bin.join("kube-apiserver"));
        cmd.arg(format!("--etcd-servers=http://127.0.0.1:{etcd}"))
            // It makes itself a CA and a serving certificate there, for
            // 127.0.0.1 and localhost, and reuses them when restarted.
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!("--secure-port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--authorization-mode=RBAC")
            // No controller manager makes the service account tokens it needs.
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!("--service-account-key-file={}", dir.join("service-account.pub").display()))
            .arg(format!("--service-account-signing-key-file={}", dir.join("service-account.key").display()))
            .arg(format!("--token-auth-file={}", dir.join("tokens.csv").display()))
            .arg("--allow-privileged=true")
            // The default reconciler keeps logging that 127.0.0.1 is not a
            // valid endpoint for the `kubernetes` Service.
            .arg("--endpoint-reconciler-type=none")
            .arg("--profiling=false");
        *lock(&self.apiserver) = Some(self.spawn(cmd, "kube-apiserver.log"));

        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = exited(&self.apiserver) {
                return Err(format!("kube-apiserver exited ({status})\n{}", self.apiserver_log_tail()));
            }
            if Instant::now() > deadline {
                return Err(format!("kube-apiserver not ready after {READY_TIMEOUT:?}\n{}", self.apiserver_log_tail()));
            }
            // The kubeconfig only once the API server has written its CA.
            if self.write_admin_kubeconfig() {
                let tls = self.tls.get_or_init(|| tls_config(&self.ca_file())).clone();
                let token = self.token(Self::ADMIN).to_string();
                let ready = tokio::task::spawn_blocking(move || readyz(port, tls, &token)).await;
                if ready.unwrap_or(false) {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Writes ca.crt (the self-signed CA that the API server put after its
    /// serving certificate in certs/apiserver.crt) and the admin kubeconfig,
    /// unless done already; false if the certificate is not there yet.
    fn write_admin_kubeconfig(&self) -> bool {
        if self.kubeconfig.is_file() {
            return true;
        }
        const END: &str = "-----END CERTIFICATE-----";
        let chain = std::fs::read_to_string(self.dir.path().join("certs/apiserver.crt")).unwrap_or_default();
        // Written without a rename: wait for the whole chain.
        let Some(ca_start) = chain.find(END).map(|end| end + END.len()) else { return false };
        let ca = chain[ca_start..].trim();
        if !ca.ends_with(END) {
            return false;
        }
        write(&self.ca_file(), &format!("{ca}\n"));
        write(&self.kubeconfig, &self.kubeconfig_yaml(Self::ADMIN));
        true
    }

    fn kubeconfig_yaml(&self, user: &str) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: sluice-test\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n\
             users:\n\
             - name: {user}\n  user:\n    token: {token}\n\
             contexts:\n\
             - name: {user}\n  context:\n    cluster: sluice-test\n    user: {user}\n\
             current-context: {user}\n",
            server = self.server(),
            ca = self.ca_file().display(),
            token = self.token(user),
        )
    }

    /// Starts `cmd` with its output appended to `log_name` in the cluster
    /// dir, so that it dies with the test process.
    fn spawn(&self, mut cmd: Command, log_name: &str) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(log_name))
            .unwrap_or_else(|e| panic!("opening {log_name}: {e}"));
        cmd.stdin(Stdio::null()).stdout(log.try_clone().expect("cloning a log file")).stderr(log);
        let shown = cmd.get_program().to_string_lossy().into_owned();
        spawn_for_life(cmd).unwrap_or_else(|e| panic!("starting {shown}: {e}"))
    }

    /// Panics with `message`, which shows the logs.
    fn fail(&self, message: &str) -> ! {
        self.logs_shown.store(true, Ordering::Relaxed);
        panic!("{message}")
    }

    fn kill_all(&self) {
        kill(&mut lock(&self.apiserver));
        kill(&mut lock(&self.etcd));
    }

    fn apiserver_log_tail(&self) -> String {
        log_tail(&self.dir.path().join("kube-apiserver.log"))
    }

    fn etcd_log_tail(&self) -> String {
        log_tail(&self.dir.path().join("etcd.log"))
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        self.kill_all();
        if std::thread::panicking() && !self.logs_shown.load(Ordering::Relaxed) {
            eprintln!("{}\n{}", self.apiserver_log_tail(), self.etcd_log_tail());
        }
    }
}

/// Spawns `cmd` with `PR_SET_PDEATHSIG` = SIGKILL, from a thread that lives
/// as long as the process: the kernel kills the child when the thread that
/// forked it exits, so not a test thread.
fn spawn_for_life(mut cmd: Command) -> io::Result<Child> {
    type Request = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::other("the test process exited"));
            }
            Ok(())
        });
    }
    let spawner = SPAWNER.get_or_init(|| {
        let (send, receive) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("kube-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in receive {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("starting the kube-spawner thread");
        send
    });
    let (reply, result) = mpsc::channel();
    spawner.send((cmd, reply)).expect("the kube-spawner thread is running");
    result.recv().expect("the kube-spawner thread answers")
}

/// kubectl, for tests that run it without a cluster (`kubectl kustomize`).
pub fn kubectl_binary() -> PathBuf {
    bin_dir().join("kubectl")
}

/// The binaries: `$SLUICE_KUBE_BIN_DIR`, else the xtask's cache directory.
fn bin_dir() -> PathBuf {
    let dir = match std::env::var_os(BIN_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = crate::user_cache_dir();
            cache.join(CACHE_SUBDIR)
        }
    };
    for name in ["etcd", "kube-apiserver", "kubectl"] {
        let path = dir.join(name);
        assert!(path.is_file(), "{} is missing: {BUILD_HINT}", path.display());
    }
    dir
}

/// A fresh ECDSA P-256 key pair: the private key as PKCS#8 PEM (the crate's
/// SEC1 form leaves out the curve, which Go's parser requires) and the public
/// key as PKIX PEM (the API server reads only RSA keys from a PKCS#8 file of
/// public keys).
fn service_account_key_pair() -> (String, String) {
    use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _, LineEnding};
    loop {
        // Out of the scalar range with a probability of about 2^-32.
        if let Ok(key) = p256::SecretKey::from_slice(&random_bytes(32)) {
            let private = key.to_pkcs8_pem(LineEnding::LF).expect("encoding a P-256 key").to_string();
            let public = key.public_key().to_public_key_pem(LineEnding::LF).expect("encoding a P-256 public key");
            return (private, public);
        }
    }
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0; len];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).expect("reading /dev/urandom");
    bytes
}

fn random_hex(len: usize) -> String {
    random_bytes(len).iter().map(|b| format!("{b:02x}")).collect()
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("a bound listener has an address").port()
}

/// A TLS client that trusts only the CA in `ca_file` (as kube-rs would with
/// the kubeconfig). Probing with it costs far less CPU than a kubectl per
/// probe, which matters on a 2-core machine where the API server is starting.
fn tls_config(ca_file: &Path) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).expect("reading the CA") {
        roots.add(cert.expect("parsing the CA")).expect("adding the CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// Whether `GET /readyz`, as the admin, answers 200 (blocking; loopback).
fn readyz(port: u16, tls: Arc<rustls::ClientConfig>, token: &str) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(tcp) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else { return false };
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = tcp.set_write_timeout(Some(Duration::from_secs(5)));
    let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let Ok(connection) = rustls::ClientConnection::new(tls, name) else { return false };
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = Vec::new();
    // The server closes the connection after answering; an error (such as a
    // close without TLS close_notify) after the status line is fine.
    let _ = stream.read_to_end(&mut response);
    response.starts_with(b"HTTP/1.1 200 ")
}

/// A bare HTTP/1.0 GET on loopback: etcd's health needs a status code only.
async fn http_status(port: u16, path: &str) -> Option<u16> {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", port));
    let mut stream = tokio::time::timeout(Duration::from_millis(500), connect).await.ok()?.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).await.ok()?;
    let mut head = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut head)).await.ok()?.ok()?;
    let line = std::str::from_utf8(&head[..read]).ok()?;
    line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()
}

fn lock(child: &Mutex<Option<Child>>) -> MutexGuard<'_, Option<Child>> {
    child.lock()
}

/// The exit status if the process has exited (and forgets it then).
fn exited(child: &Mutex<Option<Child>>) -> Option<std::process::ExitStatus> {
    let mut child = lock(child);
    let status = child.as_mut()?.try_wait().ok()??;
    *child = None;
    Some(status)
}

fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        // An error means it has exited already.
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn write(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn log_tail(path: &Path) -> String {
    crate::log_tail(path, LOG_TAIL_LINES)
}
