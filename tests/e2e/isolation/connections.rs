//! Isolation: connections (docs/security.md). One client, or one pod, must
//! not take what the gateway shares between all of them: the requests in
//! flight, the request-body budget, the probe listener's connections.
//!
//! The attacker connects from 127.0.0.1 and the victim from 127.0.0.2 (all
//! of 127/8 is loopback on Linux): two peers, as two pods would be.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use sluice_tests::{ConfigDir, Echo, Gateway, Options, Route, chat_body};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
const VICTIM: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

async fn gateway(echo: &Echo, args: &[String]) -> Gateway {
    let dir = ConfigDir::new();
    dir.write("routes.yaml", &Route::new("chat", &["m"], &echo.url()).yaml());
    Gateway::start_with(&dir, Options { args: args.to_vec(), ..Default::default() }).await
}

fn data_addr(gateway: &Gateway) -> SocketAddr {
    gateway.url("").trim_start_matches("http://").parse().unwrap()
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// One HTTP/1.1 request on a fresh connection from `from`: the status and
/// the body, or what went wrong, within `within`.
async fn request_from(
    from: IpAddr,
    to: SocketAddr,
    request: http::Request<Full<Bytes>>,
    within: Duration,
) -> Result<(u16, String), String> {
    let exchange = async {
        let stream = connect_from(from, to).await.map_err(|e| format!("connect: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(connection);
        let response = sender.send_request(request).await.map_err(|e| format!("request: {e}"))?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.map_err(|e| format!("body: {e}"))?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(within, exchange).await.unwrap_or_else(|_| Err(format!("no answer within {within:?}")))
}

fn get(to: SocketAddr, path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(format!("http://{to}{path}")).header("host", "x").body(Full::default()).unwrap()
}

fn chat(to: SocketAddr) -> http::Request<Full<Bytes>> {
    http::Request::post(format!("http://{to}/v1/chat/completions"))
        .header("host", "x")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body("m").to_string())))
        .unwrap()
}

/// An h2c connection from the attacker's address with the receive window
/// `window` for each stream: the connection task, and the handle that
/// opens streams.
async fn h2_connection(to: SocketAddr, window: u32) -> (JoinHandle<()>, h2::client::SendRequest<Bytes>) {
    let stream = connect_from(ATTACKER, to).await.unwrap();
    let (send, connection) = h2::client::Builder::new().initial_window_size(window).handshake(stream).await.unwrap();
    // Polled to the end so that the connection answers pings and notices
    // when the gateway closes it.
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (task, send)
}

/// A client that sets SETTINGS_INITIAL_WINDOW_SIZE=0 never lets a response
/// body out. Before, every stream kept its request in flight: 11
/// connections × 100 streams of `GET /v1/models` took all 1024 and every
/// other client got 503 `overloaded`. Now a connection and a peer address
/// each get a share of the budget, and a response the client does not take
/// within the write timeout closes its connection (docs/security.md, C1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_responses_does_not_hold_the_requests_in_flight() {
    let echo = Echo::start().await;
    let write_timeout = Duration::from_secs(5);
    let gateway = gateway(&echo, &["--write-timeout-seconds".into(), write_timeout.as_secs().to_string()]).await;
    let addr = data_addr(&gateway);

    let mut connections = Vec::new();
    let mut responses = Vec::new();
    for _ in 0..11 {
        let (task, mut send) = h2_connection(addr, 0).await;
        for _ in 0..100 {
            send = send.ready().await.unwrap();
            let request = http::Request::get(format!("http://{addr}/v1/models")).body(()).unwrap();
            let (response, _) = send.send_request(request, true).unwrap();
            responses.push(response);
        }
        connections.push((task, send));
    }
    // Every stream has its response head (heads need no window); its body
    // waits for a window that never opens. The responses are kept: dropping
    // one would reset its stream.
    let mut bodies = Vec::new();
    let mut refused = 0;
    for response in responses {
        let response = tokio::time::timeout(Duration::from_secs(20), response).await.expect("a response head").unwrap();
        refused += usize::from(response.status() == 503);
        bodies.push(response.into_body());
    }
    let attacked = Instant::now();
    eprintln!("the attacker's 1100 streams have their heads: {refused} were refused");

    // Another client is served while the attack holds.
    let within = Duration::from_secs(2);
    let (status, body) = request_from(VICTIM, addr, chat(addr), within).await.unwrap();
    assert_eq!(status, 200, "a chat request from another client while the attack holds: {body}");
    assert!(body.contains("chat.completion"), "{body}");
    let (status, body) = request_from(VICTIM, addr, get(addr, "/v1/models"), within).await.unwrap();
    assert_eq!(status, 200, "/v1/models from another client while the attack holds: {body}");
    assert!(
        connections.iter().all(|(task, _)| !task.is_finished()),
        "the attacker's connections were closed before the other client was served: the caps did not serve it"
    );

    // After the write timeout (checked every second), the attacker's
    // connections are closed, and with them their streams.
    for (task, _) in &mut connections {
        let left = (write_timeout + Duration::from_secs(3)).saturating_sub(attacked.elapsed());
        assert!(
            tokio::time::timeout(left, task).await.is_ok(),
            "an attacker's connection was still open {:?} after its responses stalled",
            attacked.elapsed()
        );
    }
    drop(bodies);
    let (status, body) = request_from(ATTACKER, addr, chat(addr), within).await.unwrap();
    assert_eq!(status, 200, "after the attack: {body}");
}

/// Before, the request-body budget was reserved from the declared
/// `Content-Length` before a byte arrived, so 100 h2 streams declaring
/// 4 MiB and sending nothing made every POST a 503 for the 30 s of the body
/// timeout, renewable. Now a body holds budget for the bytes that have
/// arrived (docs/security.md, C2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_only_requests_do_not_take_the_request_body_budget() {
    let echo = Echo::start().await;
    let gateway = gateway(&echo, &[]).await;
    let addr = data_addr(&gateway);
    // Two connections of 50 streams: within every per-connection cap, so
    // the gateway admits all 100.
    let mut connections = Vec::new();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let (task, mut send) = h2_connection(addr, 65_535).await;
        for _ in 0..50 {
            send = send.ready().await.unwrap();
            let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("content-length", (4 << 20).to_string())
                .body(())
                .unwrap();
            let (response, body) = send.send_request(request, false).unwrap();
            streams.push((response, body));
        }
        connections.push((task, send));
    }
    // Let the gateway read every head and admit the requests.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (status, body) = request_from(VICTIM, addr, chat(addr), Duration::from_secs(5)).await.unwrap();
    assert_eq!(status, 200, "a POST from another client while 100 streams declare 4 MiB each: {body}");
    // The attacker's requests still hang: the victim was not served because
    // they had given up.
    let mut answered = 0;
    for (response, _) in &mut streams {
        if tokio::time::timeout(Duration::ZERO, response).await.is_ok() {
            answered += 1;
        }
    }
    assert_eq!(answered, 0, "the attacker's streams were answered before the victim's POST");
    assert!(connections.iter().all(|(task, _)| !task.is_finished()), "the attacker's connections were closed");
}

/// Before, the probes listener had 64 connection slots and every pod could
/// reach it; holding them made the kubelet's 1 s probe time out, so
/// readiness failed and liveness restarted the pod. Now a full probes
/// listener closes the oldest connection of the address holding the most,
/// and a probe connection must send its request within a second
/// (docs/security.md, C4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_the_probe_listener_does_not_fail_the_kubelets_probes() {
    let echo = Echo::start().await;
    let probes: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gateway = gateway(&echo, &["--probes".into(), probes.to_string()]).await;
    assert_eq!(request_from(VICTIM, probes, get(probes, "/readyz"), Duration::from_secs(1)).await.unwrap().0, 200);

    // 100 silent connections and 100 that trickle a request head, from
    // one pod; whatever the gateway closes is opened again.
    let attack = tokio::spawn(async move {
        let mut held: Vec<(bool, Option<TcpStream>)> = (0..200).map(|i| (i % 2 == 1, None)).collect();
        for round in 0.. {
            for (slow, stream) in &mut held {
                let closed = match stream {
                    None => true,
                    Some(stream) => {
                        let mut buf = [0u8; 256];
                        let gone = match stream.try_read(&mut buf) {
                            Ok(read) => read == 0,
                            Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
                        };
                        gone || (*slow && stream.write_all(format!("x-{round}: 1\r\n").as_bytes()).await.is_err())
                    }
                };
                if closed {
                    *stream = connect_from(ATTACKER, probes).await.ok();
                    if let (true, Some(stream)) = (*slow, stream.as_mut()) {
                        let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    // Let the attack fill the listener.
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // The kubelet probes from its node: every probe answers within its
    // 1 s timeout, over several header timeouts of the attacker's.
    for round in 0..10 {
        for path in ["/healthz", "/readyz"] {
            let started = Instant::now();
            let answer = request_from(VICTIM, probes, get(probes, path), Duration::from_secs(1)).await;
            assert_eq!(
                answer.map(|(status, _)| status),
                Ok(200),
                "{path} in round {round}, after {:?}",
                started.elapsed()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(!attack.is_finished(), "the attack stopped early");
    attack.abort();
    drop(gateway);
}
