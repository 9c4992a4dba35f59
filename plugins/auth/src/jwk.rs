//! JSON Web Keys (RFC 7517) and the JWS signatures they check (RFC 7518).
//!
//! Each key is decoded and checked once, when the config loads: its type,
//! curve, size and point, so a bad JWKS is a config error rather than every
//! token failing. A request then only verifies: HMAC here in the guest (a
//! few microseconds), the public-key algorithms by the gateway natively
//! (`sluice:plugin/crypto`), where an RSA check costs tens of microseconds
//! rather than the 1–2 ms of big-number arithmetic in Wasm.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Sha256, Sha384, Sha512};
use sluice_plugin_sdk::host::{self, PublicKey, RsaPublicKey, SignatureAlgorithm};

/// The JWS algorithms a key can be bound to. `none` is not one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    HS256,
    HS384,
    HS512,
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

const ALGS: [Alg; 12] = [
    Alg::HS256,
    Alg::HS384,
    Alg::HS512,
    Alg::RS256,
    Alg::RS384,
    Alg::RS512,
    Alg::PS256,
    Alg::PS384,
    Alg::PS512,
    Alg::ES256,
    Alg::ES384,
    Alg::EdDSA,
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Hmac,
    Rsa,
    Ec,
    Ed,
}

impl Alg {
    /// The algorithm of a JWS `alg` value, exactly as RFC 7518 spells it.
    pub fn parse(name: &str) -> Option<Alg> {
        ALGS.into_iter().find(|alg| alg.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::HS256 => "HS256",
            Alg::HS384 => "HS384",
            Alg::HS512 => "HS512",
            Alg::RS256 => "RS256",
            Alg::RS384 => "RS384",
            Alg::RS512 => "RS512",
            Alg::PS256 => "PS256",
            Alg::PS384 => "PS384",
            Alg::PS512 => "PS512",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::EdDSA => "EdDSA",
        }
    }

    /// How the gateway names a public-key algorithm (`None` for HMAC).
    fn public_key_algorithm(self) -> Option<SignatureAlgorithm> {
        use SignatureAlgorithm as S;
        Some(match self {
            Alg::HS256 | Alg::HS384 | Alg::HS512 => return None,
            Alg::RS256 => S::Rs256,
            Alg::RS384 => S::Rs384,
            Alg::RS512 => S::Rs512,
            Alg::PS256 => S::Ps256,
            Alg::PS384 => S::Ps384,
            Alg::PS512 => S::Ps512,
            Alg::ES256 => S::Es256,
            Alg::ES384 => S::Es384,
            Alg::EdDSA => S::EdDsa,
        })
    }

    fn family(self) -> Family {
        match self {
            Alg::HS256 | Alg::HS384 | Alg::HS512 => Family::Hmac,
            Alg::RS256 | Alg::RS384 | Alg::RS512 | Alg::PS256 | Alg::PS384 | Alg::PS512 => Family::Rsa,
            Alg::ES256 | Alg::ES384 => Family::Ec,
            Alg::EdDSA => Family::Ed,
        }
    }
}

/// The members of a JWK this plugin reads; others are ignored.
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    #[serde(rename = "use")]
    usage: Option<String>,
    alg: Option<String>,
    kid: Option<String>,
    crv: Option<String>,
    k: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

/// A loaded key, ready to check signatures.
enum Material {
    Hmac(Vec<u8>),
    /// Checked by the gateway.
    Public(PublicKey),
}

/// A key from the JWKS, bound to one algorithm.
pub struct Key {
    pub kid: Option<String>,
    pub alg: Alg,
    key: Material,
}

/// RFC 7518 §3.3: RSA keys for RS* and PS* MUST be 2048 bits or larger;
/// the gateway checks up to 8192.
const RSA_BITS: std::ops::RangeInclusive<usize> = 2048..=8192;

impl Key {
    /// Loads a JWK: its type, curve and key material checked, and the
    /// algorithm it verifies fixed (its `alg`, or the one its type implies).
    pub fn from_jwk(value: Value) -> Result<Key, String> {
        // serde's message can quote the key's own fields: only its position is named.
        let jwk: Jwk = serde_json::from_value(value).map_err(|e| {
            format!("not a supported JWK ({:?} error at line {}, column {})", e.classify(), e.line(), e.column())
        })?;
        if jwk.usage.as_deref() == Some("enc") {
            return Err("an encryption key (`use: enc`) cannot verify signatures".into());
        }
        let implied = match (jwk.kty.as_str(), jwk.crv.as_deref()) {
            ("oct", _) => Alg::HS256,
            ("RSA", _) => Alg::RS256,
            ("EC", Some("P-256")) => Alg::ES256,
            ("EC", Some("P-384")) => Alg::ES384,
            ("OKP", Some("Ed25519")) => Alg::EdDSA,
            ("EC" | "OKP", Some(curve)) => return Err(format!("curve {curve:?} is not supported")),
            ("EC" | "OKP", None) => return Err(format!("not a supported JWK: a {} key needs `crv`", jwk.kty)),
            (other, _) => {
                return Err(format!("not a supported JWK: kty {other:?} is not one of oct, RSA, EC, OKP"));
            }
        };
        let alg = match &jwk.alg {
            None => implied,
            Some(name) => {
                let declared = Alg::parse(name).ok_or_else(|| format!("alg {name} is not a signature algorithm"))?;
                // An EC key's curve fixes its algorithm; other types allow
                // any hash of their family.
                let fits =
                    declared.family() == implied.family() && (implied.family() != Family::Ec || declared == implied);
                if !fits {
                    return Err(format!("alg {name} does not fit this key's type and curve"));
                }
                declared
            }
        };
        let key = public_key(&jwk, alg)?;
        Ok(Key { kid: jwk.kid, alg, key })
    }

    /// Whether `signature` is this key's, with its algorithm, over `message`.
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        match (&self.key, self.alg) {
            (Material::Hmac(secret), Alg::HS256) => hmac_verify::<Hmac<Sha256>>(secret, message, signature),
            (Material::Hmac(secret), Alg::HS384) => hmac_verify::<Hmac<Sha384>>(secret, message, signature),
            (Material::Hmac(secret), Alg::HS512) => hmac_verify::<Hmac<Sha512>>(secret, message, signature),
            (Material::Public(key), alg) => alg
                .public_key_algorithm()
                .is_some_and(|algorithm| host::verify_signature(algorithm, key, message, signature)),
            (Material::Hmac(_), _) => false,
        }
    }
}

fn public_key(jwk: &Jwk, alg: Alg) -> Result<Material, String> {
    let member = |name: &str, value: &Option<String>| -> Result<Vec<u8>, String> {
        let text = value.as_deref().ok_or_else(|| format!("not a supported JWK: a {} key needs `{name}`", jwk.kty))?;
        URL_SAFE_NO_PAD.decode(text).map_err(|_| format!("unusable key: `{name}` is not base64url"))
    };
    match alg.family() {
        Family::Hmac => {
            let secret = member("k", &jwk.k)?;
            // RFC 7518 §3.2: a key at least as long as the hash's output.
            let min = match alg {
                Alg::HS384 => 48,
                Alg::HS512 => 64,
                _ => 32,
            };
            if secret.len() < min {
                return Err(format!(
                    "unusable key: an {} secret must be at least {min} bytes; this one has {}",
                    alg.name(),
                    secret.len()
                ));
            }
            Ok(Material::Hmac(secret))
        }
        Family::Rsa => {
            let n = unsigned(member("n", &jwk.n)?);
            let e = unsigned(member("e", &jwk.e)?);
            let bits = n.first().map_or(0, |top| n.len() * 8 - top.leading_zeros() as usize);
            if !RSA_BITS.contains(&bits) {
                return Err(format!(
                    "unusable key: an RSA key must have {} to {} bits; this one has {bits}",
                    RSA_BITS.start(),
                    RSA_BITS.end()
                ));
            }
            // A modulus is odd; an exponent odd and from 3 to 2^33 - 1 (the
            // range the gateway checks with).
            let exponent = (e.len() <= 8).then(|| e.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b)));
            if n.last().is_none_or(|low| low % 2 == 0)
                || !exponent.is_some_and(|e| e % 2 == 1 && (3..1 << 33).contains(&e))
            {
                return Err(
                    "unusable key: not an RSA public key (even modulus, or exponent not odd from 3 to 2^33 - 1)".into(),
                );
            }
            Ok(Material::Public(PublicKey::Rsa(RsaPublicKey { n, e })))
        }
        Family::Ec => {
            let mut point = vec![0x04];
            point.extend(member("x", &jwk.x)?);
            point.extend(member("y", &jwk.y)?);
            let on_curve = match alg {
                Alg::ES384 => p384::PublicKey::from_sec1_bytes(&point).is_ok(),
                _ => p256::PublicKey::from_sec1_bytes(&point).is_ok(),
            };
            if !on_curve {
                return Err("unusable key: not a point on its curve".into());
            }
            Ok(Material::Public(PublicKey::Ec(point)))
        }
        Family::Ed => {
            let x: [u8; 32] =
                member("x", &jwk.x)?.try_into().map_err(|_| "unusable key: an Ed25519 `x` is 32 bytes".to_string())?;
            ed25519_dalek::VerifyingKey::from_bytes(&x)
                .map_err(|_| "unusable key: not an Ed25519 public key".to_string())?;
            Ok(Material::Public(PublicKey::Ed25519(x.to_vec())))
        }
    }
}

/// A big-endian number without its leading zero bytes.
fn unsigned(mut bytes: Vec<u8>) -> Vec<u8> {
    let zeros = bytes.iter().take_while(|&&b| b == 0).count();
    bytes.drain(..zeros);
    bytes
}

/// Constant-time comparison of the MAC (`verify_slice`).
fn hmac_verify<M: Mac + hmac::digest::KeyInit>(secret: &[u8], message: &[u8], signature: &[u8]) -> bool {
    let Ok(mut mac) = <M as Mac>::new_from_slice(secret) else { return false };
    mac.update(message);
    mac.verify_slice(signature).is_ok()
}
