use super::*;

/// Test keys made with openssl: a PKCS#8 P-256 key and its public key, a
/// SEC1 one and its public key, and a P-384 public key (not cosign's curve).
pub(crate) const PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgDxzcInMp8qZfD1qt
4VBgY568FNDBA+Pgp42K43H8Tj+hRANCAAQ7uV6olCYlCoFfJ4k4Q9nuZlQvNnxZ
pTr+7Iv/71QC8aPJTcyT7jKDIo0+KJQywN371OxZzZeKt4JstAGeA2pu
-----END PRIVATE KEY-----";
pub(crate) const PKCS8_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEO7leqJQmJQqBXyeJOEPZ7mZULzZ8
WaU6/uyL/+9UAvGjyU3Mk+4ygyKNPiiUMsDd+9TsWc2XireCbLQBngNqbg==
-----END PUBLIC KEY-----";
const SEC1: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIA4+/RdVQpnl9jyP3ubIV/MdJ0sq/cmfgxnd9O0K9r/hoAoGCCqGSM49
AwEHoUQDQgAE7zxqS0nEqgZQ4ZuX+r3S/CPrKO2WrDPYAChney/8vaxE1VnvQHjk
r5NFn3kXq+4B3D+T9f8Gq/DOfT1d7QHllA==
-----END EC PRIVATE KEY-----";
pub(crate) const SEC1_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE7zxqS0nEqgZQ4ZuX+r3S/CPrKO2W
rDPYAChney/8vaxE1VnvQHjkr5NFn3kXq+4B3D+T9f8Gq/DOfT1d7QHllA==
-----END PUBLIC KEY-----";
const P384_PUB: &str = "-----BEGIN PUBLIC KEY-----
MHYwEAYHKoZIzj0CAQYFK4EEACIDYgAEVsc3gBL5p6U6EOdNQud9q7w0Rw58+pCL
U2gWRGSQcUldxJLAbRX/AFxiQMAP8/33QhLKBq/ny4CXsdKb8TqNt3VAyzaAGqeu
qsWYspu/ZuT29mJcxn7SIll9hy5QlZEL
-----END PUBLIC KEY-----";

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const OTHER: &str = "sha256:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

fn pkcs8() -> SigningKey {
    SigningKey::from_pem(PKCS8.as_bytes(), None).unwrap()
}

fn sec1() -> SigningKey {
    SigningKey::from_pem(SEC1.as_bytes(), None).unwrap()
}

fn signed(key: &SigningKey, digest: &str) -> SignedPayload {
    let payload = simple_signing_payload("127.0.0.1:5000/plugins/p", digest);
    SignedPayload { signature: key.sign(&payload), payload }
}

fn keys(pems: &[&str]) -> PublicKeys {
    PublicKeys::from_pems(pems).unwrap()
}

#[test]
fn the_payload_is_cosigns_byte_for_byte() {
    let payload = simple_signing_payload("127.0.0.1:5000/plugins/p", DIGEST);
    assert_eq!(
        String::from_utf8(payload).unwrap(),
        format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"127.0.0.1:5000/plugins/p"}},"image":{{"docker-manifest-digest":"{DIGEST}"}},"type":"cosign container image signature"}},"optional":null}}"#
        )
    );
    assert_eq!(signature_tag(DIGEST), format!("sha256-{}.sig", &DIGEST[7..]));
}

#[test]
fn a_signature_verifies_only_its_digest_under_its_key() {
    let good = signed(&pkcs8(), DIGEST);
    assert_eq!(verify(&keys(&[PKCS8_PUB]), std::slice::from_ref(&good), DIGEST), Ok((0, 0)));
    // The public key a signing key reports is the one openssl derived.
    assert_eq!(pkcs8().public_key_pem().trim(), PKCS8_PUB.trim());
    assert_eq!(sec1().public_key_pem().trim(), SEC1_PUB.trim());

    // Another key.
    assert_eq!(
        verify(&keys(&[SEC1_PUB]), std::slice::from_ref(&good), DIGEST),
        Err(Refusal::NoKeyVerifies { signatures: 1, keys: 1 })
    );
    // A valid signature of another manifest.
    let error = verify(&keys(&[PKCS8_PUB]), std::slice::from_ref(&good), OTHER).unwrap_err();
    assert_eq!(error, Refusal::OtherDigest(vec![DIGEST.to_string()]));
    assert!(error.to_string().contains("another manifest"), "{error}");
    // One byte of the payload changed: the signature no longer covers it.
    let mut tampered = good.clone();
    tampered.payload = String::from_utf8(tampered.payload).unwrap().replace("plugins/p", "plugins/q").into_bytes();
    assert!(matches!(verify(&keys(&[PKCS8_PUB]), &[tampered], DIGEST), Err(Refusal::NoKeyVerifies { .. })));
    // Not a signature at all.
    let garbage = SignedPayload { signature: b"not DER".to_vec(), ..good.clone() };
    assert!(matches!(verify(&keys(&[PKCS8_PUB]), &[garbage], DIGEST), Err(Refusal::NoKeyVerifies { .. })));
    // No signatures.
    assert!(matches!(verify(&keys(&[PKCS8_PUB]), &[], DIGEST), Err(Refusal::Unreadable(_))));
}

#[test]
fn any_of_the_keys_and_any_of_the_signatures() {
    let by_sec1 = signed(&sec1(), DIGEST);
    let other_manifest = signed(&pkcs8(), OTHER);
    let both = keys(&[PKCS8_PUB, SEC1_PUB]);
    // The second key verifies the second signature.
    assert_eq!(verify(&both, &[other_manifest.clone(), by_sec1.clone()], DIGEST), Ok((1, 1)));
    // The best reason wins: a signature for this manifest under no key.
    assert_eq!(
        verify(&keys(&[PKCS8_PUB]), &[other_manifest, by_sec1], DIGEST),
        Err(Refusal::NoKeyVerifies { signatures: 1, keys: 1 })
    );
}

#[test]
fn payloads_must_be_cosign_signatures() {
    let key = pkcs8();
    let sign = |payload: &str| SignedPayload { signature: key.sign(payload.as_bytes()), payload: payload.into() };
    let wrong_type = format!(
        r#"{{"critical":{{"identity":{{"docker-reference":"r/p"}},"image":{{"docker-manifest-digest":"{DIGEST}"}},"type":"something else"}},"optional":null}}"#
    );
    for payload in
        [wrong_type.as_str(), "not json", "{}", r#"{"critical":{"type":"cosign container image signature"}}"#]
    {
        match verify(&keys(&[PKCS8_PUB]), &[sign(payload)], DIGEST) {
            Err(Refusal::Unreadable(_)) => {}
            other => panic!("{payload}: {other:?}"),
        }
    }
    // A payload naming something that is not a digest is not quoted.
    let odd = simple_signing_payload("r/p", "sha256:../../etc");
    let error =
        verify(&keys(&[PKCS8_PUB]), &[SignedPayload { signature: key.sign(&odd), payload: odd }], DIGEST).unwrap_err();
    assert_eq!(error, Refusal::OtherDigest(vec!["a malformed digest".into()]));
}

#[test]
fn public_keys_are_p256_pem_and_bounded() {
    for (pem, expected) in [
        ("", "not a PEM public key"),
        ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "not an ECDSA P-256 public key"),
        (P384_PUB, "not an ECDSA P-256 public key"),
        (PKCS8, "not a PEM public key"),
    ] {
        let error = PublicKeys::from_pems(&[PKCS8_PUB, pem]).unwrap_err();
        assert!(error.starts_with("public key 2: ") && error.contains(expected), "{error}");
    }
    assert!(PublicKeys::from_pems::<&str>(&[]).is_err());
    assert!(PublicKeys::from_pems(&vec![PKCS8_PUB; MAX_KEYS + 1]).unwrap_err().contains("at most"));
    assert!(PublicKeys::from_pems(&["x".repeat(MAX_KEY_BYTES + 1)]).unwrap_err().contains("over"));
    assert_eq!(keys(&vec![PKCS8_PUB; MAX_KEYS]).len(), MAX_KEYS);
}

#[test]
fn private_keys_say_what_is_wrong() {
    for (pem, password, expected) in [
        ("nothing", None, "no PEM block"),
        ("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n", None, "unsupported key file"),
        (
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
            None,
            "COSIGN_PASSWORD",
        ),
        (
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
            Some(&b"pw"[..]),
            "not cosign's envelope",
        ),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", None, "not an ECDSA P-256 PKCS#8 key"),
    ] {
        let error = SigningKey::from_pem(pem.as_bytes(), password).unwrap_err();
        assert!(error.contains(expected), "{pem}: {error}");
    }
    assert_eq!(format!("{:?}", pkcs8()), "SigningKey(<redacted>)");
}

#[test]
fn signed_payloads_round_trip_through_the_cache_record() {
    let record = signed(&pkcs8(), DIGEST);
    let json = serde_json::to_string(&record).unwrap();
    assert_eq!(serde_json::from_str::<SignedPayload>(&json).unwrap(), record);
    assert!(SignedPayload::from_annotation(b"p".to_vec(), "not base64!").is_err());
    assert!(SignedPayload::from_annotation(b"p".to_vec(), &"A".repeat(2000)).is_err());
}

/// Made by the real cosign v2.6.5: `COSIGN_PASSWORD=pw cosign
/// generate-key-pair`, then `cosign sign --key` of a manifest, whose
/// signature layer's payload and annotation these are.
const COSIGN_KEY: &str = "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----
eyJrZGYiOnsibmFtZSI6InNjcnlwdCIsInBhcmFtcyI6eyJOIjo2NTUzNiwiciI6
OCwicCI6MX0sInNhbHQiOiJXYjdiSHZCM0hkMzN3bFBpN0ZMclBLSEhEa0ZGclNp
eE1CNXFxTHMvcElVPSJ9LCJjaXBoZXIiOnsibmFtZSI6Im5hY2wvc2VjcmV0Ym94
Iiwibm9uY2UiOiJER0Y0bjNyeHpGRWdKd3lBVlI1TWRreE53MWpBQXpOSCJ9LCJj
aXBoZXJ0ZXh0IjoiWlA0K0IwSWNISisrRXl6YkJyK3llL01LQ3h1bEpGQitST1RX
MHhxZ2tMTDg3MG5YMTBzQ25IUG10RXBrRG9wT0tGRmZ2dndhSFRRR25vODdiZFIy
TGQ2bHBLK2ZtUk82MzJuUkNNcWp1SWpmaFJ1QTlXRnowUWpxbGtsUGw5QnNmYU40
OWs2NVBwa0tKQTVkYWJjek5hbGNVdWRZZ3I0akNodE1lKzZXeHBEQmM4bHhBOGQ0
MDNETFY1SUkrUTd2Vm41TXFvVGJkTzcrMHc9PSJ9
-----END ENCRYPTED SIGSTORE PRIVATE KEY-----";
const COSIGN_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEf47EECQar3gR7X6kWTPjgGqm/wx9
g4ziCt445+NjZVgTeVFuru5RFXN+R6/pK3Mmf7RUcaC8CaHVaohOPriDhA==
-----END PUBLIC KEY-----";
const COSIGN_SIGNED_DIGEST: &str = "sha256:93c0b4d5327cd4c70a8e958457dc31293712ea20df5bfa83a7c69175cc6effa7";
const COSIGN_PAYLOAD: &str = r#"{"critical":{"identity":{"docker-reference":"127.0.0.1:5077/plugins/probe"},"image":{"docker-manifest-digest":"sha256:93c0b4d5327cd4c70a8e958457dc31293712ea20df5bfa83a7c69175cc6effa7"},"type":"cosign container image signature"},"optional":null}"#;
const COSIGN_SIGNATURE: &str =
    "MEQCIADEggRtAOsrrqcPJYq3uy1WVYXFKHLvYFf4mjUGOmgTAiAZUv9eEqWs0XrhAq4FT3qZWFVrs9VV91As04l3Ep5Aew==";

#[test]
fn cosigns_own_keys_and_signatures_are_read() {
    // The payload sluice writes is the one cosign wrote.
    let ours = simple_signing_payload("127.0.0.1:5077/plugins/probe", COSIGN_SIGNED_DIGEST);
    assert_eq!(String::from_utf8(ours).unwrap(), COSIGN_PAYLOAD);
    // cosign's signature verifies under cosign's public key.
    let signed = SignedPayload::from_annotation(COSIGN_PAYLOAD.into(), COSIGN_SIGNATURE).unwrap();
    assert_eq!(verify(&keys(&[COSIGN_PUB]), std::slice::from_ref(&signed), COSIGN_SIGNED_DIGEST), Ok((0, 0)));
    assert!(verify(&keys(&[PKCS8_PUB]), &[signed], COSIGN_SIGNED_DIGEST).is_err());

    // cosign's encrypted private key decrypts with its password, to the key
    // cosign.pub holds.
    let key = SigningKey::from_pem(COSIGN_KEY.as_bytes(), Some(b"pw")).unwrap();
    assert_eq!(key.public_key_pem().trim(), COSIGN_PUB.trim());
    // A wrong password says so; cosign v1's label is read the same.
    let v1 = COSIGN_KEY.replace("SIGSTORE", "COSIGN");
    let error = SigningKey::from_pem(v1.as_bytes(), Some(b"not the password")).unwrap_err();
    assert!(error.contains("wrong password"), "{error}");
}
