//! The response body type, and the one place errors become HTTP responses.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use parking_lot::Mutex;
use sluice_core::{Account, ApiError};
use sluice_telemetry::metrics;
use sluice_telemetry::metrics::ResponseBufferRefusalLabels;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
// Not `Sync`: a body may own the plugin instances that rewrite it.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

pub fn json_response(status: http::StatusCode, json: Vec<u8>) -> http::Response<Body> {
    let mut response = http::Response::new(full(json));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

/// Every error a client sees goes through here, in OpenAI's shape. The
/// response carries its code for the request's record ([`ErrorCode`]).
pub fn error_response(error: &ApiError) -> http::Response<Body> {
    let status = http::StatusCode::from_u16(error.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = json_response(status, error.to_json());
    response.extensions_mut().insert(ErrorCode(error.code));
    response
}

/// The code of the error a response carries.
#[derive(Clone, Copy, Debug)]
pub struct ErrorCode(pub &'static str);

/// Reads a whole response body of at most `limit` bytes.
// A loop rather than `Limited`: its `Into<BoxError>` bound on a body that
// already has `BoxError` trips rustc's check that the handler future is Send.
/// Reads a whole body of at most `limit` bytes, each frame within `idle`.
pub async fn collect_limited(mut body: Body, limit: usize, idle: std::time::Duration) -> Result<Bytes, String> {
    let mut collected = bytes::BytesMut::new();
    loop {
        let Ok(frame) = tokio::time::timeout(idle, body.frame()).await else {
            return Err(format!("nothing arrived for {} s", idle.as_secs()));
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if collected.len() + data.len() > limit {
                return Err(format!("the body is larger than {limit} bytes"));
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}

/// Upstream response bytes held in memory (whole bodies for response-body
/// plugins and provider translation, copies read for usage, unfinished
/// events), by all responses together and by each backend's: a budget like
/// the request bodies', so that backends sending large bodies slowly, many
/// at once, cannot take the container's memory. Bytes are charged as they
/// arrive, never waited for: a response that cannot have them fails (or
/// goes on without what needed them).
#[derive(Clone)]
pub struct ResponseBuffers {
    inner: Arc<Buffers>,
}

struct Buffers {
    total: Account,
    backend_max: usize,
    backends: Mutex<HashMap<Arc<str>, Weak<Account>>>,
}

impl std::fmt::Debug for ResponseBuffers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBuffers")
            .field("max", &self.inner.total.max())
            .field("backend_max", &self.inner.backend_max)
            .finish()
    }
}

impl ResponseBuffers {
    /// `max` bytes together; the responses of one backend `backend_percent`
    /// of it.
    pub fn new(max: usize, backend_percent: u8) -> Self {
        let max = max.max(1);
        let backend_max = (max / 100).saturating_mul(usize::from(backend_percent.clamp(1, 100))).max(1);
        Self {
            inner: Arc::new(Buffers { total: Account::new(max), backend_max, backends: Mutex::new(HashMap::new()) }),
        }
    }

    pub fn max(&self) -> usize {
        self.inner.total.max()
    }

    /// An empty holding for one response from `backend` (its label; none:
    /// only the budget applies).
    pub fn hold(&self, backend: Option<&str>) -> Held {
        let backend = backend.map(|label| {
            let mut backends = self.inner.backends.lock();
            if let Some(account) = backends.get(label).and_then(Weak::upgrade) {
                return account;
            }
            backends.retain(|_, account| account.strong_count() > 0);
            let account = Arc::new(Account::new(self.inner.backend_max));
            backends.insert(label.into(), Arc::downgrade(&account));
            account
        });
        Held { buffers: self.inner.clone(), backend, bytes: 0 }
    }
}

/// What one response holds of the [`ResponseBuffers`], given back when it
/// is dropped.
pub struct Held {
    buffers: Arc<Buffers>,
    backend: Option<Arc<Account>>,
    bytes: usize,
}

impl Held {
    /// Holds `bytes` in all, more or less than before. Refused, holding as
    /// much as before, if the budget or the backend's share has not enough
    /// left: the error says which (`budget` or `backend_share`), and is
    /// counted.
    pub fn resize(&mut self, bytes: usize) -> Result<(), &'static str> {
        if bytes <= self.bytes {
            self.release(self.bytes - bytes);
            return Ok(());
        }
        let more = bytes - self.bytes;
        if let Some(backend) = &self.backend
            && !backend.reserve(more)
        {
            return Err(refused("backend_share"));
        }
        if !self.buffers.total.reserve(more) {
            if let Some(backend) = &self.backend {
                backend.release(more);
            }
            return Err(refused("budget"));
        }
        self.bytes = bytes;
        metrics().response_buffers.inc_by(more as i64);
        Ok(())
    }

    fn release(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.buffers.total.release(bytes);
        if let Some(backend) = &self.backend {
            backend.release(bytes);
        }
        self.bytes -= bytes;
        metrics().response_buffers.dec_by(bytes as i64);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.release(self.bytes);
    }
}

fn refused(limit: &'static str) -> &'static str {
    metrics().response_buffer_refusals.get_or_create(&ResponseBufferRefusalLabels { limit }).inc();
    limit
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum Collect {
    /// The upstream failed, stalled or sent too much.
    Upstream(String),
    /// The response buffer budget (or the backend's share) is used up.
    Budget(&'static str),
}

impl Collect {
    /// The client's error: a 503 when the gateway is short of memory, a
    /// 502 (`upstream_unavailable`, `what` says for what) otherwise.
    pub fn into_api_error(self, what: &str) -> ApiError {
        match self {
            Collect::Upstream(error) => ApiError::upstream_unavailable(format!("{what}: {error}")),
            Collect::Budget(limit) => ApiError::overloaded(format!(
                "{what}: the memory responses may hold together{} is in use",
                if limit == "budget" { "" } else { " (this backend's share of it)" }
            )),
        }
    }
}

/// Like [`collect_limited`], charging what it holds (its capacity, as it
/// grows) to `held` as the bytes arrive.
pub async fn collect_held(
    mut body: Body,
    limit: usize,
    idle: std::time::Duration,
    held: &mut Held,
) -> Result<Bytes, Collect> {
    let mut collected = bytes::BytesMut::new();
    loop {
        let Ok(frame) = tokio::time::timeout(idle, body.frame()).await else {
            return Err(Collect::Upstream(format!("nothing arrived for {} s", idle.as_secs())));
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(|e| Collect::Upstream(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            let needed = collected.len() + data.len();
            if needed > limit {
                return Err(Collect::Upstream(format!("the body is larger than {limit} bytes")));
            }
            if needed > collected.capacity() {
                // Doubling, as `BytesMut` would, but charged before it is
                // allocated.
                let capacity = needed.max(collected.capacity() * 2).min(limit);
                held.resize(capacity).map_err(Collect::Budget)?;
                collected.reserve(capacity - collected.len());
            }
            collected.extend_from_slice(&data);
        }
    }
    Ok(collected.freeze())
}

/// A whole body that keeps its bytes charged to the response buffers until
/// it is sent or dropped.
pub fn full_held(bytes: Bytes, held: Held) -> Body {
    HeldFull { data: (!bytes.is_empty()).then_some(bytes), held: Some(held) }.boxed_unsync()
}

struct HeldFull {
    data: Option<Bytes>,
    held: Option<Held>,
}

impl http_body::Body for HeldFull {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let frame = self.data.take().map(|data| Ok(http_body::Frame::data(data)));
        if frame.is_none() {
            self.held = None;
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |data| data.len() as u64))
    }
}
