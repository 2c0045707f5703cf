use proptest::prelude::*;

use super::*;

fn key(byte: u8) -> SessionKey {
    let mut k = [byte; 32];
    k[0] = byte.wrapping_add(1);
    SessionKey(k)
}

fn contents(initialize: &[u8]) -> Contents {
    Contents {
        issued: 1_790_000_000,
        upstream_id: HeaderValue::from_static("0b6f1c2e-7a1d-4f7e-9a53-1f0e1b2c3d4e"),
        protocol_version: Some(HeaderValue::from_static("2025-06-18")),
        endpoint: "/mcp".into(),
        initialize: Bytes::copy_from_slice(initialize),
    }
}

const INITIALIZE: &[u8] = br#"{"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"holdfast-ts-test-client","version":"1.0.0"}},"jsonrpc":"2.0","id":0}"#;

#[test]
fn a_sealed_token_opens_to_what_was_sealed_and_is_visible_ascii() {
    let ring = Keyring::new(&[key(1)]);
    let c = contents(INITIALIZE);
    let token = ring.seal(&c).unwrap();
    assert!(token.starts_with(PREFIX));
    assert!(token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
    assert!(HeaderValue::from_str(&token).is_ok());
    assert_eq!(ring.open(token.as_bytes()), Ok(c.clone()));
    // No version: an empty field, read back as none.
    let plain = Contents {
        protocol_version: None,
        ..c
    };
    assert_eq!(ring.open(ring.seal(&plain).unwrap().as_bytes()), Ok(plain));
    // Two sealings of the same contents differ (a fresh nonce each).
    assert_ne!(
        ring.seal(&contents(INITIALIZE)),
        ring.seal(&contents(INITIALIZE))
    );
}

#[test]
fn a_large_initialize_is_deflated_and_one_too_large_is_not_sealed() {
    let ring = Keyring::new(&[key(1)]);
    // Repetitive JSON (capabilities, long client names) deflates well.
    let big = format!(
        r#"{{"method":"initialize","params":{{"capabilities":{{"x":"{}"}}}},"id":0}}"#,
        "ab".repeat(4000)
    );
    let token = ring
        .seal(&contents(big.as_bytes()))
        .expect("deflated, it fits");
    assert!(token.len() <= MAX_TOKEN_LEN);
    assert_eq!(
        ring.open(token.as_bytes()).unwrap().initialize,
        big.as_bytes()
    );
    // Random bytes do not deflate: past the bound, no token.
    let mut noise = vec![0u8; 4000];
    SystemRandom::new().fill(&mut noise).unwrap();
    assert_eq!(ring.seal(&contents(&noise)), None);
}

#[test]
fn rotation_every_key_opens_the_first_seals() {
    let old = Keyring::new(&[key(1)]);
    let sealed_old = old.seal(&contents(INITIALIZE)).unwrap();
    let rotated = Keyring::new(&[key(2), key(1)]);
    assert!(
        rotated.open(sealed_old.as_bytes()).is_ok(),
        "the old key still opens"
    );
    let sealed_new = rotated.seal(&contents(INITIALIZE)).unwrap();
    assert_eq!(
        old.open(sealed_new.as_bytes()),
        Err(Refused::Unopened),
        "sealed with the new key"
    );
    let retired = Keyring::new(&[key(2)]);
    assert_eq!(retired.open(sealed_old.as_bytes()), Err(Refused::Unopened));
    assert!(retired.open(sealed_new.as_bytes()).is_ok());
}

#[test]
fn what_is_not_a_whole_token_of_ours_does_not_open() {
    let ring = Keyring::new(&[key(1)]);
    let token = ring.seal(&contents(INITIALIZE)).unwrap();
    let t = token.as_bytes();
    assert_eq!(
        ring.open(b"0b6f1c2e-7a1d-4f7e-9a53-1f0e1b2c3d4e"),
        Err(Refused::NotAToken)
    );
    assert_eq!(ring.open(b""), Err(Refused::NotAToken));
    assert_eq!(ring.open(PREFIX.as_bytes()), Err(Refused::Malformed));
    assert_eq!(
        ring.open(format!("{token}*").as_bytes()),
        Err(Refused::Malformed)
    );
    let oversized = format!("{token}{}", "A".repeat(MAX_TOKEN_LEN));
    assert_eq!(ring.open(oversized.as_bytes()), Err(Refused::Malformed));
    // Every truncation and every single changed character fails, none panics.
    for len in 0..t.len() {
        assert!(ring.open(&t[..len]).is_err(), "truncated to {len}");
    }
    for i in PREFIX.len()..t.len() {
        let mut bad = t.to_vec();
        bad[i] = if bad[i] == b'A' { b'B' } else { b'A' };
        assert!(ring.open(&bad).is_err(), "changed at {i}");
    }
    assert_eq!(
        Keyring::random().open(t),
        Err(Refused::Unopened),
        "another key"
    );
}

#[test]
fn base64url_round_trips_and_has_one_encoding_per_bytes() {
    assert_eq!(base64url_encode(b""), "");
    assert_eq!(base64url_encode(b"f"), "Zg");
    assert_eq!(base64url_encode(b"fo"), "Zm8");
    assert_eq!(base64url_encode(b"foo"), "Zm9v");
    assert_eq!(base64url_encode(&[0xfb, 0xff]), "-_8");
    assert_eq!(base64url_decode(b"Zm8").unwrap(), b"fo");
    // Non-zero bits past the last byte: another spelling of "fo", refused.
    assert_eq!(base64url_decode(b"Zm9"), None);
    assert_eq!(base64url_decode(b"Z"), None);
    assert_eq!(base64url_decode(b"Zm9v="), None);
    assert_eq!(base64url_decode(b"Zm+v"), None);
}

proptest! {
    #[test]
    fn base64url_inverts(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        prop_assert_eq!(base64url_decode(base64url_encode(&bytes).as_bytes()), Some(bytes));
    }

    /// Whatever follows the prefix, opening never panics, and nothing but a sealed token opens.
    #[test]
    fn arbitrary_ids_never_open(tail in "[A-Za-z0-9_-]{0,400}") {
        let ring = Keyring::new(&[key(1)]);
        let id = format!("{PREFIX}{tail}");
        prop_assert!(ring.open(id.as_bytes()).is_err());
    }
}

/// Whatever is sealed opens, at every holdfast with the key: at the bound of what `open`
/// inflates, a compressible initialize of `sessions.max_initialize_bytes` (64 KiB) fits a token,
/// but its fields (the body plus the id, version and path) do not fit what `open` takes.
#[test]
fn every_sealed_token_opens_even_at_the_size_bound() {
    let ring = Keyring::new(&[key(1)]);
    for size in [
        MAX_PLAIN - 200,
        MAX_PLAIN - 100,
        MAX_PLAIN - 46,
        MAX_PLAIN,
        MAX_PLAIN + 10,
    ] {
        let body = vec![b'a'; size];
        let c = contents(&body);
        if let Some(token) = ring.seal(&c) {
            assert_eq!(ring.open(token.as_bytes()), Ok(c), "{size}-byte initialize");
        }
    }
    // The largest that still fits is sealed.
    assert!(ring.seal(&contents(&vec![b'a'; MAX_PLAIN - 200])).is_some());
}

/// A token is bound to its deployment's name: another deployment sharing the key cannot open
/// it; an unnamed deployment opens what holdfast sealed before the setting existed.
#[test]
fn a_token_opens_only_in_its_deployment() {
    let plain = Keyring::new(&[key(1)]);
    let a = Keyring::new(&[key(1)]).for_deployment("prod-a");
    let b = Keyring::new(&[key(1)]).for_deployment("prod-b");
    let c = contents(INITIALIZE);
    let sealed_a = a.seal(&c).unwrap();
    assert_eq!(a.open(sealed_a.as_bytes()), Ok(c.clone()));
    assert_eq!(b.open(sealed_a.as_bytes()), Err(Refused::Unopened));
    assert_eq!(plain.open(sealed_a.as_bytes()), Err(Refused::Unopened));
    // Unnamed: the binding tokens had before.
    let unnamed = Keyring::new(&[key(1)]).for_deployment("");
    let old = plain.seal(&c).unwrap();
    assert_eq!(unnamed.open(old.as_bytes()), Ok(c));
}
