//! Cosign key-based signatures, in cosign's classic layout: what `cosign
//! sign --key` (v2, without `--new-bundle-format`) writes and `cosign verify
//! --key` reads.
//!
//! The signatures of manifest `sha256:<hex>` are the layers of the image
//! manifest tagged `sha256-<hex>.sig` in the same repository. Each layer
//! (media type [`SIMPLE_SIGNING`]) is a "simple signing" JSON payload naming
//! the signed manifest digest, and carries in its annotation
//! [`SIGNATURE_ANNOTATION`] the base64 of an ECDSA P-256 / SHA-256 ASN.1
//! signature over the payload's exact bytes.
//!
//! A manifest is verified when some payload names exactly its digest, has
//! cosign's `type`, and carries a signature that verifies under one of the
//! configured keys (any of them). The payload's `docker-reference` is not
//! compared, as cosign does not either: the digest is what is signed.
//!
//! This file is pure: keys, payloads and the decision. Fetching and
//! writing the `.sig` manifests is `registry/signatures.rs`.

use base64::Engine as _;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, Signature, SigningKey as EcdsaSigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePublicKey as _, LineEnding};
use serde::{Deserialize, Serialize};

use crate::digest::check_sha256;

/// The media type of a signature layer.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The payload's `critical.type`.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";

/// The largest signature manifest read. Cosign's are about 1 KiB per
/// signature (a few with a certificate chain, which key-based ones lack).
pub const MAX_SIGNATURE_MANIFEST_BYTES: u64 = 256 * 1024;
/// The most signature layers examined; a manifest with more is refused.
pub const MAX_SIGNATURE_LAYERS: usize = 32;
/// The largest payload read; cosign's are a few hundred bytes.
pub const MAX_PAYLOAD_BYTES: u64 = 64 * 1024;
/// The longest signature annotation read (a P-256 DER signature is at most
/// 72 bytes, 96 in base64).
const MAX_SIGNATURE_ANNOTATION_BYTES: usize = 1024;
/// The most keys a plugin may list.
pub const MAX_KEYS: usize = 16;
/// The largest key file or value read.
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// The tag cosign stores the signatures of `manifest_digest` under.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.sig", manifest_digest.replacen(':', "-", 1))
}

/// Public keys a signature must verify under, any of them.
#[derive(Clone)]
pub struct PublicKeys {
    keys: Vec<VerifyingKey>,
}

impl std::fmt::Debug for PublicKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PublicKeys({} keys)", self.keys.len())
    }
}

impl PublicKeys {
    /// Parses PEM public keys (`-----BEGIN PUBLIC KEY-----`, as `cosign
    /// generate-key-pair` writes `cosign.pub`): ECDSA P-256 only. Each
    /// key's position (from 1) names it in errors.
    pub fn from_pems<B: AsRef<[u8]>>(pems: &[B]) -> Result<PublicKeys, String> {
        if pems.is_empty() {
            return Err("no public key given".into());
        }
        if pems.len() > MAX_KEYS {
            return Err(format!("{} public keys; at most {MAX_KEYS}", pems.len()));
        }
        let keys = pems
            .iter()
            .enumerate()
            .map(|(i, pem)| parse_public_key(pem.as_ref()).map_err(|e| format!("public key {}: {e}", i + 1)))
            .collect::<Result<_, _>>()?;
        Ok(PublicKeys { keys })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The position (from 0) of the first key `signature` verifies under.
    fn verifying(&self, payload: &[u8], signature: &[u8]) -> Option<usize> {
        let signature = Signature::from_der(signature).ok()?;
        self.keys.iter().position(|key| key.verify(payload, &signature).is_ok())
    }
}

fn parse_public_key(pem: &[u8]) -> Result<VerifyingKey, String> {
    if pem.len() > MAX_KEY_BYTES {
        return Err(format!("over {MAX_KEY_BYTES} bytes"));
    }
    let text = std::str::from_utf8(pem).map_err(|_| "not PEM text".to_string())?;
    if !text.contains("-----BEGIN PUBLIC KEY-----") {
        return Err("not a PEM public key (expected -----BEGIN PUBLIC KEY-----, as in cosign.pub)".into());
    }
    VerifyingKey::from_public_key_pem(text.trim())
        .map_err(|e| format!("not an ECDSA P-256 public key ({e}); cosign's key pairs are P-256"))
}

/// One signature as it sits in a `.sig` manifest: the payload's bytes and
/// the signature's DER bytes. Kept in the cache as the proof a module was
/// verified, and verified again whenever it is served from there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SignedPayload {
    #[serde(with = "base64_bytes")]
    pub payload: Vec<u8>,
    #[serde(with = "base64_bytes")]
    pub signature: Vec<u8>,
}

impl SignedPayload {
    /// The signature of a layer, from its annotation.
    pub(crate) fn from_annotation(payload: Vec<u8>, annotation: &str) -> Result<SignedPayload, String> {
        if annotation.len() > MAX_SIGNATURE_ANNOTATION_BYTES {
            return Err(format!("its signature annotation is over {MAX_SIGNATURE_ANNOTATION_BYTES} bytes"));
        }
        let signature = base64::engine::general_purpose::STANDARD
            .decode(annotation.trim())
            .map_err(|e| format!("its signature annotation is not base64: {e}"))?;
        Ok(SignedPayload { payload, signature })
    }
}

/// Why no signature verified: each failure a distinct reason, the best one
/// seen across the layers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// No layer was a readable cosign signature payload.
    Unreadable(String),
    /// Payloads were readable, but none names this manifest digest.
    OtherDigest(Vec<String>),
    /// A payload names this digest, but no configured key verifies its
    /// signature.
    NoKeyVerifies { signatures: usize, keys: usize },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unreadable(why) => write!(f, "no readable cosign signature: {why}"),
            Refusal::OtherDigest(digests) => {
                write!(f, "the signatures are for another manifest ({}), not this one", digests.join(", "))
            }
            Refusal::NoKeyVerifies { signatures, keys } => write!(
                f,
                "no signature verifies under the configured keys ({signatures} signature(s) for this manifest, \
                 {keys} key(s))"
            ),
        }
    }
}

/// The simple signing payload, as far as it is checked.
#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// Which of `signatures` (its position, and the key's) verifies
/// `manifest_digest` under `keys`.
pub(crate) fn verify(
    keys: &PublicKeys,
    signatures: &[SignedPayload],
    manifest_digest: &str,
) -> Result<(usize, usize), Refusal> {
    let mut refusal = Refusal::Unreadable("the signature manifest has no signature layer".into());
    let mut for_this_manifest = 0;
    for (i, signed) in signatures.iter().enumerate() {
        let payload = match serde_json::from_slice::<Payload>(&signed.payload) {
            Ok(payload) => payload,
            Err(e) => {
                refusal =
                    refusal.max(Refusal::Unreadable(format!("payload {} is not a simple signing payload: {e}", i + 1)));
                continue;
            }
        };
        if payload.critical.kind != SIGNATURE_TYPE {
            let kind: String = payload.critical.kind.chars().take(64).collect();
            refusal = refusal.max(Refusal::Unreadable(format!("payload {} has type {kind:?}", i + 1)));
            continue;
        }
        let named = payload.critical.image.docker_manifest_digest;
        if named != manifest_digest {
            // A registry's text reaches an error only once it is a digest.
            let named = if check_sha256(&named).is_ok() { named } else { "a malformed digest".into() };
            refusal = match refusal {
                Refusal::OtherDigest(mut digests) if !digests.contains(&named) && digests.len() < 4 => {
                    digests.push(named);
                    Refusal::OtherDigest(digests)
                }
                keep @ (Refusal::OtherDigest(_) | Refusal::NoKeyVerifies { .. }) => keep,
                Refusal::Unreadable(_) => Refusal::OtherDigest(vec![named]),
            };
            continue;
        }
        for_this_manifest += 1;
        if let Some(key) = keys.verifying(&signed.payload, &signed.signature) {
            return Ok((i, key));
        }
        refusal = Refusal::NoKeyVerifies { signatures: for_this_manifest, keys: keys.len() };
    }
    Err(refusal)
}

/// The payload cosign signs for `manifest_digest` of `repository`
/// (`registry/repository`), byte for byte as cosign v2 writes it.
pub fn simple_signing_payload(repository: &str, manifest_digest: &str) -> Vec<u8> {
    // Fields in cosign's order: `critical` (identity, image, type), then
    // `optional`.
    #[derive(Serialize)]
    struct Out<'a> {
        critical: OutCritical<'a>,
        optional: Option<()>,
    }
    #[derive(Serialize)]
    struct OutCritical<'a> {
        identity: OutIdentity<'a>,
        image: OutImage<'a>,
        #[serde(rename = "type")]
        kind: &'a str,
    }
    #[derive(Serialize)]
    struct OutIdentity<'a> {
        #[serde(rename = "docker-reference")]
        docker_reference: &'a str,
    }
    #[derive(Serialize)]
    struct OutImage<'a> {
        #[serde(rename = "docker-manifest-digest")]
        docker_manifest_digest: &'a str,
    }
    let out = Out {
        critical: OutCritical {
            identity: OutIdentity { docker_reference: repository },
            image: OutImage { docker_manifest_digest: manifest_digest },
            kind: SIGNATURE_TYPE,
        },
        optional: None,
    };
    serde_json::to_vec(&out).expect("the payload serializes")
}

/// A private key to sign with: cosign's own key file (`cosign.key`, from
/// `cosign generate-key-pair`) or a plain PKCS#8 or SEC1 PEM EC key.
pub struct SigningKey {
    key: EcdsaSigningKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

/// cosign's encrypted key file, as v2 writes it, and as v1 did.
const SIGSTORE_PRIVATE_KEY: &str = "ENCRYPTED SIGSTORE PRIVATE KEY";
const COSIGN_PRIVATE_KEY: &str = "ENCRYPTED COSIGN PRIVATE KEY";
/// The scrypt cost accepted in a key file: cosign v2 writes N = 65536,
/// r = 8, p = 1 (64 MiB; v1 wrote N = 32768); more than twice that is
/// refused rather than let a file choose how much memory and time it takes.
const MAX_SCRYPT_LOG_N: u8 = 17;
const MAX_SCRYPT_R: u32 = 8;
const MAX_SCRYPT_P: u32 = 4;

impl SigningKey {
    /// Reads a key file's text. An encrypted cosign key needs `password`
    /// (cosign reads it from `COSIGN_PASSWORD`; empty is a valid password).
    pub fn from_pem(pem: &[u8], password: Option<&[u8]>) -> Result<SigningKey, String> {
        if pem.len() > MAX_KEY_BYTES {
            return Err(format!("the key file is over {MAX_KEY_BYTES} bytes"));
        }
        let text = std::str::from_utf8(pem).map_err(|_| "the key file is not PEM text".to_string())?;
        let label = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("-----BEGIN ")?.strip_suffix("-----"))
            .ok_or("the key file holds no PEM block")?;
        let key = match label {
            SIGSTORE_PRIVATE_KEY | COSIGN_PRIVATE_KEY => {
                let password = password
                    .ok_or("the key is encrypted (cosign generate-key-pair); set COSIGN_PASSWORD to its password")?;
                let envelope = pem_block(text, label)?;
                let der = decrypt_cosign_key(&envelope, password)?;
                EcdsaSigningKey::from_pkcs8_der(&der)
                    .map_err(|e| format!("the decrypted key is not an ECDSA P-256 PKCS#8 key: {e}"))?
            }
            "PRIVATE KEY" => EcdsaSigningKey::from_pkcs8_pem(text.trim())
                .map_err(|e| format!("not an ECDSA P-256 PKCS#8 key: {e}"))?,
            "EC PRIVATE KEY" => {
                use p256::elliptic_curve::SecretKey;
                let secret = SecretKey::<p256::NistP256>::from_sec1_pem(text.trim())
                    .map_err(|e| format!("not a P-256 SEC1 EC key: {e}"))?;
                EcdsaSigningKey::from(secret)
            }
            other => return Err(format!("unsupported key file ({other}); expected cosign.key or a PKCS#8 EC key")),
        };
        Ok(SigningKey { key })
    }

    /// The DER signature over `payload`, as cosign makes it.
    pub fn sign(&self, payload: &[u8]) -> Vec<u8> {
        let signature: Signature = self.key.sign(payload);
        let der: DerSignature = signature.to_der();
        der.as_bytes().to_vec()
    }

    /// The public key, PEM, as `cosign.pub` holds it.
    pub fn public_key_pem(&self) -> String {
        self.key.verifying_key().to_public_key_pem(LineEnding::LF).expect("a P-256 public key encodes")
    }
}

/// The bytes of the PEM block labelled `label` (cosign's envelope is JSON,
/// not DER, so the DER-checking decoders do not apply).
fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, String> {
    let (begin, end) = (format!("-----BEGIN {label}-----"), format!("-----END {label}-----"));
    let body = text
        .split_once(&begin)
        .and_then(|(_, rest)| rest.split_once(&end))
        .map(|(body, _)| body)
        .ok_or_else(|| format!("the key file's {label} block is not closed"))?;
    let base64: String = body.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(base64)
        .map_err(|e| format!("the key file's PEM is not base64: {e}"))
}

/// go-securesystemslib's `encrypted` envelope, as cosign writes it.
#[derive(Deserialize)]
struct Envelope {
    kdf: Kdf,
    cipher: Cipher,
    #[serde(with = "base64_bytes")]
    ciphertext: Vec<u8>,
}

#[derive(Deserialize)]
struct Kdf {
    name: String,
    params: KdfParams,
    #[serde(with = "base64_bytes")]
    salt: Vec<u8>,
}

#[derive(Deserialize)]
struct KdfParams {
    #[serde(rename = "N")]
    n: u64,
    r: u32,
    p: u32,
}

#[derive(Deserialize)]
struct Cipher {
    name: String,
    #[serde(with = "base64_bytes")]
    nonce: Vec<u8>,
}

fn decrypt_cosign_key(envelope: &[u8], password: &[u8]) -> Result<Vec<u8>, String> {
    use crypto_secretbox::aead::{Aead as _, KeyInit as _};
    let envelope: Envelope =
        serde_json::from_slice(envelope).map_err(|e| format!("the encrypted key is not cosign's envelope: {e}"))?;
    if envelope.kdf.name != "scrypt" || envelope.cipher.name != "nacl/secretbox" {
        return Err(format!(
            "the encrypted key uses {} and {}; cosign's use scrypt and nacl/secretbox",
            envelope.kdf.name, envelope.cipher.name
        ));
    }
    let KdfParams { n, r, p } = envelope.kdf.params;
    let log_n = n.checked_ilog2().filter(|&log| 1u64 << log == n).ok_or("the key's scrypt N is not a power of two")?;
    if log_n > MAX_SCRYPT_LOG_N.into() || r > MAX_SCRYPT_R || p > MAX_SCRYPT_P || r == 0 || p == 0 {
        return Err(format!("the key's scrypt parameters (N={n}, r={r}, p={p}) are over what cosign writes"));
    }
    let params = scrypt::Params::new(log_n as u8, r, p, 32).map_err(|e| format!("scrypt parameters: {e}"))?;
    let mut key = [0u8; 32];
    scrypt::scrypt(password, &envelope.kdf.salt, &params, &mut key).map_err(|e| format!("scrypt: {e}"))?;
    if envelope.cipher.nonce.len() != 24 {
        return Err("the key's secretbox nonce is not 24 bytes".into());
    }
    let cipher = crypto_secretbox::XSalsa20Poly1305::new(&key.into());
    let nonce = crypto_secretbox::Nonce::from_slice(&envelope.cipher.nonce);
    cipher
        .decrypt(nonce, envelope.ciphertext.as_slice())
        .map_err(|_| "the key does not decrypt: wrong password (COSIGN_PASSWORD)?".to_string())
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        base64::engine::general_purpose::STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
pub(crate) mod tests;
