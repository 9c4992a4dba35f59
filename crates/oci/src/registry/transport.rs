//! The wire. Pulls go through this crate's own HTTP client, so that every
//! body a registry sends is read with a limit, checked on its Content-Length
//! and again as it streams: manifests, blobs, token responses and error
//! bodies alike. Pushes, to a registry the operator names, go through one
//! `oci-client` per registry host.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderValue, StatusCode};
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use parking_lot::Mutex;
use serde::Deserialize;
use sha2::Digest as _;

use crate::auth::identity;
use crate::digest::{check_registry_digest, sha256_digest};
use crate::error::OciError;
use crate::media_types as mt;
use crate::reference::Reference;

/// The largest manifest or index read: distribution refuses to store a
/// larger one (`maxManifestBodySize`), and containers/image reads no more.
pub(crate) const MAX_MANIFEST_BYTES: u64 = 4 * 1024 * 1024;
/// The largest token response read, as containers/image's
/// `MaxAuthTokenBodySize`; a token is a few kilobytes.
pub(crate) const MAX_TOKEN_BYTES: u64 = 1024 * 1024;
/// How much of an error body is read to tell why a request failed.
const MAX_ERROR_BYTES: u64 = 64 * 1024;
/// Remembered logins, one per registry, repository and credential.
const MAX_LOGINS: usize = 1024;

/// Waits between tries of a transient failure: three tries in all.
const RETRY_DELAYS: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];
const USER_AGENT: &str = concat!("sluice/", env!("CARGO_PKG_VERSION"));
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const READ_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct Transport {
    /// Mozilla's roots plus the configured bundles, DER.
    pub(crate) roots: Vec<Certificate>,
    insecure_registries: Vec<String>,
    /// Pushes: one client per registry host, rebuilt when its credentials
    /// change (oci-client keeps the first credentials it is given).
    clients: Mutex<HashMap<String, (RegistryAuth, oci_client::Client)>>,
    /// Pulls.
    http: reqwest::Client,
    /// The `Authorization` that last worked, by [`Session::key`].
    logins: Mutex<HashMap<String, HeaderValue>>,
}

impl Transport {
    pub(crate) fn new(ca_bundles: &[PathBuf], insecure_registries: Vec<String>) -> Result<Transport, OciError> {
        // reqwest is built without a default crypto provider; use ring, as
        // the rest of the workspace does. An already installed one is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots: Vec<Certificate> = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|cert| Certificate { encoding: CertificateEncoding::Der, data: cert.to_vec() })
            .collect();
        for path in ca_bundles {
            roots.extend(read_pem_bundle(path)?);
        }
        let tls = |e: reqwest::Error| OciError::Tls(e.to_string());
        let certificates =
            roots.iter().map(|cert| reqwest::Certificate::from_der(&cert.data)).collect::<Result<Vec<_>, _>>();
        let http = reqwest::Client::builder()
            // Exactly these roots: the same trust on every machine.
            .tls_certs_only(certificates.map_err(tls)?)
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .user_agent(USER_AGENT)
            .build()
            .map_err(tls)?;
        Ok(Transport {
            roots,
            insecure_registries,
            clients: Mutex::new(HashMap::new()),
            http,
            logins: Mutex::new(HashMap::new()),
        })
    }

    /// The push client for this reference's registry, holding `auth`.
    pub(crate) async fn client(
        &self,
        reference: &Reference,
        auth: RegistryAuth,
    ) -> Result<(oci_client::Client, RegistryAuth), OciError> {
        let registry = reference.registry().to_string();
        if let Some((known, client)) = self.clients.lock().get(&registry)
            && *known == auth
        {
            return Ok((client.clone(), auth));
        }
        let plain_http = self.plain_http(&registry);
        let config = ClientConfig {
            protocol: if plain_http { ClientProtocol::Http } else { ClientProtocol::Https },
            // Exactly these roots: the same trust on every machine, whatever
            // its OS store holds.
            tls_certs_only: self.roots.clone(),
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            user_agent: USER_AGENT,
            // Two requests per blob instead of one per 4 MiB chunk; the
            // streamed body still reports progress.
            use_monolithic_push: true,
            ..Default::default()
        };
        let client = oci_client::Client::try_from(config).map_err(|e| OciError::Tls(e.to_string()))?;
        client.store_auth_if_needed(reference.as_oci().resolve_registry(), &auth).await;
        self.clients.lock().insert(registry, (auth.clone(), client.clone()));
        Ok((client, auth))
    }

    /// Pulls from `reference`'s repository, presenting `auth`.
    pub(crate) fn session(&self, reference: &Reference, auth: RegistryAuth) -> Session<'_> {
        let registry = reference.registry().to_string();
        let plain_http = self.plain_http(&registry);
        let scheme = if plain_http { "http" } else { "https" };
        Session {
            transport: self,
            plain_http,
            base: format!("{scheme}://{}/v2/{}", reference.as_oci().resolve_registry(), reference.repository()),
            key: format!("{registry}/{} {}", reference.repository(), identity(&registry, &auth)),
            registry,
            repository: reference.repository().to_string(),
            auth,
        }
    }

    pub(crate) fn plain_http(&self, registry: &str) -> bool {
        let host = host_of(registry);
        is_loopback(host) || self.insecure_registries.iter().any(|r| r == registry || r == host)
    }
}

/// One repository, pulled from as one caller.
pub(crate) struct Session<'a> {
    transport: &'a Transport,
    plain_http: bool,
    registry: String,
    repository: String,
    auth: RegistryAuth,
    /// `<scheme>://<registry>/v2/<repository>`.
    base: String,
    /// Registry, repository and [`identity`]: whose login is remembered.
    key: String,
}

impl Session<'_> {
    /// The manifest `reference` (in this repository) names, at most
    /// [`MAX_MANIFEST_BYTES`], and its sha256; checked against the
    /// reference's digest if it has one.
    pub(crate) async fn manifest(&self, reference: &Reference) -> Result<(Bytes, String), OciError> {
        self.manifest_limited(reference, MAX_MANIFEST_BYTES).await
    }

    /// [`Session::manifest`] with a limit of its own (a signature manifest's).
    pub(crate) async fn manifest_limited(
        &self,
        reference: &Reference,
        limit: u64,
    ) -> Result<(Bytes, String), OciError> {
        let name = reference.digest().or(reference.tag()).unwrap_or("latest");
        let url = format!("{}/manifests/{name}", self.base);
        let what = format!("manifest {reference}");
        let response = self.get(&url, &mt::MANIFESTS.join(", "), &what).await?;
        let body = self.read_limited(response, limit, &what).await?;
        // The cache is keyed by sha256, whatever digest the registry chose.
        let digest = sha256_digest(&body);
        if let Some(expected) = reference.digest()
            && expected != digest
        {
            return Err(OciError::DigestMismatch { what, expected: expected.to_string(), actual: digest });
        }
        Ok((body, digest))
    }

    /// Streams a blob into memory, hashing as it goes and stopping at `limit`.
    pub(crate) async fn blob(&self, descriptor: &OciDescriptor, limit: u64) -> Result<Bytes, OciError> {
        let registry = self.registry.as_str();
        let what = format!("blob {} of {registry}/{}", descriptor.digest, self.repository);
        check_registry_digest(&descriptor.digest, &what, registry)?;
        let url = format!("{}/blobs/{}", self.base, descriptor.digest);
        let response = self.get(&url, "*/*", &what).await?;
        if let Some(length) = response.content_length()
            && length > limit
        {
            return Err(OciError::TooLarge { size: length, max: limit });
        }
        let mut buffer = Vec::with_capacity((descriptor.size.max(0) as u64).min(limit) as usize);
        let mut hasher = sha2::Sha256::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.network(e, &what))?;
            let received = (buffer.len() + chunk.len()) as u64;
            if received > limit {
                return Err(OciError::TooLarge { size: received, max: limit });
            }
            hasher.update(&chunk);
            buffer.extend_from_slice(&chunk);
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != descriptor.digest {
            return Err(OciError::DigestMismatch { what, expected: descriptor.digest.clone(), actual });
        }
        if buffer.len() as i64 != descriptor.size {
            return Err(OciError::Protocol {
                registry: registry.to_string(),
                detail: format!("{what} is {} bytes, the manifest says {}", buffer.len(), descriptor.size),
            });
        }
        Ok(Bytes::from(buffer))
    }

    /// A GET that logs in when challenged, and fails on an error status.
    async fn get(&self, url: &str, accept: &str, what: &str) -> Result<reqwest::Response, OciError> {
        let remembered = self.transport.logins.lock().get(&self.key).cloned();
        let mut response = self.send(url, accept, remembered.as_ref(), what).await?;
        if response.status() == StatusCode::UNAUTHORIZED
            && let Some(login) = self.login(&response).await?
        {
            response = self.send(url, accept, Some(&login), what).await?;
            if response.status().is_success() {
                let mut logins = self.transport.logins.lock();
                if logins.len() >= MAX_LOGINS {
                    logins.clear();
                }
                logins.insert(self.key.clone(), login);
            }
        }
        if response.status().is_success() {
            return Ok(response);
        }
        Err(self.refusal(response, what).await)
    }

    async fn send(
        &self,
        url: &str,
        accept: &str,
        authorization: Option<&HeaderValue>,
        what: &str,
    ) -> Result<reqwest::Response, OciError> {
        let mut request = self.transport.http.get(url).header(ACCEPT, accept);
        if let Some(authorization) = authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        request.send().await.map_err(|e| self.network(e, what))
    }

    /// What to send after a 401: a token from the realm of a Bearer
    /// challenge, or the credential itself for a Basic one. `None` when
    /// there is nothing to offer.
    async fn login(&self, challenged: &reqwest::Response) -> Result<Option<HeaderValue>, OciError> {
        let header = challenged.headers().get(WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).unwrap_or_default();
        let challenges = http_auth::parse_challenges(header).unwrap_or_default();
        let param = |challenge: &http_auth::ChallengeRef, name: &str| {
            challenge.params.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, v)| v.to_unescaped())
        };
        if let Some(bearer) = challenges.iter().find(|c| c.scheme.eq_ignore_ascii_case("Bearer"))
            && let Some(realm) = param(bearer, "realm")
        {
            let token = self.token(&realm, param(bearer, "service").as_deref()).await?;
            return Ok(Some(header_value(&format!("Bearer {token}"), &self.registry)?));
        }
        let basic = challenges.iter().any(|c| c.scheme.eq_ignore_ascii_case("Basic"));
        match &self.auth {
            RegistryAuth::Basic(username, password) if basic => {
                let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
                Ok(Some(header_value(&format!("Basic {encoded}"), &self.registry)?))
            }
            _ => Ok(None),
        }
    }

    /// A pull token for this repository from `realm`, the registry's token
    /// service, presenting the credential if there is one.
    async fn token(&self, realm: &str, service: Option<&str>) -> Result<String, OciError> {
        let protocol = |detail: String| OciError::Protocol { registry: self.registry.clone(), detail };
        let mut url = reqwest::Url::parse(realm).map_err(|e| protocol(format!("token realm {realm:?}: {e}")))?;
        // A credential meant for an HTTPS registry never travels in clear.
        if url.scheme() != "https" && !(url.scheme() == "http" && self.plain_http) {
            return Err(protocol(format!("token realm {realm} is not HTTPS")));
        }
        url.query_pairs_mut().append_pair("scope", &format!("repository:{}:pull", self.repository));
        if let Some(service) = service {
            url.query_pairs_mut().append_pair("service", service);
        }
        let what = format!("the token service {realm}");
        let mut request = self.transport.http.get(url.as_str());
        if let RegistryAuth::Basic(username, password) = &self.auth {
            request = request.basic_auth(username, Some(password));
        }
        let response = request.send().await.map_err(|e| self.network(e, &what))?;
        if !response.status().is_success() {
            return Err(self.refusal(response, &what).await);
        }
        let body = self.read_limited(response, MAX_TOKEN_BYTES, &format!("the token from {realm}")).await?;
        #[derive(Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body).map_err(|e| protocol(format!("{what}: {e}")))?;
        token.token.or(token.access_token).ok_or_else(|| protocol(format!("{what} answered without a token")))
    }

    /// A body of at most `limit` bytes: refused on its Content-Length, and
    /// again as it streams.
    async fn read_limited(&self, response: reqwest::Response, limit: u64, what: &str) -> Result<Bytes, OciError> {
        let over = || OciError::OverLimit { what: what.to_string(), max: limit };
        if response.content_length().is_some_and(|length| length > limit) {
            return Err(over());
        }
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.network(e, what))?;
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(over());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(body))
    }

    /// The error an error status means, from the status and the first
    /// [`MAX_ERROR_BYTES`] of the body; the rest is never read.
    async fn refusal(&self, response: reqwest::Response, what: &str) -> OciError {
        let (status, url) = (response.status().as_u16(), response.url().to_string());
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(Ok(chunk)) = stream.next().await {
            let room = MAX_ERROR_BYTES as usize - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() == MAX_ERROR_BYTES as usize {
                break;
            }
        }
        OciError::from_status(status, &body, &url, &self.registry, what)
    }

    fn network(&self, error: reqwest::Error, what: &str) -> OciError {
        OciError::from_client(OciDistributionError::RequestError(error), &self.registry, what)
    }
}

fn header_value(value: &str, registry: &str) -> Result<HeaderValue, OciError> {
    HeaderValue::from_str(value).map_err(|_| OciError::Protocol {
        registry: registry.to_string(),
        detail: "a credential or token that cannot be sent in a header".into(),
    })
}

/// Runs `attempt` up to three times while it fails transiently.
pub(crate) async fn retrying<T, F, Fut>(reference: &Reference, mut attempt: F) -> Result<T, OciError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, OciError>>,
{
    let mut delays = RETRY_DELAYS.iter();
    loop {
        match attempt().await {
            Err(error) if error.is_transient() => match delays.next() {
                Some(delay) => {
                    tracing::debug!(%reference, %error, ?delay, "transient registry error; retrying");
                    tokio::time::sleep(*delay).await;
                }
                None => return Err(error),
            },
            result => return result,
        }
    }
}

/// CPU or disk work off the async executor.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    tokio::task::spawn_blocking(work).await.expect("blocking task panicked")
}

fn read_pem_bundle(path: &PathBuf) -> Result<Vec<Certificate>, OciError> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    let bad = |reason: String| OciError::Tls(format!("CA bundle {}: {reason}", path.display()));
    let certificates: Vec<Certificate> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .map(|cert| cert.map(|der| Certificate { encoding: CertificateEncoding::Der, data: der.to_vec() }))
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certificates.is_empty() {
        return Err(bad("no PEM certificates in it".into()));
    }
    Ok(certificates)
}

/// `host` of `host:port`, `[v6]:port` or a bare host.
fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match registry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => registry,
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_for_loopback_and_listed_registries() {
        let transport = Transport::new(&[], vec!["registry.internal:5000".into(), "plain.example".into()]).unwrap();
        for plain in [
            "127.0.0.1:5000",
            "127.8.9.10",
            "localhost:1234",
            "LOCALHOST",
            "[::1]:5000",
            "registry.internal:5000",
            "plain.example:443",
        ] {
            assert!(transport.plain_http(plain), "{plain} should be plain HTTP");
        }
        for tls in ["ghcr.io", "registry.internal:6000", "10.0.0.1:5000", "128.0.0.1", "localhost.example.com"] {
            assert!(!transport.plain_http(tls), "{tls} should be HTTPS");
        }
    }

    #[test]
    fn ca_bundles_must_hold_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = Transport::new(&[empty], Vec::new()).err().expect("an empty bundle is refused");
        assert!(error.to_string().contains("empty.pem"), "{error}");

        // One of the Mozilla roots, re-encoded as PEM, is a valid bundle.
        let der = webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].to_vec();
        let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(der)
        });
        let bundle = dir.path().join("bundle.pem");
        std::fs::write(&bundle, pem).unwrap();
        let transport = Transport::new(&[bundle], Vec::new()).unwrap();
        assert_eq!(transport.roots.len(), webpki_root_certs::TLS_SERVER_ROOT_CERTS.len() + 1);
    }
}
