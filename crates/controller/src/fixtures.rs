//! An API server in memory, for the tests, in the style of kube-rs's
//! controller-rs (`src/fixtures.rs`): the [`Client`] sends its requests to a
//! `tower_test` mock service, and the test, as the [`ApiServerVerifier`],
//! takes each request in turn, checks its method, path, query and body, and
//! answers it as the API server would. A request the test does not expect
//! fails it; one it expects and the code does not make leaves the verifier
//! waiting, and the test's timeout fails it.

use std::collections::BTreeMap;

use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

/// A client whose every request reaches the returned verifier.
pub fn mock_client() -> (Client, ApiServerVerifier) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServerVerifier(handle))
}

pub struct ApiServerVerifier(Handle<Request<Body>, Response<Body>>);

/// One request, waiting for its answer.
pub struct Exchange {
    pub method: Method,
    pub path: String,
    pub query: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The JSON body, or `Null` for none.
    pub body: Value,
    send: SendResponse<Response<Body>>,
}

impl ApiServerVerifier {
    /// The next request, whatever it is.
    pub async fn next(&mut self) -> Exchange {
        self.next_if_any().await.expect("the client is gone: no further request")
    }

    /// The next request, or `None` once every client is dropped.
    pub async fn next_if_any(&mut self) -> Option<Exchange> {
        let (request, send) = self.0.next_request().await?;
        let method = request.method().clone();
        let path = request.uri().path().to_string();
        let query = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                (key.to_string(), value.to_string())
            })
            .collect();
        let content_type =
            request.headers().get(http::header::CONTENT_TYPE).map(|v| v.to_str().unwrap_or_default().to_string());
        let bytes = request.into_body().collect_bytes().await.expect("a request body");
        let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).expect("a JSON body") };
        Some(Exchange { method, path, query, content_type, body, send })
    }

    /// The next request, which must be `method` on `path` and come within a
    /// minute (of the paused clock, in a test that pauses it).
    pub async fn expect(&mut self, method: Method, path: &str) -> Exchange {
        let next = tokio::time::timeout(std::time::Duration::from_secs(60), self.next());
        let exchange = next.await.unwrap_or_else(|_| panic!("no request for {method} {path} within a minute"));
        assert_eq!(
            (&exchange.method, exchange.path.as_str()),
            (&method, path),
            "an unexpected request; its body: {}",
            exchange.body
        );
        exchange
    }

    /// Checks that the client made no request besides those taken: to be
    /// called once every client (and clone of one) is dropped.
    pub async fn done(mut self) {
        if let Some((request, _)) = self.0.next_request().await {
            panic!("an unexpected request: {} {}", request.method(), request.uri());
        }
    }
}

impl Exchange {
    pub fn respond(self, status: StatusCode, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(body).unwrap()))
            .unwrap();
        self.send.send_response(response);
    }

    pub fn ok(self, body: &Value) {
        self.respond(StatusCode::OK, body);
    }

    /// Fails the request the way the API server does: a `Status` with `code` and `reason`.
    pub fn fail(self, code: u16, reason: &str) {
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{reason} (from the mock API server)"), "reason": reason, "code": code,
        });
        self.respond(StatusCode::from_u16(code).unwrap(), &status);
    }
}

/// What a verifier task returns once it has taken every request it
/// expects: a verifier still waiting for one (the code did not make it)
/// fails the test after 10 s (as controller-rs's `timeout_after_1s`).
pub async fn verified<T>(verifier: tokio::task::JoinHandle<T>) -> T {
    let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), verifier).await;
    outcome.expect("the verifier still waits for an expected request").expect("the verifier's checks passed")
}

/// A Lease as the API server returns it.
pub fn lease(name: &str, version: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "sluice", "resourceVersion": version},
        "spec": spec,
    })
}

/// An AIModelRoute in namespace `team`.
pub fn route(name: &str, generation: i64, spec: Value) -> Value {
    resource("AIModelRoute", name, generation, spec)
}

/// An MCPRoute in namespace `team`.
pub fn mcp_route(name: &str, generation: i64, spec: Value) -> Value {
    resource("MCPRoute", name, generation, spec)
}

/// A GatewayPlugin in namespace `team`.
pub fn plugin(name: &str, generation: i64, spec: Value) -> Value {
    resource("GatewayPlugin", name, generation, spec)
}

fn resource(kind: &str, name: &str, generation: i64, spec: Value) -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": kind,
        "metadata": {"name": name, "namespace": "team", "generation": generation, "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
    })
}

pub fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}
