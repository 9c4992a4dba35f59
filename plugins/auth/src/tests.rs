use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use sluice_plugin_sdk::host::testing::set_now_unix_ms;
use sluice_plugin_sdk::testing::request_with_headers;

use super::*;

const JWKS: &str = include_str!("../testdata/jwks.json");
const RSA_PRIVATE: &str = include_str!("../testdata/rsa-private.pem");
const RSA_PUBLIC: &str = include_str!("../testdata/rsa-public.pem");
const EC_PRIVATE: &str = include_str!("../testdata/ec-private.pem");
const EC384_PRIVATE: &str = include_str!("../testdata/ec384-private.pem");
const ED25519_PRIVATE: &str = include_str!("../testdata/ed25519-private.pem");
/// Public keys of every algorithm; the HMAC ones are 64 bytes of 7.
const JWKS_EVERY_ALGORITHM: &str = include_str!("../testdata/jwks-every-algorithm.json");
const NOW: u64 = 1_800_000_000;
/// "hunter2" hashed.
const KEY_HASH: &str = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
const HS_SECRET: &[u8] = b"a shared secret of at least 32 bytes!!";

fn auth(config: Value) -> Auth {
    set_now_unix_ms(Some(NOW * 1000));
    sluice_plugin_sdk::configure::<Auth>(&config.to_string()).unwrap_or_else(|e| panic!("{e}"))
}

fn jwt_config() -> Value {
    let mut jwks: Value = serde_json::from_str(JWKS).unwrap();
    jwks["keys"]
        .as_array_mut()
        .unwrap()
        .push(json!({"kty": "oct", "kid": "hs-1", "k": URL_SAFE_NO_PAD.encode(HS_SECRET)}));
    json!({"jwt": {"jwks": jwks, "issuer": "https://idp.example", "audience": ["sluice", "other"],
        "claimHeaders": {"x-tenant": "org.id", "x-groups": "groups"}}})
}

fn claims() -> Value {
    json!({"sub": "alice", "iss": "https://idp.example", "aud": "sluice", "exp": NOW + 300, "nbf": NOW - 10,
        "org": {"id": "acme"}, "groups": ["a", "b"], "scope": "chat:write models:read"})
}

fn sign(alg: jsonwebtoken::Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let key = match alg {
        jsonwebtoken::Algorithm::RS256 => EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap(),
        jsonwebtoken::Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap(),
        _ => EncodingKey::from_secret(HS_SECRET),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn bearer(token: &str) -> Vec<(String, String)> {
    vec![("authorization".into(), format!("Bearer {token}"))]
}

/// The headers the upstream gets once the hook ran, or the error.
fn call(auth: &Auth, model: &str, headers: &[(String, String)]) -> Result<Vec<(String, String)>, ApiError> {
    set_now_unix_ms(Some(NOW * 1000));
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let req = request_with_headers(model, &headers);
    assert_eq!(auth.on_request(&req, &mut ())?, Action::Continue);
    Ok(req.headers())
}

fn rejected(auth: &Auth, headers: &[(String, String)]) -> ApiError {
    call(auth, "gpt", headers).expect_err("rejected")
}

#[test]
fn the_test_key_hash_is_right() {
    assert_eq!(parse_sha256(KEY_HASH), Some(Sha256::digest(b"hunter2").into()));
}

#[test]
fn hashes_differing_in_any_one_bit_are_not_the_same() {
    let hash: [u8; 32] = Sha256::digest(b"hunter2").into();
    assert!(bool::from(same_hash(&hash, &hash)));
    for bit in 0..256 {
        let mut other = hash;
        other[bit / 8] ^= 1 << (bit % 8);
        assert!(!bool::from(same_hash(&hash, &other)), "bit {bit}");
        assert!(!bool::from(same_hash(&other, &hash)), "bit {bit}");
    }
}

#[test]
fn api_keys_authenticate_by_bearer_or_x_api_key_and_are_stripped() {
    let auth = auth(json!({"apiKeys": [{"consumer": "team-a", "sha256": "00".repeat(32)},
        {"consumer": "team-b", "sha256": KEY_HASH.to_uppercase()}]}));
    for headers in [bearer("hunter2"), vec![("x-api-key".to_string(), "hunter2".to_string())]] {
        let forwarded = call(&auth, "gpt", &headers).unwrap();
        assert_eq!(forwarded, [("x-sluice-consumer".to_string(), "key:team-b".to_string())], "the key is stripped");
    }
}

#[test]
fn missing_and_wrong_credentials_are_401_with_a_challenge() {
    let auth = auth(json!({"apiKeys": [{"consumer": "team-b", "sha256": KEY_HASH}]}));
    let error = rejected(&auth, &[]);
    assert_eq!((error.status, error.code.as_str()), (401, "missing_credentials"));
    assert_eq!(error.headers, [("www-authenticate".to_string(), "Bearer realm=\"sluice\"".to_string())]);
    for headers in [bearer("hunter3"), bearer(""), vec![("x-api-key".into(), "HUNTER2".into())]] {
        let error = rejected(&auth, &headers);
        assert_eq!((error.status, error.code.as_str()), (401, "invalid_api_key"), "{headers:?}");
        assert!(error.headers[0].1.contains("error=\"invalid_token\""));
    }
    let error = rejected(&auth, &[("authorization".into(), "Basic aHVudGVyMg==".into())]);
    assert_eq!(error.code, "invalid_authorization");
    // A JWT-shaped bearer with no JWT config is just a wrong key.
    assert_eq!(rejected(&auth, &bearer("a.b.c")).code, "invalid_api_key");
}

#[test]
fn valid_jwts_of_each_algorithm_pass_with_claims_mapped_to_headers() {
    let auth = auth(jwt_config());
    for (alg, kid) in [
        (jsonwebtoken::Algorithm::RS256, Some("rsa-1")),
        (jsonwebtoken::Algorithm::ES256, Some("ec-1")),
        (jsonwebtoken::Algorithm::HS256, None),
    ] {
        let forwarded =
            call(&auth, "gpt", &bearer(&sign(alg, kid, &claims()))).unwrap_or_else(|e| panic!("{alg:?}: {e}"));
        assert_eq!(forwarded.get_header("x-sluice-consumer"), Some("jwt:alice"), "{alg:?}");
        assert_eq!(forwarded.get_header("x-tenant"), Some("acme"));
        assert_eq!(forwarded.get_header("x-groups"), Some("a,b"));
        assert_eq!(forwarded.get_header("authorization"), None, "the token is stripped");
    }
}

/// One key bound to each algorithm (`kid` its name), and its signer in
/// jsonwebtoken: an independent implementation of the same RFCs.
fn every_algorithm() -> (Value, Vec<(jsonwebtoken::Algorithm, EncodingKey)>) {
    let jwks: Value = serde_json::from_str(JWKS_EVERY_ALGORITHM).unwrap();
    let signers = jwks["keys"].as_array().unwrap().iter().map(|key| signer(key["kid"].as_str().unwrap())).collect();
    (json!({"jwt": {"jwks": jwks}}), signers)
}

/// The private half of testdata/jwks-every-algorithm.json's key `kid`.
fn signer(kid: &str) -> (jsonwebtoken::Algorithm, EncodingKey) {
    use jsonwebtoken::Algorithm::*;
    let alg: jsonwebtoken::Algorithm = kid.parse().unwrap();
    let key = match alg {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()),
        HS256 | HS384 | HS512 => Ok(EncodingKey::from_secret(&[7; 64])),
        ES256 => EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()),
        ES384 => EncodingKey::from_ec_pem(EC384_PRIVATE.as_bytes()),
        EdDSA => EncodingKey::from_ed_pem(ED25519_PRIVATE.as_bytes()),
    };
    (alg, key.unwrap())
}

#[test]
fn every_algorithm_verifies_an_independent_signer_and_refuses_a_changed_bit() {
    let (config, signers) = every_algorithm();
    let auth = auth(config);
    assert_eq!(signers.len(), 12);
    for (alg, key) in &signers {
        let mut header = Header::new(*alg);
        header.kid = Some(format!("{alg:?}"));
        let token = jsonwebtoken::encode(&header, &claims(), key).unwrap();
        let forwarded = call(&auth, "gpt", &bearer(&token)).unwrap_or_else(|e| panic!("{alg:?}: {e}"));
        assert_eq!(forwarded.get_header("x-sluice-consumer"), Some("jwt:alice"), "{alg:?}");

        // One bit of the signature, then one of the signed payload.
        let (signed, signature) = token.rsplit_once('.').unwrap();
        let mut signature = URL_SAFE_NO_PAD.decode(signature).unwrap();
        signature[5] ^= 1;
        let changed = format!("{signed}.{}", URL_SAFE_NO_PAD.encode(&signature));
        assert_eq!(rejected(&auth, &bearer(&changed)).message, "invalid token signature", "{alg:?}");
        let (head, rest) = token.split_once('.').unwrap();
        let (payload, signature) = rest.split_once('.').unwrap();
        let mut payload = URL_SAFE_NO_PAD.decode(payload).unwrap();
        let at = payload.iter().position(|&b| b == b'a').unwrap();
        payload[at] ^= 1;
        let changed = format!("{head}.{}.{signature}", URL_SAFE_NO_PAD.encode(&payload));
        assert_eq!(rejected(&auth, &bearer(&changed)).message, "invalid token signature", "{alg:?}");

        // The same token, named as signed with another algorithm of the family.
        let other = signers.iter().map(|(a, _)| *a).find(|a| a != alg && a.family() == alg.family());
        if let Some(other) = other {
            let mut header: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(head).unwrap()).unwrap();
            header["alg"] = json!(format!("{other:?}"));
            header["kid"] = json!(format!("{other:?}"));
            let relabelled = format!("{}.{rest}", URL_SAFE_NO_PAD.encode(header.to_string()));
            assert_eq!(
                rejected(&auth, &bearer(&relabelled)).message,
                "invalid token signature",
                "{alg:?} as {other:?}"
            );
        }
    }
}

#[test]
fn tokens_with_critical_extensions_are_refused() {
    let auth = auth(jwt_config());
    let mut header = Header::new(jsonwebtoken::Algorithm::HS256);
    header.crit = Some(vec!["exp-v2".into()]);
    let token = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(HS_SECRET)).unwrap();
    assert_eq!(
        rejected(&auth, &bearer(&token)).message,
        "token has critical header extensions (crit), which are not supported"
    );
}

#[test]
fn weak_and_unusable_keys_are_refused_when_the_config_loads() {
    let error = |key: Value| {
        sluice_plugin_sdk::configure::<Auth>(&json!({"jwt": {"jwks": {"keys": [key]}}}).to_string()).err().unwrap()
    };
    let hs = |alg: &str, bytes: usize| json!({"kty": "oct", "alg": alg, "k": URL_SAFE_NO_PAD.encode(vec![1u8; bytes])});
    assert!(error(hs("HS256", 31)).contains("an HS256 secret must be at least 32 bytes; this one has 31"));
    assert!(error(hs("HS512", 63)).contains("an HS512 secret must be at least 64 bytes"));
    assert!(
        sluice_plugin_sdk::configure::<Auth>(&json!({"jwt": {"jwks": {"keys": [hs("HS512", 64)]}}}).to_string())
            .is_ok()
    );
    // The test key's modulus cut to 1024 bits (and odd, as a modulus is).
    let jwks: Value = serde_json::from_str(JWKS).unwrap();
    let n = URL_SAFE_NO_PAD.decode(jwks["keys"][0]["n"].as_str().unwrap()).unwrap();
    let mut n = n[..128].to_vec();
    n[127] |= 1;
    let short = json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&n), "e": "AQAB"});
    assert!(error(short).contains("an RSA key must have 2048 to 8192 bits; this one has 1024"));
    let rsa = &jwks["keys"][0];
    for (what, e) in [("exponent 1", "AQ"), ("even exponent", "AQAA"), ("exponent of 2^40 + 1", "AQAAAAAB")] {
        let key = json!({"kty": "RSA", "n": rsa["n"], "e": e});
        assert!(error(key).contains("not an RSA public key"), "{what}");
    }
    let mut even = URL_SAFE_NO_PAD.decode(rsa["n"].as_str().unwrap()).unwrap();
    *even.last_mut().unwrap() &= 0xfe;
    let key = json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode(&even), "e": "AQAB"});
    assert!(error(key).contains("not an RSA public key"), "even modulus");
    let mut off_curve = jwks["keys"][1].clone();
    off_curve["y"] = off_curve["x"].clone();
    assert!(error(off_curve).contains("not a point on its curve"));
    let x25519 = json!({"kty": "OKP", "crv": "X25519", "x": "r8JIGm0ytDm3lIUYGcsps-gkdfQ2inWBMK8dA6SKwZo"});
    assert!(error(x25519).contains("curve \"X25519\" is not supported"));
    assert!(error(json!({"kty": "RSA", "e": "AQAB"})).contains("a RSA key needs `n`"));
    assert!(
        error(json!({"kty": "RSA", "alg": "RSA-OAEP", "n": "AQAB", "e": "AQAB"}))
            .contains("alg RSA-OAEP is not a signature algorithm")
    );
}

#[test]
fn a_claim_the_token_lacks_removes_the_client_header() {
    let auth = auth(jwt_config());
    let mut claims = claims();
    claims.as_object_mut().unwrap().remove("org");
    let mut client = bearer(&sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &claims));
    client.push(("x-tenant".into(), "spoofed".into()));
    let forwarded = call(&auth, "gpt", &client).unwrap();
    assert_eq!(forwarded.get_header("x-tenant"), None, "a client-sent x-tenant must not pass");
    assert_eq!(forwarded.get_header("x-groups"), Some("a,b"));
}

#[test]
fn bad_jwts_are_401() {
    let auth = auth(jwt_config());
    let rs = |claims: &Value| sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), claims);
    let with = |key: &str, value: Value| {
        let mut claims = claims();
        claims[key] = value;
        claims
    };
    let without = |key: &str| {
        let mut claims = claims();
        claims.as_object_mut().unwrap().remove(key);
        claims
    };
    let good = rs(&claims());
    let (head, rest) = good.split_once('.').unwrap();
    let (payload, signature) = rest.split_once('.').unwrap();
    let forged_payload = URL_SAFE_NO_PAD.encode(with("sub", json!("mallory")).to_string());
    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    // HS256 "signed" with the RSA public key's bytes: the classic confusion.
    let confused = {
        let header = Header::new(jsonwebtoken::Algorithm::HS256);
        jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(RSA_PUBLIC.as_bytes())).unwrap()
    };
    let mut flipped = signature.as_bytes().to_vec();
    flipped[10] = if flipped[10] == b'A' { b'B' } else { b'A' };
    let cases = [
        ("expired", rs(&with("exp", json!(NOW - 61))), "token has expired"),
        ("not yet valid", rs(&with("nbf", json!(NOW + 61))), "token is not valid yet (nbf)"),
        ("no exp", rs(&without("exp")), "token has no exp claim"),
        ("wrong audience", rs(&with("aud", json!(["else"]))), "token audience is not accepted"),
        ("no audience", rs(&without("aud")), "token audience is not accepted"),
        ("wrong issuer", rs(&with("iss", json!("https://evil.example"))), "token issuer is not accepted"),
        (
            "bad signature",
            format!("{head}.{payload}.{}", String::from_utf8(flipped).unwrap()),
            "invalid token signature",
        ),
        ("forged payload", format!("{head}.{forged_payload}.{signature}"), "invalid token signature"),
        ("alg none", format!("{none_header}.{payload}."), "unsigned tokens (alg none) are not accepted"),
        (
            "alg none, signed",
            format!("{none_header}.{payload}.{signature}"),
            "unsigned tokens (alg none) are not accepted",
        ),
        ("HS256 with the RSA public key", confused, "invalid token signature"),
        ("unknown kid", sign(jsonwebtoken::Algorithm::RS256, Some("rsa-9"), &claims()), "no key with kid \"rsa-9\""),
        (
            "kid of another type",
            sign(jsonwebtoken::Algorithm::HS256, Some("rsa-1"), &claims()),
            "no key accepts HS256 tokens",
        ),
        ("no consumer", rs(&without("sub")), "the token has no \"sub\" claim naming the consumer"),
        ("garbage header", "e30x.e30.sig".to_string(), "malformed token header"),
    ];
    for (what, token, message) in cases {
        let error = rejected(&auth, &bearer(&token));
        assert_eq!(
            (error.status, error.code.as_str(), error.message.as_str()),
            (401, "invalid_token", message),
            "{what}"
        );
        assert!(error.headers[0].1.contains("error=\"invalid_token\""), "{what}");
    }
}

#[test]
fn hs_rs_confusion_fails_even_against_the_rsa_key_alone() {
    // Only the RSA key configured: an HS256 token has no key to try at all.
    let jwks: Value = serde_json::from_str(JWKS).unwrap();
    let auth = auth(json!({"jwt": {"jwks": {"keys": [jwks["keys"][0]]}}}));
    let header = Header::new(jsonwebtoken::Algorithm::HS256);
    let token = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(RSA_PUBLIC.as_bytes())).unwrap();
    assert_eq!(rejected(&auth, &bearer(&token)).message, "no key accepts HS256 tokens");
}

#[test]
fn leeway_is_applied_both_ways() {
    let auth = auth(jwt_config());
    let mut claims = claims();
    claims["exp"] = json!(NOW - 59);
    claims["nbf"] = json!(NOW + 59);
    assert!(call(&auth, "gpt", &bearer(&sign(jsonwebtoken::Algorithm::ES256, None, &claims))).is_ok());
}

#[test]
fn scopes_required_claims_and_models_are_403() {
    let mut config = jwt_config();
    config["jwt"]["requiredScopes"] = json!(["chat:write"]);
    config["jwt"]["requiredClaims"] = json!({"org.id": ["acme", "globex"]});
    config["allowedModels"] = json!({"jwt:alice": ["gpt-4o*"], "*": ["small-*"]});
    let auth = auth(config);
    let token = |claims: &Value| bearer(&sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), claims));
    assert!(call(&auth, "gpt-4o-mini", &token(&claims())).is_ok());

    let error = call(&auth, "o3", &token(&claims())).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (403, "model_not_allowed"));
    assert_eq!(error.message, "consumer \"jwt:alice\" may not use model \"o3\"");

    let mut bob = claims();
    bob["sub"] = json!("bob");
    assert!(call(&auth, "small-1", &token(&bob)).is_ok(), "unlisted consumers get the * entry");
    assert_eq!(call(&auth, "gpt-4o", &token(&bob)).unwrap_err().code, "model_not_allowed");

    let mut reader = claims();
    reader["scope"] = json!("models:read");
    let error = call(&auth, "gpt-4o", &token(&reader)).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (403, "insufficient_scope"));
    assert!(error.headers[0].1.contains("scope=\"chat:write\""), "{:?}", error.headers);
    let mut scp = claims();
    scp.as_object_mut().unwrap().remove("scope");
    scp["scp"] = json!(["chat:write"]);
    assert!(call(&auth, "gpt-4o", &token(&scp)).is_ok(), "scp as a list works too");

    let mut other_org = claims();
    other_org["org"]["id"] = json!("initech");
    let error = call(&auth, "gpt-4o", &token(&other_org)).unwrap_err();
    assert_eq!((error.status, error.code.as_str()), (403, "claim_not_allowed"));
}

#[test]
fn api_key_consumers_are_limited_by_allowed_models_too() {
    let auth = auth(json!({"apiKeys": [{"consumer": "team-b", "sha256": KEY_HASH}],
        "allowedModels": {"key:team-b": ["llama3"]}, "consumerHeader": "X-Team"}));
    assert_eq!(call(&auth, "llama3", &bearer("hunter2")).unwrap().get_header("x-team"), Some("key:team-b"));
    assert_eq!(call(&auth, "gpt", &bearer("hunter2")).unwrap_err().status, 403);
}

/// The hook runs on every request, and each call into the host is a
/// crossing out of the component that costs more than hashing the key: it
/// reads the model only for a consumer whose models are restricted, removes
/// neither a header it found absent nor one it sets (setting replaces), and
/// still leaves none of the client's values of them.
#[test]
fn an_api_key_costs_the_host_calls_it_needs_and_no_more() {
    let header = |name: &str| ("x-sluice-consumer".to_string(), name.to_string());
    let calls = |auth: &Auth, model: &str, headers: &[(&str, &str)]| {
        let req = request_with_headers(model, headers);
        let outcome = auth.on_request(&req, &mut ());
        let made = req.host_calls();
        (made, outcome.map(|_| req.headers()))
    };
    let open = auth(json!({"apiKeys": [{"consumer": "team-b", "sha256": KEY_HASH}]}));
    let (made, forwarded) = calls(&open, "gpt", &[("x-api-key", "hunter2"), ("x-sluice-consumer", "spoofed")]);
    assert_eq!(
        made,
        ["header(authorization)", "header(x-api-key)", "remove-header(x-api-key)", "set-header(x-sluice-consumer)"]
    );
    assert_eq!(forwarded.unwrap(), [header("key:team-b")]);
    let (made, forwarded) = calls(&open, "gpt", &[("authorization", "Bearer hunter2"), ("x-api-key", "other")]);
    assert_eq!(
        made,
        [
            "header(authorization)",
            "remove-header(authorization)",
            "remove-header(x-api-key)",
            "set-header(x-sluice-consumer)"
        ]
    );
    assert_eq!(forwarded.unwrap(), [header("key:team-b")]);

    let restricted = auth(json!({"apiKeys": [{"consumer": "team-b", "sha256": KEY_HASH}],
        "allowedModels": {"key:team-b": ["llama3"]}}));
    let (made, forwarded) = calls(&restricted, "gpt", &[("x-api-key", "hunter2")]);
    assert_eq!(made, ["header(authorization)", "header(x-api-key)", "model"]);
    assert_eq!(forwarded.unwrap_err().code, "model_not_allowed");
}

#[test]
fn bad_configs_are_rejected() {
    let error = |config: Value| sluice_plugin_sdk::configure::<Auth>(&config.to_string()).err().unwrap();
    assert!(error(json!({})).contains("configure `apiKeys`, `jwt` or both"));
    assert!(error(json!({"apiKeys": [{"consumer": "a", "sha256": "abc"}]})).contains("64 hex digits"));
    assert!(error(json!({"apiKeys": [{"consumer": "a", "sha256": "zz".repeat(32)}]})).contains("64 hex digits"));
    assert!(error(json!({"apiKeys": [{"consumer": "", "sha256": KEY_HASH}]})).contains("`consumer` is empty"));
    assert!(error(json!({"jwt": {"jwks": {"keys": []}}})).contains("keys is empty"));
    let rsa: Value = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][0].clone();
    let mut as_hs = rsa.clone();
    as_hs["alg"] = json!("HS256");
    assert!(error(json!({"jwt": {"jwks": {"keys": [as_hs]}}})).contains("alg HS256 does not fit"));
    let mut enc = rsa.clone();
    enc["use"] = json!("enc");
    assert!(error(json!({"jwt": {"jwks": {"keys": [enc]}}})).contains("encryption key"));
    let mut ec = serde_json::from_str::<Value>(JWKS).unwrap()["keys"][1].clone();
    ec["alg"] = json!("ES384");
    assert!(error(json!({"jwt": {"jwks": {"keys": [ec]}}})).contains("alg ES384 does not fit"));
    assert!(error(json!({"jwt": {"jwks": {"keys": [{"kty": "XYZ"}]}}})).contains("not a supported JWK"));
    assert!(
        error(json!({"apiKeys": [{"consumer": "a", "sha256": KEY_HASH}], "consumerHeader": "bad header"}))
            .contains("not a valid header name")
    );
}

/// `auth` has no network: a config that asks it to fetch keys is refused,
/// naming the plugin that can, and `jwt.jwks` stays required.
#[cfg(not(feature = "remote"))]
#[test]
fn remote_keys_are_refused_naming_auth_remote() {
    let error = |config: Value| sluice_plugin_sdk::configure::<Auth>(&config.to_string()).err().unwrap();
    for remote in [json!({"jwksUri": "https://idp.example/keys"}), json!({"issuer": "https://idp.example"})] {
        let message = error(json!({"jwt": {"remote": remote}}));
        assert!(message.starts_with("auth: jwt.remote (jwksUri, issuer): "), "{message}");
        assert!(message.contains("needs the auth-remote plugin"), "{message}");
    }
    let jwks: Value = serde_json::from_str(JWKS).unwrap();
    let message = error(json!({"jwt": {"jwks": jwks, "remote": {"issuer": "https://idp.example"}}}));
    assert!(message.contains("auth-remote"), "inline keys beside do not change it: {message}");
    assert!(error(json!({"jwt": {"issuer": "https://idp.example"}})).contains("jwt.jwks is required"));
}

/// Where a guessed `jwt.jwksUri` goes, in either build.
#[test]
fn a_jwks_uri_field_says_where_remote_keys_go() {
    let error = sluice_plugin_sdk::configure::<Auth>(&json!({"jwt": {"jwksUri": "https://idp/keys"}}).to_string());
    let message = error.err().unwrap();
    assert!(message.contains("jwt.jwksUri: keys from a URL are configured as jwt.remote.jwksUri"), "{message}");
    assert!(message.contains("auth-remote"), "{message}");
}

fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
}

/// With an API key, a client's own claim headers (and consumer header)
/// must not reach the upstream: those headers belong to the plugin, set
/// only from a verified key or token.
#[test]
fn a_client_cannot_set_the_headers_the_plugin_owns_whatever_its_credential() {
    let mut config = jwt_config();
    config["apiKeys"] = json!([{"consumer": "team-b", "sha256": KEY_HASH}]);
    let auth = auth(config);
    let spoofed = |credential: Vec<(String, String)>| {
        let mut headers = credential;
        for name in ["x-sluice-consumer", "X-Tenant", "x-groups"] {
            headers.push((name.to_string(), "spoofed".to_string()));
        }
        headers
    };
    let mut no_org = claims();
    no_org.as_object_mut().unwrap().remove("org");
    let token = |claims: &Value| bearer(&sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), claims));
    for (what, credential) in [
        ("bearer key", bearer("hunter2")),
        ("x-api-key", vec![("x-api-key".to_string(), "hunter2".to_string())]),
        ("jwt", token(&claims())),
        ("jwt without org", token(&no_org)),
    ] {
        let client = spoofed(credential);
        let forwarded = call(&auth, "gpt", &client).unwrap();
        for name in ["x-sluice-consumer", "x-tenant", "x-groups"] {
            assert!(
                !values(&forwarded, name).contains(&"spoofed"),
                "{what}: the client's {name} passed: {forwarded:?}"
            );
        }
        assert_eq!(values(&forwarded, "x-sluice-consumer").len(), 1, "{what}: {forwarded:?}");
        assert!(values(&forwarded, "authorization").is_empty() && values(&forwarded, "x-api-key").is_empty());
    }
}

/// An API key's consumer and a token's subject of the same name are
/// different callers, upstream and in `allowedModels`.
#[test]
fn api_key_consumers_and_jwt_subjects_are_separate_namespaces() {
    let mut config = jwt_config();
    config["apiKeys"] = json!([{"consumer": "alice", "sha256": KEY_HASH}]);
    config["allowedModels"] = json!({"key:alice": ["small-*"], "jwt:alice": ["gpt-4o*"]});
    let auth = auth(config);
    let token = bearer(&sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &claims()));

    assert_eq!(call(&auth, "small-1", &bearer("hunter2")).unwrap().get_header("x-sluice-consumer"), Some("key:alice"));
    assert_eq!(call(&auth, "gpt-4o", &token).unwrap().get_header("x-sluice-consumer"), Some("jwt:alice"));
    let error = call(&auth, "gpt-4o", &bearer("hunter2")).unwrap_err();
    assert_eq!((error.status, error.message.as_str()), (403, "consumer \"key:alice\" may not use model \"gpt-4o\""));
    let error = call(&auth, "small-1", &token).unwrap_err();
    assert_eq!((error.status, error.message.as_str()), (403, "consumer \"jwt:alice\" may not use model \"small-1\""));
}

#[test]
fn allowed_models_keys_must_name_a_namespace() {
    let error = |config: Value| sluice_plugin_sdk::configure::<Auth>(&config.to_string()).err().unwrap();
    let keys =
        |allowed: Value| json!({"apiKeys": [{"consumer": "team-b", "sha256": KEY_HASH}], "allowedModels": allowed});
    // A bare name would silently stop matching anyone: refused, not ignored.
    assert!(
        error(keys(json!({"team-b": ["llama3"]})))
            .contains("allowedModels: \"team-b\" must be \"*\", \"key:<consumer>\" or \"jwt:<subject>\"")
    );
    assert!(error(keys(json!({"key:team-c": ["llama3"]}))).contains("no API key has the consumer \"team-c\""));
    assert!(error(keys(json!({"jwt:alice": ["llama3"]}))).contains("`jwt` is not configured"));
    let mut config = jwt_config();
    config["allowedModels"] = json!({"jwt:": ["llama3"]});
    assert!(error(config).contains("names no subject"));
}

#[test]
fn owned_header_names_cannot_collide() {
    let error = |config: Value| sluice_plugin_sdk::configure::<Auth>(&config.to_string()).err().unwrap();
    let mut config = jwt_config();
    config["jwt"]["claimHeaders"] = json!({"X-Sluice-Consumer": "email"});
    assert!(error(config).contains("jwt.claimHeaders: x-sluice-consumer is the consumer header"));
    let mut config = jwt_config();
    config["jwt"]["claimHeaders"] = json!({"authorization": "sub"});
    assert!(error(config).contains("jwt.claimHeaders: authorization carries credentials"));
    let mut config = jwt_config();
    config["jwt"]["claimHeaders"] = json!({"X-Tenant": "org.id", "x-tenant": "tenant"});
    assert!(error(config).contains("jwt.claimHeaders: x-tenant is listed twice"));
    let mut config = jwt_config();
    config["consumerHeader"] = json!("x-api-key");
    assert!(error(config).contains("consumerHeader: x-api-key carries credentials"));
}

#[test]
fn consumers_that_cannot_be_header_values_are_refused() {
    let error = |config: Value| sluice_plugin_sdk::configure::<Auth>(&config.to_string()).err().unwrap();
    assert!(
        error(json!({"apiKeys": [{"consumer": "a\nb", "sha256": KEY_HASH}]}))
            .contains("apiKeys[0]: `consumer` has control characters")
    );
    let auth = auth(jwt_config());
    let mut claims = claims();
    claims["sub"] = json!("alice\r\nx-admin: true");
    let error = rejected(&auth, &bearer(&sign(jsonwebtoken::Algorithm::RS256, Some("rsa-1"), &claims)));
    assert_eq!((error.status, error.message.as_str()), (401, "the token's \"sub\" claim cannot be sent as a header"));
}
