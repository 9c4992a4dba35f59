//! An HTTPS upstream with a private CA: TLS terminated in the test process
//! and each decrypted connection passed, byte for byte, to a plain HTTP
//! upstream (an `Echo`), optionally asking for a client certificate signed
//! by a second CA (mutual TLS).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

/// A client that connects and then says nothing does not hold a task for
/// longer than this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many recent handshakes (and handshake errors) are kept for asserts.
const KEPT: usize = 64;

/// A certificate authority made for one test, trusted by nothing else.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and its key, in PEM and DER.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: PrivateKeyDer<'static>,
}

impl TestCa {
    /// A new CA whose certificate names `common_name`.
    pub fn new(common_name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::new()).expect("a CA needs no subject alt names");
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("generating a CA key");
        TestCa { issuer: CertifiedIssuer::self_signed(params, key).expect("self-signing a test CA") }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn der(&self) -> &CertificateDer<'static> {
        self.issuer.der()
    }

    /// A server certificate for `names`: DNS names or IP addresses.
    pub fn issue_server(&self, names: &[&str]) -> Issued {
        self.issue(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate naming `common_name`.
    pub fn issue_client(&self, common_name: &str) -> Issued {
        self.issue(&[common_name], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> Issued {
        let sans: Vec<String> = names.iter().map(|name| name.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap_or_else(|e| panic!("names {names:?}: {e}"));
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("sluice-test"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![purpose];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("generating a leaf key");
        let cert = params.signed_by(&key, &*self.issuer).expect("signing a leaf certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        }
    }

    /// Writes the CA certificate to `dir/name` and returns its path.
    pub fn write_pem(&self, dir: &Path, name: &str) -> PathBuf {
        write(dir, name, &self.pem())
    }

    /// Issues a client certificate and writes it and its key to
    /// `dir/cert_name` and `dir/key_name`; returns both paths.
    pub fn write_client_cert(&self, dir: &Path, cert_name: &str, key_name: &str) -> (PathBuf, PathBuf) {
        let issued = self.issue_client("sluice-gateway");
        (write(dir, cert_name, &issued.cert_pem), write(dir, key_name, &issued.key_pem))
    }
}

fn write(dir: &Path, name: &str, pem: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, pem).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

/// How a `TlsUpstream` presents itself and whom it lets in.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    names: Vec<String>,
    client_auth: bool,
    alpn: Vec<Vec<u8>>,
}

impl TlsOptions {
    /// A server certificate valid for `names` (DNS names or IP addresses),
    /// no client certificate asked for.
    pub fn new(names: &[&str]) -> TlsOptions {
        TlsOptions {
            names: names.iter().map(|name| name.to_string()).collect(),
            client_auth: false,
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }

    /// Offers only HTTP/1.1 in ALPN, as many servers do (the default offers
    /// `h2` first, then `http/1.1`).
    pub fn http1_only(mut self) -> TlsOptions {
        self.alpn = vec![b"http/1.1".to_vec()];
        self
    }

    /// Refuses clients without a certificate signed by the upstream's
    /// client CA.
    pub fn require_client_cert(mut self) -> TlsOptions {
        self.client_auth = true;
        self
    }
}

/// A completed handshake, as the upstream saw it.
#[derive(Clone, Debug)]
pub struct Handshake {
    /// The SNI the client sent (none for an IP address).
    pub server_name: Option<String>,
    /// The protocol agreed by ALPN: `h2` or `http/1.1`.
    pub alpn: Option<String>,
    /// Whether the client presented a certificate.
    pub client_cert: bool,
}

#[derive(Default)]
struct Stats {
    completed: AtomicU64,
    failed: AtomicU64,
    recent: Mutex<(VecDeque<Handshake>, VecDeque<String>)>,
}

impl Stats {
    fn completed(&self, handshake: Handshake) {
        self.completed.fetch_add(1, Ordering::SeqCst);
        push_bounded(&mut self.recent.lock().0, handshake);
    }

    fn failed(&self, error: String) {
        self.failed.fetch_add(1, Ordering::SeqCst);
        push_bounded(&mut self.recent.lock().1, error);
    }
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T) {
    if queue.len() == KEPT {
        queue.pop_front();
    }
    queue.push_back(item);
}

/// An HTTPS upstream on a free loopback port with a CA of its own, in
/// front of a plain HTTP upstream; it stops accepting when dropped.
pub struct TlsUpstream {
    addr: SocketAddr,
    ca: TestCa,
    client_ca: TestCa,
    stats: Arc<Stats>,
    _stop: oneshot::Sender<()>,
}

impl TlsUpstream {
    /// Serves TLS on the current tokio runtime and passes each decrypted
    /// connection to `target` (e.g. `echo.addr()`), which must speak what
    /// ALPN agreed: the echo speaks both HTTP/1.1 and h2.
    pub async fn start(target: SocketAddr, options: TlsOptions) -> TlsUpstream {
        let ca = TestCa::new("sluice-test upstream CA");
        let client_ca = TestCa::new("sluice-test client CA");
        let names: Vec<&str> = options.names.iter().map(String::as_str).collect();
        let server = ca.issue_server(&names);

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports the default versions");
        let config = if options.client_auth {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(client_ca.der().clone()).expect("the client CA is a valid trust anchor");
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .expect("building the client certificate verifier");
            config.with_client_cert_verifier(verifier)
        } else {
            config.with_no_client_auth()
        };
        let mut config =
            config.with_single_cert(vec![server.cert_der], server.key_der).expect("the server key fits its cert");
        config.alpn_protocols = options.alpn;
        let acceptor = TlsAcceptor::from(Arc::new(config));

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding the TLS upstream");
        let addr = listener.local_addr().expect("the TLS listener has an address");
        let stats = Arc::new(Stats::default());
        let (stop, mut stopped) = oneshot::channel::<()>();
        let accepting = stats.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    // Resolves when `_stop` is dropped, too.
                    _ = &mut stopped => return,
                    accepted = listener.accept() => {
                        let Ok((tcp, _)) = accepted else { continue };
                        tokio::spawn(relay(acceptor.clone(), tcp, target, accepting.clone()));
                    }
                }
            }
        });
        TlsUpstream { addr, ca, client_ca, stats, _stop: stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL a route's backend points at: `https://127.0.0.1:PORT/v1`.
    pub fn url(&self) -> String {
        format!("https://{}/v1", self.addr)
    }

    /// The CA that signed the server certificate.
    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// The CA whose client certificates are let in (with
    /// `require_client_cert`).
    pub fn client_ca(&self) -> &TestCa {
        &self.client_ca
    }

    /// Writes the server's CA certificate to `dir/name`.
    pub fn write_ca(&self, dir: &Path, name: &str) -> PathBuf {
        self.ca.write_pem(dir, name)
    }

    /// Writes a client certificate this upstream accepts, and its key.
    pub fn write_client_cert(&self, dir: &Path, cert_name: &str, key_name: &str) -> (PathBuf, PathBuf) {
        self.client_ca.write_client_cert(dir, cert_name, key_name)
    }

    /// Writes a client certificate from an unrelated CA, and its key.
    pub fn write_unrelated_client_cert(&self, dir: &Path, cert_name: &str, key_name: &str) -> (PathBuf, PathBuf) {
        TestCa::new("sluice-test unrelated CA").write_client_cert(dir, cert_name, key_name)
    }

    /// Handshakes completed so far.
    pub fn handshakes(&self) -> u64 {
        self.stats.completed.load(Ordering::SeqCst)
    }

    /// Handshakes that failed (or timed out) so far.
    pub fn failed_handshakes(&self) -> u64 {
        self.stats.failed.load(Ordering::SeqCst)
    }

    /// Why the most recent failed handshakes failed, once at least `count`
    /// have failed: the upstream may learn of a failure after the client
    /// does. Panics after 5 s.
    pub async fn wait_for_failed_handshakes(&self, count: u64) -> Vec<String> {
        let what = format!("{count} failed TLS handshakes");
        crate::eventually(&what, Duration::from_secs(5), async || {
            (self.failed_handshakes() >= count).then(|| self.handshake_errors())
        })
        .await
    }

    /// The most recent completed handshakes, oldest first.
    pub fn completed(&self) -> Vec<Handshake> {
        self.stats.recent.lock().0.iter().cloned().collect()
    }

    /// Why the most recent failed handshakes failed, oldest first.
    pub fn handshake_errors(&self) -> Vec<String> {
        self.stats.recent.lock().1.iter().cloned().collect()
    }
}

/// Completes the handshake on `tcp`, then copies bytes both ways between
/// it and a fresh connection to `target` until either side closes.
async fn relay(acceptor: TlsAcceptor, tcp: TcpStream, target: SocketAddr, stats: Arc<Stats>) {
    let mut tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(error)) => return stats.failed(error.to_string()),
        Err(_) => return stats.failed(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")),
    };
    let (_, connection) = tls.get_ref();
    stats.completed(Handshake {
        server_name: connection.server_name().map(str::to_owned),
        alpn: connection.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned()),
        client_cert: connection.peer_certificates().is_some_and(|chain| !chain.is_empty()),
    });
    let Ok(mut plain) = TcpStream::connect(target).await else { return };
    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
}
