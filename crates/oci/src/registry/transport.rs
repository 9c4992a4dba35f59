//! The wire: one `oci-client` per registry host with its TLS roots and
//! credentials, manifests and blobs fetched with limits, and retries.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use sha2::Digest as _;

use crate::digest::{check_registry_digest, sha256_digest};
use crate::error::OciError;
use crate::media_types as mt;
use crate::reference::Reference;

/// Waits between tries of a transient failure: three tries in all.
const RETRY_DELAYS: [Duration; 2] = [Duration::from_millis(200), Duration::from_secs(1)];
const USER_AGENT: &str = concat!("sluice/", env!("CARGO_PKG_VERSION"));

pub(crate) struct Transport {
    /// Mozilla's roots plus the configured bundles, DER.
    pub(crate) roots: Vec<Certificate>,
    insecure_registries: Vec<String>,
    /// One client per registry host, rebuilt when its credentials change
    /// (oci-client keeps the first credentials it is given).
    clients: Mutex<HashMap<String, (RegistryAuth, oci_client::Client)>>,
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
        Ok(Transport { roots, insecure_registries, clients: Mutex::new(HashMap::new()) })
    }

    /// The client for this reference's registry, holding `auth`.
    pub(crate) async fn client(
        &self,
        reference: &Reference,
        auth: RegistryAuth,
    ) -> Result<(oci_client::Client, RegistryAuth), OciError> {
        let registry = reference.registry().to_string();
        if let Some((known, client)) = self.clients.lock().expect("clients lock").get(&registry)
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
            // Indexes are resolved here, to the wasm/wasi entry.
            platform_resolver: None,
            connect_timeout: Some(Duration::from_secs(5)),
            read_timeout: Some(Duration::from_secs(60)),
            user_agent: USER_AGENT,
            // Two requests per blob instead of one per 4 MiB chunk; the
            // streamed body still reports progress.
            use_monolithic_push: true,
            ..Default::default()
        };
        let client = oci_client::Client::try_from(config).map_err(|e| OciError::Tls(e.to_string()))?;
        client.store_auth_if_needed(reference.as_oci().resolve_registry(), &auth).await;
        self.clients.lock().expect("clients lock").insert(registry, (auth.clone(), client.clone()));
        Ok((client, auth))
    }

    pub(crate) fn plain_http(&self, registry: &str) -> bool {
        let host = host_of(registry);
        is_loopback(host) || self.insecure_registries.iter().any(|r| r == registry || r == host)
    }
}

/// The manifest a reference names, verified against the reference's
/// digest if it has one (oci-client checks the body's hash).
pub(crate) async fn manifest_raw(
    client: &oci_client::Client,
    auth: &RegistryAuth,
    reference: &Reference,
) -> Result<(Bytes, String), OciError> {
    let (body, _their_digest) = client
        .pull_manifest_raw(reference.as_oci(), auth, mt::MANIFESTS)
        .await
        .map_err(|e| OciError::from_client(e, reference.registry(), &reference.to_string()))?;
    // oci-client returns the digest the registry's header names (checked
    // against the body, but in whatever algorithm the registry chose); the
    // cache is keyed by sha256, so name the body by its sha256 ourselves.
    let digest = sha256_digest(&body);
    Ok((body, digest))
}

/// Streams a blob into memory, hashing as it goes and stopping at `limit`.
pub(crate) async fn download(
    client: &oci_client::Client,
    reference: &Reference,
    descriptor: &OciDescriptor,
    limit: u64,
) -> Result<Bytes, OciError> {
    let registry = reference.registry();
    check_registry_digest(&descriptor.digest, &format!("a blob digest of {reference}"), registry)?;
    let what = format!("blob {} of {reference}", descriptor.digest);
    let mut stream = client
        .pull_blob_stream(reference.as_oci(), descriptor)
        .await
        .map_err(|e| OciError::from_client(e, registry, &what))?;
    if let Some(length) = stream.content_length
        && length > limit
    {
        return Err(OciError::TooLarge { size: length, max: limit });
    }
    let mut buffer = Vec::with_capacity((descriptor.size.max(0) as u64).min(limit) as usize);
    let mut hasher = sha2::Sha256::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| OciError::from_stream(e, registry, &what))?;
        let received = (buffer.len() + chunk.len()) as u64;
        if received > limit {
            return Err(OciError::TooLarge { size: received, max: limit });
        }
        hasher.update(&chunk);
        buffer.extend_from_slice(&chunk);
    }
    // oci-client verifies too; this check does not depend on it.
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
