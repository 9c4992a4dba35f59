//! `sluice:plugin/crypto`: public-key signature checks for plugins, with
//! ring, natively. An RSA-2048 check in a guest took 1–2 ms (big-number
//! arithmetic in Wasm); here it is tens of microseconds.
//!
//! Everything a guest passes is untrusted: a key the algorithm cannot use
//! is a `false`, never an error or a trap. The work is bounded by ring's
//! limits (RSA moduli of at most 8192 bits) and the message's length, which
//! the guest's memory limit bounds.

use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey, VerificationAlgorithm};

use crate::bindings::v3::sluice::plugin::crypto::{Host, PublicKey, SignatureAlgorithm};
use crate::host::PluginState;

impl Host for PluginState {
    fn verify_signature(
        &mut self,
        algorithm: SignatureAlgorithm,
        key: PublicKey,
        message: Vec<u8>,
        signature: Vec<u8>,
    ) -> wasmtime::Result<bool> {
        Ok(verify(algorithm, &key, &message, &signature))
    }
}

fn verify(algorithm: SignatureAlgorithm, key: &PublicKey, message: &[u8], signature: &[u8]) -> bool {
    use SignatureAlgorithm as A;
    let rsa = |params: &'static signature::RsaParameters| match key {
        PublicKey::Rsa(key) => {
            RsaPublicKeyComponents { n: &key.n, e: &key.e }.verify(params, message, signature).is_ok()
        }
        _ => false,
    };
    let point = |params: &'static dyn VerificationAlgorithm, bytes: &[u8]| {
        UnparsedPublicKey::new(params, bytes).verify(message, signature).is_ok()
    };
    match algorithm {
        A::Rs256 => rsa(&signature::RSA_PKCS1_2048_8192_SHA256),
        A::Rs384 => rsa(&signature::RSA_PKCS1_2048_8192_SHA384),
        A::Rs512 => rsa(&signature::RSA_PKCS1_2048_8192_SHA512),
        A::Ps256 => rsa(&signature::RSA_PSS_2048_8192_SHA256),
        A::Ps384 => rsa(&signature::RSA_PSS_2048_8192_SHA384),
        A::Ps512 => rsa(&signature::RSA_PSS_2048_8192_SHA512),
        A::Es256 => matches!(key, PublicKey::Ec(p) if point(&signature::ECDSA_P256_SHA256_FIXED, p)),
        A::Es384 => matches!(key, PublicKey::Ec(p) if point(&signature::ECDSA_P384_SHA384_FIXED, p)),
        A::EdDsa => matches!(key, PublicKey::Ed25519(k) if point(&signature::ED25519, k)),
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use ring::rand::SystemRandom;
    use ring::signature::{
        ECDSA_P256_SHA256_FIXED_SIGNING, ECDSA_P384_SHA384_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair,
        RSA_PKCS1_SHA256, RSA_PKCS1_SHA512, RSA_PSS_SHA384, RsaKeyPair,
    };

    use super::*;
    use crate::bindings::v3::sluice::plugin::crypto::RsaPublicKey;

    /// The auth plugin's test key (PKCS #8, 2048 bits).
    fn rsa_key_pair() -> RsaKeyPair {
        let pem = include_str!("../../../plugins/auth/testdata/rsa-private.pem");
        let body: String = pem.lines().filter(|line| !line.starts_with("-----")).collect();
        RsaKeyPair::from_pkcs8(&base64::engine::general_purpose::STANDARD.decode(body).unwrap()).unwrap()
    }

    fn rsa_public(pair: &RsaKeyPair) -> PublicKey {
        let public = RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
        PublicKey::Rsa(RsaPublicKey { n: public.n, e: public.e })
    }

    /// Every algorithm with a key of its own, then with the signature, the
    /// message or the algorithm changed.
    #[test]
    fn each_algorithm_accepts_its_signature_and_nothing_changed() {
        let rng = SystemRandom::new();
        let message = b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9";
        let rsa = rsa_key_pair();
        let rsa_sign = |padding: &'static dyn ring::signature::RsaEncoding| {
            let mut signature = vec![0; rsa.public().modulus_len()];
            rsa.sign(padding, &rng, message, &mut signature).unwrap();
            signature
        };
        let ecdsa = |alg: &'static ring::signature::EcdsaSigningAlgorithm| {
            let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
            let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).unwrap();
            (PublicKey::Ec(pair.public_key().as_ref().to_vec()), pair.sign(&rng, message).unwrap().as_ref().to_vec())
        };
        let ed = Ed25519KeyPair::from_pkcs8(Ed25519KeyPair::generate_pkcs8(&rng).unwrap().as_ref()).unwrap();
        let (p256, p256_signature) = ecdsa(&ECDSA_P256_SHA256_FIXED_SIGNING);
        let (p384, p384_signature) = ecdsa(&ECDSA_P384_SHA384_FIXED_SIGNING);
        let cases = [
            (SignatureAlgorithm::Rs256, rsa_public(&rsa), rsa_sign(&RSA_PKCS1_SHA256)),
            (SignatureAlgorithm::Rs512, rsa_public(&rsa), rsa_sign(&RSA_PKCS1_SHA512)),
            (SignatureAlgorithm::Ps384, rsa_public(&rsa), rsa_sign(&RSA_PSS_SHA384)),
            (SignatureAlgorithm::Es256, p256.clone(), p256_signature),
            (SignatureAlgorithm::Es384, p384.clone(), p384_signature),
            (
                SignatureAlgorithm::EdDsa,
                PublicKey::Ed25519(ed.public_key().as_ref().to_vec()),
                ed.sign(message).as_ref().to_vec(),
            ),
        ];
        for (algorithm, key, signature) in &cases {
            assert!(verify(*algorithm, key, message, signature), "{algorithm:?}");
            let mut changed = signature.clone();
            changed[3] ^= 1;
            assert!(!verify(*algorithm, key, message, &changed), "{algorithm:?}: a changed signature");
            assert!(!verify(*algorithm, key, b"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSK9", signature), "{algorithm:?}");
            assert!(!verify(*algorithm, key, message, &[]), "{algorithm:?}: no signature");
        }
        // The same key and signature named as another algorithm.
        let (_, rsa_key, rs256_signature) = &cases[0];
        for other in [SignatureAlgorithm::Rs384, SignatureAlgorithm::Ps256, SignatureAlgorithm::Es256] {
            assert!(!verify(other, rsa_key, message, rs256_signature), "{other:?}");
        }
        let (_, _, es256_signature) = &cases[3];
        assert!(!verify(SignatureAlgorithm::Es384, &p256, message, es256_signature), "a P-256 key as P-384");
        assert!(!verify(SignatureAlgorithm::EdDsa, &p256, message, es256_signature), "an EC key as Ed25519");
    }

    #[test]
    fn keys_the_algorithm_cannot_use_are_false_not_errors() {
        let message = b"m";
        let signature = [1u8; 256];
        let rsa = |n: Vec<u8>, e: Vec<u8>| PublicKey::Rsa(RsaPublicKey { n, e });
        let mut n_1024 = vec![0xC5; 128];
        n_1024[127] |= 1;
        for key in [
            rsa(Vec::new(), Vec::new()),
            rsa(n_1024, vec![1, 0, 1]),
            rsa(vec![0xC5; 1025], vec![1, 0, 1]),
            PublicKey::Ec(Vec::new()),
            PublicKey::Ec(vec![4; 65]),
            PublicKey::Ed25519(vec![0; 3]),
        ] {
            for algorithm in [SignatureAlgorithm::Rs256, SignatureAlgorithm::Es256, SignatureAlgorithm::EdDsa] {
                assert!(!verify(algorithm, &key, message, &signature));
            }
        }
    }
}
