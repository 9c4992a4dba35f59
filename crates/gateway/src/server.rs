//! Listeners: accept connections (HTTP/1.1 and h2c), serve until shutdown,
//! then drain in-flight requests, streams included.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::body::Body;
use crate::gateway::Gateway;

/// Serves the OpenAI API until `shutdown` resolves, then waits up to
/// `drain` for in-flight requests to finish.
pub async fn serve_data_plane(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    serve(listener, shutdown, drain, move |request| crate::proxy::handle(gateway.clone(), request)).await
}

/// Serves health, readiness and the config view.
pub async fn serve_admin(gateway: Arc<Gateway>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
    serve(listener, shutdown, Duration::from_secs(1), move |request| {
        let gateway = gateway.clone();
        async move { crate::admin::handle(&gateway, request) }
    })
    .await
}

async fn serve<F, Fut>(listener: TcpListener, shutdown: impl Future<Output = ()>, drain: Duration, handler: F)
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = http::Response<Body>> + Send + 'static,
{
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _peer) = match accepted {
                    Ok(conn) => conn,
                    Err(error) => {
                        // Usually out of file descriptors: back off rather than spin.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let service = service_fn(move |request| {
                    let handler = handler.clone();
                    async move { Ok::<_, std::convert::Infallible>(handler(request).await) }
                });
                let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
                let connection = graceful.watch(connection.into_owned());
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("some connections were still busy after {drain:?}; closing them");
    }
}
