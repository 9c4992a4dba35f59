//! JWT verification against an inline JWKS, and with the `remote` feature
//! (the auth-remote plugin), against keys fetched from the identity
//! provider (`remote.rs`).
//!
//! Each key is bound to one algorithm when the config loads (`jwk.rs`): the
//! JWK's `alg`, or the one its type implies (`oct` HS256, `RSA` RS256, `EC`
//! P-256 ES256 / P-384 ES384, `OKP` EdDSA). A token is only checked with
//! keys bound to the algorithm its header names, so `alg: none` and HS/RS
//! confusion (an HS256 token "signed" with an RSA public key) find no key
//! and fail. Time claims are checked against the gateway's clock, not the
//! guest's.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_plugin_sdk::host;

use crate::jwk::{Alg, Key};
use crate::remote::{RemoteConfig, RemoteKeys};

pub type Claims = Map<String, Value>;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtConfig {
    /// `{"keys": [JWK, …]}`, as an identity provider publishes it. With
    /// `remote`, optional: the keys used while no fresh remote set is held.
    jwks: Option<Jwks>,
    /// Keys fetched from the identity provider: the auth-remote plugin only.
    remote: Option<RemoteConfig>,
    /// Not a field: named so that its error says where remote keys go.
    jwks_uri: Option<serde::de::IgnoredAny>,
    /// Accepted `iss` values; unchecked when absent.
    issuer: Option<OneOrMany>,
    /// Accepted `aud` values (one must be in the token); unchecked when absent.
    audience: Option<OneOrMany>,
    /// Clock skew allowed for `exp` and `nbf`.
    #[serde(default = "default_leeway")]
    leeway_seconds: u64,
    /// Refuse tokens without `exp`: they would never expire.
    #[serde(default = "yes")]
    require_exp: bool,
    /// The claim naming the consumer (a dotted path for nested claims).
    #[serde(default = "default_consumer_claim")]
    consumer_claim: String,
    /// Scopes the token must all have, from `scope` (space-separated) or `scp`.
    #[serde(default)]
    required_scopes: Vec<String>,
    /// Claims that must have these values (or, for list claims, contain them).
    #[serde(default)]
    required_claims: Map<String, Value>,
    /// Upstream header name → claim path, e.g. `x-tenant: org.id`.
    #[serde(default)]
    claim_headers: BTreeMap<String, String>,
}

fn default_leeway() -> u64 {
    60
}

fn yes() -> bool {
    true
}

fn default_consumer_claim() -> String {
    "sub".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Jwks {
    keys: Vec<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

pub struct JwtVerifier {
    /// The inline keys.
    keys: Vec<Key>,
    remote: Option<RemoteKeys>,
    issuers: Vec<String>,
    audiences: Vec<String>,
    leeway: u64,
    require_exp: bool,
    consumer_claim: String,
    required_scopes: Vec<String>,
    required_claims: Map<String, Value>,
    claim_headers: Vec<(String, String)>,
}

/// Why a valid token may not proceed: a 403.
pub struct Forbidden {
    pub code: &'static str,
    pub message: String,
    /// For `insufficient_scope`, the scopes needed.
    pub scope: Option<String>,
}

/// Why a token is not let through.
#[derive(Debug, PartialEq)]
pub enum Rejected {
    /// The token is not valid: a 401.
    Invalid(String),
    /// No key could be had to check it with: the identity provider's keys
    /// are not fetched yet or not reachable, and there are no inline keys
    /// to fall back on. A 503: the token may well be good.
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    KeysUnavailable(String),
}

impl From<String> for Rejected {
    fn from(why: String) -> Rejected {
        Rejected::Invalid(why)
    }
}

impl From<&str> for Rejected {
    fn from(why: &str) -> Rejected {
        Rejected::Invalid(why.to_string())
    }
}

impl JwtVerifier {
    pub fn new(config: JwtConfig) -> Result<JwtVerifier, String> {
        if config.jwks_uri.is_some() {
            return Err("jwt.jwksUri: keys from a URL are configured as jwt.remote.jwksUri (or jwt.remote.issuer, \
                        for OIDC discovery), with the auth-remote plugin"
                .into());
        }
        // Tokens of a discovered issuer carry it as `iss`.
        let discovered_issuer = config.remote.as_ref().and_then(RemoteConfig::issuer).map(str::to_string);
        let remote = config.remote.map(RemoteKeys::new).transpose()?;
        let keys = match config.jwks {
            Some(jwks) if jwks.keys.is_empty() => return Err("jwt.jwks.keys is empty".into()),
            Some(jwks) => jwks
                .keys
                .into_iter()
                .enumerate()
                .map(|(i, key)| Key::from_jwk(key).map_err(|e| format!("jwt.jwks.keys[{i}]: {e}")))
                .collect::<Result<_, _>>()?,
            None if remote.is_none() => return Err("jwt.jwks is required: the keys tokens are checked with".into()),
            None => Vec::new(),
        };
        let mut claim_headers: Vec<(String, String)> = Vec::new();
        for (header, claim) in config.claim_headers {
            let header = header_name(&header).map_err(|e| format!("jwt.claimHeaders: {e}"))?;
            // `X-Tenant` and `x-tenant` are one header: two claims would race for it.
            if claim_headers.iter().any(|(h, _)| *h == header) {
                return Err(format!("jwt.claimHeaders: {header} is listed twice"));
            }
            claim_headers.push((header, claim));
        }
        Ok(JwtVerifier {
            keys,
            remote,
            issuers: config.issuer.map(OneOrMany::into_vec).or(discovered_issuer.map(|i| vec![i])).unwrap_or_default(),
            audiences: config.audience.map(OneOrMany::into_vec).unwrap_or_default(),
            leeway: config.leeway_seconds,
            require_exp: config.require_exp,
            consumer_claim: config.consumer_claim,
            required_scopes: config.required_scopes,
            required_claims: config.required_claims,
            claim_headers,
        })
    }

    /// The token's claims, if its signature, time window, issuer and
    /// audience are all good; otherwise why not.
    pub fn verify(&self, token: &str) -> Result<Claims, Rejected> {
        // JWS compact serialization: header.payload.signature, the
        // signature over the first two as sent.
        let (signed, signature) = token.rsplit_once('.').ok_or("malformed token")?;
        let (header, payload) = signed.split_once('.').ok_or("malformed token")?;
        let header = token_header(header)?;
        let alg_name = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg_name.eq_ignore_ascii_case("none") {
            return Err("unsigned tokens (alg none) are not accepted".into());
        }
        // RFC 7515 §4.1.11: extensions the recipient must understand; this
        // one understands none.
        if header.contains_key("crit") {
            return Err("token has critical header extensions (crit), which are not supported".into());
        }
        let alg = Alg::parse(alg_name).ok_or_else(|| format!("unsupported token algorithm {alg_name:?}"))?;
        let kid = header.get("kid").and_then(Value::as_str);
        let by_kid = |k: &&Key| kid.is_none() || k.kid.as_deref() == kid;
        let mut candidates: Vec<&Key> = Vec::new();
        // The remote keys, if configured: a fresh set alone, else what is
        // held of an expired one and the inline keys.
        let selection;
        let inline = match &self.remote {
            Some(remote) => {
                selection = remote.select(kid);
                candidates.extend(selection.keys(kid));
                if selection.is_none() && self.keys.is_empty() {
                    return Err(Rejected::KeysUnavailable(
                        "the identity provider's keys are not available yet; try again shortly".into(),
                    ));
                }
                selection.with_inline()
            }
            None => true,
        };
        if inline {
            candidates.extend(self.keys.iter().filter(by_kid));
        }
        if candidates.is_empty() {
            return Err(format!("no key with kid {:?}", kid.unwrap_or_default()).into());
        }
        // Only keys bound to the token's algorithm: this is what defeats
        // algorithm confusion.
        let candidates: Vec<&Key> = candidates.into_iter().filter(|k| k.alg == alg).collect();
        if candidates.is_empty() {
            return Err(format!("no key accepts {alg_name} tokens").into());
        }
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| "invalid token signature")?;
        if !candidates.iter().any(|key| key.verify(signed.as_bytes(), &signature)) {
            return Err("invalid token signature".into());
        }
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or("malformed token payload")?;
        self.check_time(&claims)?;
        self.check_issuer_and_audience(&claims)?;
        Ok(claims)
    }

    fn check_time(&self, claims: &Claims) -> Result<(), String> {
        let now = host::now_unix_secs() as f64;
        let leeway = self.leeway as f64;
        match numeric(claims, "exp")? {
            Some(exp) if now > exp + leeway => return Err("token has expired".into()),
            None if self.require_exp => return Err("token has no exp claim".into()),
            _ => {}
        }
        match numeric(claims, "nbf")? {
            Some(nbf) if now + leeway < nbf => Err("token is not valid yet (nbf)".into()),
            _ => Ok(()),
        }
    }

    fn check_issuer_and_audience(&self, claims: &Claims) -> Result<(), String> {
        if !self.issuers.is_empty() {
            let issuer = claims.get("iss").and_then(Value::as_str);
            if !issuer.is_some_and(|iss| self.issuers.iter().any(|i| i == iss)) {
                return Err("token issuer is not accepted".into());
            }
        }
        if !self.audiences.is_empty() {
            let audiences: Vec<&str> = match claims.get("aud") {
                Some(Value::String(aud)) => vec![aud],
                Some(Value::Array(auds)) => auds.iter().filter_map(Value::as_str).collect(),
                _ => Vec::new(),
            };
            if !audiences.iter().any(|aud| self.audiences.iter().any(|a| a == aud)) {
                return Err("token audience is not accepted".into());
            }
        }
        Ok(())
    }

    /// Scopes and required claims, for a token already known to be valid.
    pub fn check_access(&self, claims: &Claims) -> Result<(), Forbidden> {
        let granted = scopes(claims);
        let missing: Vec<&str> =
            self.required_scopes.iter().map(String::as_str).filter(|s| !granted.contains(s)).collect();
        if !missing.is_empty() {
            return Err(Forbidden {
                code: "insufficient_scope",
                message: format!("the token lacks the scopes {missing:?}"),
                scope: Some(self.required_scopes.join(" ")),
            });
        }
        for (name, wanted) in &self.required_claims {
            if !claim_matches(claim(claims, name), wanted) {
                return Err(Forbidden {
                    code: "claim_not_allowed",
                    message: format!("the token's {name:?} claim does not have an allowed value"),
                    scope: None,
                });
            }
        }
        Ok(())
    }

    /// The consumer the token names, without its namespace.
    pub fn consumer(&self, claims: &Claims) -> Result<String, String> {
        let name = match claim(claims, &self.consumer_claim) {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err(format!("the token has no {:?} claim naming the consumer", self.consumer_claim)),
        };
        if !header_safe(&name) {
            return Err(format!("the token's {:?} claim cannot be sent as a header", self.consumer_claim));
        }
        Ok(name)
    }

    /// The upstream headers the claims map to, lower-case.
    pub fn header_names(&self) -> impl Iterator<Item = &str> {
        self.claim_headers.iter().map(|(header, _)| header.as_str())
    }

    /// Upstream headers from the claims the token has. A claim it lacks, or
    /// that cannot be a header value, gives no header.
    pub fn claim_headers(&self, claims: &Claims) -> Vec<(String, String)> {
        self.claim_headers
            .iter()
            .filter_map(|(header, path)| {
                let value = claim(claims, path).and_then(header_value).filter(|v| header_safe(v))?;
                Some((header.clone(), value))
            })
            .collect()
    }
}

/// Whether a bearer credential has a JWT's shape: three base64url parts.
pub fn looks_like_jwt(credential: &str) -> bool {
    let parts: Vec<&str> = credential.split('.').collect();
    parts.len() == 3
        && parts[..2].iter().all(|p| !p.is_empty())
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
}

/// Whether `value` can be sent as a header value: no control characters
/// (no CR or LF to split the header, no NUL).
pub fn header_safe(value: &str) -> bool {
    !value.chars().any(char::is_control)
}

/// Checks `name` is an HTTP token (RFC 9110) and lower-cases it.
pub fn header_name(name: &str) -> Result<String, String> {
    let is_token_char = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(is_token_char) {
        return Err(format!("{name:?} is not a valid header name"));
    }
    Ok(name.to_ascii_lowercase())
}

/// The token's header as JSON, read before any key is chosen.
fn token_header(encoded: &str) -> Result<Map<String, Value>, String> {
    let bytes = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| "malformed token header".to_string())?;
    serde_json::from_slice(&bytes).map_err(|_| "malformed token header".to_string())
}

fn numeric(claims: &Claims, name: &str) -> Result<Option<f64>, String> {
    match claims.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n.as_f64().map(Some).ok_or_else(|| format!("the {name} claim is not a number")),
        Some(_) => Err(format!("the {name} claim is not a number")),
    }
}

/// A claim by dotted path: `org.id` is `{"org": {"id": …}}`. An exact
/// top-level name wins, for claims that are URLs with dots.
fn claim<'a>(claims: &'a Claims, path: &str) -> Option<&'a Value> {
    if let Some(value) = claims.get(path) {
        return Some(value);
    }
    let mut parts = path.split('.');
    let mut value = claims.get(parts.next()?)?;
    for part in parts {
        value = value.get(part)?;
    }
    Some(value)
}

fn scopes(claims: &Claims) -> Vec<&str> {
    let mut scopes = Vec::new();
    for name in ["scope", "scp"] {
        match claims.get(name) {
            Some(Value::String(list)) => scopes.extend(list.split_whitespace()),
            Some(Value::Array(list)) => scopes.extend(list.iter().filter_map(Value::as_str)),
            _ => {}
        }
    }
    scopes
}

/// Whether a claim has the wanted value: equal to it (or to one of a wanted
/// list), or for a list claim, containing it.
fn claim_matches(actual: Option<&Value>, wanted: &Value) -> bool {
    let Some(actual) = actual else { return false };
    let wanted: Vec<&Value> = match wanted {
        Value::Array(any_of) => any_of.iter().collect(),
        one => vec![one],
    };
    match actual {
        Value::Array(items) => items.iter().any(|item| wanted.contains(&item)),
        one => wanted.contains(&one),
    }
}

fn header_value(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(_) | Value::Bool(_) => Some(value.to_string()),
        Value::Array(items) => {
            let parts: Option<Vec<String>> = items.iter().map(header_value).collect();
            parts.map(|parts| parts.join(","))
        }
        Value::Null => None,
        Value::Object(_) => Some(value.to_string()),
    }
}
