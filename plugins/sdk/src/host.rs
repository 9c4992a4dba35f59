//! What the gateway provides, callable from plugin code on any target.
//!
//! On `wasm32` these call the WIT `host` imports. Natively (unit tests) they
//! use deterministic stand-ins, so a plugin's logic runs under plain
//! `cargo test`:
//! - [`count_tokens`] counts each run of letters/digits as one token and
//!   each other non-space character as one token (`"Hi, you!"` is 4). The
//!   gateway counts real BPE tokens; tests should assert relations to the
//!   budget, not exact counts.
//! - [`now_unix_ms`] is the system clock unless a test pinned it with
//!   [`testing::set_now_unix_ms`].
//! - [`log`] writes to stderr.
//! - [`verify_signature`] verifies with the RustCrypto crates (the gateway
//!   uses ring: two implementations of the same RFCs).

use crate::LogLevel;

#[cfg(target_arch = "wasm32")]
mod imp {
    use super::{PublicKey, SignatureAlgorithm};
    use crate::LogLevel;
    use crate::bindings::sluice::plugin::host;

    pub fn log(level: LogLevel, message: &str, fields: &[(&str, &str)]) {
        let fields: Vec<(String, String)> = fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        host::log(level, message, &fields);
    }

    pub fn count_tokens(model: &str, text: &str) -> u32 {
        host::count_tokens(model, text)
    }

    pub fn now_unix_ms() -> u64 {
        host::now_unix_ms()
    }

    pub fn monotonic_ns() -> u64 {
        host::monotonic_ns()
    }

    pub fn verify_signature(algorithm: SignatureAlgorithm, key: &PublicKey, message: &[u8], signature: &[u8]) -> bool {
        crate::bindings::sluice::plugin::crypto::verify_signature(algorithm, key, message, signature)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use std::cell::Cell;
    use std::sync::OnceLock;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    use super::{PublicKey, SignatureAlgorithm};
    use crate::LogLevel;

    thread_local! {
        pub static PINNED_NOW_MS: Cell<Option<u64>> = const { Cell::new(None) };
    }

    pub fn log(level: LogLevel, message: &str, fields: &[(&str, &str)]) {
        eprintln!("[{level:?}] {message} {fields:?}");
    }

    pub fn count_tokens(_model: &str, text: &str) -> u32 {
        let mut tokens = 0u32;
        let mut in_word = false;
        for c in text.chars() {
            if c.is_alphanumeric() {
                if !in_word {
                    tokens = tokens.saturating_add(1);
                }
                in_word = true;
            } else {
                in_word = false;
                if !c.is_whitespace() {
                    tokens = tokens.saturating_add(1);
                }
            }
        }
        tokens
    }

    pub fn now_unix_ms() -> u64 {
        PINNED_NOW_MS.get().unwrap_or_else(|| {
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }

    pub fn monotonic_ns() -> u64 {
        static START: OnceLock<Instant> = OnceLock::new();
        u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub fn verify_signature(algorithm: SignatureAlgorithm, key: &PublicKey, message: &[u8], signature: &[u8]) -> bool {
        use SignatureAlgorithm as A;
        use ed25519_dalek::Verifier as _;
        use rsa::{BigUint, Pkcs1v15Sign, Pss, RsaPublicKey};
        use sha2::{Digest, Sha256, Sha384, Sha512};

        let rsa = |verify: &dyn Fn(&RsaPublicKey) -> bool| match key {
            PublicKey::Rsa(key) => {
                // The gateway's limits (ring's): 2048 to 8192 bits.
                RsaPublicKey::new_with_max_size(BigUint::from_bytes_be(&key.n), BigUint::from_bytes_be(&key.e), 8192)
                    .is_ok_and(|key| {
                        (2048..=8192).contains(&rsa::traits::PublicKeyParts::n(&key).bits()) && verify(&key)
                    })
            }
            _ => false,
        };
        match (algorithm, key) {
            (A::Rs256, _) => {
                rsa(&|k| k.verify(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(message), signature).is_ok())
            }
            (A::Rs384, _) => {
                rsa(&|k| k.verify(Pkcs1v15Sign::new::<Sha384>(), &Sha384::digest(message), signature).is_ok())
            }
            (A::Rs512, _) => {
                rsa(&|k| k.verify(Pkcs1v15Sign::new::<Sha512>(), &Sha512::digest(message), signature).is_ok())
            }
            (A::Ps256, _) => rsa(&|k| k.verify(Pss::new::<Sha256>(), &Sha256::digest(message), signature).is_ok()),
            (A::Ps384, _) => rsa(&|k| k.verify(Pss::new::<Sha384>(), &Sha384::digest(message), signature).is_ok()),
            (A::Ps512, _) => rsa(&|k| k.verify(Pss::new::<Sha512>(), &Sha512::digest(message), signature).is_ok()),
            (A::Es256, PublicKey::Ec(point)) => {
                use p256::ecdsa::signature::Verifier as _;
                let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(point);
                let signature = p256::ecdsa::Signature::from_slice(signature);
                matches!((key, signature), (Ok(key), Ok(signature)) if key.verify(message, &signature).is_ok())
            }
            (A::Es384, PublicKey::Ec(point)) => {
                use p384::ecdsa::signature::Verifier as _;
                let key = p384::ecdsa::VerifyingKey::from_sec1_bytes(point);
                let signature = p384::ecdsa::Signature::from_slice(signature);
                matches!((key, signature), (Ok(key), Ok(signature)) if key.verify(message, &signature).is_ok())
            }
            (A::EdDsa, PublicKey::Ed25519(bytes)) => {
                let key = <[u8; 32]>::try_from(bytes.as_slice())
                    .ok()
                    .and_then(|b| ed25519_dalek::VerifyingKey::from_bytes(&b).ok());
                let signature = ed25519_dalek::Signature::from_slice(signature);
                matches!((key, signature), (Some(key), Ok(signature)) if key.verify(message, &signature).is_ok())
            }
            _ => false,
        }
    }
}

/// A structured log line, attributed to the plugin by the gateway.
pub fn log(level: LogLevel, message: &str, fields: &[(&str, &str)]) {
    imp::log(level, message, fields)
}

/// Tokens in `text` as `model` counts them (natively: the stand-in above).
pub fn count_tokens(model: &str, text: &str) -> u32 {
    imp::count_tokens(model, text)
}

/// Wall-clock time in milliseconds since the Unix epoch.
pub fn now_unix_ms() -> u64 {
    imp::now_unix_ms()
}

/// Seconds since the Unix epoch.
pub fn now_unix_secs() -> u64 {
    now_unix_ms() / 1000
}

/// A monotonic clock in nanoseconds, for measuring durations.
pub fn monotonic_ns() -> u64 {
    imp::monotonic_ns()
}

pub use crate::bindings::sluice::plugin::crypto::{PublicKey, RsaPublicKey, SignatureAlgorithm};

/// Whether `signature` is `key`'s signature of `message` with `algorithm`,
/// checked natively by the gateway (RSA in a guest costs milliseconds). A
/// key the algorithm cannot use is `false`.
pub fn verify_signature(algorithm: SignatureAlgorithm, key: &PublicKey, message: &[u8], signature: &[u8]) -> bool {
    imp::verify_signature(algorithm, key, message, signature)
}

/// Test controls for the native stand-ins.
#[cfg(not(target_arch = "wasm32"))]
pub mod testing {
    /// Pins [`super::now_unix_ms`] for the current thread (`None` unpins).
    pub fn set_now_unix_ms(now: Option<u64>) {
        super::imp::PINNED_NOW_MS.set(now);
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn the_native_token_count_is_words_and_punctuation() {
        assert_eq!(count_tokens("m", ""), 0);
        assert_eq!(count_tokens("m", "Hi, you!"), 4);
        assert_eq!(count_tokens("m", "  hello   world  "), 2);
        assert_eq!(count_tokens("m", "{{name}}"), 5);
    }

    #[test]
    fn the_clock_can_be_pinned() {
        testing::set_now_unix_ms(Some(1_700_000_000_123));
        assert_eq!(now_unix_ms(), 1_700_000_000_123);
        assert_eq!(now_unix_secs(), 1_700_000_000);
        testing::set_now_unix_ms(None);
        assert!(now_unix_ms() > 1_700_000_000_000);
    }

    #[test]
    fn log_does_not_panic_natively() {
        log(LogLevel::Info, "hello", &[("k", "v")]);
    }
}
