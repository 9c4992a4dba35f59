//! Authenticates clients by API key or JWT, fails closed, strips the
//! client's credential before forwarding, and tells the upstream who called
//! in a header. 401 for a missing or invalid credential, 403 for a valid one
//! that may not do what it asks.
//!
//! Consumers are named in two namespaces, so an API key's consumer can never
//! pass for a token's subject of the same name: `key:<consumer>` for an API
//! key, `jwt:<subject>` for a token. That is the value of the consumer header
//! upstream, and the form of every `allowedModels` entry but `"*"`.
//!
//! The plugin owns the consumer header and every `jwt.claimHeaders` name. It
//! removes all of them from every request it lets through, however the client
//! authenticated, and sets them only from the verified key or token.
//!
//! The same sources build two components: `auth`, with inline keys only and
//! no import that needs a grant, and with the `remote` feature `auth-remote`
//! (plugins/auth-remote), which also fetches keys from the identity provider
//! (`jwt.remote`, `remote.rs`).

mod jwk;
mod jwt;
mod remote;

use std::collections::BTreeMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sluice_plugin_sdk::ModelPattern;
use sluice_plugin_sdk::prelude::*;
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::jwt::{JwtConfig, JwtVerifier, Rejected};

/// Headers that carry the client's credential. Never forwarded.
const CREDENTIAL_HEADERS: [&str; 2] = ["authorization", "x-api-key"];

/// The namespace of consumers authenticated by API key.
const API_KEY_NAMESPACE: &str = "key:";
/// The namespace of consumers authenticated by token.
const JWT_NAMESPACE: &str = "jwt:";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    #[serde(default)]
    api_keys: Vec<ApiKeyConfig>,
    jwt: Option<JwtConfig>,
    /// The header naming the consumer upstream.
    #[serde(default = "default_consumer_header")]
    consumer_header: String,
    /// Model patterns each consumer (`key:<consumer>`, `jwt:<subject>`) may
    /// use; `"*"` is for consumers not listed. Without an entry that applies,
    /// every model is allowed.
    #[serde(default)]
    allowed_models: BTreeMap<String, Vec<ModelPattern>>,
    /// The `realm` in `www-authenticate`.
    #[serde(default = "default_realm")]
    realm: String,
}

fn default_consumer_header() -> String {
    "x-sluice-consumer".to_string()
}

fn default_realm() -> String {
    "sluice".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeyConfig {
    consumer: String,
    /// Hex SHA-256 of the key: the key itself never sits in the config.
    sha256: String,
}

struct ApiKey {
    consumer: String,
    hash: [u8; 32],
}

struct Auth {
    api_keys: Vec<ApiKey>,
    jwt: Option<JwtVerifier>,
    consumer_header: String,
    /// The consumer header and the claim headers: removed from every
    /// request, then set from verified data only.
    owned_headers: Vec<String>,
    allowed_models: BTreeMap<String, Vec<ModelPattern>>,
    realm: String,
}

/// Who called, once authenticated.
#[derive(Debug, PartialEq)]
struct Identity {
    /// With its namespace: `key:<consumer>` or `jwt:<subject>`.
    consumer: String,
    /// Upstream headers from the token's claims, those it has.
    headers: Vec<(String, String)>,
}

impl Plugin for Auth {
    const NAME: &'static str = if cfg!(feature = "remote") { "auth-remote" } else { "auth" };
    type Config = Config;
    type State = ();

    fn new(config: Config) -> Result<Self, String> {
        if config.api_keys.is_empty() && config.jwt.is_none() {
            return Err("configure `apiKeys`, `jwt` or both: with neither, no request could pass".into());
        }
        let api_keys = config
            .api_keys
            .into_iter()
            .enumerate()
            .map(|(i, key)| {
                if key.consumer.is_empty() {
                    return Err(format!("apiKeys[{i}]: `consumer` is empty"));
                }
                if !jwt::header_safe(&key.consumer) {
                    return Err(format!("apiKeys[{i}]: `consumer` has control characters"));
                }
                let hash =
                    parse_sha256(&key.sha256).ok_or_else(|| format!("apiKeys[{i}]: `sha256` must be 64 hex digits"))?;
                Ok(ApiKey { consumer: key.consumer, hash })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let jwt = config.jwt.map(JwtVerifier::new).transpose()?;
        let consumer_header = jwt::header_name(&config.consumer_header)?;
        if CREDENTIAL_HEADERS.contains(&consumer_header.as_str()) {
            return Err(format!("consumerHeader: {consumer_header} carries credentials"));
        }
        let mut owned_headers = vec![consumer_header.clone()];
        for header in jwt.iter().flat_map(JwtVerifier::header_names) {
            if CREDENTIAL_HEADERS.contains(&header) {
                return Err(format!("jwt.claimHeaders: {header} carries credentials"));
            }
            if header == consumer_header {
                return Err(format!("jwt.claimHeaders: {header} is the consumer header"));
            }
            owned_headers.push(header.to_string());
        }
        for name in config.allowed_models.keys() {
            check_allowed_models_key(name, &api_keys, jwt.is_some())?;
        }
        Ok(Auth {
            api_keys,
            jwt,
            consumer_header,
            owned_headers,
            allowed_models: config.allowed_models,
            realm: config.realm.replace(['"', '\\'], ""),
        })
    }

    fn on_request(&self, req: &Request, _: &mut ()) -> Result<Action, ApiError> {
        let (identity, by_authorization) = self.authenticate(req)?;
        self.authorize(&identity, req)?;
        // Whatever the credential, none of the client's own values of these
        // headers pass: a client cannot pose as someone else, or claim a
        // tenant, by sending them itself. Each call into the host is a
        // crossing on every request, so none is made for nothing: an
        // `authorization` found absent is not removed, and a header about
        // to be set is not removed first (setting replaces every value).
        let credentials = CREDENTIAL_HEADERS.iter().copied().filter(|h| by_authorization || *h != "authorization");
        let set = |h: &str| h == self.consumer_header || identity.headers.iter().any(|(name, _)| name == h);
        for header in credentials.chain(self.owned_headers.iter().map(String::as_str).filter(|h| !set(h))) {
            req.remove_header(header);
        }
        req.set_header(&self.consumer_header, &identity.consumer);
        for (name, value) in &identity.headers {
            req.set_header(name, value);
        }
        Ok(Action::Continue)
    }
}

impl Auth {
    /// Who sent `req`, and whether by `authorization` (else by `x-api-key`,
    /// `authorization` being absent).
    fn authenticate(&self, req: &Request) -> Result<(Identity, bool), ApiError> {
        if let Some(authorization) = req.header("authorization") {
            let authorization = authorization.trim();
            let (scheme, credential) = authorization.split_once(' ').unwrap_or((authorization, ""));
            if !scheme.eq_ignore_ascii_case("bearer") {
                return Err(self.unauthorized(
                    "invalid_authorization",
                    "the Authorization scheme must be Bearer",
                    None,
                ));
            }
            let credential = credential.trim();
            let identity = match &self.jwt {
                Some(jwt) if jwt::looks_like_jwt(credential) => self.token(jwt, credential),
                _ => self.api_key(credential),
            };
            return identity.map(|identity| (identity, true));
        }
        if let Some(key) = req.header("x-api-key") {
            return self.api_key(key.trim()).map(|identity| (identity, false));
        }
        Err(self.unauthorized(
            "missing_credentials",
            "authentication required: send `Authorization: Bearer <key or token>` or `x-api-key`",
            None,
        ))
    }

    fn token(&self, jwt: &JwtVerifier, token: &str) -> Result<Identity, ApiError> {
        let invalid = |why: String| self.unauthorized("invalid_token", &why, Some("invalid_token"));
        let claims = jwt.verify(token).map_err(|rejected| match rejected {
            Rejected::Invalid(why) => invalid(why),
            Rejected::KeysUnavailable(why) => {
                ApiError::new(503, "jwks_unavailable", why).with_header("retry-after", "1")
            }
        })?;
        let consumer = jwt.consumer(&claims).map_err(invalid)?;
        jwt.check_access(&claims).map_err(|denied| {
            let mut challenge = format!("Bearer realm=\"{}\", error=\"insufficient_scope\"", self.realm);
            if let Some(scope) = &denied.scope {
                challenge += &format!(", scope=\"{scope}\"");
            }
            ApiError::new(403, denied.code, denied.message).with_header("www-authenticate", &challenge)
        })?;
        Ok(Identity { consumer: format!("{JWT_NAMESPACE}{consumer}"), headers: jwt.claim_headers(&claims) })
    }

    /// Finds the key's consumer, comparing the key's hash with every
    /// configured hash in constant time.
    fn api_key(&self, key: &str) -> Result<Identity, ApiError> {
        if self.api_keys.is_empty() || key.is_empty() {
            return Err(self.unauthorized("invalid_api_key", "invalid API key", Some("invalid_token")));
        }
        let presented: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        // 1-based index of the match; 0 for none. No early exit.
        let mut found = 0u32;
        for (i, entry) in self.api_keys.iter().enumerate() {
            found = u32::conditional_select(&found, &(i as u32 + 1), same_hash(&presented, &entry.hash));
        }
        match found.checked_sub(1).and_then(|i| self.api_keys.get(i as usize)) {
            Some(entry) => {
                // Not `format!`: its machinery costs a guest more than the copy.
                Ok(Identity { consumer: [API_KEY_NAMESPACE, &entry.consumer].concat(), headers: Vec::new() })
            }
            None => Err(self.unauthorized("invalid_api_key", "invalid API key", Some("invalid_token"))),
        }
    }

    /// Asks the host for the model only if the consumer's models are
    /// restricted.
    fn authorize(&self, identity: &Identity, req: &Request) -> Result<(), ApiError> {
        let Some(patterns) = self.allowed_models.get(&identity.consumer).or_else(|| self.allowed_models.get("*"))
        else {
            return Ok(());
        };
        let model = req.model();
        if patterns.iter().any(|p| p.matches(&model)) {
            return Ok(());
        }
        Err(ApiError::new(
            403,
            "model_not_allowed",
            format!("consumer {:?} may not use model {model:?}", identity.consumer),
        ))
    }

    /// A 401 with a `www-authenticate` challenge (RFC 6750).
    fn unauthorized(&self, code: &str, message: &str, error: Option<&str>) -> ApiError {
        let mut challenge = format!("Bearer realm=\"{}\"", self.realm);
        if let Some(error) = error {
            let description: String = message.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect();
            challenge += &format!(", error=\"{error}\", error_description=\"{description}\"");
        }
        ApiError::new(401, code, message).with_header("www-authenticate", &challenge)
    }
}

/// An `allowedModels` key must be `"*"` or name a namespace: a bare name
/// would match nobody, and silently leave that consumer to `"*"`.
fn check_allowed_models_key(name: &str, api_keys: &[ApiKey], jwt: bool) -> Result<(), String> {
    if name == "*" {
        return Ok(());
    }
    if let Some(consumer) = name.strip_prefix(API_KEY_NAMESPACE) {
        if !api_keys.iter().any(|key| key.consumer == consumer) {
            return Err(format!("allowedModels: {name:?}: no API key has the consumer {consumer:?}"));
        }
        return Ok(());
    }
    if let Some(subject) = name.strip_prefix(JWT_NAMESPACE) {
        if !jwt {
            return Err(format!("allowedModels: {name:?}: `jwt` is not configured"));
        }
        if subject.is_empty() {
            return Err(format!("allowedModels: {name:?} names no subject"));
        }
        return Ok(());
    }
    Err(format!(
        "allowedModels: {name:?} must be \"*\", \"key:<consumer>\" or \"jwt:<subject>\": \
         API-key consumers and token subjects are separate namespaces"
    ))
}

/// Whether two hashes are equal, in constant time: the words' differences
/// are gathered without a branch, and only what they add up to goes
/// through subtle's barrier. Byte by byte (subtle's `[u8]::ct_eq`), each of
/// the 32 bytes went through it: 2 thousand of the 22 thousand instructions
/// the plugin ran a request.
fn same_hash(a: &[u8; 32], b: &[u8; 32]) -> subtle::Choice {
    let (a, b) = (a.as_chunks::<8>().0, b.as_chunks::<8>().0);
    let diff = a.iter().zip(b).fold(0u64, |diff, (a, b)| diff | (u64::from_ne_bytes(*a) ^ u64::from_ne_bytes(*b)));
    diff.ct_eq(&0)
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().to_ascii_lowercase();
    if hex.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

export_plugin!(Auth);

#[cfg(all(test, feature = "remote"))]
mod remote_tests;
#[cfg(test)]
mod tests;
