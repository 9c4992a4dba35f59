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
//! the kernel's backlog instead of taking memory here; or, on a listener
//! that must always answer a new client (the kubelet's probes), it closes
//! the oldest connection of the peer address holding the most
//! (`evict_when_full`).
//!
//! A client that does not read its responses (an HTTP/2 window of 0, a
//! TCP window of 0) must not keep them in flight: a connection where some
//! response has waited for the client longer than `write_timeout` is
//! closed, which ends every stream on it.
//!
//! Limits on requests (how many in flight, how much body memory) belong to
//! the handler, which can answer in its own error shape: each request
//! carries a [`Connection`] extension (the peer, the requests in flight on
//! its connection) for it to share them out fairly.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
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
    /// A response the client has not taken for this long (its body was
    /// ready to send, the client's window or socket was not) closes its
    /// connection. Time a body spends waiting on its own source (a slow
    /// upstream) does not count.
    pub write_timeout: Duration,
    /// When every connection slot is taken, accept the new connection and
    /// close the oldest one of the peer address holding the most, instead
    /// of leaving it in the backlog: for listeners that must answer a new
    /// client (a probe) whoever holds the others.
    pub evict_when_full: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            idle_timeout: Duration::from_secs(60),
            header_read_timeout: Duration::from_secs(10),
            http2_max_concurrent_streams: 100,
            http2_keep_alive: Duration::from_secs(20),
            // nginx's `send_timeout`: a client reading a stream as it comes
            // never waits this long for its socket.
            write_timeout: Duration::from_secs(60),
            evict_when_full: false,
        }
    }
}

impl Limits {
    /// For the admin and metrics listeners: probes, Prometheus and an
    /// operator, never many. A full listener drops the oldest connection of
    /// whoever holds the most, so holding its slots locks no one out.
    pub fn admin() -> Self {
        Self {
            max_connections: 64,
            idle_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            evict_when_full: true,
            ..Self::default()
        }
    }

    /// For the kubelet's probes, which may come over the pod network: a
    /// probe connects, asks at once and closes, within its 1 s timeout, so
    /// a connection that has not asked within a second is no probe.
    pub fn probes() -> Self {
        Self {
            idle_timeout: Duration::from_secs(2),
            header_read_timeout: Duration::from_secs(1),
            write_timeout: Duration::from_secs(2),
            ..Self::admin()
        }
    }
}

/// What the handler is told about the connection a request came on, as a
/// request extension.
#[derive(Clone, Copy, Debug)]
pub struct Connection {
    /// The peer's address.
    pub peer: SocketAddr,
    /// Requests in flight on this connection, this one included (a
    /// request stays in flight until its response body has been sent).
    pub in_flight: usize,
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
    let mut open = OpenConnections::default();
    let (stop, stopping) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        // Without eviction a slot is taken before accepting, so that past
        // the limit new connections wait in the kernel's backlog.
        let reserved = if limits.evict_when_full {
            None
        } else {
            tokio::select! {
                slot = slots.clone().acquire_owned() => Some(slot.expect("the semaphore is never closed")),
                () = &mut shutdown => break,
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
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
        let slot = match reserved {
            Some(slot) => slot,
            None => match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    open.evict_one();
                    // The evicted connection gives its slot back as its
                    // task ends, at once.
                    match tokio::time::timeout(Duration::from_secs(1), slots.clone().acquire_owned()).await {
                        Ok(slot) => slot.expect("the semaphore is never closed"),
                        Err(_) => continue,
                    }
                }
            },
        };
        let close = limits.evict_when_full.then(|| open.add(peer_group(peer.ip())));
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new(limits.header_read_timeout));
        let counted = activity.clone();
        let handler = handler.clone();
        let service = service_fn(move |mut request: http::Request<Incoming>| {
            let handler = handler.clone();
            let guard = counted.begin();
            request.extensions_mut().insert(Connection { peer, in_flight: counted.in_flight() });
            async move {
                let response = handler(request).await;
                // A streamed body is still in flight after this: the guard
                // travels with it and ends the request when the body ends.
                // From here the response waits on the client.
                guard.owe();
                Ok::<_, Infallible>(response.map(|body| Tracked { body, guard }))
            }
        });
        let builder = builder.clone();
        let idle_timeout = limits.idle_timeout;
        let write_timeout = limits.write_timeout;
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
                    // The listener is full and this is the oldest
                    // connection of the peer holding the most.
                    () = closed(close.as_deref()) => {
                        tracing::debug!(%peer, "the listener is full: closing the oldest connection of its busiest peer");
                        break;
                    }
                    // Nothing is in flight, so nothing is lost: a client
                    // that sent no complete request in all that time is
                    // dropped.
                    () = sleep_until(idle_deadline, idle_timeout.min(write_timeout)) => {
                        if activity.idle_deadline(idle_timeout).is_some_and(|d| d <= Instant::now()) {
                            break;
                        }
                        // A response the client has not taken in time: its
                        // stream, and every other on the connection, ends
                        // as the connection is dropped.
                        if activity.stalled(write_timeout) {
                            tracing::info!(%peer, "closing a connection whose client has not read a response for {write_timeout:?}");
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

/// Sleeps to `deadline`, or for a tick at most (a second at most): a
/// request that arrives meanwhile may stall, and is looked at again then.
async fn sleep_until(deadline: Option<Instant>, tick: Duration) {
    let tick = Instant::now() + tick.min(Duration::from_secs(1));
    tokio::time::sleep_until(deadline.map_or(tick, |deadline| deadline.min(tick)).into()).await
}

/// Resolves when the accept loop asks this connection to close, if it can.
async fn closed(close: Option<&Notify>) {
    match close {
        Some(close) => close.notified().await,
        None => std::future::pending().await,
    }
}

/// The address a peer's connections and requests are counted under: an
/// IPv4 address (mapped or not), or an IPv6 /64, which one host usually
/// has whole.
pub fn peer_group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
    }
}

/// The open connections of a listener that evicts, oldest first, for
/// [`Limits::evict_when_full`]. Small listeners only: each accept scans it.
#[derive(Default)]
struct OpenConnections {
    open: VecDeque<(IpAddr, Weak<Notify>)>,
}

impl OpenConnections {
    /// Registers a new connection from `peer`; it closes when notified.
    fn add(&mut self, peer: IpAddr) -> Arc<Notify> {
        self.open.retain(|(_, close)| close.strong_count() > 0);
        let close = Arc::new(Notify::new());
        self.open.push_back((peer, Arc::downgrade(&close)));
        close
    }

    /// Closes the oldest connection of the peer with the most: an attacker
    /// holding slots loses its own, and a probe's connection, the newest
    /// from an address with few, survives.
    fn evict_one(&mut self) {
        self.open.retain(|(_, close)| close.strong_count() > 0);
        let mut counts: HashMap<IpAddr, usize> = HashMap::new();
        for (peer, _) in &self.open {
            *counts.entry(*peer).or_default() += 1;
        }
        let Some(most) = counts.values().copied().max() else { return };
        if let Some(oldest) = self.open.iter().position(|(peer, _)| counts[peer] == most)
            && let Some((_, close)) = self.open.remove(oldest)
            && let Some(close) = close.upgrade()
        {
            // Stores a permit: the connection closes even if its task is
            // not waiting yet.
            close.notify_one();
        }
    }
}

/// Requests in flight on one connection, when the last one ended, and
/// which responses wait on the client.
struct Activity {
    started: Instant,
    /// How long the first request may take to arrive.
    first_request_timeout: Duration,
    /// Whether any request has arrived yet.
    served: std::sync::atomic::AtomicBool,
    in_flight: AtomicUsize,
    /// Milliseconds after `started` when the connection last became idle.
    idle_since_ms: AtomicU64,
    /// Per request in flight: since when (milliseconds after `started`,
    /// plus one; 0 for not) its response has waited for the client to take
    /// it. Per request, so that one stream that moves cannot hide others
    /// that are stuck.
    owed: Mutex<Vec<Arc<AtomicU64>>>,
}

impl Activity {
    fn new(first_request_timeout: Duration) -> Self {
        Self {
            started: Instant::now(),
            first_request_timeout,
            served: Default::default(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            owed: Mutex::new(Vec::new()),
        }
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.served.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        let owed = Arc::new(AtomicU64::new(0));
        let mut all = self.owed.lock();
        // Requests that ended hold no other reference.
        all.retain(|owed| Arc::strong_count(owed) > 1);
        all.push(owed.clone());
        drop(all);
        InFlight { activity: self.clone(), owed }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Whether some response has waited for the client for `timeout`.
    fn stalled(&self, timeout: Duration) -> bool {
        let all = self.owed.lock();
        let oldest = all.iter().map(|owed| owed.load(Ordering::Acquire)).filter(|&since| since > 0).min();
        oldest.is_some_and(|since| self.now_ms() + 1 >= since + timeout.as_millis() as u64)
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
struct InFlight {
    activity: Arc<Activity>,
    owed: Arc<AtomicU64>,
}

impl InFlight {
    /// The response is the client's to take from now on.
    fn owe(&self) {
        self.owed.store(self.activity.now_ms() + 1, Ordering::Release);
    }

    /// The response waits on its own source, not on the client.
    fn paid(&self) {
        self.owed.store(0, Ordering::Release);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.owed.store(0, Ordering::Release);
        let now = self.activity.now_ms();
        self.activity.idle_since_ms.store(now, Ordering::Release);
        self.activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted as in flight until it
/// has been sent (or dropped), and tells whether it waits on the client.
/// hyper polls a body only when the client can take more (HTTP/2 waits for
/// window first, HTTP/1 for room in its write buffer): between a frame
/// returned (or the head handed over) and the next poll, the client owes
/// us a read.
struct Tracked<B> {
    body: B,
    guard: InFlight,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        self.guard.paid();
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let std::task::Poll::Ready(Some(_)) = &polled {
            self.guard.owe();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
