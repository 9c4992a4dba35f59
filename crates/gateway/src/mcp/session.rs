//! MCP session ids that carry the session: an AEAD-sealed record of what a
//! session is (its route, the revision negotiated, the client's
//! `initialize`, and each upstream server's own session), so that any
//! replica holding the key continues any session and none keeps state.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

const NONCE_BYTES: usize = 24;
/// The longest session id opened: a record holds at most 2 KiB of the
/// client's `initialize` and under 400 bytes per server (a route has at
/// most 16), a third more in base64.
pub const MAX_SESSION_ID_BYTES: usize = 16 * 1024;
/// The most keys a ring holds: each costs one decryption attempt per
/// request, for an id none of them sealed.
pub const MAX_KEYS: usize = 8;

/// What a session is. Short field names: the id travels on every request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The MCP route's key, `namespace/name`: a session of one route is not
    /// one of another (also bound as associated data).
    pub r: String,
    /// Expiry, seconds since the epoch.
    pub e: u64,
    /// The protocol revision negotiated with the client.
    pub v: String,
    /// The client's `initialize` params (capabilities, clientInfo), so an
    /// upstream that forgot its session can be initialised again as the
    /// client initialised it.
    pub i: serde_json::Value,
    /// Each server's session, by the server's name.
    pub u: Vec<Upstream>,
}

/// One upstream server's side of a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upstream {
    /// The server's name in the route.
    pub n: String,
    /// The endpoint the session was opened on (a tag of its URL): the
    /// server's id is sent only there.
    pub u: String,
    /// The server's `Mcp-Session-Id`, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s: Option<String>,
    /// The revision the server negotiated.
    pub v: String,
}

impl Record {
    pub fn upstream(&self, name: &str) -> Option<&Upstream> {
        self.u.iter().find(|u| u.n == name)
    }

    /// Server `name`'s session, if it was opened on the endpoint tagged
    /// `tag`: a session opened where the route pointed before is not sent
    /// to where it points now.
    pub fn upstream_at(&self, name: &str, tag: &str) -> Option<&Upstream> {
        self.upstream(name).filter(|u| u.u == tag)
    }

    pub fn expired(&self) -> bool {
        self.e < now_secs()
    }
}

pub fn expiry(ttl: Duration) -> u64 {
    now_secs().saturating_add(ttl.as_secs())
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The keys that seal and open session ids: the first seals, all open, so
/// a new key is rolled out second, then moved first, and the old one
/// dropped once sessions sealed with it have expired.
pub struct SessionKeys {
    ciphers: Vec<XChaCha20Poly1305>,
    /// Made up at start: sessions end with the process and do not move
    /// between replicas.
    pub ephemeral: bool,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("reading the MCP session key file {path}: {error}")]
    Read { path: String, error: String },
    #[error("MCP session key file {path}, line {line}: {why}")]
    Bad { path: String, line: usize, why: String },
    #[error("MCP session key file {path} holds no key")]
    Empty { path: String },
    #[error("MCP session key file {path} holds more than {MAX_KEYS} keys")]
    TooMany { path: String },
}

/// Why a session id was not opened.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OpenError {
    #[error("the session id is not one this gateway issued")]
    Invalid,
    #[error("the session has expired")]
    Expired,
    #[error("the session belongs to another MCP route")]
    OtherRoute,
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionKeys({} keys, ephemeral: {})", self.ciphers.len(), self.ephemeral)
    }
}

impl SessionKeys {
    /// One random key, for a gateway given none.
    pub fn ephemeral() -> Self {
        let mut key = [0u8; 32];
        // The OS's generator failing is not a state to serve from.
        getrandom::fill(&mut key).unwrap_or_else(|e| panic!("no OS randomness for the MCP session key: {e}"));
        Self { ciphers: vec![XChaCha20Poly1305::new(&key.into())], ephemeral: true }
    }

    /// Keys from text: one per line, 32 bytes each in base64 (standard or
    /// URL-safe, padded or not) or hex; `#` comments and blank lines are
    /// skipped. A Kubernetes Secret mounted as a file holds exactly this.
    pub fn parse(text: &str, path: &str) -> Result<Self, KeyError> {
        let mut ciphers = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| KeyError::Bad { path: path.into(), line: i + 1, why: why.into() };
            let key = decode_key(line).ok_or_else(|| bad("not 32 bytes of base64 or hex"))?;
            if ciphers.len() == MAX_KEYS {
                return Err(KeyError::TooMany { path: path.into() });
            }
            ciphers.push(XChaCha20Poly1305::new(&key.into()));
        }
        if ciphers.is_empty() {
            return Err(KeyError::Empty { path: path.into() });
        }
        Ok(Self { ciphers, ephemeral: false })
    }

    pub fn read(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|e| KeyError::Read { path: shown.clone(), error: e.to_string() })?;
        Self::parse(&text, &shown)
    }

    /// The record as a session id: base64url of nonce and ciphertext, with
    /// the route bound as associated data.
    pub fn seal(&self, record: &Record) -> Result<String, String> {
        let plain = serde_json::to_vec(record).map_err(|e| e.to_string())?;
        let mut nonce = [0u8; NONCE_BYTES];
        getrandom::fill(&mut nonce).map_err(|e| format!("no OS randomness: {e}"))?;
        let cipher = self.ciphers.first().ok_or("no session key")?;
        let sealed = cipher
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: &plain, aad: record.r.as_bytes() })
            .map_err(|_| "sealing the session failed".to_string())?;
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        let id = URL_SAFE_NO_PAD.encode(out);
        if id.len() > MAX_SESSION_ID_BYTES {
            return Err(format!("the session id would be {} bytes, over {MAX_SESSION_ID_BYTES}", id.len()));
        }
        Ok(id)
    }

    /// The record sealed in `id` for route `route`, if a key of the ring
    /// sealed it for that route and it has not expired.
    pub fn open(&self, id: &str, route: &str) -> Result<Record, OpenError> {
        if id.len() > MAX_SESSION_ID_BYTES {
            return Err(OpenError::Invalid);
        }
        let bytes = URL_SAFE_NO_PAD.decode(id).map_err(|_| OpenError::Invalid)?;
        if bytes.len() <= NONCE_BYTES {
            return Err(OpenError::Invalid);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
        let plain = self
            .ciphers
            .iter()
            .find_map(|cipher| {
                cipher.decrypt(XNonce::from_slice(nonce), Payload { msg: sealed, aad: route.as_bytes() }).ok()
            })
            .ok_or(OpenError::Invalid)?;
        let record: Record = serde_json::from_slice(&plain).map_err(|_| OpenError::Invalid)?;
        if record.r != route {
            return Err(OpenError::OtherRoute);
        }
        if record.expired() {
            return Err(OpenError::Expired);
        }
        Ok(record)
    }
}

fn decode_key(text: &str) -> Option<[u8; 32]> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE};
    let decoded = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        (0..32).map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()).collect::<Option<Vec<u8>>>()?
    } else {
        [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD].iter().find_map(|engine| engine.decode(text).ok())?
    };
    decoded.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(route: &str) -> Record {
        Record {
            r: route.into(),
            e: expiry(Duration::from_secs(60)),
            v: "2025-11-25".into(),
            i: serde_json::json!({"clientInfo": {"name": "t", "version": "1"}, "capabilities": {}}),
            u: vec![Upstream {
                n: "a".into(),
                u: "http://127.0.0.1:1/mcp".into(),
                s: Some("abc".into()),
                v: "2025-06-18".into(),
            }],
        }
    }

    const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KEY_B: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

    #[test]
    fn a_sealed_record_opens_with_any_key_of_the_ring() {
        let old = SessionKeys::parse(KEY_A, "k").unwrap();
        let sealed = record("ns/r");
        let id = old.seal(&sealed).unwrap();
        assert_eq!(old.open(&id, "ns/r").unwrap(), sealed);
        // Rotated: a new key first, the old one second.
        let rotated = SessionKeys::parse(&format!("# new\n{KEY_B}\n\n{KEY_A}\n"), "k").unwrap();
        assert!(rotated.open(&id, "ns/r").is_ok(), "an id sealed with the old key opens");
        let new_id = rotated.seal(&record("ns/r")).unwrap();
        assert_eq!(old.open(&new_id, "ns/r"), Err(OpenError::Invalid), "the new key seals");
        let only_new = SessionKeys::parse(KEY_B, "k").unwrap();
        assert_eq!(only_new.open(&id, "ns/r"), Err(OpenError::Invalid), "the old key dropped");
    }

    #[test]
    fn a_changed_id_another_route_or_an_expired_one_is_refused() {
        let keys = SessionKeys::parse(KEY_A, "k").unwrap();
        let id = keys.seal(&record("ns/r")).unwrap();
        assert_eq!(keys.open(&id, "ns/other"), Err(OpenError::Invalid), "the route is bound");
        for at in [0, NONCE_BYTES + 3, id.len() - 1] {
            let mut bytes = id.clone().into_bytes();
            bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
            let flipped = String::from_utf8(bytes).unwrap();
            assert!(keys.open(&flipped, "ns/r").is_err(), "flipped at {at}");
        }
        for junk in ["", "x", "!!!", &"A".repeat(MAX_SESSION_ID_BYTES + 1)] {
            assert_eq!(keys.open(junk, "ns/r"), Err(OpenError::Invalid));
        }
        let mut old = record("ns/r");
        old.e = 1;
        let expired = keys.seal(&old).unwrap();
        assert_eq!(keys.open(&expired, "ns/r"), Err(OpenError::Expired));
        // Each seal draws a fresh nonce.
        assert_ne!(keys.seal(&record("ns/r")).unwrap(), keys.seal(&record("ns/r")).unwrap());
    }

    #[test]
    fn a_servers_session_is_used_only_on_the_endpoint_it_was_opened_on() {
        let record = record("ns/r");
        let at = &record.u[0].u;
        assert_eq!(record.upstream_at("a", at).and_then(|u| u.s.as_deref()), Some("abc"));
        assert!(record.upstream_at("a", "another endpoint").is_none(), "the route now points elsewhere");
        assert!(record.upstream_at("b", at).is_none());
    }

    #[test]
    fn key_files_are_checked() {
        assert!(matches!(SessionKeys::parse("", "k"), Err(KeyError::Empty { .. })));
        assert!(matches!(SessionKeys::parse("# none\n", "k"), Err(KeyError::Empty { .. })));
        let short = SessionKeys::parse("AAEC", "k").err().unwrap();
        assert_eq!(short.to_string(), "MCP session key file k, line 1: not 32 bytes of base64 or hex");
        let nine = [KEY_A; MAX_KEYS + 1].join("\n");
        assert!(matches!(SessionKeys::parse(&nine, "k"), Err(KeyError::TooMany { .. })));
        assert!(!SessionKeys::parse(KEY_B, "k").unwrap().ephemeral);
        assert!(SessionKeys::ephemeral().ephemeral);
    }
}
