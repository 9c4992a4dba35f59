//! Against a real `redis-server`, one of each test's own: the in-process
//! store's tests (memory/tests.rs) again, the two stores side by side on
//! the same calls, replicas at once, and Redis going away.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;

use super::*;
use crate::testing::{check, fixed, granted, refused, scope, used};
use crate::{MemoryStore, Window};

/// 2096-03-15T00:00:00Z: the start of a UTC day, as memory/tests.rs's T0,
/// but in the future: counters expire at their buckets' ends by Redis's
/// clock (`PEXPIREAT`), so tests on made-up times keep them by taking
/// times to come.
const T0: u64 = 3_982_608_000_000;

/// How long a test waits for a server to answer, or to answer again.
const PATIENCE: Duration = Duration::from_secs(10);

// --- A redis-server of the test's own ------------------------------------

/// A `redis-server` on a free loopback port, in a scratch directory, with
/// nothing saved; killed when dropped.
struct Server {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::with_args(&[])
    }

    fn with_args(args: &[&str]) -> Server {
        Server::on(free_port(), args)
    }

    fn on(port: u16, args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server { child: None, port, args: args.iter().map(|&arg| arg.to_owned()).collect(), dir };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let dir = self.dir.path();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir".as_ref(), dir.as_os_str(), "--logfile".as_ref(), dir.join("redis.log").as_os_str()])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => panic!(
                "redis-server is not on the PATH: install Debian's `redis-server` package \
                 (`cargo xtask test` installs it)"
            ),
            Err(error) => panic!("redis-server did not start: {error}"),
        };
        self.child = Some(child);
        self.wait_for_pong();
    }

    /// Waits until the server answers PING (to a client without a
    /// password, NOAUTH is an answer too).
    fn wait_for_pong(&self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                let mut answer = [0; 16];
                if stream.write_all(b"PING\r\n").is_ok()
                    && let Ok(read) = stream.read(&mut answer)
                    && (answer[..read].starts_with(b"+PONG") || answer[..read].starts_with(b"-NOAUTH"))
                {
                    return;
                }
            }
            let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
            assert!(Instant::now() < deadline, "redis-server on port {} did not answer; its log:\n{log}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A new server on the same port (nothing kept: nothing was saved).
    fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Sends the server a signal (`STOP`, `CONT`).
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let status = Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap();
        assert!(status.success());
    }

    /// A connection of the test's own, to look at what the store wrote.
    async fn raw(&self) -> MultiplexedConnection {
        redis::Client::open(self.url()).unwrap().get_multiplexed_async_connection().await.unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

// --- Helpers, as memory/tests.rs's -----------------------------------------

fn config(url: String, limits: Limits) -> RedisConfig {
    RedisConfig { limits, ..RedisConfig::new(url) }
}

async fn connect(server: &Server, limits: Limits) -> RedisStore {
    RedisStore::connect(config(server.url(), limits)).await.unwrap()
}

/// A server and a store on it, with `limits`.
async fn fixture(limits: Limits) -> (Server, RedisStore) {
    let server = Server::start();
    let store = connect(&server, limits).await;
    (server, store)
}

/// Reserves `amount` on `key` of [`scope`]: whether granted, and the
/// standing after (or as it stood when refused).
async fn reserve_one(
    store: &RedisStore,
    key: &str,
    window: Window,
    limit: u64,
    amount: u64,
    now: u64,
) -> (bool, Standing) {
    let checks = [check(key, window, limit, amount)];
    match store.reserve(&scope(), &checks, now).await.unwrap() {
        Reserved::Granted { mut standings, .. } => (true, standings.remove(0)),
        Reserved::Refused { mut standings, .. } => (false, standings.remove(0)),
    }
}

/// The count in one bucket of a counter, if Redis holds it.
async fn count(server: &Server, scope: &Scope, key: &str, window: Window, bucket: u64) -> Option<u64> {
    let key = redis_key(scope, KeyKind::Counter { window, bucket }, key);
    redis::cmd("GET").arg(key).query_async(&mut server.raw().await).await.unwrap()
}

/// The keys and bytes the scope's index holds.
async fn held(server: &Server, scope: &Scope) -> (u64, u64) {
    let (index, sizes) = index_keys(scope);
    let mut raw = server.raw().await;
    let keys: u64 = redis::cmd("ZCARD").arg(&index).query_async(&mut raw).await.unwrap();
    let bytes: Option<u64> = redis::cmd("HGET").arg(&sizes).arg("total").query_async(&mut raw).await.unwrap();
    (keys, bytes.unwrap_or(0))
}

async fn all_keys(server: &Server) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut server.raw().await).await.unwrap();
    keys.sort();
    keys
}

async fn exists(server: &Server, key: &str) -> bool {
    redis::cmd("EXISTS").arg(key).query_async::<i64>(&mut server.raw().await).await.unwrap() == 1
}

/// When Redis will expire `key` (Unix ms), if it has an expiry.
async fn expires_at(server: &Server, key: &str) -> Option<u64> {
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query_async(&mut server.raw().await).await.unwrap();
    u64::try_from(at).ok()
}

fn real_now() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// What Redis Cluster hashes: between the first `{` and the first `}`
/// after it.
fn hash_tag(key: &str) -> &str {
    let open = key.find('{').unwrap();
    let close = open + 1 + key[open + 1..].find('}').unwrap();
    &key[open + 1..close]
}

// --- The in-process store's tests, against Redis ---------------------------

#[tokio::test]
async fn scopes_never_see_each_others_state_and_each_keeps_to_one_slot() {
    let (server, store) = fixture(Limits::default()).await;
    // Pairs that would collide if the names were joined naively.
    let pairs = [
        (Scope::new("a", "b/c"), Scope::new("a/b", "c")),
        (Scope::new("ns", "p1"), Scope::new("ns", "p2")),
        (Scope::new("", "ab"), Scope::new("a", "b")),
        (Scope::new("x}", "{y"), Scope::new("x", "}{y")),
        (Scope::new("a:b", "c"), Scope::new("a", "b:c")),
    ];
    for (first, second) in &pairs {
        for key in ["k", "{k}", "}:{", "a/b:c"] {
            let checks = [check(key, fixed(60), 5, 3)];
            let (_, standings) = granted(store.reserve(first, &checks, T0).await);
            assert_eq!(used(&standings), [3]);
            let checks = [check(key, fixed(60), 5, 5)];
            let (_, standings) = granted(store.reserve(second, &checks, T0).await);
            assert_eq!(used(&standings), [5]);
            assert_eq!(count(&server, first, key, fixed(60), T0 / 60_000).await, Some(3));

            store.set(first, key, b"one", 0, T0).await.unwrap();
            assert_eq!(store.get(second, key, T0).await.unwrap(), None);
            assert!(!store.delete(second, key, T0).await.unwrap());
            store.set(second, key, b"two", 0, T0).await.unwrap();
            assert_eq!(store.get(first, key, T0).await.unwrap().as_deref(), Some(&b"one"[..]));
            assert!(store.delete(second, key, T0).await.unwrap());
            assert_eq!(store.get(first, key, T0).await.unwrap().as_deref(), Some(&b"one"[..]));
        }
    }
    // Every key the store wrote, the indexes too, is under the hash tag of
    // its scope: one slot a scope.
    let keys = all_keys(&server).await;
    let scopes: Vec<&Scope> = pairs.iter().flat_map(|(first, second)| [first, second]).collect();
    let tags: Vec<String> = scopes.iter().map(|scope| hash_tag(&index_keys(scope).0).to_owned()).collect();
    for key in &keys {
        assert!(key.starts_with("sluice:{"), "{key}");
        assert!(tags.iter().any(|tag| tag == hash_tag(key)), "{key} is under no scope's tag");
    }
    for (scope, tag) in scopes.iter().zip(&tags) {
        // Four counters, the index and its sizes; the first of a pair keeps
        // its four entries.
        let own = keys.iter().filter(|key| hash_tag(key) == tag).count();
        let first = pairs.iter().any(|(first, _)| std::ptr::eq(first, *scope));
        assert_eq!(own, if first { 10 } else { 6 }, "{tag}");
    }
}

#[tokio::test]
async fn reserves_are_granted_up_to_the_limit_exactly() {
    let (server, store) = fixture(Limits::default()).await;
    let end = T0 + 60_000;
    for n in 1..=5 {
        let (granted, standing) = reserve_one(&store, "k", fixed(60), 5, 1, T0 + n).await;
        assert!(granted, "reserve {n}");
        let expected = Standing { key: "k".into(), limit: 5, used: n, remaining: 5 - n, reset_unix_ms: end };
        assert_eq!(standing, expected);
    }
    let (tightest, standings) = refused(store.reserve(&scope(), &[check("k", fixed(60), 5, 1)], T0 + 10).await);
    assert_eq!(tightest, 0);
    assert_eq!(standings, [Standing { key: "k".into(), limit: 5, used: 5, remaining: 0, reset_unix_ms: end }]);
    assert_eq!(count(&server, &scope(), "k", fixed(60), T0 / 60_000).await, Some(5));
    // An amount of 0 still passes; an amount past the limit never does.
    assert!(reserve_one(&store, "k", fixed(60), 5, 0, T0 + 11).await.0);
    let (granted, standing) = reserve_one(&store, "fresh", fixed(60), 5, 6, T0).await;
    assert!(!granted);
    assert_eq!((standing.used, standing.remaining), (0, 5));
    assert_eq!(count(&server, &scope(), "fresh", fixed(60), T0 / 60_000).await, None);
    // A sum past what is counted is past any limit.
    assert!(!reserve_one(&store, "k", fixed(60), u64::MAX, u64::MAX, T0).await.0);
}

#[tokio::test]
async fn the_tightest_refusal_is_the_one_that_resets_last() {
    let (_server, store) = fixture(Limits::default()).await;
    let day_end = T0 + 86_400_000;
    let checks = [check("roomy", fixed(1), 100, 1), check("u", fixed(60), 1, 1), check("u", fixed(86_400), 1, 1)];
    granted(store.reserve(&scope(), &checks, T0).await);
    let (tightest, standings) = refused(store.reserve(&scope(), &checks, T0 + 1).await);
    assert_eq!(tightest, 2);
    assert_eq!(used(&standings), [1, 1, 1]);
    let resets: Vec<u64> = standings.iter().map(|standing| standing.reset_unix_ms).collect();
    assert_eq!(resets, [T0 + 1000, T0 + 60_000, day_end]);
    let reversed = [check("u", fixed(86_400), 1, 1), check("u", fixed(60), 1, 1)];
    assert_eq!(refused(store.reserve(&scope(), &reversed, T0 + 1).await).0, 0);
    let minute_only = [check("v", fixed(86_400), 10, 1), check("v", fixed(60), 1, 1)];
    granted(store.reserve(&scope(), &minute_only, T0).await);
    assert_eq!(refused(store.reserve(&scope(), &minute_only, T0 + 1).await).0, 1);
    let tie = [check("w", fixed(60), 0, 1), check("x", fixed(60), 0, 1)];
    assert_eq!(refused(store.reserve(&scope(), &tie, T0).await).0, 0);
}

#[tokio::test]
async fn a_refused_reserve_adds_nothing_to_any_counter() {
    let (server, store) = fixture(Limits::default()).await;
    let checks = [check("a", fixed(60), 10, 3), check("b", fixed(60), 2, 3), check("c", Window::CalendarMonth, 9, 1)];
    let (tightest, standings) = refused(store.reserve(&scope(), &checks, T0).await);
    assert_eq!(tightest, 1);
    assert_eq!(used(&standings), [0, 0, 0]);
    for check in &checks {
        assert_eq!(count(&server, &scope(), &check.key, check.window, check.window.bucket(T0).index).await, None);
    }
    assert_eq!(held(&server, &scope()).await, (0, 0));
    assert_eq!(all_keys(&server).await, Vec::<String>::new());
    assert!(reserve_one(&store, "a", fixed(60), 10, 10, T0).await.0);
}

#[tokio::test]
async fn checks_on_one_counter_count_together() {
    let (server, store) = fixture(Limits::default()).await;
    let over = [check("k", fixed(60), 5, 3), check("k", fixed(60), 5, 3)];
    let (tightest, standings) = refused(store.reserve(&scope(), &over, T0).await);
    assert_eq!((tightest, used(&standings)), (1, vec![0, 0]));
    let within = [check("k", fixed(60), 5, 2), check("k", fixed(60), 5, 3)];
    let (ticket, standings) = granted(store.reserve(&scope(), &within, T0).await);
    assert_eq!(used(&standings), [5, 5]);
    assert_eq!(ticket.amounts().collect::<Vec<_>>(), [2, 3]);
    assert_eq!(held(&server, &scope()).await, (1, 1 + 8));
    store.commit(&scope(), ticket, &[0]).await.unwrap();
    assert_eq!(count(&server, &scope(), "k", fixed(60), T0 / 60_000).await, Some(3));
    // One key in two windows is two counters.
    let windows = [check("k", fixed(60), 5, 2), check("k", Window::Sliding { seconds: 60 }, 2, 2)];
    granted(store.reserve(&scope(), &windows, T0).await);
    assert_eq!(held(&server, &scope()).await, (2, 2 * (1 + 8)));
}

/// A request counter and a token counter, as a quota plugin keeps them.
fn request_and_tokens(tokens: u64) -> [Check; 2] {
    [check("requests", fixed(60), 10, 1), check("tokens", fixed(60), 1000, tokens)]
}

async fn counts(server: &Server) -> (Option<u64>, Option<u64>) {
    let bucket = T0 / 60_000;
    (
        count(server, &scope(), "requests", fixed(60), bucket).await,
        count(server, &scope(), "tokens", fixed(60), bucket).await,
    )
}

#[tokio::test]
async fn committing_less_gives_the_rest_back() {
    let (server, store) = fixture(Limits::default()).await;
    let (ticket, _) = granted(store.reserve(&scope(), &request_and_tokens(500), T0).await);
    assert_eq!(ticket.amounts().collect::<Vec<_>>(), [1, 500]);
    assert_eq!(ticket.charges()[1].bucket, T0 / 60_000);
    assert_eq!(ticket.charges()[1].expires_unix_ms, T0 + 60_000);
    store.commit(&scope(), ticket, &[1, 120]).await.unwrap();
    assert_eq!(counts(&server).await, (Some(1), Some(120)));
    let (_, standings) = granted(store.reserve(&scope(), &request_and_tokens(880), T0 + 1).await);
    assert_eq!(used(&standings), [2, 1000]);
}

#[tokio::test]
async fn committing_more_counts_the_extra_past_the_limit() {
    let (server, store) = fixture(Limits::default()).await;
    let (ticket, _) = granted(store.reserve(&scope(), &request_and_tokens(500), T0).await);
    store.commit(&scope(), ticket, &[1, 1500]).await.unwrap();
    assert_eq!(counts(&server).await, (Some(1), Some(1500)));
    let (tightest, standings) = refused(store.reserve(&scope(), &request_and_tokens(1), T0 + 1).await);
    assert_eq!(tightest, 1);
    assert_eq!((standings[1].used, standings[1].remaining), (1500, 0));
    // Past what Lua counts exactly, the counter stays at its most.
    let (ticket, _) = granted(store.reserve(&scope(), &[check("big", fixed(60), 10, 1)], T0).await);
    store.commit(&scope(), ticket, &[u64::MAX]).await.unwrap();
    let (ticket, _) = granted(store.reserve(&scope(), &[check("big", fixed(60), u64::MAX, 0)], T0).await);
    store.commit(&scope(), ticket, &[u64::MAX]).await.unwrap();
    assert_eq!(count(&server, &scope(), "big", fixed(60), T0 / 60_000).await, Some(MAX_EXACT));
}

/// Amounts and limits past 2^53 - 1 count as 2^53 - 1 (module docs).
#[tokio::test]
async fn numbers_past_what_lua_counts_exactly_are_capped() {
    let (server, store) = fixture(Limits::default()).await;
    let (ticket, standings) = granted(store.reserve(&scope(), &[check("k", fixed(60), u64::MAX, u64::MAX)], T0).await);
    assert_eq!(standings[0].used, MAX_EXACT);
    assert_eq!(standings[0].remaining, u64::MAX - MAX_EXACT);
    assert_eq!(ticket.amounts().collect::<Vec<_>>(), [u64::MAX]);
    assert!(!reserve_one(&store, "k", fixed(60), u64::MAX, 1, T0).await.0);
    // Given back whole: the reservation and the actual are capped alike.
    store.commit(&scope(), ticket, &[0]).await.unwrap();
    assert_eq!(count(&server, &scope(), "k", fixed(60), T0 / 60_000).await, Some(0));
    // Exact just below the cap.
    let (_, standings) = granted(store.reserve(&scope(), &[check("k", fixed(60), MAX_EXACT, MAX_EXACT - 1)], T0).await);
    assert_eq!(standings[0].used, MAX_EXACT - 1);
    assert!(reserve_one(&store, "k", fixed(60), MAX_EXACT, 1, T0).await.0);
    assert!(!reserve_one(&store, "k", fixed(60), MAX_EXACT, 1, T0).await.0);
    // A sliding window's weighted previous bucket, exact at that size:
    // ceil((2^53 - 1) / 2) at half weight.
    let sliding = Window::Sliding { seconds: 10 };
    assert!(reserve_one(&store, "s", sliding, MAX_EXACT, MAX_EXACT, T0).await.0);
    let (_, standing) = reserve_one(&store, "s", sliding, MAX_EXACT, 0, T0 + 15_000).await;
    assert_eq!(standing.used, MAX_EXACT.div_ceil(2));
    assert_eq!(standing.used, sliding.buckets(T0 + 15_000).estimate(0, MAX_EXACT));
}

#[tokio::test]
async fn releasing_gives_everything_back() {
    let (server, store) = fixture(Limits::default()).await;
    let (ticket, _) = granted(store.reserve(&scope(), &request_and_tokens(1000), T0).await);
    assert!(!reserve_one(&store, "tokens", fixed(60), 1000, 1, T0).await.0);
    store.release(&scope(), ticket).await.unwrap();
    assert_eq!(counts(&server).await, (Some(0), Some(0)));
    assert!(reserve_one(&store, "tokens", fixed(60), 1000, 1000, T0).await.0);
}

#[tokio::test]
async fn counters_without_an_actual_keep_their_reservation() {
    let (server, store) = fixture(Limits::default()).await;
    let (ticket, _) = granted(store.reserve(&scope(), &request_and_tokens(500), T0).await);
    store.commit(&scope(), ticket, &[0]).await.unwrap();
    assert_eq!(counts(&server).await, (Some(0), Some(500)));
    let (ticket, _) = granted(store.reserve(&scope(), &request_and_tokens(100), T0).await);
    store.commit(&scope(), ticket, &[]).await.unwrap();
    assert_eq!(counts(&server).await, (Some(1), Some(600)));
    let (ticket, _) = granted(store.reserve(&scope(), &request_and_tokens(100), T0).await);
    let result = store.commit(&scope(), ticket, &[0, 0, 0]).await;
    assert_eq!(result, Err(StateError::TooManyAmounts { given: 3, counters: 2 }));
    assert_eq!(counts(&server).await, (Some(2), Some(700)));
}

#[tokio::test]
async fn a_commit_after_the_window_moved_on_adjusts_the_bucket_it_was_charged_to() {
    let (server, store) = fixture(Limits::default()).await;
    let (old, new) = (T0 / 60_000, T0 / 60_000 + 1);
    let (ticket, _) = granted(store.reserve(&scope(), &[check("k", fixed(60), 100, 50)], T0 + 59_000).await);
    store.commit(&scope(), ticket, &[20]).await.unwrap();
    assert_eq!(count(&server, &scope(), "k", fixed(60), old).await, Some(20));
    assert_eq!(count(&server, &scope(), "k", fixed(60), new).await, None);

    let (ticket, _) = granted(store.reserve(&scope(), &[check("j", fixed(60), 100, 50)], T0 + 59_000).await);
    let (_, standing) = reserve_one(&store, "j", fixed(60), 100, 7, T0 + 61_000).await;
    assert_eq!(standing.used, 7);
    store.commit(&scope(), ticket, &[90]).await.unwrap();
    assert_eq!(count(&server, &scope(), "j", fixed(60), new).await, Some(7));
    assert_eq!(reserve_one(&store, "j", fixed(60), 100, 0, T0 + 62_000).await.1.used, 7);

    let sliding = Window::Sliding { seconds: 60 };
    let (ticket, _) = granted(store.reserve(&scope(), &[check("s", sliding, 100, 50)], T0).await);
    assert_eq!(reserve_one(&store, "s", sliding, 100, 0, T0 + 90_000).await.1.used, 25);
    store.commit(&scope(), ticket, &[10]).await.unwrap();
    assert_eq!(reserve_one(&store, "s", sliding, 100, 0, T0 + 90_000).await.1.used, 5);
    assert_eq!(count(&server, &scope(), "s", sliding, new).await, Some(0));
}

/// On real time: Redis itself drops a counter when its bucket ends, and a
/// late commit does not make it again.
#[tokio::test]
async fn a_commit_after_the_bucket_expired_changes_nothing() {
    let (server, store) = fixture(Limits::default()).await;
    // Early in a second: the bucket has most of it to live.
    tokio::time::sleep(Duration::from_millis(1000 - real_now() % 1000)).await;
    let now = real_now();
    let (ticket, _) = granted(store.reserve(&scope(), &[check("k", fixed(1), 10, 5)], now).await);
    let charge = ticket.charges()[0].clone();
    let key = redis_key(&scope(), KeyKind::Counter { window: fixed(1), bucket: charge.bucket }, "k");
    assert_eq!(expires_at(&server, &key).await, Some(charge.expires_unix_ms));
    tokio::time::sleep(Duration::from_millis(charge.expires_unix_ms.saturating_sub(real_now()) + 100)).await;
    assert!(!exists(&server, &key).await);
    store.commit(&scope(), ticket, &[9]).await.unwrap();
    assert!(!exists(&server, &key).await);
}

#[tokio::test]
async fn counters_never_go_below_zero() {
    let (server, store) = fixture(Limits::default()).await;
    let (ticket, _) = granted(store.reserve(&scope(), &[check("k", fixed(60), 100, 50)], T0).await);
    // The bucket ends and goes; a clock stepped back makes it again, with less.
    reserve_one(&store, "k", fixed(60), 100, 1, T0 + 60_000).await;
    assert_eq!(count(&server, &scope(), "k", fixed(60), T0 / 60_000).await, None);
    reserve_one(&store, "k", fixed(60), 100, 3, T0).await;
    store.commit(&scope(), ticket, &[0]).await.unwrap();
    assert_eq!(count(&server, &scope(), "k", fixed(60), T0 / 60_000).await, Some(0));
}

#[tokio::test]
async fn counters_expire_when_their_buckets_stop_counting() {
    let (server, store) = fixture(Limits::default()).await;
    let sliding = Window::Sliding { seconds: 60 };
    let checks = [check("f", fixed(60), 10, 1), check("s", sliding, 10, 1), check("m", Window::CalendarMonth, 10, 1)];
    let (ticket, _) = granted(store.reserve(&scope(), &checks, T0 + 30_000).await);
    for charge in ticket.charges() {
        let key = redis_key(&scope(), KeyKind::Counter { window: charge.window, bucket: charge.bucket }, &charge.key);
        assert_eq!(expires_at(&server, &key).await, Some(charge.expires_unix_ms), "{key}");
    }
    let expiries: Vec<u64> = ticket.charges().iter().map(|charge| charge.expires_unix_ms).collect();
    // 2096-04-01T00:00Z.
    assert_eq!(expiries, [T0 + 60_000, T0 + 120_000, 3_984_076_800_000]);
    // The index lives as long as its last key.
    let (index, sizes) = index_keys(&scope());
    assert_eq!(expires_at(&server, &index).await, Some(3_984_076_800_000));
    assert_eq!(expires_at(&server, &sizes).await, Some(3_984_076_800_000));
}

#[tokio::test]
async fn a_fixed_window_resets_at_its_boundary() {
    let (_server, store) = fixture(Limits::default()).await;
    assert!(reserve_one(&store, "k", fixed(60), 2, 1, T0).await.0);
    assert!(reserve_one(&store, "k", fixed(60), 2, 1, T0 + 30_000).await.0);
    let (granted, standing) = reserve_one(&store, "k", fixed(60), 2, 1, T0 + 59_999).await;
    assert!(!granted);
    assert_eq!(standing.reset_unix_ms, T0 + 60_000);
    let (granted, standing) = reserve_one(&store, "k", fixed(60), 2, 1, T0 + 60_000).await;
    assert!(granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (1, T0 + 120_000));
}

#[tokio::test]
async fn a_calendar_month_resets_at_the_months_end() {
    let (_server, store) = fixture(Limits::default()).await;
    // 2096-02-29T23:59:59.999Z, the last millisecond of a leap February.
    let (february, march, april) = (3_978_892_800_000, 3_981_398_400_000, 3_984_076_800_000);
    assert_eq!(march - february, 29 * 86_400_000);
    assert!(reserve_one(&store, "k", Window::CalendarMonth, 1, 1, february).await.0);
    let (granted, standing) = reserve_one(&store, "k", Window::CalendarMonth, 1, 1, march - 1).await;
    assert!(!granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (1, march));
    let (granted, standing) = reserve_one(&store, "k", Window::CalendarMonth, 1, 1, march).await;
    assert!(granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (1, april));
}

#[tokio::test]
async fn a_sliding_window_counts_the_weighted_previous_bucket() {
    let (_server, store) = fixture(Limits::default()).await;
    let window = Window::Sliding { seconds: 10 };
    assert!(reserve_one(&store, "k", window, 10, 8, T0 + 1000).await.0);
    let (granted, standing) = reserve_one(&store, "k", window, 10, 3, T0 + 10_000).await;
    assert!(!granted);
    assert_eq!((standing.used, standing.reset_unix_ms), (8, T0 + 20_000));
    assert!(reserve_one(&store, "k", window, 10, 2, T0 + 10_000).await.0);
    let (granted, standing) = reserve_one(&store, "k", window, 10, 5, T0 + 15_000).await;
    assert!(!granted);
    assert_eq!((standing.used, standing.remaining), (6, 4));
    assert!(reserve_one(&store, "k", window, 10, 4, T0 + 15_000).await.0);
    assert_eq!(reserve_one(&store, "k", window, 10, 0, T0 + 17_500).await.1.used, 8);
    assert_eq!(reserve_one(&store, "k", window, 10, 0, T0 + 20_000).await.1.used, 6);
    assert_eq!(reserve_one(&store, "k", window, 10, 0, T0 + 30_000).await.1.used, 0);
    // Rounded up, as Buckets::estimate: 1 ms of 3 s left of 1000 is 334 ppm.
    let three = Window::Sliding { seconds: 3 };
    assert!(reserve_one(&store, "r", three, 10_000, 1000, T0 + 1).await.0);
    assert_eq!(reserve_one(&store, "r", three, 10_000, 0, T0 + 5_999).await.1.used, 1);
    assert!(reserve_one(&store, "r", three, 10_000, 999, T0 + 5_999).await.0);
    assert_eq!(reserve_one(&store, "r", three, 10_000, 0, T0 + 6_000).await.1.used, 999);
}

#[tokio::test]
async fn dead_counters_go_and_free_their_share() {
    let limits = Limits { max_keys_per_plugin: 2, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let sliding = Window::Sliding { seconds: 60 };
    assert!(reserve_one(&store, "s", sliding, 10, 1, T0).await.0);
    assert!(reserve_one(&store, "f", fixed(60), 10, 1, T0).await.0);
    assert_eq!(held(&server, &scope()).await, (2, 2 * (1 + 8)));
    let result = store.reserve(&scope(), &[check("x", fixed(60), 10, 1)], T0).await;
    assert_eq!(result, Err(StateError::TooManyKeys { max: 2 }));
    assert_eq!(count(&server, &scope(), "x", fixed(60), T0 / 60_000).await, None);
    // A minute on, the fixed bucket is dead; the sliding one is the
    // previous bucket and still counts.
    assert!(reserve_one(&store, "x", fixed(60), 10, 1, T0 + 60_000).await.0);
    assert_eq!(count(&server, &scope(), "f", fixed(60), T0 / 60_000).await, None);
    assert_eq!(count(&server, &scope(), "s", sliding, T0 / 60_000).await, Some(1));
    // Two minutes on, it goes too, and so does `x`'s bucket: every write
    // drops dead keys, not only the ones it names.
    assert!(reserve_one(&store, "s", sliding, 10, 1, T0 + 120_000).await.0);
    assert_eq!(count(&server, &scope(), "s", sliding, T0 / 60_000).await, None);
    assert_eq!(count(&server, &scope(), "x", fixed(60), T0 / 60_000 + 1).await, None);
    assert_eq!(held(&server, &scope()).await, (1, 1 + 8));
}

#[tokio::test]
async fn reserves_with_bad_checks_are_errors_and_add_nothing() {
    let limits = Limits { max_checks_per_call: 2, max_key_bytes: 4, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let ok = check("k", fixed(60), 10, 1);
    let three = [ok.clone(), ok.clone(), ok.clone()];
    assert_eq!(store.reserve(&scope(), &three, T0).await, Err(StateError::TooManyChecks { given: 3, max: 2 }));
    let long = [ok.clone(), check("12345", fixed(60), 10, 1)];
    assert_eq!(store.reserve(&scope(), &long, T0).await, Err(StateError::KeyTooLong { len: 5, max: 4 }));
    let window = [ok.clone(), check("k", fixed(0), 10, 1)];
    assert_eq!(store.reserve(&scope(), &window, T0).await, Err(StateError::InvalidWindow(fixed(0))));
    assert_eq!(all_keys(&server).await, Vec::<String>::new());
    let (_, standings) = granted(store.reserve(&scope(), &[ok], T0).await);
    assert_eq!(used(&standings), [1]);
    // No checks: granted, nothing asked of Redis.
    let (ticket, standings) = granted(store.reserve(&scope(), &[], T0).await);
    assert!(ticket.is_empty() && standings.is_empty());
}

#[tokio::test]
async fn entries_are_set_read_and_deleted() {
    let (server, store) = fixture(Limits::default()).await;
    let scope = scope();
    assert_eq!(store.get(&scope, "k", T0).await.unwrap(), None);
    assert_eq!(all_keys(&server).await, Vec::<String>::new(), "reading made no state");
    store.set(&scope, "k", b"one", 0, T0).await.unwrap();
    assert_eq!(store.get(&scope, "k", T0).await.unwrap(), Some(b"one".to_vec()));
    store.set(&scope, "k", b"three", 0, T0).await.unwrap();
    assert_eq!(store.get(&scope, "k", T0).await.unwrap(), Some(b"three".to_vec()));
    assert_eq!(held(&server, &scope).await, (1, 1 + 5));
    store.set(&scope, "", b"", 0, T0).await.unwrap();
    assert_eq!(store.get(&scope, "", T0).await.unwrap(), Some(Vec::new()));
    // Any bytes, as they are.
    let binary: Vec<u8> = (0..=255).collect();
    store.set(&scope, "bin", &binary, 0, T0).await.unwrap();
    assert_eq!(store.get(&scope, "bin", T0).await.unwrap(), Some(binary));
    assert!(store.delete(&scope, "bin", T0).await.unwrap());
    assert!(store.delete(&scope, "k", T0).await.unwrap());
    assert_eq!(store.get(&scope, "k", T0).await.unwrap(), None);
    assert!(!store.delete(&scope, "k", T0).await.unwrap());
    assert_eq!(held(&server, &scope).await, (1, 0));
    // The last one gone, the index goes too.
    assert!(store.delete(&scope, "", T0).await.unwrap());
    assert_eq!(all_keys(&server).await, Vec::<String>::new());
}

#[tokio::test]
async fn entries_expire_at_their_ttl() {
    let limits = Limits { max_ttl_ms: 10_000, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let scope = scope();
    store.set(&scope, "short", b"v", 1000, T0).await.unwrap();
    store.set(&scope, "default", b"v", 0, T0).await.unwrap();
    store.set(&scope, "long", b"v", u64::MAX, T0).await.unwrap();
    assert_eq!(store.get(&scope, "short", T0 + 999).await.unwrap(), Some(b"v".to_vec()));
    assert_eq!(store.get(&scope, "short", T0 + 1000).await.unwrap(), None);
    for key in ["default", "long"] {
        assert_eq!(store.get(&scope, key, T0 + 9_999).await.unwrap(), Some(b"v".to_vec()), "{key}");
        assert_eq!(store.get(&scope, key, T0 + 10_000).await.unwrap(), None, "{key}");
        // Redis's own expiry: the TTL asked for, or the most.
        let ttl: i64 = redis::cmd("PTTL")
            .arg(redis_key(&scope, KeyKind::Entry, key))
            .query_async(&mut server.raw().await)
            .await
            .unwrap();
        assert!((9_000..=10_000).contains(&ttl), "{key}: {ttl}");
    }
    assert!(!store.delete(&scope, "short", T0 + 1000).await.unwrap());
    store.set(&scope, "k", b"v", 5, T0).await.unwrap();
    assert!(!store.delete(&scope, "k", T0 + 5).await.unwrap());
    // The next write drops the dead ones from the index.
    store.set(&scope, "other", b"v", 0, T0 + 10_000).await.unwrap();
    assert_eq!(held(&server, &scope).await, (1, 5 + 1));
    assert_eq!(all_keys(&server).await.len(), 3, "the entry and the index");
}

/// On real time: Redis drops an entry at its TTL by itself.
#[tokio::test]
async fn redis_expires_entries_at_their_ttl() {
    let (server, store) = fixture(Limits::default()).await;
    let scope = scope();
    store.set(&scope, "k", b"v", 300, real_now()).await.unwrap();
    assert_eq!(store.get(&scope, "k", real_now()).await.unwrap(), Some(b"v".to_vec()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!exists(&server, &redis_key(&scope, KeyKind::Entry, "k")).await);
    assert_eq!(store.get(&scope, "k", real_now()).await.unwrap(), None);
    // So does the index, at its last member's end.
    let (index, _) = index_keys(&scope);
    assert!(!exists(&server, &index).await);
    // And a compare-and-set finds it absent.
    assert!(store.compare_and_set(&scope, "k", None, b"w", 0, real_now()).await.unwrap());
}

#[tokio::test]
async fn compare_and_set_sets_only_over_what_was_expected() {
    let (server, store) = fixture(Limits::default()).await;
    let scope = scope();
    let cas = async |expected: Option<&[u8]>, value: &[u8], now| {
        store.compare_and_set(&scope, "k", expected, value, 1000, now).await.unwrap()
    };
    let get = async |now| store.get(&scope, "k", now).await.unwrap();
    assert!(cas(None, b"one", T0).await);
    assert_eq!(get(T0).await, Some(b"one".to_vec()));
    assert!(!cas(None, b"two", T0).await);
    assert!(!cas(Some(b"uno"), b"two", T0).await);
    assert!(!cas(Some(b""), b"two", T0).await);
    assert_eq!(get(T0).await, Some(b"one".to_vec()));
    assert!(cas(Some(b"one"), b"two", T0 + 1).await);
    assert_eq!(get(T0 + 1).await, Some(b"two".to_vec()));
    assert!(!cas(Some(b"two"), b"three", T0 + 1001).await);
    assert!(cas(None, b"three", T0 + 1001).await);
    assert_eq!(get(T0 + 1001).await, Some(b"three".to_vec()));
    assert_eq!(held(&server, &scope).await, (1, 1 + 5));
    // An empty value is a value, not absence.
    store.set(&scope, "e", b"", 0, T0).await.unwrap();
    assert!(!store.compare_and_set(&scope, "e", None, b"x", 0, T0).await.unwrap());
    assert!(store.compare_and_set(&scope, "e", Some(b""), b"x", 0, T0).await.unwrap());
}

#[tokio::test]
async fn entries_past_a_cap_are_refused_and_nothing_is_stored() {
    let limits = Limits { max_key_bytes: 4, max_value_bytes: 8, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let scope = scope();
    assert_eq!(store.set(&scope, "12345", b"v", 0, T0).await, Err(StateError::KeyTooLong { len: 5, max: 4 }));
    assert_eq!(store.get(&scope, "12345", T0).await, Err(StateError::KeyTooLong { len: 5, max: 4 }));
    assert_eq!(store.delete(&scope, "12345", T0).await, Err(StateError::KeyTooLong { len: 5, max: 4 }));
    assert_eq!(store.set(&scope, "k", b"123456789", 0, T0).await, Err(StateError::ValueTooLarge { len: 9, max: 8 }));
    let cas = store.compare_and_set(&scope, "k", None, b"123456789", 0, T0).await;
    assert_eq!(cas, Err(StateError::ValueTooLarge { len: 9, max: 8 }));
    assert_eq!(all_keys(&server).await, Vec::<String>::new());
    store.set(&scope, "1234", b"12345678", 0, T0).await.unwrap();
    assert_eq!(held(&server, &scope).await, (1, 12));
}

#[tokio::test]
async fn a_plugin_holds_no_more_keys_than_its_cap() {
    let limits = Limits { max_keys_per_plugin: 3, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let scope = scope();
    for key in ["a", "b"] {
        store.set(&scope, key, b"v", 0, T0).await.unwrap();
    }
    assert!(reserve_one(&store, "c", fixed(60), 10, 1, T0).await.0);
    assert_eq!(store.set(&scope, "d", b"v", 0, T0).await, Err(StateError::TooManyKeys { max: 3 }));
    let cas = store.compare_and_set(&scope, "d", None, b"v", 0, T0).await;
    assert_eq!(cas, Err(StateError::TooManyKeys { max: 3 }));
    assert_eq!(store.get(&scope, "d", T0).await.unwrap(), None);
    assert!(!exists(&server, &redis_key(&scope, KeyKind::Entry, "d")).await);
    store.set(&scope, "a", b"new", 0, T0).await.unwrap();
    assert!(reserve_one(&store, "c", fixed(60), 10, 1, T0).await.0);
    assert_eq!(held(&server, &scope).await.0, 3);
    store.set(&Scope::new("team-b", "quota"), "d", b"v", 0, T0).await.unwrap();
    let mut small = Scope::new("team-c", "cache");
    small.max_keys = Some(1);
    store.set(&small, "a", b"v", 0, T0).await.unwrap();
    assert_eq!(store.set(&small, "b", b"v", 0, T0).await, Err(StateError::TooManyKeys { max: 1 }));
    assert_eq!(store.caps(&small), (1, Limits::default().max_bytes_per_plugin));
}

#[tokio::test]
async fn a_plugin_holds_no_more_bytes_than_its_cap() {
    let limits = Limits { max_bytes_per_plugin: 20, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let scope = scope();
    store.set(&scope, "a", b"123456789", 0, T0).await.unwrap();
    store.set(&scope, "b", b"123456789", 0, T0).await.unwrap();
    assert_eq!(held(&server, &scope).await.1, 20);
    let refused = store.set(&scope, "c", b"", 0, T0).await;
    assert_eq!(refused, Err(StateError::PluginBytesExceeded { needed: 21, max: 20 }));
    store.set(&scope, "a", b"987654321", 0, T0).await.unwrap();
    assert_eq!(held(&server, &scope).await, (2, 20));
    let refused = store.set(&scope, "a", b"1234567890", 0, T0).await;
    assert_eq!(refused, Err(StateError::PluginBytesExceeded { needed: 21, max: 20 }));
    assert_eq!(store.get(&scope, "a", T0).await.unwrap(), Some(b"987654321".to_vec()));
    store.set(&scope, "a", b"1", 0, T0).await.unwrap();
    assert_eq!(held(&server, &scope).await.1, 12);
    let counter = store.reserve(&scope, &[check("k", fixed(60), 1, 1)], T0).await;
    assert_eq!(counter, Err(StateError::PluginBytesExceeded { needed: 21, max: 20 }));
    store.delete(&scope, "a", T0).await.unwrap();
    assert!(reserve_one(&store, "k", fixed(60), 1, 1, T0).await.0);
    assert_eq!(held(&server, &scope).await, (2, 10 + 9));
    let mut small = Scope::new("team-c", "cache");
    small.max_bytes = Some(4);
    let refused = store.set(&small, "a", b"1234", 0, T0).await;
    assert_eq!(refused, Err(StateError::PluginBytesExceeded { needed: 5, max: 4 }));
}

#[tokio::test]
async fn expired_entries_free_their_share() {
    let limits = Limits { max_keys_per_plugin: 2, max_bytes_per_plugin: 100, ..Limits::default() };
    let (server, store) = fixture(limits).await;
    let scope = scope();
    store.set(&scope, "a", &[0; 40], 100, T0).await.unwrap();
    store.set(&scope, "b", &[0; 40], 200, T0).await.unwrap();
    assert_eq!(store.set(&scope, "c", b"v", 0, T0 + 99).await, Err(StateError::TooManyKeys { max: 2 }));
    store.set(&scope, "c", &[0; 50], 0, T0 + 100).await.unwrap();
    assert_eq!(held(&server, &scope).await, (2, 41 + 51));
    assert_eq!(store.get(&scope, "a", T0 + 100).await.unwrap(), None);
    store.set(&scope, "b", b"v", 0, T0 + 200).await.unwrap();
    assert_eq!(held(&server, &scope).await, (2, 51 + 2));
}

/// A cap is checked once every dead key is dropped, however many there
/// are, not only the batch a write drops by the way.
#[tokio::test]
async fn every_dead_key_makes_room_before_a_refusal() {
    let (server, store) = fixture(Limits::default()).await;
    for n in 0..200 {
        store.set(&scope(), &format!("k{n}"), b"v", 1000 + n, T0).await.unwrap();
    }
    // Its cap lowered under what it holds: growth is refused, and what it
    // holds is left alone.
    let mut lowered = scope();
    lowered.max_keys = Some(100);
    assert_eq!(store.set(&lowered, "new", b"v", 0, T0).await, Err(StateError::TooManyKeys { max: 100 }));
    store.set(&lowered, "k0", b"w", 0, T0).await.unwrap();
    assert_eq!(held(&server, &scope()).await.0, 200);
    // All dead by T0 + 5000 but `k0`: more than a batch.
    store.set(&lowered, "new", b"v", 0, T0 + 5000).await.unwrap();
    assert_eq!(held(&server, &scope()).await, (2, 3 + 4));
    assert_eq!(all_keys(&server).await.len(), 4);
}

// --- The two stores side by side ------------------------------------------

/// A small generator of the calls' inputs, the same every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        // xorshift64*.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// What a call came to, to tally the outcomes a run saw.
fn outcome<T: fmt::Debug>(call: &str, result: &Result<T, StateError>) -> String {
    match result {
        Ok(value) => {
            let value = format!("{value:?}");
            // The variant or value, without its fields.
            let head = value.split([' ', '(', '{']).next().unwrap_or_default();
            format!("{call}: {}", if head.is_empty() { "ok" } else { head })
        }
        Err(error) => format!("{call}: {}", format!("{error:?}").split([' ', '(', '{']).next().unwrap_or_default()),
    }
}

/// The same calls on both stores give the same results, call by call: the
/// in-process store's semantics are the spec.
#[tokio::test]
async fn the_same_calls_give_what_the_in_process_store_gives() {
    let limits = Limits {
        max_key_bytes: 8,
        max_value_bytes: 40,
        max_keys_per_plugin: 16,
        max_bytes_per_plugin: 120,
        max_checks_per_call: 3,
        max_ttl_ms: 20_000,
        ..Limits::default()
    };
    let memory = MemoryStore::new(limits.clone());
    let (_server, redis) = fixture(limits).await;
    let mut lowered = Scope::new("a", "b/c");
    (lowered.max_keys, lowered.max_bytes) = (Some(6), Some(50));
    let scopes = [Scope::new("a/b", "c"), lowered];
    let keys = ["k", "q:{x}", "", "}", "too-long!"];
    let windows = [
        fixed(1),
        fixed(10),
        Window::Sliding { seconds: 5 },
        Window::Sliding { seconds: 10 },
        Window::CalendarMonth,
        fixed(0),
    ];
    let values: [&[u8]; 5] = [b"", b"v", b"value", &[7; 30], &[1; 41]];
    // At least a second: the entries' Redis TTLs run on real time, which
    // must not overtake the made-up time.
    let ttls = [0, 1000, 2500, 15_000, u64::MAX];
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut tickets: Vec<(usize, Ticket, Ticket)> = Vec::new();
    // Two minutes before 2096-03-01: the month changes on the way.
    let mut now = 3_981_398_400_000 - 120_000;
    let mut seen: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for step in 0..4000 {
        now += rng.below(4) * rng.below(1200);
        let at = rng.below(scopes.len() as u64) as usize;
        let scope = &scopes[at];
        let key = *rng.pick(&keys);
        let seen_now = match rng.below(10) {
            0..=3 => {
                let checks: Vec<Check> = (0..=rng.below(4))
                    .map(|_| check(rng.pick::<&str>(&keys), *rng.pick(&windows), rng.below(25), rng.below(9)))
                    .collect();
                let expected = memory.reserve(scope, &checks, now).await;
                let got = redis.reserve(scope, &checks, now).await;
                assert_eq!(expected, got, "step {step}: {checks:?} at {now}");
                let seen = outcome("reserve", &got);
                if let (Ok(Reserved::Granted { ticket: ours, .. }), Ok(Reserved::Granted { ticket, .. })) =
                    (expected, got)
                {
                    tickets.push((at, ours, ticket));
                }
                seen
            }
            4 | 5 if !tickets.is_empty() => {
                let (at, ours, ticket) = tickets.swap_remove(rng.below(tickets.len() as u64) as usize);
                let scope = &scopes[at];
                let actual: Vec<u64> = (0..rng.below(ticket.len() as u64 + 2)).map(|_| rng.below(12)).collect();
                let (expected, got) = if rng.below(4) == 0 {
                    (memory.release(scope, ours).await, redis.release(scope, ticket).await)
                } else {
                    (memory.commit(scope, ours, &actual).await, redis.commit(scope, ticket, &actual).await)
                };
                assert_eq!(expected, got, "step {step}: commit {actual:?}");
                outcome("commit", &got)
            }
            6 => {
                let (value, ttl) = (*rng.pick(&values), *rng.pick(&ttls));
                let expected = memory.set(scope, key, value, ttl, now).await;
                let got = redis.set(scope, key, value, ttl, now).await;
                assert_eq!(expected, got, "step {step}: set {key}");
                outcome("set", &got)
            }
            7 => {
                let current = memory.get(scope, key, now).await.ok().flatten();
                let expected = match rng.below(3) {
                    0 => None,
                    1 => current.as_deref(),
                    _ => Some(*rng.pick(&values)),
                };
                let (value, ttl) = (*rng.pick(&values), *rng.pick(&ttls));
                let ours = memory.compare_and_set(scope, key, expected, value, ttl, now).await;
                let got = redis.compare_and_set(scope, key, expected, value, ttl, now).await;
                assert_eq!(ours, got, "step {step}: compare-and-set {key}");
                outcome("compare-and-set", &got)
            }
            8 => {
                let got = redis.get(scope, key, now).await;
                assert_eq!(memory.get(scope, key, now).await, got, "step {step}: get {key}");
                outcome("get", &got)
            }
            _ => {
                let got = redis.delete(scope, key, now).await;
                assert_eq!(memory.delete(scope, key, now).await, got, "step {step}: delete {key}");
                outcome("delete", &got)
            }
        };
        *seen.entry(seen_now).or_default() += 1;
    }
    // The run saw every outcome, each more than once.
    let expected = [
        "commit: ok",
        "commit: TooManyAmounts",
        "compare-and-set: PluginBytesExceeded",
        "compare-and-set: TooManyKeys",
        "compare-and-set: false",
        "compare-and-set: true",
        "delete: false",
        "delete: true",
        "get: None",
        "get: Some",
        "reserve: Granted",
        "reserve: InvalidWindow",
        "reserve: KeyTooLong",
        "reserve: PluginBytesExceeded",
        "reserve: Refused",
        "reserve: TooManyChecks",
        "reserve: TooManyKeys",
        "set: ok",
        "set: KeyTooLong",
        "set: PluginBytesExceeded",
        "set: TooManyKeys",
        "set: ValueTooLarge",
    ];
    for outcome in expected {
        assert!(seen.get(outcome).is_some_and(|&times| times > 1), "{outcome} not seen twice: {seen:#?}");
    }
}

// --- Replicas -------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_never_pass_a_limit_together() {
    const LIMIT: u64 = 300;
    let server = Server::start();
    // Two stores on one Redis, as two replicas of the gateway.
    let replicas: Vec<Arc<dyn Store>> =
        vec![Arc::new(connect(&server, Limits::default()).await), Arc::new(connect(&server, Limits::default()).await)];
    let tasks: Vec<_> = (0..16)
        .map(|task| {
            let store = Arc::clone(&replicas[task % 2]);
            tokio::spawn(async move {
                let mut granted = 0;
                for n in 0..50 {
                    let checks = [check("k", fixed(3600), LIMIT, 1), check("tokens", fixed(3600), 2 * LIMIT, 2)];
                    if let Reserved::Granted { ticket, .. } = store.reserve(&scope(), &checks, T0 + n).await.unwrap() {
                        granted += 1;
                        store.commit(&scope(), ticket, &[1, 2]).await.unwrap();
                    }
                }
                granted
            })
        })
        .collect();
    let mut granted = 0;
    for task in tasks {
        granted += task.await.unwrap();
    }
    assert_eq!(granted, LIMIT);
    assert_eq!(count(&server, &scope(), "k", fixed(3600), T0 / 3_600_000).await, Some(LIMIT));
    assert_eq!(count(&server, &scope(), "tokens", fixed(3600), T0 / 3_600_000).await, Some(2 * LIMIT));
}

// --- TLS ------------------------------------------------------------------

/// A CA's certificate, and a certificate and key it signed for `purpose`
/// (naming `names`), in PEM.
fn issue(
    ca: &rcgen::CertifiedIssuer<'_, rcgen::KeyPair>,
    names: &[&str],
    purpose: rcgen::ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    // Named apart from the CA: a leaf named as its issuer reads as self-signed.
    params.distinguished_name.push(rcgen::DnType::CommonName, names[0]);
    params.extended_key_usages = vec![purpose];
    params.use_authority_key_identifier_extension = true;
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A Redis serving TLS on a second port with a certificate of a CA of its
/// own, asking clients for a certificate of that CA (`tls-auth-clients
/// yes`, Redis's default); its TLS URL, and TLS settings that it takes.
fn tls_server() -> (Server, String, RedisTls) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, "sluice test CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let (server_cert, server_key) = issue(&ca, &["127.0.0.1"], rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let (client_cert, client_key) = issue(&ca, &["sluice-gateway"], rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    let files = tempfile::tempdir().unwrap();
    let write = |name: &str, pem: &str| {
        let path = files.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path.display().to_string()
    };
    let tls_port = free_port();
    let args = [
        "--tls-port".to_string(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        write("server.pem", &server_cert),
        "--tls-key-file".into(),
        write("server.key", &server_key),
        "--tls-ca-cert-file".into(),
        write("ca.pem", &ca.pem()),
        "--tls-auth-clients".into(),
        "yes".into(),
    ];
    let server = Server::with_args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // The server has read its files.
    drop(files);
    let tls = RedisTls {
        ca_pem: Some(ca.pem().into_bytes()),
        client_cert_pem: Some(client_cert.into_bytes()),
        client_key_pem: Some(client_key.into_bytes()),
    };
    (server, format!("rediss://127.0.0.1:{tls_port}"), tls)
}

/// `rediss://` to a Redis with a private CA that asks for client
/// certificates: the store works with the CA and a client certificate
/// given, and without either its calls fail as unavailable, promptly.
#[tokio::test]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    let (_server, url, tls) = tls_server();
    let store = RedisStore::connect(RedisConfig { tls: tls.clone(), ..quick(url.clone()) }).await.unwrap();
    let (granted, standing) = reserve_one(&store, "k", fixed(60), 5, 2, T0).await;
    assert!(granted && standing.used == 2, "{standing:?}");
    // The webpki roots do not know the CA.
    let unknown_ca = RedisStore::connect(quick(url.clone())).await.unwrap();
    assert_unavailable(timed(reserve_now(&unknown_ca)).await);
    // Known, but without a client certificate Redis closes the connection.
    let anonymous = RedisTls { client_cert_pem: None, client_key_pem: None, ..tls.clone() };
    let anonymous = RedisStore::connect(RedisConfig { tls: anonymous, ..quick(url.clone()) }).await.unwrap();
    assert_unavailable(timed(reserve_now(&anonymous)).await);
    // Settings that cannot be used are refused at the start.
    let half = RedisTls { client_key_pem: None, ..tls.clone() };
    let error = RedisStore::connect(RedisConfig { tls: half, ..quick(url) }).await.unwrap_err();
    assert!(error.to_string().contains("needs its key"), "{error}");
    let plain = RedisStore::connect(RedisConfig { tls, ..quick("redis://127.0.0.1:1".into()) }).await.unwrap_err();
    assert!(plain.to_string().contains("needs a rediss:// URL"), "{plain}");
}

// --- Redis going away -----------------------------------------------------

fn quick(url: String) -> RedisConfig {
    RedisConfig {
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_millis(500),
        ..RedisConfig::new(url)
    }
}

/// A call, timed: it must end within 2 s whatever Redis does.
async fn timed<T>(call: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let result = call.await;
    assert!(started.elapsed() < Duration::from_secs(2), "a call took {:?}", started.elapsed());
    result
}

async fn reserve_now(store: &RedisStore) -> Result<Reserved, StateError> {
    timed(store.reserve(&scope(), &[check("k", fixed(60), 1_000_000, 1)], T0)).await
}

#[track_caller]
fn assert_unavailable<T: fmt::Debug>(result: Result<T, StateError>) {
    match result {
        Err(error) if error.is_unavailable() => {}
        other => panic!("not unavailable: {other:?}"),
    }
}

/// Calls until one works, each within 2 s; Redis answers within
/// [`PATIENCE`].
async fn until_it_answers(store: &RedisStore) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match reserve_now(store).await {
            Ok(reserved) => {
                granted(Ok(reserved));
                return;
            }
            Err(error) => {
                assert!(error.is_unavailable(), "{error}");
                assert!(Instant::now() < deadline, "still failing: {error}");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_goes_away_fails_calls_fast_until_it_is_back() {
    let mut server = Server::start();
    let store = RedisStore::connect(quick(server.url())).await.unwrap();
    granted(reserve_now(&store).await);
    server.kill();
    for _ in 0..5 {
        assert_unavailable(reserve_now(&store).await);
        assert_unavailable(timed(store.get(&scope(), "k", T0)).await);
        assert_unavailable(timed(store.set(&scope(), "k", b"v", 0, T0)).await);
    }
    // A new server on the same port: the same store works again.
    server.restart();
    until_it_answers(&store).await;
    store.set(&scope(), "k", b"v", 0, T0).await.unwrap();
    assert_eq!(store.get(&scope(), "k", T0).await.unwrap(), Some(b"v".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_down_at_start_is_not_fatal() {
    let port = free_port();
    let started = Instant::now();
    let store = RedisStore::connect(quick(format!("redis://127.0.0.1:{port}"))).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "connect took {:?}", started.elapsed());
    assert_unavailable(reserve_now(&store).await);
    let _server = Server::on(port, &[]);
    until_it_answers(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_hangs_times_calls_out() {
    let server = Server::start();
    let store = RedisStore::connect(quick(server.url())).await.unwrap();
    granted(reserve_now(&store).await);
    server.signal("STOP");
    for _ in 0..3 {
        let started = Instant::now();
        assert_eq!(reserve_now(&store).await, Err(StateError::Timeout));
        assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
    }
    server.signal("CONT");
    until_it_answers(&store).await;
}

/// Nothing answers on the port at all: connecting times out, as calls do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_answers_times_calls_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // Takes connections and says nothing.
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let started = Instant::now();
    let store = RedisStore::connect(quick(format!("redis://127.0.0.1:{port}"))).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "connect took {:?}", started.elapsed());
    for _ in 0..3 {
        assert_unavailable(reserve_now(&store).await);
    }
    silent.abort();
}

// --- Credentials ----------------------------------------------------------

#[tokio::test]
async fn credentials_are_never_shown() {
    let server = Server::with_args(&[
        "--requirepass",
        "pass-s3cret",
        "--user",
        "alice",
        "on",
        ">alice-s3cret",
        "~*",
        "&*",
        "+@all",
    ]);
    let port = server.port;
    let shown = |text: &str| text.contains("s3cret");

    // As fields.
    let mut config = quick(server.url());
    config.password = Some("pass-s3cret".into());
    assert!(!shown(&format!("{config:?}")), "{config:?}");
    let store = RedisStore::connect(config).await.unwrap();
    store.set(&scope(), "k", b"v", 0, T0).await.unwrap();
    assert!(!shown(&format!("{store:?}")), "{store:?}");
    let mut config = quick(server.url());
    (config.username, config.password) = (Some("alice".into()), Some("alice-s3cret".into()));
    let store = RedisStore::connect(config).await.unwrap();
    assert_eq!(store.get(&scope(), "k", T0).await.unwrap(), Some(b"v".to_vec()));
    assert_eq!(
        format!("{:?}", RedisConfig { username: Some("alice".into()), ..quick(server.url()) }).matches("alice").count(),
        0
    );

    // In the URL, percent-encoded or not.
    let config = quick(format!("redis://alice:alice-s3cret@127.0.0.1:{port}/0"));
    assert!(!shown(&format!("{config:?}")), "{config:?}");
    let store = RedisStore::connect(config).await.unwrap();
    assert_eq!(store.get(&scope(), "k", T0).await.unwrap(), Some(b"v".to_vec()));
    assert!(!shown(&format!("{store:?}")), "{store:?}");

    // Wrong ones: the errors do not show them either.
    let wrong = [
        RedisConfig { password: Some("wrong-s3cret".into()), ..quick(server.url()) },
        RedisConfig { username: Some("alice".into()), password: Some("wrong-s3cret".into()), ..quick(server.url()) },
        quick(format!("redis://alice:wrong%2Ds3cret@127.0.0.1:{port}")),
        quick(format!("redis://:wrong-s3cret@127.0.0.1:{port}")),
        quick(format!("redis://:wrong-s3cret@127.0.0.1:{port}/not-a-db")),
        quick(format!("bogus://alice:wrong-s3cret@127.0.0.1:{port}")),
    ];
    for config in wrong {
        let debug = format!("{config:?}");
        assert!(!shown(&debug), "{debug}");
        let error = match RedisStore::connect(config).await {
            Ok(store) => {
                assert!(!shown(&format!("{store:?}")));
                store.get(&scope(), "k", T0).await.unwrap_err()
            }
            Err(error) => error,
        };
        assert!(error.is_unavailable(), "{error:?}");
        assert!(!shown(&error.to_string()) && !shown(&format!("{error:?}")), "{error:?}");
    }
}

/// A connection Redis refuses (a wrong password) is made anew until it
/// takes it: the store is not stuck with the refusal.
#[tokio::test]
async fn a_refused_connection_is_tried_again() {
    let server = Server::with_args(&["--requirepass", "old-s3cret"]);
    let config = RedisConfig { password: Some("new-s3cret".into()), ..quick(server.url()) };
    let store = RedisStore::connect(config).await.unwrap();
    assert_unavailable(store.get(&scope(), "k", T0).await);
    // The password changes to the store's.
    let admin = format!("redis://:old-s3cret@127.0.0.1:{}", server.port);
    let mut admin = redis::Client::open(admin).unwrap().get_multiplexed_async_connection().await.unwrap();
    let () =
        redis::cmd("CONFIG").arg("SET").arg("requirepass").arg("new-s3cret").query_async(&mut admin).await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    while let Err(error) = timed(store.get(&scope(), "k", T0)).await {
        assert!(error.is_unavailable(), "{error}");
        assert!(Instant::now() < deadline, "still refused: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// --- Small parts ----------------------------------------------------------

#[test]
fn a_scopes_index_is_under_its_hash_tag_and_apart_from_its_keys() {
    let (index, sizes) = index_keys(&Scope::new("team-a", "quota.v1"));
    assert_eq!((index.as_str(), sizes.as_str()), ("sluice:{team-a/quota.v1}:idx", "sluice:{team-a/quota.v1}:size"));
    let (index, _) = index_keys(&Scope::new("a/b", "c}{:"));
    assert_eq!(index, "sluice:{a%2Fb/c%7D%7B%3A}:idx");
}

#[test]
fn urls_are_shown_without_credentials() {
    assert_eq!(redact_url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    assert_eq!(redact_url("rediss://user:pw@redis.example:6380/2"), "rediss://<redacted>@redis.example:6380/2");
    assert_eq!(redact_url("redis://:p@ss@host"), "redis://<redacted>@host");
    assert_eq!(redact_url("redis+unix:///run/redis.sock?db=1&pass=pw"), "redis+unix:///run/redis.sock?<redacted>");
    assert_eq!(redact_url("not a url"), "not a url");
    let secrets = url_credentials("redis://user:p%40w@host/0");
    assert_eq!(secrets, ["user:p%40w", "user", "p%40w"]);
    assert_eq!(url_credentials("redis+unix:///s?pass=pw#x"), ["pw"]);
    assert_eq!(scrub("user pw password", &["pw".into(), "password".into()]), "user <redacted> <redacted>");
}

#[tokio::test]
async fn a_url_that_cannot_be_used_is_an_error() {
    let error = RedisStore::connect(RedisConfig::new("http://127.0.0.1:1")).await.unwrap_err();
    assert!(matches!(&error, StateError::Unavailable(message) if message.contains("invalid Redis URL")), "{error:?}");
    // TLS is built in: a `rediss://` URL is taken (nothing listens here).
    let store = RedisStore::connect(quick("rediss://127.0.0.1:1".into())).await.unwrap();
    assert_unavailable(reserve_now(&store).await);
    assert_eq!(store.kind(), "redis");
}
