//! The auth-remote plugin through the real gateway, against a small real
//! identity provider on loopback (hyper) that serves OIDC discovery and a
//! JWKS the test rotates, and counts what it is asked for: a valid token
//! passes, unknown and forged ones are 401, a key rotated at the IdP is
//! taken up without a restart, a flood of made-up `kid`s costs the IdP at
//! most one fetch per `minRefreshIntervalSeconds`, and the inline keys serve
//! while the IdP cannot be reached. Plus the grants: `auth` refuses remote
//! keys naming auth-remote, and auth-remote loads only with egress and state.

use crate::plugin_support as support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_tests::{Gateway, Plugin, Reply, chat_body};
use support::{assert_configs_rejected, serve};
use tokio::net::TcpListener;

const JWKS: &str = include_str!("../../plugins/auth/testdata/jwks.json");
const RSA_PRIVATE: &str = include_str!("../../plugins/auth/testdata/rsa-private.pem");
const EC_PRIVATE: &str = include_str!("../../plugins/auth/testdata/ec-private.pem");
const MODELS: [&str; 1] = ["gpt-test"];

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// The testdata RSA public key, published as `kid`.
fn rsa(kid: &str) -> Value {
    let mut key = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][0].clone();
    key["kid"] = json!(kid);
    key
}

/// The testdata P-256 public key, published as `kid`.
fn ec(kid: &str) -> Value {
    let mut key = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][1].clone();
    key["kid"] = json!(kid);
    key
}

/// What the identity provider serves, and what it was asked for.
struct IdpState {
    keys: Mutex<Vec<Value>>,
    /// The JWKS's `Cache-Control: max-age`.
    max_age: AtomicU64,
    discovery_fetches: AtomicUsize,
    jwks_fetches: AtomicUsize,
}

/// A small real OIDC provider: discovery at
/// `/.well-known/openid-configuration`, the JWKS at `/jwks`.
struct Idp {
    addr: SocketAddr,
    state: Arc<IdpState>,
}

impl Idp {
    async fn start(keys: Vec<Value>) -> Idp {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(IdpState {
            keys: Mutex::new(keys),
            max_age: AtomicU64::new(300),
            discovery_fetches: AtomicUsize::new(0),
            jwks_fetches: AtomicUsize::new(0),
        });
        let serving = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let state = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| answer(addr, state.clone(), request));
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        Idp { addr, state }
    }

    fn issuer(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn publish(&self, keys: Vec<Value>) {
        *self.state.keys.lock() = keys;
    }

    fn jwks_fetches(&self) -> usize {
        self.state.jwks_fetches.load(Ordering::SeqCst)
    }

    fn discovery_fetches(&self) -> usize {
        self.state.discovery_fetches.load(Ordering::SeqCst)
    }
}

async fn answer(
    addr: SocketAddr,
    state: Arc<IdpState>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let issuer = format!("http://{addr}");
    let json = |body: Value, max_age: u64| {
        Response::builder()
            .header("content-type", "application/json")
            .header("cache-control", format!("public, max-age={max_age}"))
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };
    Ok(match request.uri().path() {
        "/.well-known/openid-configuration" => {
            state.discovery_fetches.fetch_add(1, Ordering::SeqCst);
            json(json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")}), 3600)
        }
        "/jwks" => {
            state.jwks_fetches.fetch_add(1, Ordering::SeqCst);
            let keys = state.keys.lock().clone();
            json(json!({"keys": keys}), state.max_age.load(Ordering::SeqCst))
        }
        _ => Response::builder().status(404).body(Full::new(Bytes::new())).unwrap(),
    })
}

/// A token for alice from `issuer`, signed with the testdata key of `alg`
/// (any other: an HMAC secret no key here knows) and naming `kid`.
fn token(issuer: &str, alg: Algorithm, kid: &str) -> String {
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap(),
        _ => EncodingKey::from_secret(b"a secret the identity provider never had"),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_string());
    let claims = json!({"sub": "alice", "iss": issuer, "aud": "sluice", "exp": now() + 600});
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// auth-remote finding its keys by discovery from the IdP, with the grants
/// it needs: the IdP's origin for egress, and shared state (where the key
/// set and the refresh turn are kept). Its deadline leaves room for two
/// fetches of a second each (discovery, then the JWKS) in one request.
fn auth_remote(issuer: &str, remote: Value) -> Plugin {
    let mut remote_config = json!({"issuer": issuer});
    remote_config.as_object_mut().unwrap().extend(remote.as_object().unwrap().clone());
    Plugin::new("auth-remote", "auth-remote")
        .auth_phase()
        .timeout_ms(2500)
        .egress(json!({"destinations": [{"url": issuer}]}))
        .state(json!({}))
        .config(json!({"jwt": {"remote": remote_config, "audience": "sluice"}}))
}

async fn send(gateway: &Gateway, token: &str) -> Reply {
    let bearer = format!("Bearer {token}");
    gateway.post("/v1/chat/completions", chat_body("gpt-test").to_string(), &[("authorization", &bearer)]).await
}

async fn passes(gateway: &Gateway, token: &str) {
    let echoed = send(gateway, token).await.echoed();
    assert_eq!(echoed["headers"]["x-sluice-consumer"], "jwt:alice", "{echoed}");
    assert!(echoed["headers"].get("authorization").is_none(), "the token was forwarded: {echoed}");
}

/// The 401's message.
async fn refused(gateway: &Gateway, token: &str) -> String {
    let reply = send(gateway, token).await;
    let error = reply.assert_error(401, "invalid_token");
    assert!(reply.header("www-authenticate").is_some_and(|h| h.contains("error=\"invalid_token\"")));
    error["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn tokens_verify_with_keys_discovered_from_the_issuer() {
    let idp = Idp::start(vec![rsa("r1")]).await;
    let issuer = idp.issuer();
    let (_echo, _dir, gateway) = serve(&[auth_remote(&issuer, json!({}))], &MODELS).await;
    assert_eq!(idp.jwks_fetches(), 0, "nothing is fetched until a token needs it");

    let valid = token(&issuer, Algorithm::RS256, "r1");
    for _ in 0..5 {
        passes(&gateway, &valid).await;
    }
    // Each request is a fresh instance (PerRequest): they share the set
    // through state, fetched once, with the discovery before it.
    assert_eq!((idp.discovery_fetches(), idp.jwks_fetches()), (1, 1));

    // A kid the IdP does not publish.
    assert_eq!(refused(&gateway, &token(&issuer, Algorithm::RS256, "unknown")).await, "no key with kid \"unknown\"");
    // A forged token: a valid one's payload changed (another subject),
    // the signature kept.
    let (head, rest) = valid.split_once('.').unwrap();
    let (_, signature) = rest.split_once('.').unwrap();
    let mallory = json!({"sub": "mallory", "iss": issuer, "aud": "sluice", "exp": now() + 600});
    let forged = format!("{head}.{}.{signature}", base64_url(&mallory.to_string()));
    assert_eq!(refused(&gateway, &forged).await, "invalid token signature");
    // Signed by a key the IdP never had, under its kid.
    assert_eq!(refused(&gateway, &token(&issuer, Algorithm::ES256, "r1")).await, "no key accepts ES256 tokens");
    // Another issuer's token, though signed with the published key.
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("r1".into());
    let elsewhere = json!({"sub": "alice", "iss": "https://elsewhere.example", "aud": "sluice", "exp": now() + 600});
    let elsewhere =
        jsonwebtoken::encode(&header, &elsewhere, &EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap()).unwrap();
    assert_eq!(refused(&gateway, &elsewhere).await, "token issuer is not accepted");
    passes(&gateway, &valid).await;
}

fn base64_url(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[tokio::test]
async fn a_key_rotated_at_the_idp_is_taken_up_without_a_restart() {
    let idp = Idp::start(vec![rsa("r1")]).await;
    idp.state.max_age.store(2, Ordering::SeqCst);
    let issuer = idp.issuer();
    // Reused instances: each holds the set it saw, and learns of a newer
    // one from shared state.
    let plugin = auth_remote(&issuer, json!({"minRefreshIntervalSeconds": 1, "minCacheSeconds": 1})).reused(4);
    let (_echo, _dir, gateway) = serve(&[plugin], &MODELS).await;
    passes(&gateway, &token(&issuer, Algorithm::RS256, "r1")).await;
    assert_eq!(idp.jwks_fetches(), 1);

    // The IdP adds a key and signs with it: its unknown kid makes the
    // plugin fetch again (once the last fetch is a second old).
    idp.publish(vec![rsa("r1"), ec("e2")]);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    passes(&gateway, &token(&issuer, Algorithm::ES256, "e2")).await;
    passes(&gateway, &token(&issuer, Algorithm::RS256, "r1")).await;
    assert_eq!(idp.jwks_fetches(), 2);

    // It withdraws the old key: once the set expires (max-age=2), tokens
    // naming it fail, and the new key's pass.
    idp.publish(vec![ec("e2")]);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(refused(&gateway, &token(&issuer, Algorithm::RS256, "r1")).await, "no key with kid \"r1\"");
    passes(&gateway, &token(&issuer, Algorithm::ES256, "e2")).await;
    assert_eq!(idp.discovery_fetches(), 1, "the discovered JWKS URL is kept (max-age=3600)");
}

#[tokio::test]
async fn a_flood_of_made_up_kids_fetches_at_most_once_per_interval() {
    const INTERVAL: u64 = 5;
    let idp = Idp::start(vec![rsa("r1")]).await;
    let issuer = idp.issuer();
    let plugin = auth_remote(&issuer, json!({"minRefreshIntervalSeconds": INTERVAL, "minCacheSeconds": INTERVAL}));
    let (_echo, _dir, gateway) = serve(&[plugin], &MODELS).await;
    let valid = token(&issuer, Algorithm::RS256, "r1");
    passes(&gateway, &valid).await;
    assert_eq!(idp.jwks_fetches(), 1);
    // Past the interval, so that the flood may cause one fetch.
    tokio::time::sleep(Duration::from_millis(INTERVAL * 1000 + 200)).await;

    // 400 tokens with made-up kids, 20 at a time: fresh instances in
    // parallel, all sharing one refresh turn per interval.
    let before = idp.jwks_fetches();
    let started = Instant::now();
    for batch in 0..20 {
        let tokens: Vec<String> =
            (0..20).map(|i| token(&issuer, Algorithm::HS256, &format!("made-up-{batch}-{i}"))).collect();
        let replies = futures_util::future::join_all(tokens.iter().map(|t| send(&gateway, t))).await;
        for reply in replies {
            reply.assert_error(401, "invalid_token");
        }
    }
    let elapsed = started.elapsed();
    let fetched = idp.jwks_fetches() - before;
    let allowed = 1 + elapsed.as_secs() / INTERVAL;
    assert!(fetched >= 1, "an unknown kid past the interval refreshes");
    assert!(fetched as u64 <= allowed, "{fetched} JWKS fetches for 400 made-up kids in {elapsed:?}");
    assert_eq!(idp.discovery_fetches(), 1);
    passes(&gateway, &valid).await;
}

#[tokio::test]
async fn inline_keys_serve_while_the_idp_cannot_be_reached() {
    // A granted origin where nothing listens.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let plugin = |name: &str, inline: Option<Vec<Value>>| {
        let mut jwt = json!({"remote": {"jwksUri": format!("{origin}/jwks")}, "issuer": origin, "audience": "sluice"});
        if let Some(keys) = inline {
            jwt["jwks"] = json!({"keys": keys});
        }
        Plugin::new(name, "auth-remote")
            .auth_phase()
            .timeout_ms(2500)
            .egress(json!({"destinations": [{"url": origin}]}))
            .state(json!({}))
            .config(json!({"jwt": jwt}))
    };

    let (_echo, _dir, gateway) = serve(&[plugin("with-inline", Some(vec![rsa("r1")]))], &MODELS).await;
    passes(&gateway, &token(&origin, Algorithm::RS256, "r1")).await;
    assert_eq!(refused(&gateway, &token(&origin, Algorithm::ES256, "e1")).await, "no key with kid \"e1\"");
    drop(gateway);

    // Without inline keys nothing can check a token: 503, to retry, not a
    // 401 that would call the token bad.
    let (_echo, _dir, gateway) = serve(&[plugin("bare", None)], &MODELS).await;
    let reply = send(&gateway, &token(&origin, Algorithm::RS256, "r1")).await;
    reply.assert_error(503, "jwks_unavailable");
    assert_eq!(reply.header("retry-after"), Some("1"));
}

#[tokio::test]
async fn remote_keys_need_auth_remote_and_its_grants() {
    let issuer = "https://idp.example";
    let remote = json!({"jwt": {"remote": {"issuer": issuer}}});
    let grants = |plugin: Plugin, egress: bool, state: bool| {
        let plugin = if egress { plugin.egress(json!({"destinations": [{"url": issuer}]})) } else { plugin };
        if state { plugin.state(json!({})) } else { plugin }
    };
    assert_configs_rejected(vec![
        (Plugin::new("auth-asked-to-fetch", "auth").config(remote.clone()), "needs the auth-remote plugin"),
        (grants(Plugin::new("no-egress", "auth-remote").config(remote.clone()), false, true), "spec.egress"),
        (grants(Plugin::new("no-state", "auth-remote").config(remote.clone()), true, false), "spec.state"),
    ])
    .await;
}

/// plugins/auth-remote/example.yaml loads as written (its module path and
/// upstream pointed at this test's), and its API key passes without any
/// call to the identity provider.
#[tokio::test]
async fn the_example_loads_as_written() {
    let plugins = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins").canonicalize().unwrap();
    let yaml = std::fs::read_to_string(plugins.join("auth-remote/example.yaml")).unwrap();
    let echo = sluice_tests::Echo::start().await;
    let pointed = yaml
        .replace("file: ../dist/", &format!("file: {}/", plugins.join("dist").display()))
        .replace("http://127.0.0.1:9000/v1", &echo.url());
    assert_ne!(pointed, yaml, "example.yaml has the expected module path and upstream");
    let dir = sluice_tests::ConfigDir::new();
    dir.write("example.yaml", &pointed);
    let gateway = Gateway::start(&dir).await;
    let admin = gateway.admin_config().await;
    assert_eq!(admin["errors"], json!([]), "example.yaml has errors: {admin}");
    let hello = |headers: &'static [(&'static str, &'static str)]| {
        gateway.post("/v1/chat/completions", chat_body("gpt-4o-mini").to_string(), headers)
    };
    hello(&[]).await.assert_error(401, "missing_credentials");
    let echoed = hello(&[("x-api-key", "sk-sluice-example-key")]).await.echoed();
    assert_eq!(echoed["headers"]["x-sluice-consumer"], "key:search-service");
}
