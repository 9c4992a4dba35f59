//! A stand-in OTLP collector for the export tests, on a runtime of its own:
//! takes gRPC and HTTP/protobuf exports of message `M` and hands over each
//! with its path and headers, then answers with `reply`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::mpsc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

/// How the collector answers.
#[derive(Clone)]
pub enum Reply {
    /// This encoded export response.
    Ok(Bytes),
    /// Never.
    Hang,
}

pub struct Export<M> {
    pub path: String,
    pub headers: http::HeaderMap,
    pub request: M,
}

pub struct Collector<M> {
    pub addr: SocketAddr,
    pub received: mpsc::Receiver<Export<M>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl<M> Drop for Collector<M> {
    fn drop(&mut self) {
        // Dropping a runtime inside another one panics.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

pub fn start<M: Message + Default + Send + 'static>(reply: Reply) -> Collector<M> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    // Not `block_on`: the tests start it from inside a runtime too.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = {
        let _runtime = runtime.enter();
        tokio::net::TcpListener::from_std(listener).unwrap()
    };
    let (sender, received) = mpsc::channel();
    runtime.spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (sender, reply) = (sender.clone(), reply.clone());
            let service = hyper::service::service_fn(move |request| answer(request, reply.clone(), sender.clone()));
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Collector { addr, received, runtime: Some(runtime) }
}

async fn answer<M: Message + Default>(
    request: http::Request<Incoming>,
    reply: Reply,
    sender: mpsc::Sender<Export<M>>,
) -> Result<http::Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let path = request.uri().path().to_string();
    let headers = request.headers().clone();
    let grpc = headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    let body = request.into_body().collect().await.unwrap().to_bytes();
    // A gRPC message has a five-byte prefix: compressed flag, length.
    let message = if grpc { body.slice(5..) } else { body };
    let _ = sender.send(Export { path, headers, request: M::decode(message).unwrap() });
    let reply = match reply {
        Reply::Ok(reply) => reply,
        Reply::Hang => std::future::pending().await,
    };
    let response = http::Response::builder().status(200);
    Ok(if grpc {
        let mut framed = vec![0];
        framed.extend_from_slice(&u32::try_from(reply.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(&reply);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from(framed)).with_trailers(async { Some(Ok(trailers)) });
        response.header("content-type", "application/grpc").body(body.boxed()).unwrap()
    } else {
        response.header("content-type", "application/x-protobuf").body(Full::new(reply).boxed()).unwrap()
    })
}
