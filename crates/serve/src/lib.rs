//! The accept loop of every Sluice listener (the gateway's data plane and
//! admin listeners, the echo upstream): HTTP/1.1 and h2c on one port, until
//! shutdown, then a bounded drain of in-flight requests, streams included.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// Serves `handler` on every connection `listener` accepts until `shutdown`
/// resolves, then waits up to `drain` for in-flight requests to finish.
pub async fn serve<F, Fut, B>(listener: TcpListener, shutdown: impl Future<Output = ()>, drain: Duration, handler: F)
where
    F: Fn(http::Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
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
        };
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let service = service_fn(move |request| {
            let handler = handler.clone();
            async move { Ok::<_, Infallible>(handler(request).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("some connections were still busy after {drain:?}; closing them");
    }
}
