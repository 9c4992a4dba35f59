//! The pooled clients for upstreams, plain HTTP or HTTPS: one shared by
//! backends with default settings, and one per backend with TLS settings
//! (a private CA, a client certificate, an SNI name) or a connect timeout
//! of its own. Every connection is checked against the gateway's
//! [`BackendPolicy`] first, addresses and resolved names alike.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::Full;
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sluice_core::{BackendPolicy, BackendTimeouts, BackendTls};
use tower_service::Service;

#[derive(Debug, thiserror::Error)]
#[error("building the upstream TLS client: {0}")]
pub struct ClientError(#[from] rustls::Error);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone)]
pub struct UpstreamClient {
    client: Client<HttpsConnector<Guarded>, Full<Bytes>>,
}

impl UpstreamClient {
    /// The shared client, trusting the public (webpki) roots.
    pub fn new(policy: Arc<BackendPolicy>) -> Result<Self, ClientError> {
        let config = builder()?.with_root_certificates(webpki_roots()).with_no_client_auth();
        Ok(Self::build(BackendTimeouts::DEFAULT_CONNECT, config, None, policy))
    }

    /// A backend's own client. Its CA bundle replaces the public roots: a
    /// backend behind a company CA is trusted for that CA's certificates
    /// only.
    pub fn for_backend(
        connect: Option<Duration>,
        tls: Option<&BackendTls>,
        policy: Arc<BackendPolicy>,
    ) -> Result<Self, String> {
        let connect = connect.unwrap_or(BackendTimeouts::DEFAULT_CONNECT);
        let Some(tls) = tls else {
            let config = builder().map_err(|e| e.to_string())?.with_root_certificates(webpki_roots());
            return Ok(Self::build(connect, config.with_no_client_auth(), None, policy));
        };
        let roots = match &tls.ca {
            None => webpki_roots(),
            Some(pem) => {
                let bytes = pem.read("tls CA bundle")?;
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
                let chain = CertificateDer::pem_slice_iter(&cert.read("tls client certificate")?)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("the tls client certificate: {e}"))?;
                if chain.is_empty() {
                    return Err("the tls client certificate file holds no certificate".into());
                }
                let key = PrivateKeyDer::from_pem_slice(&key.read("tls client key")?)
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
        Ok(Self::build(connect, config, server_name, policy))
    }

    fn build(
        connect: Duration,
        config: rustls::ClientConfig,
        server_name: Option<ServerName<'static>>,
        policy: Arc<BackendPolicy>,
    ) -> Self {
        let mut http =
            HttpConnector::new_with_resolver(GuardedResolver { gai: GaiResolver::new(), policy: policy.clone() });
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect));
        let http = Guarded { inner: http, policy };
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

/// A connection the gateway's [`BackendPolicy`] refused: nothing was sent.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

impl Refused {
    /// The refusal somewhere in `error`'s causes, if that is why it failed.
    pub fn found_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a Refused> {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if let Some(refused) = error.downcast_ref::<Refused>() {
                return Some(refused);
            }
            cause = error.source();
        }
        None
    }
}

tokio::task_local! {
    /// The port of the connection being made, for the resolver's check:
    /// hyper's resolver is asked about a name alone.
    static CONNECTING_PORT: u16;
}

/// The plain connector, checking an address (or `localhost`) before
/// connecting to it; names are checked by [`GuardedResolver`].
#[derive(Clone)]
struct Guarded {
    inner: HttpConnector<GuardedResolver>,
    policy: Arc<BackendPolicy>,
}

type Connecting<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

impl Service<Uri> for Guarded {
    type Response = <HttpConnector<GuardedResolver> as Service<Uri>>::Response;
    type Error = BoxError;
    type Future = Connecting<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        if let Some(why) = uri.host().and_then(|host| self.policy.refuses_host(host, port)) {
            return Box::pin(async move { Err(Box::new(Refused(why)) as BoxError) });
        }
        let connecting = self.inner.call(uri);
        Box::pin(CONNECTING_PORT.scope(port, async move { connecting.await.map_err(Into::into) }))
    }
}

/// The system resolver, refusing a name any of whose addresses the policy
/// refuses: one such address is enough for the name to point (perhaps only
/// sometimes) into the gateway's own network position.
#[derive(Clone)]
struct GuardedResolver {
    gai: GaiResolver,
    policy: Arc<BackendPolicy>,
}

impl Service<Name> for GuardedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Connecting<Self::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.gai.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        // Called while connecting, within the connection's scope.
        let port = CONNECTING_PORT.try_with(|port| *port).unwrap_or(0);
        let policy = self.policy.clone();
        let resolving = self.gai.call(name.clone());
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = resolving.await?.collect();
            if let Some(why) = addresses.iter().find_map(|address| policy.refuses(address.ip(), port)) {
                return Err(Box::new(Refused(format!("`{name}` resolves to {why}"))) as BoxError);
            }
            Ok(addresses.into_iter())
        })
    }
}

fn builder() -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>, rustls::Error> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
}

fn webpki_roots() -> rustls::RootCertStore {
    rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener on loopback counting the connections it accepts.
    async fn listener() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(stream);
            }
        });
        (port, accepted)
    }

    async fn send(client: &UpstreamClient, url: &str) -> Result<(), hyper_util::client::legacy::Error> {
        let request = http::Request::get(url).body(Full::new(Bytes::new())).unwrap();
        client.send(request).await.map(drop)
    }

    /// A backend on loopback could reach the gateway's own admin listener.
    /// The forms of a loopback address that are not a literal `IpAddr`
    /// (decimal, hex, octal, short, IPv4-mapped, a name) reach the resolver
    /// or the connector, and are refused there: nothing connects.
    #[tokio::test]
    async fn a_restricted_client_refuses_every_spelling_of_loopback() {
        let (port, accepted) = listener().await;
        let policy = BackendPolicy { restricted: true, ..BackendPolicy::default() };
        let client = UpstreamClient::new(Arc::new(policy)).unwrap();
        for host in
            ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "localhost"]
        {
            let error = send(&client, &format!("http://{host}:{port}/v1")).await.unwrap_err();
            let refused = Refused::found_in(&error).unwrap_or_else(|| panic!("{host}: not refused: {error:?}"));
            assert!(refused.to_string().contains("--allow-backend-cidr"), "{host}: {refused}");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "a refused backend was connected to");

        // An allowed range, but the gateway's own listener port: refused,
        // however the name is spelled; another port in the range connects.
        let (other, other_accepted) = listener().await;
        let policy = BackendPolicy {
            restricted: true,
            allowed: vec!["127.0.0.0/8".parse().unwrap()],
            own_ports: vec![port],
            ..BackendPolicy::default()
        };
        let client = UpstreamClient::new(Arc::new(policy)).unwrap();
        for host in ["2130706433", "127.0.0.1", "localhost"] {
            let error = send(&client, &format!("http://{host}:{port}/v1")).await.unwrap_err();
            let refused = Refused::found_in(&error).unwrap_or_else(|| panic!("{host}: not refused: {error:?}"));
            assert!(refused.to_string().contains("own listeners"), "{host}: {refused}");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
        let _ = send(&client, &format!("http://2130706433:{other}/v1")).await;
        assert!(other_accepted.load(std::sync::atomic::Ordering::SeqCst) >= 1, "an allowed backend connects");
    }

    /// Unrestricted (a standalone gateway's default): loopback connects as before.
    #[tokio::test]
    async fn an_unrestricted_client_connects_anywhere() {
        let (port, accepted) = listener().await;
        let client = UpstreamClient::new(Arc::default()).unwrap();
        for host in ["127.0.0.1", "2130706433", "localhost"] {
            let error = send(&client, &format!("http://{host}:{port}/v1")).await.err();
            assert!(error.as_ref().and_then(|e| Refused::found_in(e)).is_none(), "{host}: {error:?}");
        }
        assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) >= 3, "every spelling connects");
    }
}
