//! A plugin's state calls against stores that fail: each ends within the
//! plugin's deadline, and a failure that follows is the store's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_core::Isolation;
use sluice_state::{BoxFuture, Check, Reserved, Scope, StateError, Store, Ticket};

use crate::{Grants, Limits, PluginError, Runtime, RuntimeConfig, StateStore, built_plugin as wasm, test_request};

/// A store that is down, or one that never answers.
struct Broken {
    hangs: bool,
}

impl Broken {
    fn answer<'a, T: Send + 'a>(&'a self) -> BoxFuture<'a, Result<T, StateError>> {
        if self.hangs {
            Box::pin(std::future::pending())
        } else {
            Box::pin(std::future::ready(Err(StateError::Unavailable("connection refused".into()))))
        }
    }
}

impl Store for Broken {
    fn kind(&self) -> &'static str {
        "broken"
    }

    fn caps(&self, _: &Scope) -> (usize, usize) {
        (0, 0)
    }

    fn reserve<'a>(&'a self, _: &'a Scope, _: &'a [Check], _: u64) -> BoxFuture<'a, Result<Reserved, StateError>> {
        self.answer()
    }

    fn commit<'a>(&'a self, _: &'a Scope, _: Ticket, _: &'a [u64]) -> BoxFuture<'a, Result<(), StateError>> {
        self.answer()
    }

    fn get<'a>(&'a self, _: &'a Scope, _: &'a str, _: u64) -> BoxFuture<'a, Result<Option<Vec<u8>>, StateError>> {
        self.answer()
    }

    fn set<'a>(
        &'a self,
        _: &'a Scope,
        _: &'a str,
        _: &'a [u8],
        _: u64,
        _: u64,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        self.answer()
    }

    fn compare_and_set<'a>(
        &'a self,
        _: &'a Scope,
        _: &'a str,
        _: Option<&'a [u8]>,
        _: &'a [u8],
        _: u64,
        _: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>> {
        self.answer()
    }

    fn delete<'a>(&'a self, _: &'a Scope, _: &'a str, _: u64) -> BoxFuture<'a, Result<bool, StateError>> {
        self.answer()
    }
}

fn runtime(store: Option<Broken>) -> Runtime {
    let state_store = store.map(|store| StateStore(Arc::new(store)));
    Runtime::new(RuntimeConfig { max_instances: 10, state_store, ..Default::default() }).unwrap()
}

const QUOTA: &str = "token-quota";

fn quota_config() -> serde_json::Value {
    json!({"rules": [{"name": "rpm", "counts": "requests", "limit": 10, "window": {"fixed": 60}}]})
}

async fn reserve_once(runtime: &Runtime, timeout: Duration) -> Result<(), PluginError> {
    let module = runtime.load(wasm(QUOTA), None).await.unwrap();
    let limits = Limits { timeout, max_memory_bytes: 64 << 20 };
    let scope = Grants { state: Some(Scope::new("team-a", "quota")), ..Grants::default() };
    let plugin = module.configure("team-a/quota", &quota_config(), limits, Isolation::PerRequest, scope).await.unwrap();
    let mut instance = plugin.instance().await?;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    instance.request_filter(&mut test_request(&[], body)).await.map(|_| ())
}

/// token-quota fails on a store that is down: the failure is the store's
/// (`StateUnavailable`: a 503 under `Closed`), not a trap of the plugin's.
#[tokio::test]
async fn a_plugin_failing_on_a_store_that_is_down_fails_as_the_store() {
    let result = reserve_once(&runtime(Some(Broken { hangs: false })), Duration::from_millis(500)).await;
    assert!(matches!(&result, Err(PluginError::StateUnavailable(why)) if why.contains("refused")), "{result:?}");
    // The same plugin on a working store is served.
    reserve_once(&runtime(None), Duration::from_millis(500)).await.unwrap();
}

/// A store that never answers holds the call no longer than the plugin's
/// deadline, and the failure is the store's.
#[tokio::test]
async fn a_store_that_never_answers_holds_a_call_only_until_the_deadline() {
    let started = Instant::now();
    let result = reserve_once(&runtime(Some(Broken { hangs: true })), Duration::from_millis(300)).await;
    let took = started.elapsed();
    assert!(matches!(&result, Err(PluginError::StateUnavailable(why)) if why.contains("deadline")), "{result:?}");
    assert!(took < Duration::from_secs(3), "the call took {took:?}");
}

async fn stateful(runtime: &Runtime, name: &str) -> crate::ConfiguredPlugin {
    let module = runtime.load(wasm("stateful"), None).await.unwrap();
    let limits = Limits { timeout: Duration::from_secs(1), max_memory_bytes: 64 << 20 };
    let config = json!({"limit": 100, "window": "fixed:3600"});
    let scope = Grants { state: Some(Scope::new("team-a", name)), ..Grants::default() };
    module.configure(&format!("team-a/{name}"), &config, limits, Isolation::PerRequest, scope).await.unwrap()
}

/// What `x-state-remaining` says after a request with `headers`.
async fn remaining(plugin: &crate::ConfiguredPlugin, headers: &[(&str, &str)]) -> (String, Vec<crate::Settlement>) {
    let mut instance = plugin.instance().await.unwrap();
    let mut request = test_request(headers, json!({"messages": []}).to_string());
    let action = instance.request_filter(&mut request).await.unwrap();
    assert!(matches!(action, crate::RequestAction::Continue), "{headers:?}");
    let left = request.response_headers.get("x-state-remaining").unwrap().to_str().unwrap().to_owned();
    (left, instance.take_settlements())
}

/// A reservation handed to the gateway in the request hook leaves the
/// plugin with it, and is committed by the response's status and usage at
/// the weights the plugin gave; without usage it stands, unless the
/// response failed.
#[tokio::test]
async fn a_reservation_left_to_the_gateway_counts_the_usage_at_its_weights() {
    let runtime = runtime(None);
    let plugin = stateful(&runtime, "settle").await;
    let (left, settlements) = remaining(&plugin, &[("x-state-reserve", "k=50"), ("x-state-settle", "0,1,2")]).await;
    assert_eq!((left.as_str(), settlements.len()), ("50", 1));
    // 10 prompt + 2 × 5 completion tokens instead of the 50 reserved.
    crate::settle_all(settlements, 200, Some((10, 5)));
    let (left, _) = remaining(&plugin, &[("x-state-reserve", "k=0")]).await;
    assert_eq!(left, "80");
    let (_, settlements) = remaining(&plugin, &[("x-state-reserve", "k=30"), ("x-state-settle", "1,1,1")]).await;
    crate::settle_all(settlements, 200, None);
    let (_, settlements) = remaining(&plugin, &[("x-state-reserve", "k=30"), ("x-state-settle", "1,1,1")]).await;
    crate::settle_all(settlements, 503, None);
    // The first stood (30); the failed one counts its request weight (1).
    let (left, _) = remaining(&plugin, &[("x-state-reserve", "k=0")]).await;
    assert_eq!(left, "49");
}

/// More weights than checks are refused, and nothing is left to settle.
#[tokio::test]
async fn settling_with_more_weights_than_checks_is_refused() {
    let runtime = runtime(None);
    let plugin = stateful(&runtime, "settle-twice").await;
    let mut instance = plugin.instance().await.unwrap();
    let headers = [("x-state-reserve", "k=5"), ("x-state-settle", "0,1,0;0,0,1")];
    let mut request = test_request(&headers, json!({"messages": []}).to_string());
    let action = instance.request_filter(&mut request).await.unwrap();
    let crate::RequestAction::Respond(direct) = action else { panic!("a refusal") };
    let error = direct.headers.iter().find(|(name, _)| name == "x-state-error").map(|(_, v)| v.as_str());
    assert_eq!((direct.status, error), (503, Some("refused: 2 weights for a reservation of 1 checks")));
    assert!(instance.take_settlements().is_empty());
}
