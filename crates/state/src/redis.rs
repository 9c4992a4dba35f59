//! The store shared by replicas: plugins' state in Redis, so that every
//! replica of the gateway counts against the same quotas and reads the same
//! cache.
//!
//! Keys are named by [`redis_key`]; each scope also keeps an index of its
//! keys (`sluice:{<namespace>/<plugin>}:idx`, a sorted set of its keys by
//! when they stop counting, and `…:size`, a hash of the bytes each counts)
//! that the plugin's caps are checked against. The hash tag puts all of a
//! scope's keys, its index too, in one Cluster slot.
//!
//! Every call is one round trip: a Lua script (`redis/*.lua`, run by its
//! hash and sent whole only when the server does not have it) that touches
//! one scope's keys and runs atomically, as the in-process store's calls do
//! under a lock. The scripts read no clock: the caller's `now` decides
//! which bucket counts and which entry has expired, as in [`MemoryStore`];
//! Redis expires the keys by its own clock too (a counter at the end of its
//! bucket's life, `PEXPIREAT`; an entry after its TTL, `PX`), so nothing
//! needs sweeping, and the scripts drop dead members of the index as they
//! go.
//!
//! The semantics are [`MemoryStore`]'s, caps included, with these
//! differences:
//! - Counts, limits and amounts are exact up to 2^53 - 1 (Lua's numbers are
//!   doubles); larger ones count as 2^53 - 1.
//! - The store-wide totals and namespace shares ([`Limits::max_bytes_total`],
//!   [`Limits::max_keys_total`], [`Limits::namespace_percent`]) bound the
//!   in-process store's memory and are not applied: they would take keys of
//!   every scope, across slots. Redis's own `maxmemory` bounds the whole;
//!   the per-plugin caps bound each tenant.
//! - A call that timed out may still have been done: a reserve so lost
//!   counts until its bucket ends, as an unsettled ticket does.
//!
//! A Redis that is down or slow fails calls with [`StateError::Unavailable`]
//! or [`StateError::Timeout`] within the response timeout, never longer;
//! the connection is remade with backoff (and one Redis refused, a wrong
//! password say, made anew at most every second), and calls work again once
//! Redis answers, the store as it was. The connection is to one server (or
//! a proxy in front of a cluster); `rediss://` is TLS through rustls, with
//! the webpki roots or the CA given ([`RedisTls`]), and a client
//! certificate when Redis asks for one (`tls-auth-clients`). Credentials
//! never show in errors, logs or Debug.
//!
//! [`MemoryStore`]: crate::MemoryStore

use std::fmt;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Client, ClientTlsConfig, ConnectionAddr, FromRedisValue, IntoConnectionInfo, RedisError, Script, ScriptInvocation,
    TlsCertificates,
};

use crate::keys::{KeyKind, redis_key};
use crate::window::{Buckets, MAX_UNIX_MS};
use crate::{BoxFuture, Charge, Check, Limits, Reserved, Scope, Standing, StateError, Store, Ticket};

/// The largest count, limit, amount or time the scripts take: Lua's
/// numbers are doubles, exact to 2^53.
const MAX_EXACT: u64 = (1 << 53) - 1;

/// What a counter's value counts against a plugin's bytes, beside its key,
/// as the in-process store counts it.
const COUNTER_VALUE_BYTES: usize = 8;

/// Attempts to remake a lost connection before the calls waiting on it
/// fail; the next call starts again. Few, so that a Redis that is down
/// fails calls fast rather than at the response timeout.
const RECONNECT_RETRIES: usize = 2;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);

/// The least time between two connections made anew after a failure the
/// connection does not recover from by itself ([`RedisStore::remake`]).
const REMAKE_EVERY: Duration = Duration::from_secs(1);

/// Where the shared store is and how long to wait for it.
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://host:port[/db]`, or `rediss://` for TLS. Credentials are
    /// better given below than in the URL.
    pub url: String,
    /// An ACL user (`AUTH username password`); none for `default`.
    pub username: Option<String>,
    pub password: Option<String>,
    /// How long one attempt to connect may take.
    pub connect_timeout: Duration,
    /// How long a call may take, from the caller's side: past it the call
    /// is [`StateError::Timeout`], whatever the connection is doing.
    pub response_timeout: Duration,
    pub limits: Limits,
    /// For `rediss://`: whom to trust and who the gateway is.
    pub tls: RedisTls,
}

/// TLS to Redis beyond the defaults (the webpki roots, no client
/// certificate), in PEM.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// The CA that signed Redis's certificate (an in-cluster Redis's own),
    /// trusted instead of the webpki roots.
    pub ca_pem: Option<Vec<u8>>,
    /// A client certificate and its key, for a Redis that asks for one
    /// (`tls-auth-clients yes`, its default).
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
}

impl RedisTls {
    fn is_default(&self) -> bool {
        self.ca_pem.is_none() && self.client_cert_pem.is_none() && self.client_key_pem.is_none()
    }
}

impl RedisConfig {
    /// The store at `url`, without credentials, with the default caps: 2 s
    /// to connect, 500 ms a call.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            username: None,
            password: None,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_millis(500),
            limits: Limits::default(),
            tls: RedisTls::default(),
        }
    }
}

/// By hand: credentials are never shown.
impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(&self.url))
            .field("username", &self.username.as_ref().map(|_| Redacted))
            .field("password", &self.password.as_ref().map(|_| Redacted))
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("limits", &self.limits)
            .field("tls_ca", &self.tls.ca_pem.is_some())
            .field("tls_client_cert", &self.tls.client_cert_pem.is_some())
            .finish()
    }
}

struct Redacted;

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Plugins' shared state in Redis: for a gateway of several replicas.
pub struct RedisStore {
    /// Cloned for each call (it is shared: an `Arc`).
    connection: RwLock<ConnectionManager>,
    /// To make the connection anew ([`RedisStore::remake`]), and when it
    /// last was.
    client: Client,
    manager: ConnectionManagerConfig,
    remade: Mutex<Instant>,
    limits: Limits,
    response_timeout: Duration,
    scripts: Scripts,
    /// The URL without its credentials, for errors and Debug.
    server: String,
    /// What no error may show: the credentials, as given and as decoded.
    secrets: Vec<String>,
}

struct Scripts {
    reserve: Script,
    commit: Script,
    get: Script,
    set: Script,
    delete: Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            reserve: Script::new(concat!(include_str!("redis/common.lua"), include_str!("redis/reserve.lua"))),
            commit: Script::new(include_str!("redis/commit.lua")),
            get: Script::new(include_str!("redis/get.lua")),
            set: Script::new(concat!(include_str!("redis/common.lua"), include_str!("redis/set.lua"))),
            delete: Script::new(concat!(include_str!("redis/common.lua"), include_str!("redis/delete.lua"))),
        }
    }
}

/// By hand: the connection's own Debug shows the user name.
impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("server", &self.server)
            .field("response_timeout", &self.response_timeout)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// What a set does beside setting.
#[derive(Clone, Copy)]
enum Mode<'a> {
    Set,
    /// Only over `expected` (`None`: no live entry).
    CompareAndSet(Option<&'a [u8]>),
}

impl RedisStore {
    /// A store on the Redis at `config.url`, connected if Redis answers
    /// within the connect and response timeouts. A Redis that does not
    /// (down, or not yet up) is not an error, only logged: the store's calls
    /// fail as unavailable until Redis answers. Only a URL that cannot be
    /// used is an error.
    pub async fn connect(config: RedisConfig) -> Result<RedisStore, StateError> {
        let server = redact_url(&config.url);
        let mut secrets: Vec<String> = url_credentials(&config.url);
        secrets.extend(config.username.iter().chain(&config.password).cloned());
        let invalid = |error: RedisError, secrets: &[String]| {
            StateError::Unavailable(format!("invalid Redis URL {server}: {}", scrub(&error.to_string(), secrets)))
        };
        let info = config.url.as_str().into_connection_info().map_err(|error| invalid(error, &secrets))?;
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &config.username {
            settings = settings.set_username(username);
        }
        if let Some(password) = &config.password {
            settings = settings.set_password(password);
        }
        // The URL's credentials as the server gets them (percent-decoded).
        secrets.extend(settings.username().into_iter().chain(settings.password()).map(str::to_owned));
        secrets.retain(|secret| !secret.is_empty());
        let tls = matches!(info.addr(), ConnectionAddr::TcpTls { .. });
        if tls {
            // redis-rs asks rustls for the process's provider: ring, as the
            // rest of the workspace. An already installed one is fine.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let info = info.set_redis_settings(settings);
        let client = if config.tls.is_default() {
            Client::open(info).map_err(|error| invalid(error, &secrets))?
        } else {
            if !tls {
                return Err(StateError::Unavailable(format!(
                    "a CA or client certificate for Redis needs a rediss:// URL, not {server}"
                )));
            }
            let client_tls = match (config.tls.client_cert_pem, config.tls.client_key_pem) {
                (Some(client_cert), Some(client_key)) => Some(ClientTlsConfig { client_cert, client_key }),
                (None, None) => None,
                _ => {
                    return Err(StateError::Unavailable(
                        "a client certificate for Redis needs its key, and a key its certificate".into(),
                    ));
                }
            };
            Client::build_with_tls(info, TlsCertificates { client_tls, root_cert: config.tls.ca_pem }).map_err(
                |error| {
                    StateError::Unavailable(format!(
                        "TLS to Redis at {server}: {}",
                        scrub(&error.to_string(), &secrets)
                    ))
                },
            )?
        };
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(RECONNECT_MAX_DELAY);
        // Lazy: connects on first use, so a Redis that is down fails calls,
        // not the start.
        let connection = ConnectionManager::new_lazy_with_config(client.clone(), manager.clone())
            .map_err(|error| invalid(error, &secrets))?;
        let store = RedisStore {
            connection: RwLock::new(connection),
            client,
            manager,
            remade: Mutex::new(Instant::now()),
            limits: config.limits,
            response_timeout: config.response_timeout,
            scripts: Scripts::new(),
            server,
            secrets,
        };
        // Connects now, so that the first call finds the connection made.
        let ping = redis::cmd("PING");
        let mut connection = store.connection.read().clone();
        let within = config.connect_timeout.saturating_add(config.response_timeout);
        let answer = match tokio::time::timeout(within, ping.query_async::<()>(&mut connection)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(store.failed(&error)),
            Err(_) => Err(StateError::Timeout),
        };
        if let Err(error) = answer {
            tracing::warn!(server = %store.server, %error, "Redis does not answer yet: state calls fail until it does");
        }
        Ok(store)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Runs a script, within the response timeout.
    async fn run<T: FromRedisValue>(&self, invocation: &ScriptInvocation<'_>) -> Result<T, StateError> {
        let mut connection = self.connection.read().clone();
        match tokio::time::timeout(self.response_timeout, invocation.invoke_async(&mut connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.failed(&error)),
            Err(_) => Err(StateError::Timeout),
        }
    }

    fn failed(&self, error: &RedisError) -> StateError {
        if error.is_timeout() {
            return StateError::Timeout;
        }
        // The connection manager makes a connection again after an I/O
        // error only: one refused otherwise (a wrong password, say) would
        // fail every call for good, even once Redis would take it.
        if !error.is_io_error() && error.is_unrecoverable_error() {
            self.remake();
        }
        StateError::Unavailable(format!("Redis at {}: {}", self.server, scrub(&error.to_string(), &self.secrets)))
    }

    /// Replaces the connection with one made anew (on the next call), at
    /// most every [`REMAKE_EVERY`].
    fn remake(&self) {
        let mut remade = self.remade.lock();
        if remade.elapsed() < REMAKE_EVERY {
            return;
        }
        *remade = Instant::now();
        // Made as at the start, so this fails only as that did not.
        if let Ok(connection) = ConnectionManager::new_lazy_with_config(self.client.clone(), self.manager.clone()) {
            *self.connection.write() = connection;
        }
    }

    fn unexpected(&self, reply: &[i64]) -> StateError {
        StateError::Unavailable(format!("Redis at {}: unexpected reply {reply:?}", self.server))
    }

    /// The scope's caps, as the scripts take them.
    fn script_caps(&self, scope: &Scope) -> (u64, u64) {
        (exact_usize(self.limits.max_keys(scope)), exact_usize(self.limits.max_bytes(scope)))
    }

    /// A refusal by the caps, from a script's reply (`{2}`, `{3, bytes}`).
    fn caps_refusal(&self, scope: &Scope, reply: &[i64]) -> StateError {
        match reply {
            [2] => StateError::TooManyKeys { max: self.limits.max_keys(scope) },
            [3, needed] => StateError::PluginBytesExceeded {
                needed: usize::try_from(*needed).unwrap_or(usize::MAX),
                max: self.limits.max_bytes(scope),
            },
            _ => self.unexpected(reply),
        }
    }

    async fn reserve_at(&self, scope: &Scope, checks: &[Check], now: u64) -> Result<Reserved, StateError> {
        self.limits.check_checks(checks)?;
        if checks.is_empty() {
            return Ok(Reserved::Granted { ticket: Ticket::new(Vec::new()), standings: Vec::new() });
        }
        let now = now.min(MAX_UNIX_MS);
        let buckets: Vec<Buckets> = checks.iter().map(|check| check.window.buckets(now)).collect();
        let (index, sizes) = index_keys(scope);
        let (max_keys, max_bytes) = self.script_caps(scope);
        let mut invocation = self.scripts.reserve.prepare_invoke();
        invocation.key(index).key(sizes).arg(now).arg(max_keys).arg(max_bytes);
        for (check, buckets) in checks.iter().zip(&buckets) {
            let counter = |bucket: u64| redis_key(scope, KeyKind::Counter { window: check.window, bucket }, &check.key);
            let current = counter(buckets.current.index);
            let previous = buckets.previous.map_or_else(|| current.clone(), |previous| counter(previous.index));
            invocation.key(current).key(previous);
            invocation
                .arg(exact(check.amount))
                .arg(exact(check.limit))
                .arg(buckets.previous_weight_ppm)
                .arg(exact(check.window.expires_unix_ms(&buckets.current)))
                .arg(exact_usize(counter_bytes(&check.key)));
        }
        let reply: Vec<i64> = self.run(&invocation).await?;
        let n = checks.len();
        let standings = |used: &[i64]| -> Vec<Standing> {
            checks
                .iter()
                .zip(&buckets)
                .zip(used)
                .map(|((check, buckets), used)| {
                    let used = u64::try_from(*used).unwrap_or(0);
                    Standing {
                        key: check.key.clone(),
                        limit: check.limit,
                        used,
                        remaining: check.limit.saturating_sub(used),
                        reset_unix_ms: buckets.current.end_ms,
                    }
                })
                .collect()
        };
        match reply.split_first() {
            Some((0, used)) if used.len() == n => {
                let charges = checks
                    .iter()
                    .zip(&buckets)
                    .map(|(check, buckets)| Charge {
                        key: check.key.clone(),
                        window: check.window,
                        bucket: buckets.current.index,
                        expires_unix_ms: check.window.expires_unix_ms(&buckets.current),
                        reserved: check.amount,
                    })
                    .collect();
                Ok(Reserved::Granted { ticket: Ticket::new(charges), standings: standings(used) })
            }
            Some((1, rest)) if rest.len() == 2 * n => {
                let (used, refused) = rest.split_at(n);
                let standings = standings(used);
                let refused = refused.iter().enumerate().filter(|(_, flag)| **flag == 1).map(|(index, _)| index);
                Ok(Reserved::Refused { tightest: tightest(refused, &standings), standings })
            }
            Some((2 | 3, _)) => Err(self.caps_refusal(scope, &reply)),
            _ => Err(self.unexpected(&reply)),
        }
    }

    async fn commit_at(&self, scope: &Scope, ticket: &Ticket, actual: &[u64]) -> Result<(), StateError> {
        if actual.len() > ticket.len() {
            return Err(StateError::TooManyAmounts { given: actual.len(), counters: ticket.len() });
        }
        let mut invocation = self.scripts.commit.prepare_invoke();
        let mut changes = 0;
        for (charge, actual) in ticket.charges().iter().zip(actual) {
            // Both within 2^53, so the difference is exact in i64 and Lua.
            let delta = exact(*actual).cast_signed() - exact(charge.reserved).cast_signed();
            if delta != 0 {
                let kind = KeyKind::Counter { window: charge.window, bucket: charge.bucket };
                invocation.key(redis_key(scope, kind, &charge.key)).arg(delta);
                changes += 1;
            }
        }
        // Every counter keeps what was reserved: nothing to send.
        if changes == 0 {
            return Ok(());
        }
        self.run::<i64>(&invocation).await.map(drop)
    }

    async fn get_at(&self, scope: &Scope, key: &str, now: u64) -> Result<Option<Vec<u8>>, StateError> {
        self.limits.check_key(key)?;
        let now = now.min(MAX_UNIX_MS);
        let (index, _) = index_keys(scope);
        let mut invocation = self.scripts.get.prepare_invoke();
        invocation.key(index).key(redis_key(scope, KeyKind::Entry, key)).arg(now);
        self.run(&invocation).await
    }

    /// Sets `key` unless `mode` finds another value; whether it did.
    async fn set_at(
        &self,
        scope: &Scope,
        key: &str,
        mode: Mode<'_>,
        value: &[u8],
        ttl_ms: u64,
        now: u64,
    ) -> Result<bool, StateError> {
        self.limits.check_key(key)?;
        self.limits.check_value(value)?;
        let now = now.min(MAX_UNIX_MS);
        let ttl_ms = self.limits.ttl_ms(ttl_ms);
        let expires_ms = exact(now.saturating_add(ttl_ms));
        // Redis takes no TTL of 0; the index says when the entry ends.
        let px = ttl_ms.clamp(1, MAX_EXACT);
        let (mode, expected): (&str, &[u8]) = match mode {
            Mode::Set => ("set", b""),
            Mode::CompareAndSet(None) => ("absent", b""),
            Mode::CompareAndSet(Some(expected)) => ("equal", expected),
        };
        let (index, sizes) = index_keys(scope);
        let (max_keys, max_bytes) = self.script_caps(scope);
        let mut invocation = self.scripts.set.prepare_invoke();
        invocation.key(index).key(sizes).key(redis_key(scope, KeyKind::Entry, key));
        invocation.arg(now).arg(max_keys).arg(max_bytes).arg(mode).arg(expected).arg(value);
        invocation.arg(px).arg(expires_ms).arg(exact_usize(entry_bytes(key, value)));
        let reply: Vec<i64> = self.run(&invocation).await?;
        match reply.as_slice() {
            [1] => Ok(true),
            [0] => Ok(false),
            _ => Err(self.caps_refusal(scope, &reply)),
        }
    }

    async fn delete_at(&self, scope: &Scope, key: &str, now: u64) -> Result<bool, StateError> {
        self.limits.check_key(key)?;
        let now = now.min(MAX_UNIX_MS);
        let (index, sizes) = index_keys(scope);
        let mut invocation = self.scripts.delete.prepare_invoke();
        invocation.key(index).key(sizes).key(redis_key(scope, KeyKind::Entry, key)).arg(now);
        let deleted: i64 = self.run(&invocation).await?;
        Ok(deleted == 1)
    }
}

impl Store for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    fn caps(&self, scope: &Scope) -> (usize, usize) {
        (self.limits.max_keys(scope), self.limits.max_bytes(scope))
    }

    fn reserve<'a>(
        &'a self,
        scope: &'a Scope,
        checks: &'a [Check],
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Reserved, StateError>> {
        Box::pin(self.reserve_at(scope, checks, now_unix_ms))
    }

    fn commit<'a>(
        &'a self,
        scope: &'a Scope,
        ticket: Ticket,
        actual: &'a [u64],
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { self.commit_at(scope, &ticket, actual).await })
    }

    fn get<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<u8>>, StateError>> {
        Box::pin(self.get_at(scope, key, now_unix_ms))
    }

    fn set<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        value: &'a [u8],
        ttl_ms: u64,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<(), StateError>> {
        Box::pin(async move { self.set_at(scope, key, Mode::Set, value, ttl_ms, now_unix_ms).await.map(drop) })
    }

    fn compare_and_set<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        expected: Option<&'a [u8]>,
        value: &'a [u8],
        ttl_ms: u64,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>> {
        Box::pin(self.set_at(scope, key, Mode::CompareAndSet(expected), value, ttl_ms, now_unix_ms))
    }

    fn delete<'a>(
        &'a self,
        scope: &'a Scope,
        key: &'a str,
        now_unix_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StateError>> {
        Box::pin(self.delete_at(scope, key, now_unix_ms))
    }
}

/// Of the refused checks, the one whose window resets last; the first of
/// them on a tie (as [`Reserved::Refused`] defines it).
fn tightest(refused: impl Iterator<Item = usize>, standings: &[Standing]) -> usize {
    let mut tightest: Option<(usize, u64)> = None;
    for index in refused {
        let reset = standings.get(index).map_or(0, |standing| standing.reset_unix_ms);
        if tightest.is_none_or(|(_, latest)| reset > latest) {
            tightest = Some((index, reset));
        }
    }
    tightest.map_or(0, |(index, _)| index)
}

/// The scope's index: its keys by when they stop counting, and the bytes
/// each counts (`redis/common.lua`). Under the scope's hash tag, and named
/// apart from its counters (`:c:`) and entries (`:e:`).
fn index_keys(scope: &Scope) -> (String, String) {
    // `sluice:{<namespace>/<plugin>}:e:` less its `e:`.
    let mut prefix = redis_key(scope, KeyKind::Entry, "");
    prefix.truncate(prefix.len().saturating_sub(2));
    (format!("{prefix}idx"), format!("{prefix}size"))
}

fn counter_bytes(key: &str) -> usize {
    key.len().saturating_add(COUNTER_VALUE_BYTES)
}

fn entry_bytes(key: &str, value: &[u8]) -> usize {
    key.len().saturating_add(value.len())
}

fn exact(n: u64) -> u64 {
    n.min(MAX_EXACT)
}

fn exact_usize(n: usize) -> u64 {
    exact(u64::try_from(n).unwrap_or(u64::MAX))
}

/// `url` with no credentials: its user and password, and its query (a
/// `unix://` URL's may hold them), replaced.
fn redact_url(url: &str) -> String {
    let (url, query) = match url.split_once('?') {
        Some((url, _)) => (url, "?<redacted>"),
        None => (url, ""),
    };
    let Some((scheme, rest)) = url.split_once("://") else { return format!("{url}{query}") };
    let authority_end = rest.find(['/', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://<redacted>@{host}{path}{query}"),
        None => format!("{scheme}://{authority}{path}{query}"),
    }
}

/// The user and password in `url`, as written, and its query's values (a
/// `unix://` URL's `pass`).
fn url_credentials(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    if let Some((_, query)) = url.split_once('?') {
        let query = query.split('#').next().unwrap_or("");
        secrets.extend(query.split('&').filter_map(|pair| pair.split_once('=')).map(|(_, value)| value.to_owned()));
    }
    let Some((_, rest)) = url.split_once("://") else { return secrets };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((credentials, _)) = authority.rsplit_once('@') {
        secrets.push(credentials.to_owned());
        if let Some((user, password)) = credentials.split_once(':') {
            secrets.extend([user.to_owned(), password.to_owned()]);
        }
    }
    secrets
}

/// `message` with every secret in it replaced.
fn scrub(message: &str, secrets: &[String]) -> String {
    let mut message = message.to_owned();
    // The longest first, so that one inside another goes whole.
    let mut secrets: Vec<&String> = secrets.iter().filter(|secret| !secret.is_empty()).collect();
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    for secret in secrets {
        message = message.replace(secret.as_str(), "<redacted>");
    }
    message
}

#[cfg(test)]
mod tests;
