//! The auth plugin through the real gateway: API keys and JWTs accepted,
//! every kind of bad credential refused with 401, disallowed access with
//! 403, the client's credential never forwarded, and the headers the plugin
//! owns never taken from the client.

use crate::plugin_support as support;

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use sluice_tests::{Gateway, Plugin, chat_body};
use support::{assert_configs_rejected, serve};

const JWKS: &str = include_str!("../../plugins/auth/testdata/jwks.json");
const RSA_PRIVATE: &str = include_str!("../../plugins/auth/testdata/rsa-private.pem");
const RSA_PUBLIC: &str = include_str!("../../plugins/auth/testdata/rsa-public.pem");
const EC_PRIVATE: &str = include_str!("../../plugins/auth/testdata/ec-private.pem");
const EC384_PRIVATE: &str = include_str!("../../plugins/auth/testdata/ec384-private.pem");
const ED25519_PRIVATE: &str = include_str!("../../plugins/auth/testdata/ed25519-private.pem");
/// Public keys of every algorithm (`kid` its name).
const JWKS_EVERY_ALGORITHM: &str = include_str!("../../plugins/auth/testdata/jwks-every-algorithm.json");
const HS_SECRET: &[u8] = b"an e2e shared secret, 32 bytes or more";
/// The API key clients send; the config holds only its SHA-256.
const API_KEY: &str = "sk-e2e-team-search";

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn sha256_hex(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn jwt_config() -> Value {
    let mut jwks: Value = serde_json::from_str(JWKS).unwrap();
    jwks["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kty": "oct", "kid": "hs-1", "k": URL_SAFE_NO_PAD.encode(HS_SECRET)}));
    json!({
        "jwks": jwks,
        "issuer": "https://idp.example",
        "audience": "sluice",
        "leewaySeconds": 5,
        "requiredScopes": ["llm.invoke"],
        "claimHeaders": {"x-tenant": "org.id"}
    })
}

fn auth_plugin() -> Plugin {
    Plugin::new("auth", "auth").auth_phase().config(json!({
        "apiKeys": [
            {"consumer": "someone-else", "sha256": sha256_hex("another key")},
            {"consumer": "team-search", "sha256": sha256_hex(API_KEY)}
        ],
        "jwt": jwt_config(),
        "allowedModels": {"key:team-search": ["gpt-test"], "*": ["gpt-test", "gpt-test-large"]}
    }))
}

const MODELS: [&str; 3] = ["gpt-test", "gpt-test-large", "o-test"];

async fn gateway() -> (impl Sized, Gateway) {
    let (echo, dir, gateway) = serve(&[auth_plugin()], &MODELS).await;
    ((echo, dir), gateway)
}

fn claims() -> Value {
    json!({"sub": "alice", "iss": "https://idp.example", "aud": "sluice", "exp": now() + 300,
        "nbf": now() - 5, "scope": "llm.invoke profile", "org": {"id": "acme"}})
}

fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let key = match alg {
        Algorithm::RS256 => EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap(),
        Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap(),
        _ => EncodingKey::from_secret(HS_SECRET),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn with(key: &str, value: Value) -> Value {
    let mut claims = claims();
    claims[key] = value;
    claims
}

async fn send(gateway: &Gateway, model: &str, headers: &[(&str, &str)]) -> sluice_tests::Reply {
    gateway.post("/v1/chat/completions", chat_body(model).to_string(), headers).await
}

#[tokio::test]
async fn api_keys_pass_without_their_credential_and_with_the_consumer() {
    let (_keep, gateway) = gateway().await;
    let bearer = format!("Bearer {API_KEY}");
    for headers in [vec![("authorization", bearer.as_str())], vec![("x-api-key", API_KEY)]] {
        // A client cannot name itself: its own consumer header is replaced.
        let mut headers = headers.clone();
        headers.push(("x-sluice-consumer", "admin"));
        let echoed = send(&gateway, "gpt-test", &headers).await.echoed();
        let upstream = &echoed["headers"];
        assert_eq!(upstream["x-sluice-consumer"], "key:team-search", "{echoed}");
        assert!(upstream.get("authorization").is_none(), "the credential was forwarded: {upstream}");
        assert!(upstream.get("x-api-key").is_none(), "the credential was forwarded: {upstream}");
    }
}

#[tokio::test]
async fn missing_or_wrong_credentials_are_401_with_a_challenge() {
    let (_keep, gateway) = gateway().await;
    let missing = send(&gateway, "gpt-test", &[]).await;
    missing.assert_error(401, "missing_credentials");
    assert_eq!(missing.header("www-authenticate"), Some("Bearer realm=\"sluice\""));
    assert_eq!(missing.json()["error"]["type"], "authentication_error");

    for headers in [
        vec![("authorization", "Bearer sk-e2e-team-searcH")],
        vec![("x-api-key", "sk-e2e-team-search2")],
        vec![("authorization", "Bearer ")],
    ] {
        let reply = send(&gateway, "gpt-test", &headers).await;
        reply.assert_error(401, "invalid_api_key");
        assert!(reply.header("www-authenticate").unwrap().contains("error=\"invalid_token\""), "{headers:?}");
    }
    let basic = send(&gateway, "gpt-test", &[("authorization", "Basic dXNlcjpwYXNz")]).await;
    basic.assert_error(401, "invalid_authorization");
}

#[tokio::test]
async fn jwts_of_each_algorithm_pass_with_claims_mapped() {
    let (_keep, gateway) = gateway().await;
    for (alg, kid) in [(Algorithm::RS256, Some("rsa-1")), (Algorithm::ES256, Some("ec-1")), (Algorithm::HS256, None)] {
        let bearer = format!("Bearer {}", sign(alg, kid, &claims()));
        let echoed =
            send(&gateway, "gpt-test-large", &[("authorization", &bearer), ("x-tenant", "spoofed")]).await.echoed();
        let upstream = &echoed["headers"];
        assert_eq!(upstream["x-sluice-consumer"], "jwt:alice", "{alg:?}: {upstream}");
        assert_eq!(upstream["x-tenant"], "acme", "{alg:?}: the claim replaces the client's header");
        assert!(upstream.get("authorization").is_none(), "{alg:?}: the token was forwarded");
    }
    // A token without the mapped claim removes a client-sent header.
    let mut no_org = claims();
    no_org.as_object_mut().unwrap().remove("org");
    let bearer = format!("Bearer {}", sign(Algorithm::RS256, Some("rsa-1"), &no_org));
    let echoed = send(&gateway, "gpt-test", &[("authorization", &bearer), ("x-tenant", "spoofed")]).await.echoed();
    assert!(echoed["headers"].get("x-tenant").is_none(), "{echoed}");
}

/// The private half of testdata/jwks-every-algorithm.json's public key `kid`.
fn signer(kid: &str) -> (Algorithm, EncodingKey) {
    let alg: Algorithm = kid.parse().unwrap();
    let key = match alg {
        Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()),
        Algorithm::ES384 => EncodingKey::from_ec_pem(EC384_PRIVATE.as_bytes()),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(ED25519_PRIVATE.as_bytes()),
        _ => EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()),
    };
    (alg, key.unwrap())
}

/// The public-key algorithms are checked by the gateway (ring, through
/// `sluice:plugin/crypto`); the tokens are jsonwebtoken's (RustCrypto).
#[tokio::test]
async fn every_public_key_algorithm_is_verified_by_the_gateway() {
    let jwks: Value = serde_json::from_str(JWKS_EVERY_ALGORITHM).unwrap();
    let keys: Vec<Value> = jwks["keys"].as_array().unwrap().iter().filter(|key| key["kty"] != "oct").cloned().collect();
    let signers: Vec<(Algorithm, EncodingKey)> = keys.iter().map(|key| signer(key["kid"].as_str().unwrap())).collect();
    let plugin = Plugin::new("auth", "auth").auth_phase().config(json!({"jwt": {"jwks": {"keys": keys}}}));
    let (_echo, _dir, gateway) = serve(&[plugin], &MODELS).await;
    for (alg, key) in &signers {
        let mut header = Header::new(*alg);
        header.kid = Some(format!("{alg:?}"));
        let token = jsonwebtoken::encode(&header, &claims(), key).unwrap();
        let echoed = send(&gateway, "gpt-test", &[("authorization", &format!("Bearer {token}"))]).await.echoed();
        assert_eq!(echoed["headers"]["x-sluice-consumer"], "jwt:alice", "{alg:?}");

        let (signed, signature) = token.rsplit_once('.').unwrap();
        let mut signature = URL_SAFE_NO_PAD.decode(signature).unwrap();
        signature[7] ^= 0x20;
        let changed = format!("Bearer {signed}.{}", URL_SAFE_NO_PAD.encode(&signature));
        let reply = send(&gateway, "gpt-test", &[("authorization", &changed)]).await;
        let error = reply.assert_error(401, "invalid_token");
        assert_eq!(error["message"], "invalid token signature", "{alg:?}");
    }
}

#[tokio::test]
async fn every_kind_of_bad_token_is_401() {
    let (_keep, gateway) = gateway().await;
    let rs = |claims: &Value| sign(Algorithm::RS256, Some("rsa-1"), claims);
    let good = rs(&claims());
    let parts: Vec<&str> = good.split('.').collect();
    let mut tampered_signature = parts[2].as_bytes().to_vec();
    tampered_signature[5] = if tampered_signature[5] == b'x' { b'y' } else { b'x' };
    let forged_claims = URL_SAFE_NO_PAD.encode(with("sub", json!("mallory")).to_string());
    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    // HS256 keyed with the RSA public key's PEM bytes: algorithm confusion.
    let confused = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims(),
        &EncodingKey::from_secret(RSA_PUBLIC.as_bytes()),
    )
    .unwrap();
    let mut confused_with_kid = Header::new(Algorithm::HS256);
    confused_with_kid.kid = Some("rsa-1".into());
    let confused_with_kid =
        jsonwebtoken::encode(&confused_with_kid, &claims(), &EncodingKey::from_secret(RSA_PUBLIC.as_bytes())).unwrap();

    let cases = [
        ("expired", rs(&with("exp", json!(now() - 60))), "token has expired"),
        ("not yet valid", rs(&with("nbf", json!(now() + 60))), "token is not valid yet"),
        ("wrong audience", rs(&with("aud", json!("someone-else"))), "token audience is not accepted"),
        ("wrong issuer", rs(&with("iss", json!("https://evil.example"))), "token issuer is not accepted"),
        (
            "bad signature",
            format!("{}.{}.{}", parts[0], parts[1], String::from_utf8(tampered_signature).unwrap()),
            "invalid token signature",
        ),
        ("forged claims", format!("{}.{forged_claims}.{}", parts[0], parts[2]), "invalid token signature"),
        ("alg none", format!("{none_header}.{}.", parts[1]), "alg none"),
        ("HS256 signed with the RSA public key", confused, "invalid token signature"),
        ("HS256 naming the RSA key", confused_with_kid, "no key accepts HS256 tokens"),
        ("unknown kid", sign(Algorithm::RS256, Some("rsa-2"), &claims()), "no key with kid"),
    ];
    for (what, token, message) in cases {
        let bearer = format!("Bearer {token}");
        let reply = send(&gateway, "gpt-test", &[("authorization", &bearer)]).await;
        let error = reply.assert_error(401, "invalid_token");
        assert!(error["message"].as_str().unwrap().contains(message), "{what}: {error}");
        assert!(reply.header("www-authenticate").unwrap().contains("error=\"invalid_token\""), "{what}");
    }
    // The same token, untouched, passes: the cases above failed for their defect.
    assert_eq!(send(&gateway, "gpt-test", &[("authorization", &format!("Bearer {good}"))]).await.status, 200);
}

#[tokio::test]
async fn valid_credentials_without_access_are_403() {
    let (_keep, gateway) = gateway().await;
    let error =
        send(&gateway, "gpt-test-large", &[("x-api-key", API_KEY)]).await.assert_error(403, "model_not_allowed");
    assert_eq!(error["message"], "consumer \"key:team-search\" may not use model \"gpt-test-large\"");
    assert_eq!(error["type"], "permission_error");

    let bearer = format!("Bearer {}", sign(Algorithm::ES256, Some("ec-1"), &claims()));
    send(&gateway, "o-test", &[("authorization", &bearer)]).await.assert_error(403, "model_not_allowed");

    let bearer = format!("Bearer {}", sign(Algorithm::ES256, Some("ec-1"), &with("scope", json!("profile"))));
    let reply = send(&gateway, "gpt-test", &[("authorization", &bearer)]).await;
    reply.assert_error(403, "insufficient_scope");
    assert!(reply.header("www-authenticate").unwrap().contains("scope=\"llm.invoke\""));
}

#[tokio::test]
async fn bad_auth_configs_are_refused_at_load() {
    let jwks: Value = serde_json::from_str(JWKS).unwrap();
    let mut rsa_as_hmac = jwks["keys"][0].clone();
    rsa_as_hmac["alg"] = json!("HS256");
    assert_configs_rejected(vec![
        (Plugin::new("auth-empty", "auth").config(json!({})), "configure `apiKeys`, `jwt` or both"),
        (
            Plugin::new("auth-bad-hash", "auth").config(json!({"apiKeys": [{"consumer": "a", "sha256": "plain-key"}]})),
            "64 hex digits",
        ),
        (
            Plugin::new("auth-confused-key", "auth").config(json!({"jwt": {"jwks": {"keys": [rsa_as_hmac]}}})),
            // The alg is a config value: the gateway cuts config values out
            // of config errors (one may be a Secret's), so only the rest is
            // named.
            "jwt.jwks.keys[0]: alg [redacted] does not fit",
        ),
        // A name without its namespace would match no one, leaving that
        // consumer to "*" (or to every model): refused, not ignored.
        (
            Plugin::new("auth-bare-consumer", "auth").config(json!({
                "apiKeys": [{"consumer": "team-search", "sha256": sha256_hex(API_KEY)}],
                "allowedModels": {"team-search": ["gpt-test"]}
            })),
            "must be \"*\", \"key:<consumer>\" or \"jwt:<subject>\"",
        ),
    ])
    .await;
}

/// The consumer header and every claim header belong to the auth plugin
/// (docs/security.md, T8). Whatever the client authenticated with, its own
/// values of them never reach the upstream; only values from the verified
/// key or token do.
#[tokio::test]
async fn a_client_cannot_set_the_headers_the_auth_plugin_owns() {
    let (_keep, gateway) = gateway().await;
    let api_key_bearer = format!("Bearer {API_KEY}");
    let mut no_org = claims();
    no_org.as_object_mut().unwrap().remove("org");
    let no_org_bearer = format!("Bearer {}", sign(Algorithm::RS256, Some("rsa-1"), &no_org));
    let cases = [
        ("bearer API key", ("authorization", api_key_bearer.as_str()), "key:team-search"),
        ("x-api-key", ("x-api-key", API_KEY), "key:team-search"),
        ("JWT without the tenant claim", ("authorization", no_org_bearer.as_str()), "jwt:alice"),
    ];
    for (what, credential, consumer) in cases {
        let headers = [credential, ("X-Sluice-Consumer", "admin"), ("x-tenant", "spoofed"), ("X-Tenant", "spoofed-2")];
        let echoed = send(&gateway, "gpt-test", &headers).await.echoed();
        let upstream = &echoed["headers"];
        assert!(upstream.get("x-tenant").is_none(), "{what}: the client's x-tenant reached the upstream: {upstream}");
        assert_eq!(upstream["x-sluice-consumer"], consumer, "{what}: {upstream}");
    }
}

/// An API key's consumer "alice" and a token whose subject is "alice" are
/// different callers: the upstream sees `key:alice` and `jwt:alice`, and
/// each has its own `allowedModels` entry.
#[tokio::test]
async fn an_api_key_consumer_and_a_token_subject_of_the_same_name_are_different_consumers() {
    let auth = Plugin::new("auth", "auth").auth_phase().config(json!({
        "apiKeys": [{"consumer": "alice", "sha256": sha256_hex(API_KEY)}],
        "jwt": jwt_config(),
        "allowedModels": {"key:alice": ["gpt-test"], "jwt:alice": ["gpt-test-large"]}
    }));
    let (_echo, _dir, gateway) = serve(&[auth], &MODELS).await;
    let key = [("x-api-key", API_KEY)];
    let token = format!("Bearer {}", sign(Algorithm::ES256, Some("ec-1"), &claims()));
    let token = [("authorization", token.as_str())];

    let echoed = send(&gateway, "gpt-test", &key).await.echoed();
    assert_eq!(echoed["headers"]["x-sluice-consumer"], "key:alice", "{echoed}");
    let echoed = send(&gateway, "gpt-test-large", &token).await.echoed();
    assert_eq!(echoed["headers"]["x-sluice-consumer"], "jwt:alice", "{echoed}");

    // Neither gets the other's models.
    let error = send(&gateway, "gpt-test-large", &key).await.assert_error(403, "model_not_allowed");
    assert_eq!(error["message"], "consumer \"key:alice\" may not use model \"gpt-test-large\"");
    let error = send(&gateway, "gpt-test", &token).await.assert_error(403, "model_not_allowed");
    assert_eq!(error["message"], "consumer \"jwt:alice\" may not use model \"gpt-test\"");
}
