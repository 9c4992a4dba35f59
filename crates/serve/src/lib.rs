//! The accept loop of every Sluice listener (the gateway's data plane and
//! admin listeners, the echo upstream): HTTP/1.1 and h2c on one port, with
//! the connection limits in [`Limits`], until shutdown, then a bounded drain
//! of in-flight requests, streams included.
//!
//! A client that opens connections and sends nothing, or a request head one
//! byte at a time (slowloris), must not hold a connection for long: the
//! first request must arrive within `header_read_timeout` (whatever the
//! protocol: this also bounds HTTP/1-or-2 sniffing), a connection with no
//! request in flight is closed after `idle_timeout`, and each HTTP/1
//! request head must arrive within `header_read_timeout`. Past
//! `max_connections` the loop stops accepting, so new connections wait in
//! the kernel's backlog instead of taking memory here. Limits on requests
//! (how many in flight, how much body memory) belong to the handler, which
//! can answer in its own error shape.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Per-listener connection limits. The defaults suit the data plane.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once; past it, new ones wait to be accepted.
    pub max_connections: usize,
    /// A connection with no request in flight is closed after this long
    /// (keep-alive idle time, and the time to send a first request).
    pub idle_timeout: Duration,
    /// An HTTP/1 request head must arrive within this long.
    pub header_read_timeout: Duration,
    /// Streams one HTTP/2 connection may have open at once.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 PING interval; a peer that does not answer within the same
    /// time is disconnected.
    pub http2_keep_alive: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            http2_max_concurrent_streams: 100,
            http2_keep_alive: Duration::from_secs(20),
        }
    }
}

impl Limits {
    /// For the admin listener: probes and an operator, never many.
    pub fn admin() -> Self {
        Self { max_connections: 64, idle_timeout: Duration::from_secs(10), ..Self::default() }
    }
}

/// Serves `handler` on every connection `listener` accepts until `shutdown`
/// resolves, then waits up to `drain` for in-flight requests to finish.
pub async fn serve<F, Fut, B>(
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
    handler: F,
) where
    F: Fn(http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .keep_alive_interval(limits.http2_keep_alive)
        .keep_alive_timeout(limits.http2_keep_alive);
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(error) => {
                    // Usually out of file descriptors: back off rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new(limits.header_read_timeout));
        let counted = activity.clone();
        let handler = handler.clone();
        let service = service_fn(move |request| {
            let handler = handler.clone();
            let guard = counted.begin();
            async move {
                let response = handler(request).await;
                // A streamed body is still in flight after this: the guard
                // travels with it and ends the request when the body ends.
                Ok::<_, Infallible>(response.map(|body| Tracked { body, _guard: guard }))
            }
        });
        let builder = builder.clone();
        let idle_timeout = limits.idle_timeout;
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let mut closing = false;
            loop {
                let idle_deadline = activity.idle_deadline(idle_timeout);
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(error) = result {
                            tracing::debug!(%error, "connection ended with an error");
                        }
                        break;
                    }
                    // The server stops: in-flight requests finish first.
                    _ = stopping.wait_for(|stop| *stop), if !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    // Nothing is in flight, so nothing is lost: a client
                    // that sent no complete request in all that time is
                    // dropped.
                    () = sleep_until(idle_deadline, idle_timeout) => {
                        if activity.idle_deadline(idle_timeout).is_some_and(|d| d <= Instant::now()) {
                            break;
                        }
                    }
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = stop.send(true);
    let drained = tokio::time::timeout(drain, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("some connections were still busy after {drain:?}; closing them");
        connections.shutdown().await;
    }
}

/// Sleeps to `deadline`; without one (a request is in flight), for a while,
/// to look again once it may have ended.
async fn sleep_until(deadline: Option<Instant>, idle_timeout: Duration) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline.into()).await,
        None => tokio::time::sleep(idle_timeout.min(Duration::from_secs(1))).await,
    }
}

/// Requests in flight on one connection, and when the last one ended.
struct Activity {
    started: Instant,
    /// How long the first request may take to arrive.
    first_request_timeout: Duration,
    /// Whether any request has arrived yet.
    served: std::sync::atomic::AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds after `started` when the connection last became idle.
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new(first_request_timeout: Duration) -> Self {
        Self {
            started: Instant::now(),
            first_request_timeout,
            served: Default::default(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// When the connection may be closed for idleness, or `None` while a
    /// request is in flight.
    fn idle_deadline(&self, idle_timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        if !self.served.load(Ordering::Acquire) {
            return Some(self.started + self.first_request_timeout.min(idle_timeout));
        }
        let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire));
        Some(self.started + since + idle_timeout)
    }
}

/// One request in flight, from its head to the end of its response body.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let now = self.0.started.elapsed().as_millis() as u64;
        self.0.idle_since_ms.store(now, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight until it
/// has been sent (or dropped).
struct Tracked<B> {
    body: B,
    _guard: InFlight,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}
