//! The pooled clients for upstreams, plain HTTP or HTTPS: one shared by
//! backends with default settings, and one per backend with TLS settings
//! (a private CA, a client certificate, an SNI name) or a connect timeout
//! of its own.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice_core::{BackendTimeouts, BackendTls, Pem};

#[derive(Debug, thiserror::Error)]
#[error("building the upstream TLS client: {0}")]
pub struct ClientError(#[from] rustls::Error);

/// The largest PEM file read for a backend's TLS settings.
const MAX_PEM_BYTES: u64 = 1 << 20;

#[derive(Clone)]
pub struct UpstreamClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl UpstreamClient {
    /// The shared client, trusting the public (webpki) roots.
    pub fn new() -> Result<Self, ClientError> {
        let config = builder()?.with_root_certificates(webpki_roots()).with_no_client_auth();
        Ok(Self::build(BackendTimeouts::DEFAULT_CONNECT, config, None))
    }

    /// A backend's own client. Its CA bundle replaces the public roots: a
    /// backend behind a company CA is trusted for that CA's certificates
    /// only.
    pub fn for_backend(connect: Option<Duration>, tls: Option<&BackendTls>) -> Result<Self, String> {
        let connect = connect.unwrap_or(BackendTimeouts::DEFAULT_CONNECT);
        let Some(tls) = tls else {
            let config = builder().map_err(|e| e.to_string())?.with_root_certificates(webpki_roots());
            return Ok(Self::build(connect, config.with_no_client_auth(), None));
        };
        let roots = match &tls.ca {
            None => webpki_roots(),
            Some(pem) => {
                let bytes = read_pem(pem, "tls CA bundle")?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(&bytes) {
                    let cert = cert.map_err(|e| format!("the tls CA bundle: {e}"))?;
                    roots.add(cert).map_err(|e| format!("the tls CA bundle: {e}"))?;
                }
                if roots.is_empty() {
                    return Err("the tls CA bundle holds no certificate".into());
                }
                roots
            }
        };
        let config = builder().map_err(|e| e.to_string())?.with_root_certificates(roots);
        let config = match (&tls.client_cert, &tls.client_key) {
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_slice_iter(&read_pem(cert, "tls client certificate")?)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the tls client certificate: {e}"))?;
                if chain.is_empty() {
                    return Err("the tls client certificate file holds no certificate".into());
                }
                let key = PrivateKeyDer::from_pem_slice(&read_pem(key, "tls client key")?)
                    .map_err(|e| format!("the tls client key: {e}"))?;
                config.with_client_auth_cert(chain, key).map_err(|e| format!("the tls client certificate: {e}"))?
            }
            (None, None) => config.with_no_client_auth(),
            _ => return Err("a tls client certificate and its key go together".into()),
        };
        let server_name = match &tls.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| format!("tls serverName `{name}` is not a valid name"))?,
            ),
            None => None,
        };
        Ok(Self::build(connect, config, server_name))
    }

    fn build(connect: Duration, config: rustls::ClientConfig, server_name: Option<ServerName<'static>>) -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect));
        let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http();
        let https = match server_name {
            Some(name) => https.with_server_name_resolver(FixedServerNameResolver::new(name)),
            None => https,
        };
        let https = https.enable_http1().enable_http2().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(90)).build(https);
        Self { client }
    }

    pub async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
        self.client.request(request).await
    }
}

fn builder() -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>, rustls::Error> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
}

fn webpki_roots() -> rustls::RootCertStore {
    rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() }
}

fn read_pem(pem: &Pem, what: &str) -> Result<Vec<u8>, String> {
    match pem {
        Pem::Value(secret) => Ok(secret.expose().as_bytes().to_vec()),
        Pem::File(path) => {
            use std::io::Read;
            let file = std::fs::File::open(path).map_err(|e| format!("reading the {what} {}: {e}", path.display()))?;
            let mut bytes = Vec::new();
            file.take(MAX_PEM_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("reading the {what} {}: {e}", path.display()))?;
            if bytes.len() as u64 > MAX_PEM_BYTES {
                return Err(format!("the {what} {} is larger than {MAX_PEM_BYTES} bytes", path.display()));
            }
            Ok(bytes)
        }
    }
}
