//! A plugin's state calls against stores that fail: each ends within the
//! plugin's deadline, and a failure that follows is the store's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_core::Isolation;
use sluice_state::{BoxFuture, Check, Reserved, Scope, StateError, Store, Ticket};

use crate::{Limits, PluginError, Runtime, RuntimeConfig, StateStore, built_plugin as wasm, test_request};

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
    let scope = Some(Scope::new("team-a", "quota"));
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
