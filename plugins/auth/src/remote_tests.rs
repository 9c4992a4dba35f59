//! Keys from the identity provider (`jwt.remote`, the `remote` feature):
//! `testing::on_outbound` stands in for the IdP, the SDK's in-process store
//! for shared state, and a pinned clock for time. Several `Auth` values in
//! one test are several instances of one plugin: they share the store (it
//! is the thread's), not their memory.

use std::cell::RefCell;
use std::rc::Rc;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sluice_plugin_sdk::host::testing::set_now_unix_ms;
use sluice_plugin_sdk::outbound;
use sluice_plugin_sdk::testing::{counter, on_outbound, outbound_requests, request_with_headers, reset_metrics};

use super::*;
use crate::remote::keys::max_age;

const JWKS: &str = include_str!("../testdata/jwks.json");
const RSA_PRIVATE: &str = include_str!("../testdata/rsa-private.pem");
const EC_PRIVATE: &str = include_str!("../testdata/ec-private.pem");
const ISSUER: &str = "https://idp.example";
const DISCOVERY: &str = "https://idp.example/.well-known/openid-configuration";
/// On another host than the issuer, as the discovery document may say.
const JWKS_URI: &str = "https://keys.idp.example/jwks";
/// 2027-01-15T08:00:00Z.
const T0: u64 = 1_800_000_000_000;
const SECOND: u64 = 1000;

/// The testdata RSA key, published as `kid`.
fn rsa(kid: &str) -> Value {
    let mut key = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][0].clone();
    key["kid"] = json!(kid);
    key
}

/// The testdata P-256 key, published as `kid`.
fn ec(kid: &str) -> Value {
    let mut key = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][1].clone();
    key["kid"] = json!(kid);
    key
}

/// A token for alice from the issuer, valid for a year, signed with the
/// testdata key of `alg` and naming `kid`.
fn token(alg: Algorithm, kid: &str) -> String {
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap(),
        _ => EncodingKey::from_secret(&[7; 32]),
    };
    let mut header = Header::new(alg);
    header.kid = Some(kid.to_string());
    let claims = json!({"sub": "alice", "iss": ISSUER, "exp": T0 / 1000 + 365 * 86_400});
    jsonwebtoken::encode(&header, &claims, &key).unwrap()
}

/// What the stand-in identity provider serves.
struct IdpState {
    keys: Vec<Value>,
    /// `Cache-Control` of the JWKS.
    cache_control: Option<String>,
    discovery: Value,
    /// Every call fails to connect.
    down: bool,
    /// The JWKS answers this status, with no body.
    status: Option<u16>,
    /// The JWKS answers this body.
    body: Option<String>,
}

#[derive(Clone)]
struct Idp(Rc<RefCell<IdpState>>);

impl Idp {
    /// Serves `keys` at JWKS_URI (and discovery), `max-age=600`.
    fn serve(keys: Vec<Value>) -> Idp {
        let idp = Idp(Rc::new(RefCell::new(IdpState {
            keys,
            cache_control: Some("public, max-age=600".into()),
            discovery: json!({"issuer": ISSUER, "jwks_uri": JWKS_URI, "id_token_signing_alg_values_supported": ["RS256"]}),
            down: false,
            status: None,
            body: None,
        })));
        let answering = idp.clone();
        on_outbound(move |request| answering.answer(request));
        idp
    }

    fn answer(&self, request: &outbound::Request) -> Result<outbound::Response, outbound::Error> {
        let idp = self.0.borrow();
        if idp.down {
            return Err(outbound::Error::Failed("ConnectionRefused".into()));
        }
        assert_eq!(request.method, "GET");
        let ok = |body: String, headers: Vec<(String, String)>| {
            Ok(outbound::Response { status: 200, headers, body: body.into_bytes() })
        };
        match request.url.as_str() {
            DISCOVERY => ok(idp.discovery.to_string(), vec![("cache-control".into(), "max-age=86400".into())]),
            JWKS_URI => {
                if let Some(status) = idp.status {
                    return Ok(outbound::Response { status, headers: Vec::new(), body: Vec::new() });
                }
                let body = idp.body.clone().unwrap_or_else(|| json!({"keys": idp.keys}).to_string());
                let headers = idp.cache_control.iter().map(|v| ("cache-control".to_string(), v.clone())).collect();
                ok(body, headers)
            }
            _ => Ok(outbound::Response { status: 404, headers: Vec::new(), body: Vec::new() }),
        }
    }

    fn publish(&self, keys: Vec<Value>) {
        self.0.borrow_mut().keys = keys;
    }

    fn set(&self, change: impl FnOnce(&mut IdpState)) {
        change(&mut self.0.borrow_mut());
    }
}

/// Calls made to `url` so far.
fn fetches(url: &str) -> usize {
    outbound_requests().iter().filter(|r| r.url == url).count()
}

fn at(ms: u64) {
    set_now_unix_ms(Some(ms));
}

/// An instance of the plugin configured with `jwt`. Each configures
/// afresh, as each version would (the SDK's stand-in takes one declaration
/// of metrics per thread).
fn instance(jwt: Value) -> Auth {
    reset_metrics();
    sluice_plugin_sdk::configure::<Auth>(&json!({"jwt": jwt}).to_string()).unwrap_or_else(|e| panic!("{e}"))
}

fn by_uri(extra: Value) -> Value {
    let mut remote = json!({"jwksUri": JWKS_URI});
    remote.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    json!({"remote": remote, "issuer": ISSUER})
}

/// The consumer the plugin named, or its error.
fn call(auth: &Auth, token: &str) -> Result<String, ApiError> {
    let bearer = format!("Bearer {token}");
    let req = request_with_headers("gpt", &[("authorization", &bearer)]);
    auth.on_request(&req, &mut ())?;
    Ok(req.headers().get_header("x-sluice-consumer").unwrap_or_default().to_string())
}

fn passes(auth: &Auth, token: &str) {
    assert_eq!(call(auth, token).unwrap_or_else(|e| panic!("{}: {}", e.code, e.message)), "jwt:alice");
}

/// The 401's message.
fn refused(auth: &Auth, token: &str) -> String {
    let error = call(auth, token).expect_err("refused");
    assert_eq!((error.status, error.code.as_str()), (401, "invalid_token"), "{}", error.message);
    error.message
}

#[test]
fn discovery_finds_the_jwks_and_its_issuer_is_the_one_accepted() {
    at(T0);
    let _idp = Idp::serve(vec![rsa("r1")]);
    let auth = instance(json!({"remote": {"issuer": ISSUER}}));
    assert!(outbound_requests().is_empty(), "configure fetches nothing: it is snapshotted");
    passes(&auth, &token(Algorithm::RS256, "r1"));
    let urls: Vec<String> = outbound_requests().into_iter().map(|r| r.url).collect();
    assert_eq!(urls, [DISCOVERY, JWKS_URI], "discovery, then the JWKS it names");
    let sent = &outbound_requests()[1];
    assert_eq!((sent.timeout_ms, sent.max_response_bytes), (Some(1000), 64 * 1024));

    // `iss` must be the discovered issuer, as `jwt.issuer` was not given.
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("r1".into());
    let other = json!({"sub": "alice", "iss": "https://elsewhere.example", "exp": T0 / 1000 + 60});
    let other = jsonwebtoken::encode(&header, &other, &EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap());
    assert_eq!(refused(&auth, &other.unwrap()), "token issuer is not accepted");
    assert_eq!(outbound_requests().len(), 2, "a cached set needs no call");
}

#[test]
fn a_discovery_document_for_another_issuer_is_not_followed() {
    at(T0);
    let idp = Idp::serve(vec![rsa("r1")]);
    idp.set(|idp| idp.discovery["issuer"] = json!("https://impostor.example"));
    let auth = instance(json!({"remote": {"issuer": ISSUER}}));
    let error = call(&auth, &token(Algorithm::RS256, "r1")).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (503, "jwks_unavailable"), "{}", error.message);
    assert_eq!(error.headers, [("retry-after".to_string(), "1".to_string())]);
    assert_eq!(fetches(JWKS_URI), 0);
    assert_eq!(counter("auth_jwks_refreshes", &["failed"]), 1);
}

#[test]
fn the_discovered_uri_is_kept_and_found_again_when_it_moves() {
    at(T0);
    let idp = Idp::serve(vec![rsa("r1")]);
    idp.set(|idp| idp.cache_control = Some("max-age=60".into()));
    let auth = instance(json!({"remote": {"issuer": ISSUER, "minRefreshIntervalSeconds": 10}}));
    passes(&auth, &token(Algorithm::RS256, "r1"));
    // The set expires; the JWKS is fetched again, discovery is not.
    at(T0 + 61 * SECOND);
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert_eq!((fetches(DISCOVERY), fetches(JWKS_URI)), (1, 2));
    // The JWKS is gone from its URL: the next refresh discovers again.
    idp.set(|idp| idp.status = Some(404));
    at(T0 + 122 * SECOND);
    passes(&auth, &token(Algorithm::RS256, "r1")); // the expired set, while fetching fails
    idp.set(|idp| idp.status = None);
    at(T0 + 133 * SECOND);
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert_eq!((fetches(DISCOVERY), fetches(JWKS_URI)), (2, 4));
}

#[test]
fn cache_control_max_age_is_honoured_within_the_floor_and_the_ceiling() {
    let r1 = token(Algorithm::RS256, "r1");
    for (i, (cache_control, fresh_seconds)) in [
        (Some("public, max-age=600"), 600),
        (Some("max-age=5"), 60),                  // the floor: minCacheSeconds
        (Some("max-age=31536000"), 3600),         // the ceiling: maxCacheSeconds
        (Some("no-cache"), 60),                   // asked not to cache: the floor
        (None, 60),                               // nothing said: the floor
        (Some("max-age=600, s-maxage=900"), 900), // a shared cache's own
    ]
    .into_iter()
    .enumerate()
    {
        // Each case 8 days after the last, when what it left in shared
        // state has expired.
        let t0 = T0 + i as u64 * 8 * 86_400 * SECOND;
        at(t0);
        let idp = Idp::serve(vec![rsa("r1")]);
        idp.set(|idp| idp.cache_control = cache_control.map(str::to_string));
        let auth = instance(by_uri(json!({})));
        let before = fetches(JWKS_URI);
        passes(&auth, &r1);
        at(t0 + (fresh_seconds - 1) * SECOND);
        passes(&auth, &r1);
        assert_eq!(fetches(JWKS_URI), before + 1, "{cache_control:?}: still fresh");
        at(t0 + fresh_seconds * SECOND);
        passes(&auth, &r1);
        assert_eq!(fetches(JWKS_URI), before + 2, "{cache_control:?}: expired at {fresh_seconds} s");
    }
}

#[test]
fn max_age_reads_cache_control_as_a_shared_cache() {
    let headers = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    };
    assert_eq!(max_age(&headers(&[("Cache-Control", "public, max-age=300, must-revalidate")])), Some(300));
    assert_eq!(max_age(&headers(&[("cache-control", "MAX-AGE=\"120\"")])), Some(120));
    assert_eq!(max_age(&headers(&[("cache-control", "max-age=300"), ("age", "100")])), Some(200));
    assert_eq!(max_age(&headers(&[("cache-control", "max-age=300"), ("age", "400")])), Some(0));
    assert_eq!(
        max_age(&headers(&[("cache-control", "private"), ("cache-control", "s-maxage=50, max-age=9")])),
        Some(50)
    );
    assert_eq!(max_age(&headers(&[("cache-control", "max-age=300, no-store")])), Some(0));
    assert_eq!(max_age(&headers(&[("cache-control", "max-age=soon")])), Some(0));
    assert_eq!(max_age(&headers(&[("cache-control", "public")])), None);
    assert_eq!(max_age(&headers(&[("expires", "Thu, 01 Dec 2094 16:00:00 GMT")])), None);
}

#[test]
fn an_unknown_kid_refreshes_and_rotation_is_picked_up_without_a_restart() {
    at(T0);
    let idp = Idp::serve(vec![rsa("r1")]);
    let auth = instance(by_uri(json!({"minRefreshIntervalSeconds": 30})));
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert_eq!(fetches(JWKS_URI), 1);

    // The IdP publishes a new key and signs with it. Within the interval of
    // the last fetch the plugin may not fetch: the new kid is unknown.
    idp.publish(vec![rsa("r1"), ec("e2")]);
    at(T0 + 10 * SECOND);
    assert_eq!(refused(&auth, &token(Algorithm::ES256, "e2")), "no key with kid \"e2\"");
    assert_eq!(fetches(JWKS_URI), 1);
    assert_eq!(counter("auth_jwks_refreshes", &["limited"]), 1);
    // Past it, the unknown kid fetches the set, long before it expires.
    at(T0 + 31 * SECOND);
    passes(&auth, &token(Algorithm::ES256, "e2"));
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert_eq!(fetches(JWKS_URI), 2);

    // The old key is withdrawn. A token naming it finds the held set has
    // it, until the set expires (max-age=600).
    idp.publish(vec![ec("e2")]);
    at(T0 + 62 * SECOND);
    passes(&auth, &token(Algorithm::RS256, "r1"));
    at(T0 + 31 * SECOND + 600 * SECOND);
    assert_eq!(refused(&auth, &token(Algorithm::RS256, "r1")), "no key with kid \"r1\"");
    passes(&auth, &token(Algorithm::ES256, "e2"));
    assert_eq!(fetches(JWKS_URI), 3);

    // A key rotated in under a kid it already had (the same kid, another
    // key) is picked up when the set expires.
    idp.publish(vec![rsa("e2")]);
    at(T0 + 31 * SECOND + 1200 * SECOND);
    passes(&auth, &token(Algorithm::RS256, "e2"));
    assert!(refused(&auth, &token(Algorithm::ES256, "e2")).contains("no key accepts ES256 tokens"));
}

#[test]
fn a_flood_of_made_up_kids_fetches_once_per_interval_across_instances() {
    at(T0);
    let _idp = Idp::serve(vec![rsa("r1")]);
    let config = by_uri(json!({"minRefreshIntervalSeconds": 30}));
    let instances: Vec<Auth> = (0..4).map(|_| instance(config.clone())).collect();
    passes(&instances[0], &token(Algorithm::RS256, "r1"));
    // The other instances read the set the first one fetched.
    for auth in &instances[1..] {
        passes(auth, &token(Algorithm::RS256, "r1"));
    }
    assert_eq!(fetches(JWKS_URI), 1);

    // 2000 tokens with made-up kids over 100 s, spread over the instances:
    // one refresh per 30 s at most (at 30, 60 and 90 s), whichever
    // instance asks. (HS256: the kid is looked up before any signature,
    // and an RSA signature per token would make this test slow.)
    let start = T0 + 5 * SECOND;
    for i in 0..2000u64 {
        at(start + i * 50);
        let kid = format!("made-up-{i}");
        let message = refused(&instances[i as usize % 4], &token(Algorithm::HS256, &kid));
        assert_eq!(message, format!("no key with kid {kid:?}"));
    }
    assert_eq!(counter("auth_jwks_refreshes", &["limited"]), 2000 - 3);
    assert_eq!(fetches(JWKS_URI), 4, "the warm-up's fetch, then one per 30 s (at 30, 60 and 90 s)");
    // The valid token never stopped passing, on any instance.
    for auth in &instances {
        passes(auth, &token(Algorithm::RS256, "r1"));
    }
}

#[test]
fn inline_keys_are_the_fallback_while_the_idp_is_unreachable() {
    at(T0);
    let idp = Idp::serve(vec![ec("e1")]);
    idp.set(|idp| idp.down = true);
    let with_inline = json!({"remote": {"jwksUri": JWKS_URI, "minRefreshIntervalSeconds": 10,
        "staleIfErrorSeconds": 3600}, "jwks": {"keys": [rsa("r1")]}, "issuer": ISSUER});
    let auth = instance(with_inline.clone());
    // Down from the start: the inline key serves, and nothing else does.
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert_eq!(refused(&auth, &token(Algorithm::ES256, "e1")), "no key with kid \"e1\"");
    assert_eq!(fetches(JWKS_URI), 1, "one try per interval, not one per token");

    // Without inline keys, nothing can be checked: 503, not a 401 that
    // would tell the client its token is bad.
    let bare = instance(by_uri(json!({})));
    let error = call(&bare, &token(Algorithm::RS256, "r1")).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (503, "jwks_unavailable"));

    // Up again (past the interval): the remote set is fresh, and the inline
    // key is no longer accepted: it is a fallback, not a second issuer.
    idp.set(|idp| idp.down = false);
    at(T0 + 11 * SECOND);
    passes(&auth, &token(Algorithm::ES256, "e1"));
    assert_eq!(refused(&auth, &token(Algorithm::RS256, "r1")), "no key with kid \"r1\"");

    // Down once the set expired (max-age=600): the expired set still
    // serves, for staleIfErrorSeconds, and the inline key with it.
    idp.set(|idp| idp.down = true);
    at(T0 + 11 * SECOND + 600 * SECOND);
    passes(&auth, &token(Algorithm::ES256, "e1"));
    passes(&auth, &token(Algorithm::RS256, "r1"));
    // A fresh instance (PerRequest) has it from shared state.
    let fresh = instance(with_inline.clone());
    passes(&fresh, &token(Algorithm::ES256, "e1"));
    // Past that, only the inline key.
    at(T0 + 11 * SECOND + 600 * SECOND + 3600 * SECOND);
    assert_eq!(refused(&auth, &token(Algorithm::ES256, "e1")), "no key with kid \"e1\"");
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert!(counter("auth_jwks_refreshes", &["failed"]) >= 1);
}

#[test]
fn bad_answers_are_failed_fetches_and_secret_keys_are_never_taken() {
    let hs = json!({"kty": "oct", "kid": "h1", "k": "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"});
    type Answer = Box<dyn Fn(&mut IdpState)>;
    let cases: [(&str, Answer); 5] = [
        ("an error status", Box::new(|idp| idp.status = Some(500))),
        ("not JSON", Box::new(|idp| idp.body = Some("<html>".into()))),
        ("no keys", Box::new(|idp| idp.body = Some(r#"{"keys": "none"}"#.into()))),
        ("only a secret", Box::new(move |idp| idp.keys = vec![hs.clone()])),
        ("too large", Box::new(|idp| idp.body = Some(format!(r#"{{"keys": [], "pad": "{}"}}"#, "x".repeat(65536))))),
    ];
    for (i, (what, answer)) in cases.into_iter().enumerate() {
        // A minute apart: each may fetch.
        at(T0 + i as u64 * 60 * SECOND);
        let idp = Idp::serve(vec![rsa("r1")]);
        idp.set(answer);
        let auth = instance(by_uri(json!({})));
        let error = call(&auth, &token(Algorithm::RS256, "r1")).unwrap_err();
        assert_eq!((error.status, error.code.as_str()), (503, "jwks_unavailable"), "{what}");
    }
    assert_eq!(fetches(JWKS_URI), 5);

    // A secret beside a public key: the public key serves, the secret is
    // left out, so a token "signed" with what anyone can read fails.
    at(T0 + 3600 * SECOND);
    let _idp = Idp::serve(vec![
        json!({"kty": "oct", "kid": "h1", "k": "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"}),
        rsa("r1"),
        json!({"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"}),
    ]);
    let auth = instance(by_uri(json!({})));
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert_eq!(refused(&auth, &token(Algorithm::HS256, "h1")), "no key with kid \"h1\"");
}

#[test]
fn another_source_does_not_see_the_old_ones_keys() {
    at(T0);
    let _idp = Idp::serve(vec![rsa("r1")]);
    passes(&instance(by_uri(json!({}))), &token(Algorithm::RS256, "r1"));
    // The same plugin, reconfigured for another URL (its keys' state is the
    // plugin's): it fetches its own set instead of trusting the old one.
    let elsewhere = instance(json!({"remote": {"jwksUri": "https://other.example/jwks"}}));
    let error = call(&elsewhere, &token(Algorithm::RS256, "r1")).unwrap_err();
    assert_eq!(error.status, 503, "{}", error.message);
    assert_eq!(fetches("https://other.example/jwks"), 1);
}

#[test]
fn api_keys_and_inline_only_configs_make_no_outbound_call() {
    at(T0);
    let _idp = Idp::serve(vec![rsa("r1")]);
    let auth = instance(json!({"jwks": {"keys": [rsa("r1")]}}));
    passes(&auth, &token(Algorithm::RS256, "r1"));
    assert!(outbound_requests().is_empty());
}

#[test]
fn bad_remote_configs_are_refused() {
    let error = |remote: Value| {
        reset_metrics();
        sluice_plugin_sdk::configure::<Auth>(&json!({"jwt": {"remote": remote}}).to_string()).err().unwrap()
    };
    let both = error(json!({"jwksUri": JWKS_URI, "issuer": ISSUER}));
    assert!(both.starts_with("auth-remote: jwt.remote: give `jwksUri` or `issuer`, not both"), "{both}");
    assert!(error(json!({})).contains("give `jwksUri`, or `issuer`"));
    assert!(error(json!({"jwksUri": "ftp://idp/keys"})).contains("jwt.remote.jwksUri: not an http(s) URL"));
    assert!(error(json!({"jwksUri": "https://user:pw@idp/keys"})).contains("credentials in the URL"));
    assert!(error(json!({"jwksUri": "https:///keys"})).contains("no host"));
    assert!(error(json!({"issuer": "https://idp.example/?tenant=1"})).contains("no query or fragment"));
    assert!(error(json!({"issuer": ISSUER, "timeoutMs": 0})).contains("timeoutMs: must be from 1 to 60000"));
    let interval = error(json!({"issuer": ISSUER, "minRefreshIntervalSeconds": 0}));
    assert!(interval.contains("minRefreshIntervalSeconds: must be at least 1"), "{interval}");
    let floor = error(json!({"issuer": ISSUER, "minCacheSeconds": 10}));
    assert!(floor.contains("minCacheSeconds: must be at least minRefreshIntervalSeconds"), "{floor}");
    let ceiling = error(json!({"issuer": ISSUER, "maxCacheSeconds": 30}));
    assert!(ceiling.contains("maxCacheSeconds: must be at least minCacheSeconds"), "{ceiling}");
    assert!(error(json!({"issuer": ISSUER, "staleIfErrorSeconds": 700_000})).contains("at most 604800"));
    assert!(error(json!({"issuer": ISSUER, "cacheSeconds": 5})).contains("unknown field `cacheSeconds`"));
}
