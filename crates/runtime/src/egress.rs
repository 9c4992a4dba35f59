//! Outbound HTTP for plugins granted it (`spec.egress`): the standard
//! `wasi:http/outgoing-handler`, as wasmtime-wasi-http implements it, with
//! its send hook ([`WasiHttpHooks::send_request`]) replaced by one that
//! enforces the grant. So a plugin uses its language's usual client, and
//! every request it makes passes here:
//! - only a granted scheme, host and port; a redirect is the guest's next
//!   request and is checked like the first;
//! - a granted name that resolves to loopback, "this host", link-local or
//!   cloud metadata is refused (DNS cannot point a grant at the gateway's
//!   own network position); such an address is reachable only when the
//!   grant names it as an address, and where the gateway restricts
//!   backends (Kubernetes), only in ranges its operator allows;
//! - a deadline: the grant's timeout, and never past the hook's own;
//! - a response body cap, and a cap on calls in flight per plugin, past
//!   which a call is refused at once rather than queued;
//! - HTTPS verified against the public roots plus the destination's CA.
//!
//! Each destination has its own connection pool, built when the plugin is
//! configured: no connection is shared between plugins or destinations.
//! The waiting happens on the async runtime (the guest's `pollable.block`
//! suspends its fiber), never on a worker thread.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::{GaiResolver, Name};
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sluice_core::{BackendPolicy, EgressDestination, EgressGrant, Pem};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower_service::Service;
use wasmtime_wasi_http::{Error as ErrorCode, RequestOptions, Result as HttpResult, WasiBody, WasiHttpHooks};

/// The gateway's caps on every plugin's outbound calls; a grant may only
/// lower them.
#[derive(Clone, Debug)]
pub struct EgressConfig {
    pub max_response_bytes: u64,
    pub max_concurrent_calls: u32,
    /// Which addresses may be reached by address, as for backends.
    pub policy: Arc<BackendPolicy>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self { max_response_bytes: 1 << 20, max_concurrent_calls: 16, policy: Arc::default() }
    }
}

/// A configured plugin's outbound HTTP: its destinations and their pools.
pub(crate) struct Egress {
    plugin: Arc<str>,
    destinations: Vec<Destination>,
    timeout: Option<Duration>,
    max_response_bytes: u64,
    calls: Arc<Semaphore>,
    max_calls: u32,
}

struct Destination {
    grant: EgressDestination,
    origin: String,
    client: Client<hyper_rustls::HttpsConnector<HttpConnector<Resolver>>, WasiBody>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Egress {
    pub fn new(plugin: &str, grant: &EgressGrant, config: &EgressConfig) -> Result<Self, String> {
        let mut destinations = Vec::with_capacity(grant.destinations.len());
        for destination in &grant.destinations {
            let origin = destination.origin();
            if let Ok(ip) = destination.host.parse::<IpAddr>()
                && let Some(why) = config.policy.refuses(ip, destination.port)
            {
                return Err(format!("spec.egress destination {origin}: {why}"));
            }
            let tls =
                tls_config(destination.ca.as_ref()).map_err(|e| format!("spec.egress destination {origin}: {e}"))?;
            let resolver = Resolver { gai: GaiResolver::new(), policy: config.policy.clone() };
            let mut http = HttpConnector::new_with_resolver(resolver);
            http.enforce_http(false);
            http.set_nodelay(true);
            let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls);
            let connector = match destination.https {
                true => builder.https_only().enable_http1().enable_http2().wrap_connector(http),
                false => builder.https_or_http().enable_http1().enable_http2().wrap_connector(http),
            };
            let client = Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(8)
                .build(connector);
            destinations.push(Destination { grant: destination.clone(), origin, client });
        }
        let max_calls = grant.max_concurrent_calls.unwrap_or(u32::MAX).min(config.max_concurrent_calls).max(1);
        Ok(Self {
            plugin: plugin.into(),
            destinations,
            timeout: grant.timeout,
            max_response_bytes: grant.max_response_bytes.unwrap_or(u64::MAX).min(config.max_response_bytes),
            calls: Arc::new(Semaphore::new(max_calls as usize)),
            max_calls,
        })
    }

    /// The destination `uri` names, if granted.
    fn destination(&self, uri: &http::Uri) -> Option<&Destination> {
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return None,
        };
        let host = uri.host()?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        // An IPv6 host compares as an address: `::1` and `0::1` are one.
        let same_host = |granted: &str| match (granted.parse::<IpAddr>(), host.parse::<IpAddr>()) {
            (Ok(a), Ok(b)) => a == b,
            _ => granted == host,
        };
        self.destinations.iter().find(|d| d.grant.https == https && d.grant.port == port && same_host(&d.grant.host))
    }
}

/// One outbound call a plugin made, for the request's trace.
#[derive(Clone, Debug)]
pub struct OutboundCall {
    /// The granted origin, or `other`.
    pub destination: Arc<str>,
    pub started: Instant,
    /// When its response head came, or it failed.
    pub ended: Instant,
    pub status: Option<u16>,
    /// As `sluice_plugin_outbound_calls_total` counts it.
    pub result: &'static str,
    /// The span id the destination saw in `traceparent`, if the request
    /// is traced.
    pub span_id: Option<[u8; 8]>,
}

/// The calls an instance made during the current request, at most
/// [`MAX_RECORDED_CALLS`] (the rest are counted, not recorded).
pub(crate) type Calls = Arc<parking_lot::Mutex<Vec<OutboundCall>>>;

pub(crate) const MAX_RECORDED_CALLS: usize = 16;

/// The send hook of one instance: its plugin's grant, the deadline of the
/// hook it is in, the request's trace, and where its calls are recorded.
pub(crate) struct EgressHooks {
    pub egress: Option<Arc<Egress>>,
    pub deadline: Instant,
    /// The request's trace id, if it is traced (sampled).
    pub trace: Option<[u8; 16]>,
    pub calls: Calls,
}

impl WasiHttpHooks for EgressHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), ErrorCode>> + Send>,
    ) -> Box<
        dyn Future<
                Output = HttpResult<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), ErrorCode>> + Send>)>,
            > + Send,
    > {
        let Some(egress) = self.egress.clone() else {
            return Box::new(async { Err(ErrorCode::HttpRequestDenied) });
        };
        // The earliest of the hook's deadline, the grant's timeout and the
        // plugin's own (its request options: the time to the response head
        // bounds the whole call here, which is stricter).
        let now = Instant::now();
        let asked = options.and_then(|o| o.first_byte_timeout.or(o.connect_timeout));
        let deadline =
            [egress.timeout, asked].into_iter().flatten().fold(self.deadline, |at, timeout| at.min(now + timeout));
        let (trace, calls) = (self.trace, self.calls.clone());
        Box::new(async move {
            let (response, io) = egress.send(request, deadline, trace, calls).await?;
            Ok((response, Box::new(io) as Box<dyn Future<Output = _> + Send>))
        })
    }
}

impl Egress {
    async fn send(
        self: Arc<Self>,
        mut request: http::Request<WasiBody>,
        deadline: Instant,
        trace: Option<[u8; 16]>,
        calls: Calls,
    ) -> Result<(http::Response<WasiBody>, std::future::Ready<Result<(), ErrorCode>>), ErrorCode> {
        let started = Instant::now();
        let record = |destination: &str, result: &'static str, status: Option<u16>, span_id: Option<[u8; 8]>| {
            self.count(destination, result, started);
            let mut calls = calls.lock();
            if calls.len() < MAX_RECORDED_CALLS {
                let call = OutboundCall {
                    destination: destination.into(),
                    started,
                    ended: Instant::now(),
                    status,
                    result,
                    span_id,
                };
                calls.push(call);
            }
        };
        let Some(destination) = self.destination(request.uri()) else {
            // Not the plugin's to label with: the destination it asked for
            // is any string.
            record("other", "denied", None, None);
            tracing::debug!(plugin = &*self.plugin, "outbound call to a destination its grant does not list refused");
            return Err(ErrorCode::HttpRequestDenied);
        };
        let Ok(permit) = self.calls.clone().try_acquire_owned() else {
            record(&destination.origin, "concurrency_cap", None, None);
            return Err(ErrorCode::InternalError(Some(format!(
                "sluice: the plugin has {} outbound calls in flight, its cap",
                self.max_calls
            ))));
        };
        // The call is a span of the request's trace: the destination
        // gets its `traceparent`, whatever the plugin set.
        let span_id = trace.map(|trace_id| {
            let span_id = sluice_telemetry::trace::new_span_id();
            let parent = format!("00-{}-{}-01", hex::encode(trace_id), hex::encode(span_id));
            if let Ok(value) = http::HeaderValue::from_str(&parent) {
                request.headers_mut().insert("traceparent", value);
            }
            span_id
        });
        let at = tokio::time::Instant::from_std(deadline);
        let response = match tokio::time::timeout_at(at, destination.client.request(request)).await {
            Err(_) => {
                record(&destination.origin, "timeout", None, span_id);
                return Err(ErrorCode::ConnectionTimeout);
            }
            Ok(Err(error)) => {
                let code = error_code(&error);
                record(&destination.origin, result_of(&code), None, span_id);
                return Err(code);
            }
            Ok(Ok(response)) => response,
        };
        let status = Some(response.status().as_u16());
        let limit = self.max_response_bytes;
        if let Some(length) = response.headers().get(http::header::CONTENT_LENGTH)
            && length.to_str().ok().and_then(|l| l.parse::<u64>().ok()).is_some_and(|l| l > limit)
        {
            record(&destination.origin, "too_large", status, span_id);
            return Err(ErrorCode::HttpResponseBodySize(Some(limit)));
        }
        record(&destination.origin, "ok", status, span_id);
        let response = response.map(|body| {
            Capped {
                inner: body,
                left: limit,
                limit,
                deadline: Box::pin(tokio::time::sleep_until(at)),
                _permit: permit,
            }
            .boxed_unsync()
        });
        Ok((response, std::future::ready(Ok(()))))
    }

    fn count(&self, destination: &str, result: &'static str, started: Instant) {
        let metrics = sluice_telemetry::metrics();
        let (namespace, plugin) = self.plugin.split_once('/').unwrap_or(("", &self.plugin));
        let labels = sluice_telemetry::metrics::OutboundCallLabels {
            namespace: namespace.into(),
            plugin: plugin.into(),
            destination: sluice_telemetry::metrics::Label::from(destination),
            result,
        };
        metrics.plugin_outbound_calls.get_or_create(&labels).inc();
        metrics.plugin_outbound_call_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    }
}

/// The `result` label of a failed call.
fn result_of(code: &ErrorCode) -> &'static str {
    match code {
        ErrorCode::ConnectionTimeout | ErrorCode::HttpResponseTimeout => "timeout",
        ErrorCode::DestinationIpProhibited => "denied",
        ErrorCode::TlsCertificateError | ErrorCode::TlsProtocolError => "tls_error",
        _ => "error",
    }
}

/// What the guest is told a failed call was. The resolver's refusal is the
/// grant's; the rest are the network's.
fn error_code(error: &hyper_util::client::legacy::Error) -> ErrorCode {
    use std::error::Error as _;
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(refused) = cause.downcast_ref::<Refused>() {
            tracing::debug!(why = %refused.0, "outbound call refused");
            return ErrorCode::DestinationIpProhibited;
        }
        if cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused) {
            return ErrorCode::ConnectionRefused;
        }
        if is_tls(cause) {
            return ErrorCode::TlsCertificateError;
        }
        source = cause.source();
    }
    if error.is_connect() {
        return ErrorCode::DestinationUnavailable;
    }
    ErrorCode::HttpProtocolError
}

/// Whether `error` is TLS's, or an I/O error wrapping it (hyper-rustls
/// wraps it twice, and an I/O error's `source` skips what it wraps).
fn is_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    if error.downcast_ref::<rustls::Error>().is_some() {
        return true;
    }
    match error.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
        Some(inner) => is_tls(inner),
        None => false,
    }
}

/// A response body cut off at the byte cap and at the call's deadline; it
/// holds the call's place under the plugin's concurrency cap until it is
/// read to the end or dropped.
struct Capped {
    inner: hyper::body::Incoming,
    left: u64,
    limit: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _permit: OwnedSemaphorePermit,
}

impl Body for Capped {
    type Data = Bytes;
    type Error = ErrorCode;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ErrorCode>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(ErrorCode::HttpResponseTimeout)));
        }
        let frame = match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(error)) => return Poll::Ready(Some(Err(ErrorCode::from(error)))),
            Some(Ok(frame)) => frame,
        };
        if let Some(data) = frame.data_ref() {
            let len = data.len() as u64;
            if len > self.left {
                let limit = self.limit;
                self.left = 0;
                return Poll::Ready(Some(Err(ErrorCode::HttpResponseBodySize(Some(limit)))));
            }
            self.left -= len;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The system resolver, refusing a granted name any of whose addresses is
/// loopback, "this host", link-local or cloud metadata (unless the
/// operator allows the range): a name in a grant must not be a way to the
/// gateway's own network position. One such address is enough, as the
/// name could point there only sometimes.
#[derive(Clone)]
struct Resolver {
    gai: GaiResolver,
    policy: Arc<BackendPolicy>,
}

#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

type Resolving = Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, BoxError>> + Send>>;

impl Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Resolving;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.gai.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let policy = self.policy.clone();
        // An address needs no resolving, and was checked against the
        // policy when the grant was loaded.
        if let Ok(ip) = name.as_str().parse::<IpAddr>() {
            return Box::pin(async move { Ok(vec![SocketAddr::new(ip, 0)].into_iter()) });
        }
        let resolving = self.gai.call(name.clone());
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = resolving.await?.collect();
            if let Some(why) = addresses.iter().find_map(|address| refused_by_name(&policy, address.ip())) {
                return Err(Box::new(Refused(format!("`{name}` resolves to {why}"))) as BoxError);
            }
            Ok(addresses.into_iter())
        })
    }
}

/// Why a name's address may not be reached, if it may not.
fn refused_by_name(policy: &BackendPolicy, ip: IpAddr) -> Option<String> {
    let ip = ip.to_canonical();
    let own = policy.restricted && policy.own_addresses.contains(&ip);
    let what = sluice_core::backends::forbidden_range(ip).or(own.then_some("the gateway's own address"))?;
    if policy.allowed.iter().any(|range| range.contains(ip)) {
        return None;
    }
    Some(format!("{ip}, {what}, which a plugin may reach only when its grant names the address"))
}

/// The public roots, and the destination's CA if it has one.
fn tls_config(ca: Option<&Pem>) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    if let Some(pem) = ca {
        let bytes = pem.read("CA bundle")?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&bytes) {
            let cert = cert.map_err(|e| format!("its CA bundle: {e}"))?;
            roots.add(cert).map_err(|e| format!("its CA bundle: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err("its CA bundle holds no certificate".into());
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}
