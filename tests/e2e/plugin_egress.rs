//! Outbound HTTP from plugins (`wasi:http/outgoing-handler`, granted by
//! `spec.egress`) through the real gateway, with the `caller` test plugin
//! (plugins/testing/caller), which makes the call its request headers
//! describe and answers with what came back. Two real HTTP servers on
//! loopback: one granted, one not. Each way out of a grant is tried: an
//! unlisted port, a redirect to it, the metadata address, a granted name
//! that resolves to loopback, a huge response, a slow server, too many
//! calls at once, and a component without a grant.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Echo, Gateway, Plugin, Reply, Route, documents, eventually};
use tokio::net::TcpListener;

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// A small real HTTP/1.1 server on loopback, counting the requests it saw.
struct Origin {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
    /// The `traceparent` of each request it saw.
    traceparents: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl Origin {
    async fn start() -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(AtomicUsize::new(0));
        let traceparents = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let (counter, parents) = (seen.clone(), traceparents.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let (counter, parents) = (counter.clone(), parents.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        if let Some(parent) = request.headers().get("traceparent").and_then(|v| v.to_str().ok()) {
                            parents.lock().push(parent.to_string());
                        }
                        answer(request)
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Origin { addr, seen, traceparents }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn seen(&self) -> usize {
        self.seen.load(Ordering::SeqCst)
    }
}

async fn answer(request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    let method = request.method().to_string();
    // How the body was framed: a declared length, which every server reads,
    // or chunks, which some (Python's http.server) leave on the connection.
    let framing = match (request.headers().get("content-length"), request.headers().get("transfer-encoding")) {
        (Some(_), _) => "length",
        (None, Some(_)) => "chunked",
        (None, None) => "none",
    };
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let full = |status: u16, body: Bytes| {
        Response::builder().status(status).body(Full::new(body).map_err(|e| match e {}).boxed()).unwrap()
    };
    Ok(match path.as_str() {
        "/ok" => {
            let mut response = full(200, Bytes::from(format!(r#"{{"hello":"world","got":{}}}"#, body.len())));
            response.headers_mut().insert("x-seen", format!("{method} {} {framing}", body.len()).parse().unwrap());
            response
        }
        "/redirect" => {
            let to = query.strip_prefix("to=").unwrap_or_default().to_string();
            let mut response = full(302, Bytes::new());
            response.headers_mut().insert("location", to.parse().unwrap());
            response
        }
        // 2 MiB, with its length declared.
        "/huge" => full(200, Bytes::from(vec![b'x'; 2 << 20])),
        // 2 MiB in 64 KiB chunks, with no length declared.
        "/huge-chunked" => {
            let chunks = (0..32).map(|_| Ok::<_, Infallible>(Frame::data(Bytes::from(vec![b'y'; 64 << 10]))));
            Response::new(StreamBody::new(futures_util::stream::iter(chunks)).boxed())
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            full(200, Bytes::from_static(b"late"))
        }
        _ => full(404, Bytes::new()),
    })
}

async fn call(gateway: &Gateway, model: &str, headers: &[(&str, &str)]) -> Reply {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    gateway.post("/v1/chat/completions", body.to_string(), headers).await
}

/// What the caller plugin answered: `(status, its JSON)`.
fn outcome(reply: &Reply) -> (u16, Value) {
    (reply.status.as_u16(), serde_json::from_str(&reply.text()).unwrap_or(Value::Null))
}

fn destination(url: &str) -> Value {
    json!({"url": url})
}

#[tokio::test]
async fn a_plugin_reaches_only_what_its_grant_lists() {
    let echo = Echo::start().await;
    let granted = Origin::start().await;
    let other = Origin::start().await;
    let origin = format!("http://{}", granted.addr);
    let caller = |name: &str, egress: Option<Value>| {
        let plugin = Plugin::new(name, "caller").timeout_ms(5000);
        match egress {
            Some(egress) => plugin.egress(egress),
            None => plugin,
        }
        .yaml()
    };
    let plugins = [
        caller("caller", Some(json!({"destinations": [destination(&origin)], "maxResponseBytes": 65536}))),
        caller("quick", Some(json!({"destinations": [destination(&origin)], "timeoutMs": 300}))),
        caller("one-at-a-time", Some(json!({"destinations": [destination(&origin)], "maxConcurrentCalls": 1}))),
        // A name, not an address: it resolves to loopback.
        caller(
            "by-name",
            Some(json!({"destinations": [destination(&format!("http://localhost:{}", granted.addr.port()))]})),
        ),
        caller("ungranted", None),
    ];
    let twice = Plugin::new("declares-twice", "caller").config(json!({"declareTwice": true}));
    let twice = twice.egress(json!({"destinations": [destination(&origin)]})).yaml();
    let short = Plugin::new("short-deadline", "caller").timeout_ms(400);
    let short = short.egress(json!({"destinations": [destination(&origin)]})).yaml();
    let plugins: Vec<String> = plugins.into_iter().chain([short, twice]).collect();
    let route = |name: &str| Route::new(name, &[name], &echo.url()).plugins(&[name]).yaml();
    let dir = ConfigDir::new();
    dir.write("plugins.yaml", &documents(&plugins));
    let routes: Vec<String> =
        ["caller", "quick", "one-at-a-time", "by-name", "ungranted", "short-deadline", "declares-twice"]
            .map(route)
            .to_vec();
    dir.write("routes.yaml", &documents(&routes));
    let gateway = Gateway::start(&dir).await;
    let admin = eventually("the granted routes to be served", Duration::from_secs(120), async || {
        let admin = gateway.admin_config().await;
        (admin["routes"].as_array()?.len() == 5 && admin["errors"].as_array()?.len() == 4).then_some(admin.clone())
    })
    .await;

    // Without a grant, the component is refused at load, saying why.
    let refused = crate::plugin_support::errors_about(&admin, "GatewayPlugin default/ungranted");
    let refused = refused.first().unwrap_or_else(|| panic!("no error about the ungranted plugin: {admin}")).to_string();
    assert!(refused.contains("wasi:http/outgoing-handler") && refused.contains("spec.egress"), "{refused}");
    // A plugin declares its metrics once, from configure.
    let twice = crate::plugin_support::errors_about(&admin, "GatewayPlugin default/declares-twice");
    let twice = twice.first().map(|e| e.to_string());
    assert!(twice.as_deref().is_some_and(|e| e.contains("metrics are declared once")), "{admin}");

    // The granted origin answers.
    let ok_url = granted.url("/ok");
    let (status, body) = outcome(&call(&gateway, "caller", &[("x-call", &ok_url)]).await);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], 200, "{body}");
    assert_eq!(body["header_x_seen"], "GET 0 none", "{body}");
    assert!(body["body"].as_str().unwrap().contains("world"), "{body}");
    let post = [("x-call", ok_url.as_str()), ("x-call-method", "POST"), ("x-call-body", "12345")];
    assert_eq!(outcome(&call(&gateway, "caller", &post).await).1["header_x_seen"], "POST 5 length");

    // Another port of the same host is not granted; nothing reaches it.
    let (status, body) = outcome(&call(&gateway, "caller", &[("x-call", &other.url("/ok"))]).await);
    assert_eq!((status, &body["error"]), (502, &json!("refused")), "{body}");
    // A redirect there, followed as an ordinary client would, is refused too.
    let redirect = granted.url(&format!("/redirect?to={}", other.url("/ok")));
    let (status, body) = outcome(&call(&gateway, "caller", &[("x-call", &redirect), ("x-call-follow", "1")]).await);
    assert_eq!((status, &body["error"]), (502, &json!("refused")), "{body}");
    // As are the cloud metadata address and another scheme.
    for url in ["http://169.254.169.254/latest/meta-data/", &format!("https://{}/ok", granted.addr)] {
        let (status, body) = outcome(&call(&gateway, "caller", &[("x-call", url)]).await);
        assert_eq!((status, &body["error"]), (502, &json!("refused")), "{url}: {body}");
    }
    assert_eq!(other.seen(), 0, "the ungranted origin was reached");

    // A granted name that resolves to loopback is not a way to loopback.
    let by_name = format!("http://localhost:{}/ok", granted.addr.port());
    let before = granted.seen();
    let (status, body) = outcome(&call(&gateway, "by-name", &[("x-call", &by_name)]).await);
    assert_eq!((status, &body["error"]), (502, &json!("refused")), "{body}");
    assert_eq!(granted.seen(), before, "the name's loopback address was connected to");

    // A response over the grant's cap is cut off, declared or not. A
    // declared length is refused before the body: `HttpResponseBodySize`.
    // One found too long while read ends the body stream with that error,
    // which wasmtime-wasi-http 48 does not hand to `http-error-code` (it
    // keeps its own error type there), so the guest sees it as text.
    let huge = |path: &str| [("x-call", granted.url(path)), ("x-call-max-bytes", (8 << 20).to_string())];
    let headers = huge("/huge");
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (status, body) = outcome(&call(&gateway, "caller", &headers).await);
    assert_eq!((status, &body["error"]), (502, &json!("too_large")), "{body}");
    let headers = huge("/huge-chunked");
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (status, body) = outcome(&call(&gateway, "caller", &headers).await);
    assert_eq!((status, &body["error"]), (502, &json!("failed")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("body size exceeds limit: 65536 bytes"), "{body}");

    // A slow server is given up at the grant's timeout, well inside the
    // plugin's 5 s deadline.
    let started = Instant::now();
    let (status, body) = outcome(&call(&gateway, "quick", &[("x-call", &granted.url("/slow"))]).await);
    assert_eq!((status, &body["error"]), (502, &json!("timeout")), "{body}");
    assert!(started.elapsed() < Duration::from_millis(1400), "took {:?}", started.elapsed());

    // The plugin's own timeout (its request options) bounds a call too.
    let started = Instant::now();
    let own = [("x-call", granted.url("/slow")), ("x-call-timeout-ms", "300".to_string())];
    let own: Vec<(&str, &str)> = own.iter().map(|(n, v)| (*n, v.as_str())).collect();
    let (status, body) = outcome(&call(&gateway, "caller", &own).await);
    assert_eq!((status, &body["error"]), (502, &json!("timeout")), "{body}");
    assert!(started.elapsed() < Duration::from_millis(1400), "took {:?}", started.elapsed());
    // And a call never outlives the hook that made it: the plugin fails at
    // its deadline (failurePolicy: Closed).
    let started = Instant::now();
    let reply = call(&gateway, "short-deadline", &[("x-call", &granted.url("/slow"))]).await;
    reply.assert_error(500, "plugin_failed");
    assert!(started.elapsed() < Duration::from_millis(1400), "took {:?}", started.elapsed());

    // One call in flight at most: a second is refused at once, not queued.
    let slow = granted.url("/slow");
    let slow_call = [("x-call", slow.as_str())];
    let first = call(&gateway, "one-at-a-time", &slow_call);
    let second = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        (call(&gateway, "one-at-a-time", &[("x-call", &slow)]).await, started.elapsed())
    };
    let (first, (second, waited)) = tokio::join!(first, second);
    assert_eq!(outcome(&first).1["status"], 200, "{}", first.text());
    let (status, body) = outcome(&second);
    assert_eq!((status, &body["error"]), (502, &json!("refused")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("in flight"), "{body}");
    assert!(waited < Duration::from_millis(900), "the refusal waited {waited:?}");

    // Every call is counted by plugin, granted destination and result; a
    // refused destination is `other`, whatever the plugin asked for.
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    let count = |labels: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with("sluice_plugin_outbound_calls_total{") && line.contains(labels))
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let granted_label = format!("destination=\"{origin}\"");
    assert!(count(&format!("plugin=\"caller\",{granted_label},result=\"ok\"")) >= 3.0, "{metrics}");
    assert!(count("plugin=\"caller\",destination=\"other\",result=\"denied\"") >= 4.0, "{metrics}");
    assert!(count(&format!("plugin=\"caller\",{granted_label},result=\"too_large\"")) >= 1.0, "{metrics}");
    assert!(count(&format!("plugin=\"quick\",{granted_label},result=\"timeout\"")) >= 1.0, "{metrics}");
    assert!(count(&format!("plugin=\"one-at-a-time\",{granted_label},result=\"concurrency_cap\"")) >= 1.0, "{metrics}");

    // The plugin's own metrics (`sluice:plugin/metrics`), declared in its
    // configure: under its namespace and name, past its declared four
    // values of `result` as `other`.
    let own = |labels: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with("sluice_plugin_calls_total{") && line.contains(labels))
            .and_then(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(own("namespace=\"default\",plugin=\"caller\",result=\"ok\""), 2.0, "{metrics}");
    assert_eq!(own("namespace=\"default\",plugin=\"caller\",result=\"refused\""), 4.0, "{metrics}");
    // ok, refused, too_large and failed came first; the timeout is a fifth.
    assert_eq!(own("namespace=\"default\",plugin=\"caller\",result=\"other\""), 1.0, "{metrics}");
    assert!(metrics.contains("sluice_plugin_call_seconds_bucket{namespace=\"default\",plugin=\"quick\""), "{metrics}");
    // Instances started from the snapshot taken after configure (which
    // answered `declare` without the host) count into the same series.
    gateway.wait_for_snapshots(Duration::from_secs(60)).await;
    let before = own("namespace=\"default\",plugin=\"caller\",result=\"ok\"");
    for _ in 0..3 {
        assert_eq!(outcome(&call(&gateway, "caller", &[("x-call", &ok_url)]).await).0, 200);
    }
    let metrics = gateway.client().get(&gateway.admin_url("/metrics")).await.text();
    let after = metrics
        .lines()
        .find(|l| l.starts_with("sluice_plugin_calls_total{") && l.contains("plugin=\"caller\",result=\"ok\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert_eq!(after, before + 3.0, "{metrics}");
}

/// The caller plugin granted an origin, on a gateway exporting its traces
/// and metrics (every second) to a real OpenTelemetry Collector.
async fn caller_exporting_to_a_collector() -> (Origin, sluice_tests::Collector, Echo, ConfigDir, Gateway) {
    let echo = Echo::start().await;
    let origin = Origin::start().await;
    let collector = sluice_tests::Collector::start().await;
    let dir = ConfigDir::new();
    let grant = json!({"destinations": [destination(&format!("http://{}", origin.addr))]});
    dir.write("plugins.yaml", &Plugin::new("caller", "caller").timeout_ms(5000).egress(grant).yaml());
    dir.write("routes.yaml", &Route::new("caller", &["caller"], &echo.url()).plugins(&["caller"]).yaml());
    let endpoint = collector.endpoint_grpc();
    let args = ["--otlp-endpoint", &endpoint, "--otlp-protocol", "grpc", "--otlp-metrics-interval-seconds", "1"];
    let options = sluice_tests::Options { args: args.map(String::from).to_vec(), ..Default::default() };
    let gateway = Gateway::start_with(&dir, options).await;
    (origin, collector, echo, dir, gateway)
}

/// With tracing on, a plugin's outbound call is a client span of the
/// request's trace (named by plugin and granted origin, never the path),
/// and the destination gets a `traceparent` naming that span, whatever the
/// plugin set.
#[tokio::test]
async fn an_outbound_call_is_a_span_of_the_request() {
    let (origin, collector, _echo, _dir, gateway) = caller_exporting_to_a_collector().await;

    let trace_id = "5bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let url = origin.url("/ok?key=not-in-the-span");
    let headers =
        [("x-call", url.as_str()), ("traceparent", traceparent.as_str()), ("x-call-header", "traceparent: forged")];
    let (status, body) = outcome(&call(&gateway, "caller", &headers).await);
    assert_eq!((status, &body["status"]), (200, &json!(200)), "{body}");
    let seen = origin.traceparents.lock().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let parts: Vec<&str> = seen[0].split('-').collect();
    assert_eq!((parts[0], parts[1], parts[3]), ("00", trace_id, "01"), "{seen:?}");

    let spans = collector
        .wait_for_spans(|spans| spans.iter().any(|s| s.trace_id == trace_id && s.kind == 3), Duration::from_secs(30))
        .await;
    let call = spans.iter().find(|s| s.trace_id == trace_id && s.kind == 3).unwrap();
    let server = spans.iter().find(|s| s.trace_id == trace_id && s.kind == 2).expect("the server span");
    assert_eq!(call.span_id, parts[2], "the destination saw the call's span");
    assert_eq!(call.parent_span_id.as_deref(), Some(server.span_id.as_str()));
    assert_eq!(call.name, format!("plugin default/caller call http://{}", origin.addr));
    assert_eq!(call.attributes["http.response.status_code"], json!(200), "{call:?}");
    assert!(!format!("{call:?}").contains("not-in-the-span"), "the span holds the call's query: {call:?}");
}

/// HTTPS to a granted destination is verified against the public roots
/// plus the destination's own CA (`caFile`): with it the call is served,
/// without it the certificate is refused.
#[tokio::test]
async fn https_is_verified_against_the_destinations_ca() {
    let echo = Echo::start().await;
    let origin = Origin::start().await;
    let tls =
        sluice_tests::TlsUpstream::start(origin.addr, sluice_tests::TlsOptions::new(&["127.0.0.1"]).http1_only()).await;
    let dir = ConfigDir::new();
    let ca = tls.write_ca(dir.path(), "ca.pem");
    let https = format!("https://{}", tls.addr());
    let trusted = json!({"destinations": [{"url": https, "caFile": ca.to_string_lossy()}]});
    let plugins = [
        Plugin::new("private-ca", "caller").timeout_ms(5000).egress(trusted).yaml(),
        Plugin::new("public-roots", "caller").timeout_ms(5000).egress(json!({"destinations": [{"url": https}]})).yaml(),
    ];
    let route = |name: &str| Route::new(name, &[name], &echo.url()).plugins(&[name]).yaml();
    dir.write("plugins.yaml", &documents(&plugins));
    dir.write("routes.yaml", &documents(&[route("private-ca"), route("public-roots")]));
    let gateway = Gateway::start(&dir).await;

    let url = format!("{https}/ok");
    let (status, body) = outcome(&call(&gateway, "private-ca", &[("x-call", &url)]).await);
    assert_eq!((status, &body["status"]), (200, &json!(200)), "{body}");
    assert!(body["body"].as_str().unwrap().contains("world"), "{body}");
    let before = origin.seen();
    let (status, body) = outcome(&call(&gateway, "public-roots", &[("x-call", &url)]).await);
    assert_eq!((status, &body["error"]), (502, &json!("failed")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("Tls"), "{body}");
    assert_eq!(origin.seen(), before, "a request went through an unverified connection");
}

/// A plugin's own metrics reach a real OpenTelemetry Collector over OTLP,
/// as the gateway's do: under the plugin's namespace and name.
#[tokio::test]
async fn a_plugins_own_metrics_reach_a_collector_over_otlp() {
    let (origin, collector, _echo, _dir, gateway) = caller_exporting_to_a_collector().await;

    for _ in 0..2 {
        let (status, body) = outcome(&call(&gateway, "caller", &[("x-call", &origin.url("/ok"))]).await);
        assert_eq!((status, &body["status"]), (200, &json!(200)), "{body}");
    }
    let attributes = [("namespace", "default"), ("plugin", "caller"), ("result", "ok")];
    let points = collector
        .wait_for_metrics(
            |points| {
                points.iter().rev().find(|p| p.is("sluice_plugin_calls", &attributes)).and_then(|p| p.value)
                    == Some(2.0)
            },
            Duration::from_secs(30),
        )
        .await;
    let calls = points.iter().rev().find(|p| p.is("sluice_plugin_calls", &attributes)).unwrap();
    assert_eq!((calls.kind.as_str(), calls.monotonic), ("sum", true), "{calls:?}");
    // The histogram too: `call_seconds`, named as the OTLP export names
    // every histogram with a unit, the unit left to the unit field.
    let names: std::collections::BTreeSet<&str> = points.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains("sluice_plugin_call"), "{names:?}");
}
