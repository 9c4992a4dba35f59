//! The whole data plane in-process: the gateway and the echo upstream on
//! loopback listeners, driven over real HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sluice_core::{BackendDecl, DesiredConfig, FailurePolicy, Isolation, Phase, PluginDecl, PluginSource};
use sluice_core::{ConfigUpdate, ResourceKey, RouteDecl};
use sluice_runtime::{Runtime, RuntimeConfig};
use tokio::sync::watch;

use super::*;
use crate::gateway::Settings;

async fn listen() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

fn add_header() -> PluginDecl {
    PluginDecl {
        key: ResourceKey::new("default", "add-header"),
        source: PluginSource::File(PathBuf::from(sluice_test_programs::path("add-header"))),
        phase: Phase::Filter,
        sha256: None,
        config: serde_json::json!({"header": "x-team", "value": "search",
            "responseHeader": {"name": "x-sluice-plugin", "value": "add-header"}}),
        failure_policy: FailurePolicy::Closed,
        timeout: Duration::from_secs(5),
        max_memory_bytes: 64 << 20,
        isolation: Isolation::PerRequest,
        endpoints: sluice_core::config::Endpoints::ALL,
        state: None,
        egress: None,
    }
}

/// Starts echo and a gateway serving `chat` → echo through add-header;
/// returns the gateway's address, the gateway and echo's address.
async fn start() -> (SocketAddr, Arc<Gateway>, SocketAddr) {
    let (echo, echo_addr) = listen().await;
    tokio::spawn(sluice_echo::serve(echo, Default::default(), std::future::pending()));
    let runtime = Runtime::new(RuntimeConfig { max_instances: 20, ..Default::default() }).unwrap();
    let gateway = Gateway::new(runtime, None, Settings::default()).unwrap();
    let route = RouteDecl {
        backends: vec![BackendDecl::new(format!("http://{echo_addr}/v1"))],
        plugins: vec![ResourceKey::new("default", "add-header")],
        timeout: Duration::from_secs(10),
        ..RouteDecl::new(ResourceKey::new("default", "chat"), vec!["gpt-4o-mini".into()])
    };
    let desired = DesiredConfig { revision: 1, plugins: vec![add_header()], routes: vec![route], ..Default::default() };
    let (updates, rx) = watch::channel(Some(ConfigUpdate::Desired(desired)));
    // The gateway follows the source until the sender goes: keep it.
    std::mem::forget(updates);
    tokio::spawn(gateway.clone().follow(rx));
    let (data, addr) = listen().await;
    let serving = gateway.clone();
    tokio::spawn(crate::serve_data_plane(serving, data, std::future::pending(), Duration::from_secs(1)));
    // Wait for the first config; every build either loads it or reports.
    while !gateway.is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (addr, gateway, echo_addr)
}

async fn post(addr: SocketAddr, body: &str) -> (StatusCode, HeaderMap, serde_json::Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_runs_the_chain_reaches_the_upstream_and_the_response_hook_runs() {
    let (addr, _gateway, echo_addr) = start().await;
    let (status, headers, json) =
        post(addr, r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(headers["x-sluice-plugin"], "add-header");
    let echoed: serde_json::Value =
        serde_json::from_str(json["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["headers"]["x-team"], "search", "{echoed}");
    // The upstream's own authority, made once per backend, not the
    // gateway's that the client sent.
    assert_eq!(echoed["headers"]["host"], echo_addr.to_string(), "{echoed}");
}

/// Found by the request_json fuzz target (in a copy): these were routed,
/// then the rewrite to a backend's model failed (a 500), or an array was
/// routed as if it were an object.
#[test]
fn only_objects_the_rewrite_can_read_are_routed() {
    let model_of = |body: &[u8]| requested_model(&Bytes::copy_from_slice(body)).map(|(model, _)| model);
    // Refused wherever the bad value hides, as a `Value` parse refuses it.
    for body in [
        r#"["gpt-4o-mini"]"#,
        r#"{"model":"m","x":1e400}"#,
        r#"{"model":"m","x":"\ud800"}"#,
        r#"{"model":"m","x":[{"y":-1e400}]}"#,
        r#"{"model":"m","x":{"\udc00":1}}"#,
        r#"{"model":"m"} x"#,
        r#"{"model":"\ud800"}"#,
    ] {
        let error = model_of(body.as_bytes()).expect_err(body);
        assert_eq!(error.status, 400, "{body}");
        assert!(serde_json::from_str::<serde_json::Value>(body).is_err() || body.starts_with('['), "{body}");
    }
    // A name twice in one object, at any depth and however spelled, is
    // refused: readers disagree on which value counts.
    for body in [
        r#"{"model":"a","model":"b"}"#,
        r#"{"model":"a","model":7}"#,
        r#"{"model":"a","mod\u0065l":"a"}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
        r#"{"model":"m","x":[[{"y":{"z":1,"z":1}}]]}"#,
    ] {
        let error = model_of(body.as_bytes()).expect_err(body);
        assert_eq!((error.status, error.code), (400, "duplicate_key"), "{body}");
        assert!(error.message.contains("duplicate key"), "{}", error.message);
    }
    // Past the one pass's depth, serde_json's check refuses it too.
    let deep = format!(r#"{{"model":"m","x":{}{{"a":1,"a":2}}{}}}"#, "[".repeat(70), "]".repeat(70));
    assert_eq!(model_of(deep.as_bytes()).unwrap_err().code, "duplicate_key");
    // The same name in different objects is no duplicate; nor is a
    // name past the point where a set takes over.
    let wide: String = (0..40).map(|i| format!(r#""k{i}":{i},"#)).collect();
    assert_eq!(model_of(format!(r#"{{{wide}"model":"m","o":{{"model":1}}}}"#).as_bytes()).unwrap(), "m");
    let error = model_of(format!(r#"{{{wide}"model":"m","k39":0}}"#).as_bytes()).unwrap_err();
    assert_eq!(error.code, "duplicate_key");
    assert_eq!(model_of(br#"{"m\u006fdel":"\u00e9"}"#).unwrap(), "é");
    let body = Bytes::from_static(br#"{"model":"m","temperature":0.5,"seed":18446744073709551615}"#);
    assert_eq!(model_of(&body).unwrap(), "m");
    let rewritten: serde_json::Value =
        serde_json::from_slice(&crate::json::rewrite_model(&body, "backend").unwrap()).unwrap();
    assert_eq!(rewritten, serde_json::json!({"model": "backend", "temperature": 0.5, "seed": 18446744073709551615u64}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_openai_shaped() {
    let (addr, _gateway, _) = start().await;
    let (status, _, json) = post(addr, r#"{"model":"nope","messages":[]}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(json["error"]["code"], "model_not_found", "{json}");
    let (status, _, json) = post(addr, r#"{"messages":[]}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json["error"]["code"], "missing_model", "{json}");
    let (status, _, json) = post(addr, "not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
}
