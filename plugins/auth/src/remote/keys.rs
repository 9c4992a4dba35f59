//! The identity provider's key set: fetched over outbound HTTP, cached in
//! shared state for every instance and replica, refreshed when it expires
//! or a token names a `kid` it lacks, and never fetched more than once per
//! `minRefreshIntervalSeconds` by the whole plugin.
//!
//! Where the set is kept, and what a request costs:
//!
//! - In shared state, under a key of its own per source (a changed URL
//!   starts afresh), with the time it was fetched, until when it is fresh
//!   (`Cache-Control: max-age`, bounded by `minCacheSeconds` and
//!   `maxCacheSeconds`), and until when it may still serve while fetching
//!   fails (`staleIfErrorSeconds` more). Every instance reads it from
//!   there: one `state.get` a request with `isolation: PerRequest`, whose
//!   instances start empty from the snapshot taken after `configure`.
//! - In the plugin value, the last set this instance saw. With `isolation:
//!   Reused`, a token whose `kid` the held set has is checked with no host
//!   call at all; only an unknown `kid` or an expired set reads the state.
//!   Nothing per client is kept: only the provider's public keys.
//!
//! Keys are decoded lazily, only those a token's `kid` selects, so a large
//! set costs little more per request than a small one.
//!
//! Refreshes take a turn first: `compare-and-set` of a lock entry that must
//! be absent, with `minRefreshIntervalSeconds` as its TTL. One atomic call
//! in the store every instance and replica shares, so at most one fetch per
//! interval happens, whether it succeeds or not; a flood of made-up `kid`s
//! costs the identity provider nothing more. A store that does not answer
//! gives no turn: nothing is fetched rather than something unbounded.

use std::cell::{OnceCell, RefCell};
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use sluice_plugin_sdk::metrics::{self, Metric};
use sluice_plugin_sdk::{HeaderList, LogLevel, host, outbound, state};

use super::config::RemoteConfig;
use crate::jwk::Key;

/// The most a JWKS or discovery document may be: a set is kept in shared
/// state, whose entries are at most 64 KiB.
const MAX_DOCUMENT_BYTES: usize = 64 * 1024;

/// The longest `maxCacheSeconds`, `staleIfErrorSeconds` and
/// `minRefreshIntervalSeconds` may be: 7 days.
const MAX_SECONDS: u64 = 7 * 86_400;

/// Counted per refresh the plugin wanted: `fetched`, `failed`, or `limited`
/// (not tried: another was too recent, or the store did not answer).
const REFRESHES: &str = "auth_jwks_refreshes";

enum Source {
    JwksUri(String),
    /// OIDC discovery: `url` is the issuer's
    /// `/.well-known/openid-configuration`.
    Discovery {
        issuer: String,
        url: String,
    },
}

pub struct RemoteKeys {
    source: Source,
    timeout_ms: u32,
    min_cache_ms: u64,
    max_cache_ms: u64,
    refresh_interval_ms: u64,
    stale_ms: u64,
    /// The set, in shared state.
    keys_key: String,
    /// Present while a refresh's turn lasts.
    lock_key: String,
    /// The JWKS URL discovery found.
    uri_key: String,
    /// The latest set this instance has seen.
    held: RefCell<Option<Rc<KeySet>>>,
}

/// What a token is checked with: a fresh set alone, or else what is held
/// of an expired one (if any) and the inline keys.
pub struct Selection {
    set: Option<Rc<KeySet>>,
    inline: bool,
}

impl Selection {
    fn fresh(set: Rc<KeySet>) -> Selection {
        Selection { set: Some(set), inline: false }
    }

    /// The set's keys for `kid` (every key, for a token without one).
    pub fn keys<'a>(&'a self, kid: Option<&'a str>) -> impl Iterator<Item = &'a Key> + 'a {
        self.set.iter().flat_map(move |set| set.matching(kid))
    }

    /// Whether no remote set could be had at all.
    pub fn is_none(&self) -> bool {
        self.set.is_none()
    }

    /// Whether the inline keys count too: no fresh remote set is held.
    pub fn with_inline(&self) -> bool {
        self.inline
    }
}

impl RemoteKeys {
    pub fn new(config: RemoteConfig) -> Result<RemoteKeys, String> {
        let source = match (config.jwks_uri, config.issuer) {
            (Some(uri), None) => {
                check_url(&uri).map_err(|e| format!("jwt.remote.jwksUri: {e}"))?;
                Source::JwksUri(uri)
            }
            (None, Some(issuer)) => {
                check_url(&issuer).map_err(|e| format!("jwt.remote.issuer: {e}"))?;
                if issuer.contains(['?', '#']) {
                    return Err("jwt.remote.issuer: an issuer URL has no query or fragment".into());
                }
                // OIDC Discovery §4: a trailing `/` is removed first.
                let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
                Source::Discovery { issuer, url }
            }
            (Some(_), Some(_)) => return Err("jwt.remote: give `jwksUri` or `issuer`, not both".into()),
            (None, None) => {
                return Err("jwt.remote: give `jwksUri`, or `issuer` to find it by OIDC discovery".into());
            }
        };
        if !(1..=60_000).contains(&config.timeout_ms) {
            return Err("jwt.remote.timeoutMs: must be from 1 to 60000".into());
        }
        let interval = config.min_refresh_interval_seconds;
        if interval == 0 {
            return Err("jwt.remote.minRefreshIntervalSeconds: must be at least 1".into());
        }
        if config.min_cache_seconds < interval {
            return Err("jwt.remote.minCacheSeconds: must be at least minRefreshIntervalSeconds, \
                        or a set could expire before it may be fetched again"
                .into());
        }
        if config.max_cache_seconds < config.min_cache_seconds {
            return Err("jwt.remote.maxCacheSeconds: must be at least minCacheSeconds".into());
        }
        for (name, seconds) in [
            ("maxCacheSeconds", config.max_cache_seconds),
            ("minRefreshIntervalSeconds", interval),
            ("staleIfErrorSeconds", config.stale_if_error_seconds),
        ] {
            if seconds > MAX_SECONDS {
                return Err(format!("jwt.remote.{name}: must be at most {MAX_SECONDS} (7 days)"));
            }
        }
        metrics::declare(&[Metric::counter(
            REFRESHES,
            "Refreshes of the identity provider's keys: fetched, failed, or limited (not tried)",
        )
        .labels(&["result"])
        .max_values(3)])?;
        let id: String = Sha256::digest(match &source {
            Source::JwksUri(uri) => format!("jwks {uri}"),
            Source::Discovery { issuer, .. } => format!("issuer {issuer}"),
        })[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(RemoteKeys {
            source,
            timeout_ms: config.timeout_ms,
            min_cache_ms: config.min_cache_seconds * 1000,
            max_cache_ms: config.max_cache_seconds * 1000,
            refresh_interval_ms: interval * 1000,
            stale_ms: config.stale_if_error_seconds * 1000,
            keys_key: format!("jwks:{id}"),
            lock_key: format!("jwks-refresh:{id}"),
            uri_key: format!("jwks-uri:{id}"),
            held: RefCell::new(None),
        })
    }

    /// The keys to check a token naming `kid` with: the held set if fresh
    /// and it has the `kid`; else the shared one if so; else a refresh, if
    /// it is the plugin's turn. Failing all that, a fresh set that lacks
    /// the `kid` (the token fails), or what is still usable of an expired
    /// one with the inline keys.
    pub fn select(&self, kid: Option<&str>) -> Selection {
        let now = host::now_unix_ms();
        let fits = |set: &KeySet| set.is_fresh(now) && set.has(kid);
        let mut held = self.held.borrow().clone();
        if let Some(set) = held.as_ref().filter(|set| fits(set)) {
            return Selection::fresh(set.clone());
        }
        // Another instance, or replica, may have fetched a newer set.
        if let Some(shared) = self.load()
            && held.as_ref().is_none_or(|held| shared.fetched_ms > held.fetched_ms)
        {
            held = Some(self.remember(shared));
        }
        if let Some(set) = held.as_ref().filter(|set| fits(set)) {
            return Selection::fresh(set.clone());
        }
        if let Some(set) = self.refresh(now) {
            return Selection::fresh(set);
        }
        match held {
            Some(set) if set.is_fresh(now) => Selection::fresh(set),
            Some(set) if now < set.stale_until_ms => Selection { set: Some(set), inline: true },
            _ => Selection { set: None, inline: true },
        }
    }

    /// The set in shared state, if there is one it can read.
    fn load(&self) -> Option<KeySet> {
        match state::get(&self.keys_key) {
            Ok(stored) => stored.and_then(|bytes| KeySet::decode(&bytes)),
            Err(error) => {
                host::log(
                    LogLevel::Debug,
                    "cannot read the JWKS from shared state",
                    &[("error", &state::describe(&error))],
                );
                None
            }
        }
    }

    fn remember(&self, set: KeySet) -> Rc<KeySet> {
        let set = Rc::new(set);
        *self.held.borrow_mut() = Some(set.clone());
        set
    }

    /// Fetches the set if it is the plugin's turn, and shares it.
    fn refresh(&self, now: u64) -> Option<Rc<KeySet>> {
        let turn = state::compare_and_set(&self.lock_key, None, now.to_string().as_bytes(), self.refresh_interval_ms);
        match turn {
            Ok(true) => {}
            Ok(false) => {
                metrics::add(REFRESHES, &["limited"], 1);
                return None;
            }
            Err(error) => {
                metrics::add(REFRESHES, &["limited"], 1);
                host::log(
                    LogLevel::Debug,
                    "no JWKS refresh: shared state did not answer",
                    &[("error", &state::describe(&error))],
                );
                return None;
            }
        }
        match self.fetch(now) {
            Ok(set) => {
                metrics::add(REFRESHES, &["fetched"], 1);
                let seconds = ((set.fresh_until_ms - now) / 1000).to_string();
                host::log(
                    LogLevel::Info,
                    "fetched the identity provider's keys",
                    &[("keys", &set.keys.len().to_string()), ("fresh_seconds", &seconds)],
                );
                if let Err(error) = state::set(&self.keys_key, &set.encode(), set.stale_until_ms - now) {
                    host::log(
                        LogLevel::Warn,
                        "cannot share the fetched JWKS in shared state",
                        &[("error", &state::describe(&error))],
                    );
                }
                Some(self.remember(set))
            }
            Err(why) => {
                metrics::add(REFRESHES, &["failed"], 1);
                host::log(LogLevel::Warn, "cannot fetch the identity provider's keys", &[("error", &why)]);
                None
            }
        }
    }

    fn fetch(&self, now: u64) -> Result<KeySet, String> {
        let (uri, discovered) = match &self.source {
            Source::JwksUri(uri) => (uri.clone(), false),
            Source::Discovery { issuer, url } => (self.discover(issuer, url)?, true),
        };
        let response = self.get(&uri).map_err(|e| format!("the JWKS: {e}"))?;
        if !(200..300).contains(&response.status) {
            if discovered && matches!(response.status, 404 | 410) {
                // The URL may have moved: discover it again next time.
                let _ = state::delete(&self.uri_key);
            }
            return Err(format!("the JWKS: HTTP status {}", response.status));
        }
        #[derive(Deserialize)]
        struct Jwks {
            keys: Vec<Value>,
        }
        let jwks: Jwks = response.json().map_err(|_| "the JWKS is not a JSON object with `keys`".to_string())?;
        let offered = jwks.keys.len();
        let keys: Vec<Value> = jwks.keys.into_iter().filter(usable).collect();
        if keys.is_empty() {
            return Err(format!("the JWKS has no usable signature key (of {offered})"));
        }
        if keys.len() < offered {
            host::log(
                LogLevel::Debug,
                "JWKS keys skipped: secret, encryption or unsupported keys",
                &[("skipped", &(offered - keys.len()).to_string())],
            );
        }
        let fresh_until = now + self.lifetime_ms(&response.headers);
        Ok(KeySet::new(now, fresh_until, fresh_until + self.stale_ms, keys))
    }

    /// The JWKS URL the issuer's discovery document names: from shared
    /// state while it is fresh, else fetched.
    fn discover(&self, issuer: &str, url: &str) -> Result<String, String> {
        if let Ok(Some(uri)) = state::get(&self.uri_key)
            && let Ok(uri) = String::from_utf8(uri)
        {
            return Ok(uri);
        }
        let response = self.get(url).map_err(|e| format!("OIDC discovery: {e}"))?;
        if !(200..300).contains(&response.status) {
            return Err(format!("OIDC discovery: HTTP status {}", response.status));
        }
        #[derive(Deserialize)]
        struct Discovery {
            issuer: String,
            jwks_uri: String,
        }
        let document: Discovery = response
            .json()
            .map_err(|_| "OIDC discovery: the document has no `issuer` and `jwks_uri` strings".to_string())?;
        // OIDC Discovery §4.3: it must name the issuer it was fetched for.
        if document.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err("OIDC discovery: the document names another issuer".into());
        }
        check_url(&document.jwks_uri).map_err(|e| format!("OIDC discovery: jwks_uri: {e}"))?;
        let ttl = self.lifetime_ms(&response.headers);
        if let Err(error) = state::set(&self.uri_key, document.jwks_uri.as_bytes(), ttl) {
            host::log(LogLevel::Debug, "cannot keep the discovered JWKS URL", &[("error", &state::describe(&error))]);
        }
        Ok(document.jwks_uri)
    }

    fn get(&self, url: &str) -> Result<outbound::Response, outbound::Error> {
        let request = outbound::Request::get(url)
            .header("accept", "application/json")
            .timeout_ms(self.timeout_ms)
            .max_response_bytes(MAX_DOCUMENT_BYTES);
        outbound::send(&request)
    }

    /// How long a response may be used: its `max-age`, within the bounds.
    fn lifetime_ms(&self, headers: &[(String, String)]) -> u64 {
        max_age(headers).unwrap_or(0).saturating_mul(1000).clamp(self.min_cache_ms, self.max_cache_ms)
    }
}

/// Seconds a response stays fresh by `Cache-Control`: `s-maxage` (this is
/// a shared cache) or `max-age`, less its `Age`; `no-store` and `no-cache`
/// make it 0. `None` without any of them.
pub(crate) fn max_age(headers: &[(String, String)]) -> Option<u64> {
    let (mut max_age, mut shared_max_age, mut uncached) = (None, None, false);
    for value in headers.get_all_headers("cache-control") {
        for directive in value.split(',') {
            let (name, argument) = directive.split_once('=').unwrap_or((directive, ""));
            let seconds = || argument.trim().trim_matches('"').parse::<u64>().ok();
            match name.trim().to_ascii_lowercase().as_str() {
                "max-age" => max_age = seconds().or(Some(0)),
                "s-maxage" => shared_max_age = seconds().or(Some(0)),
                "no-store" | "no-cache" => uncached = true,
                _ => {}
            }
        }
    }
    if uncached {
        return Some(0);
    }
    let age = headers.get_header("age").and_then(|age| age.trim().parse::<u64>().ok()).unwrap_or(0);
    shared_max_age.or(max_age).map(|seconds| seconds.saturating_sub(age))
}

/// Whether a JWKS key can check signatures here. A published JWKS holds no
/// secrets: an `oct` key in one could be used by anyone who read it, so it
/// is never taken.
fn usable(jwk: &Value) -> bool {
    jwk.get("kty").and_then(Value::as_str) != Some("oct") && Key::from_jwk(jwk.clone()).is_ok()
}

/// What a URL must be to fetch from. Its destination must also be granted
/// by `spec.egress`, which the gateway checks on each call.
fn check_url(url: &str) -> Result<(), &'static str> {
    let lower = url.to_ascii_lowercase();
    let rest = lower.strip_prefix("https://").or_else(|| lower.strip_prefix("http://")).ok_or("not an http(s) URL")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() {
        return Err("the URL has no host");
    }
    if authority.contains('@') {
        return Err("credentials in the URL are not supported");
    }
    if url.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("the URL has spaces or control characters");
    }
    Ok(())
}

/// A fetched key set.
pub struct KeySet {
    fetched_ms: u64,
    fresh_until_ms: u64,
    /// When it may no longer serve, even while fetching fails; shared state
    /// drops it then too.
    stale_until_ms: u64,
    keys: Vec<RemoteKey>,
}

struct RemoteKey {
    kid: Option<String>,
    jwk: Value,
    /// Decoded when a token first selects it.
    key: OnceCell<Option<Key>>,
}

/// A set as shared state keeps it.
#[derive(Serialize, Deserialize)]
struct Stored {
    fetched: u64,
    fresh: u64,
    stale: u64,
    keys: Vec<Value>,
}

impl KeySet {
    fn new(fetched_ms: u64, fresh_until_ms: u64, stale_until_ms: u64, keys: Vec<Value>) -> KeySet {
        let keys = keys
            .into_iter()
            .map(|jwk| RemoteKey {
                kid: jwk.get("kid").and_then(Value::as_str).map(str::to_string),
                jwk,
                key: OnceCell::new(),
            })
            .collect();
        KeySet { fetched_ms, fresh_until_ms, stale_until_ms, keys }
    }

    fn is_fresh(&self, now: u64) -> bool {
        now < self.fresh_until_ms
    }

    /// Whether a key has `kid` (any key, for a token without one).
    fn has(&self, kid: Option<&str>) -> bool {
        self.keys.iter().any(|key| kid.is_none() || key.kid.as_deref() == kid)
    }

    fn matching<'a>(&'a self, kid: Option<&'a str>) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys
            .iter()
            .filter(move |key| kid.is_none() || key.kid.as_deref() == kid)
            .filter_map(|key| key.key.get_or_init(|| Key::from_jwk(key.jwk.clone()).ok()).as_ref())
    }

    fn encode(&self) -> Vec<u8> {
        let stored = Stored {
            fetched: self.fetched_ms,
            fresh: self.fresh_until_ms,
            stale: self.stale_until_ms,
            keys: self.keys.iter().map(|key| key.jwk.clone()).collect(),
        };
        serde_json::to_vec(&stored).unwrap_or_default()
    }

    fn decode(bytes: &[u8]) -> Option<KeySet> {
        let stored: Stored = serde_json::from_slice(bytes).ok()?;
        Some(KeySet::new(stored.fetched, stored.fresh, stored.stale, stored.keys))
    }
}
