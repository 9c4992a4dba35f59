//! `bench-hyper-proxy --listen ADDR --upstream ADDR`: forwards every request
//! to the upstream over pooled keep-alive connections, bodies streamed both
//! ways, and nothing more (no routing, no body reading, no metrics): it
//! drops the hop-by-hop headers, as RFC 9110 asks of a proxy, and names the
//! upstream in `Host`.

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderName};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Body = BoxBody<Bytes, hyper::Error>;

const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn main() {
    let (listen, upstream) = match parse(std::env::args().skip(1)) {
        Ok(addrs) => addrs,
        Err(why) => {
            eprintln!("bench-hyper-proxy: {why}\nusage: bench-hyper-proxy --listen ADDR --upstream ADDR");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    if let Err(e) = runtime.block_on(serve(listen, upstream)) {
        eprintln!("bench-hyper-proxy: {e}");
        std::process::exit(1);
    }
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<(SocketAddr, SocketAddr), String> {
    let (mut listen, mut upstream) = (None, None);
    while let Some(flag) = args.next() {
        let slot = match flag.as_str() {
            "--listen" => &mut listen,
            "--upstream" => &mut upstream,
            other => return Err(format!("unknown argument {other:?}")),
        };
        let value = args.next().ok_or_else(|| format!("{flag} needs an address"))?;
        *slot = Some(value.parse::<SocketAddr>().map_err(|e| format!("{flag} {value}: {e}"))?);
    }
    Ok((listen.ok_or("--listen is required")?, upstream.ok_or("--upstream is required")?))
}

async fn serve(listen: SocketAddr, upstream: SocketAddr) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| forward(client.clone(), upstream, request));
            // A client that goes away mid-request is not the proxy's error.
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = Uri::try_from(format!("http://{upstream}{path}")) else {
        return Ok(error(StatusCode::BAD_REQUEST, "the request's path is not a valid URI"));
    };
    *request.uri_mut() = uri;
    strip_hop_by_hop(request.headers_mut());
    // The client names the upstream's authority in Host, as nginx's
    // `proxy_set_header Host $proxy_host` does.
    request.headers_mut().remove(header::HOST);
    match client.request(request).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(parts, body.boxed()))
        }
        Err(_) => Ok(error(StatusCode::BAD_GATEWAY, "the upstream did not answer")),
    }
}

fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

fn error(status: StatusCode, why: &'static str) -> Response<Body> {
    let body = Full::new(Bytes::from(format!("bench-hyper-proxy: {why}\n")));
    let mut response = Response::new(body.map_err(|never| match never {}).boxed());
    *response.status_mut() = status;
    response
}
