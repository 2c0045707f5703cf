//! Self-describing session ids: what re-establishing a session needs, sealed into the id the
//! client holds, so that any holdfast with the key can carry the session, in any pod, after any
//! restart of its own.
//!
//! A token is `hf1.` and the URL-safe base64 (no padding) of a 12-byte random nonce and the
//! ChaCha20-Poly1305 sealing of:
//!
//! | bytes | what |
//! |---|---|
//! | 1 | flags: bit 0 set when the rest is deflated |
//! | 8 | issue time, seconds since the Unix epoch, big-endian |
//! | rest | three length-prefixed (u16, big-endian) fields: the upstream session id, the `MCP-Protocol-Version` (empty: none), the endpoint path; then the `initialize` body as the client sent it |
//!
//! Everything in it is visible ASCII (`A-Za-z0-9-_.`), as the transport requires of session ids.
//! Only a holder of a key can make or read one; a token that does not open is somebody else's id
//! and passes unchanged. Knowing a token gives nothing the session id did not give already: it
//! *is* the session id.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http::HeaderValue;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::config::SessionKey;

/// What every token starts with; nothing else is tried as one.
pub const PREFIX: &str = "hf1.";

/// Longest token handed out or opened: it rides on every request of the session, so it must fit
/// a request head with room to spare (holdfast's smallest `limits.max_header_bytes` is 8 KiB;
/// nginx's default `large_client_header_buffers` line is 8 KiB too).
pub const MAX_TOKEN_LEN: usize = 3072;

/// Bound on an opened token's inflated contents (what a token of [`MAX_TOKEN_LEN`] can hold at
/// deflate's best ratio is far above any real `initialize`).
const MAX_PLAIN: usize = 64 * 1024;

/// Bound to what the sealing is of: a token cannot be read as anything else holdfast seals.
const AAD: &[u8] = b"holdfast session token v1";

const DEFLATED: u8 = 1;

/// What a token carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    /// When it was sealed, seconds since the Unix epoch.
    pub issued: u64,
    /// The session id the upstream gave at `initialize`.
    pub upstream_id: HeaderValue,
    /// The protocol version the session was opened with.
    pub protocol_version: Option<HeaderValue>,
    /// The endpoint path the session was opened on.
    pub endpoint: String,
    /// The `initialize` request body as the client sent it.
    pub initialize: Bytes,
}

/// Why a token did not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not one of holdfast's (no [`PREFIX`]): the server's own id. Not counted.
    NotAToken,
    /// The prefix, but not the shape of a token (length, alphabet, fields).
    Malformed,
    /// No key opens it: sealed with a key rotated away or another deployment's, or altered.
    Unopened,
}

/// The keys that seal and open tokens: the first seals, every one opens.
pub struct Keyring {
    keys: Vec<LessSafeKey>,
    /// What every sealing is bound to: [`AAD`], then the deployment's name when it has one.
    aad: Vec<u8>,
    /// One MAC key per sealing key, derived from it: what holdfast writes to the shared store is
    /// signed with the first, and what it reads there trusted only when one of them signed it.
    macs: Vec<ring::hmac::Key>,
    rng: SystemRandom,
}

impl Keyring {
    /// From `keys` (at least one, as validated).
    pub fn new(keys: &[SessionKey]) -> Keyring {
        assert!(!keys.is_empty(), "a keyring needs a key");
        Keyring {
            keys: keys.iter().map(|k| less_safe(&k.0)).collect(),
            aad: AAD.to_vec(),
            macs: keys.iter().map(|k| mac_key(&k.0)).collect(),
            rng: SystemRandom::new(),
        }
    }

    /// One random key, for a holdfast without `sessions.key_file`: its tokens open only in
    /// this process.
    pub fn random() -> Keyring {
        let rng = SystemRandom::new();
        let mut key = [0u8; 32];
        rng.fill(&mut key).expect("the system's random source");
        Keyring {
            keys: vec![less_safe(&key)],
            aad: AAD.to_vec(),
            macs: vec![mac_key(&key)],
            rng,
        }
    }

    /// Seals `contents` with the first key; `None` when the token would be longer than
    /// [`MAX_TOKEN_LEN`].
    pub fn seal(&self, contents: &Contents) -> Option<String> {
        let fields = encode_fields(contents)?;
        // What no holdfast would open (its inflated fields past [`MAX_PLAIN`]) is not sealed: a
        // highly compressible initialize near `sessions.max_initialize_bytes` fits a token, but
        // its fields (the body and the other fields) may not fit the bound `open` keeps; handed
        // out, it would open here from memory and nowhere else.
        if fields.len() > MAX_PLAIN {
            return None;
        }
        let packed = miniz_oxide::deflate::compress_to_vec(&fields, 6);
        let (flags, body) = if packed.len() < fields.len() {
            (DEFLATED, packed)
        } else {
            (0, fields)
        };
        // Checked before sealing: base64 makes 4 characters of every 3 bytes.
        let sealed_len = NONCE_LEN + 9 + body.len() + CHACHA20_POLY1305.tag_len();
        if PREFIX.len() + (sealed_len * 4).div_ceil(3) > MAX_TOKEN_LEN {
            return None;
        }
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .expect("the system's random source");
        let mut plain = Vec::with_capacity(sealed_len);
        plain.push(flags);
        plain.extend_from_slice(&contents.issued.to_be_bytes());
        plain.extend_from_slice(&body);
        self.keys[0]
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(self.aad.as_slice()),
                &mut plain,
            )
            .expect("a sealing within ChaCha20-Poly1305's bounds");
        let mut raw = nonce.to_vec();
        raw.extend_from_slice(&plain);
        Some(format!("{PREFIX}{}", base64url_encode(&raw)))
    }

    /// The same keys, their tokens bound to `deployment` (`sessions.deployment`): a token sealed
    /// for one deployment does not open at another sharing a key. Unnamed (empty), the binding
    /// is the one every holdfast had before the setting existed, so tokens already handed out
    /// keep opening.
    pub fn for_deployment(mut self, deployment: &str) -> Keyring {
        if !deployment.is_empty() {
            self.aad = [AAD, b"\0", deployment.as_bytes()].concat();
        }
        self
    }

    /// The tag of `data` under the first key: what holdfast writes to the shared store carries it.
    pub fn sign(&self, data: &[u8]) -> Vec<u8> {
        ring::hmac::sign(&self.macs[0], data).as_ref().to_vec()
    }

    /// Whether one of the keys signed `data` with `tag`.
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        self.macs
            .iter()
            .any(|key| ring::hmac::verify(key, data, tag).is_ok())
    }

    /// Opens `token` with any key.
    pub fn open(&self, token: &[u8]) -> Result<Contents, Refused> {
        let Some(encoded) = token.strip_prefix(PREFIX.as_bytes()) else {
            return Err(Refused::NotAToken);
        };
        if token.len() > MAX_TOKEN_LEN {
            return Err(Refused::Malformed);
        }
        let raw = base64url_decode(encoded).ok_or(Refused::Malformed)?;
        if raw.len() < NONCE_LEN + 9 + CHACHA20_POLY1305.tag_len() {
            return Err(Refused::Malformed);
        }
        let (nonce, sealed) = raw.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().expect("split at its length");
        let plain = self
            .keys
            .iter()
            .find_map(|key| {
                let mut buf = sealed.to_vec();
                let nonce = Nonce::assume_unique_for_key(nonce);
                let len = key
                    .open_in_place(nonce, Aad::from(self.aad.as_slice()), &mut buf)
                    .ok()?
                    .len();
                buf.truncate(len);
                Some(buf)
            })
            .ok_or(Refused::Unopened)?;
        // Authentic from here: sealed by a holdfast with the key. Still read defensively.
        let (&flags, rest) = plain.split_first().ok_or(Refused::Malformed)?;
        let (issued, body) = rest.split_at_checked(8).ok_or(Refused::Malformed)?;
        let issued = u64::from_be_bytes(issued.try_into().expect("eight bytes"));
        let fields = if flags & DEFLATED != 0 {
            miniz_oxide::inflate::decompress_to_vec_with_limit(body, MAX_PLAIN)
                .map_err(|_| Refused::Malformed)?
        } else {
            body.to_vec()
        };
        decode_fields(issued, &fields).ok_or(Refused::Malformed)
    }
}

/// The random nonce a token was sealed with: what tells one token from every other, without
/// opening it (the tombstone of an ended session keeps only this).
pub fn nonce(token: &[u8]) -> Option<[u8; NONCE_LEN]> {
    // 12 bytes are exactly 16 base64 characters.
    let encoded = token.strip_prefix(PREFIX.as_bytes())?.get(..16)?;
    base64url_decode(encoded)?.try_into().ok()
}

/// The MAC key of a session key: HMAC-SHA256 under a key derived from it for this one use, so
/// that no tag can ever be taken for a sealing, nor a sealing for a tag.
fn mac_key(key: &[u8; 32]) -> ring::hmac::Key {
    let derived = ring::hmac::sign(
        &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key),
        b"holdfast shared store mac v1",
    );
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref())
}

fn less_safe(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key"))
}

fn encode_fields(c: &Contents) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + c.initialize.len());
    let empty = HeaderValue::from_static("");
    let version = c.protocol_version.as_ref().unwrap_or(&empty);
    for field in [
        c.upstream_id.as_bytes(),
        version.as_bytes(),
        c.endpoint.as_bytes(),
    ] {
        out.extend_from_slice(&u16::try_from(field.len()).ok()?.to_be_bytes());
        out.extend_from_slice(field);
    }
    out.extend_from_slice(&c.initialize);
    Some(out)
}

fn decode_fields(issued: u64, mut rest: &[u8]) -> Option<Contents> {
    let mut field = || {
        let (len, tail) = rest.split_at_checked(2)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let (value, tail) = tail.split_at_checked(len)?;
        rest = tail;
        Some(value)
    };
    let upstream_id = HeaderValue::from_bytes(field()?).ok()?;
    let version = field()?;
    let protocol_version = match version {
        [] => None,
        v => Some(HeaderValue::from_bytes(v).ok()?),
    };
    let endpoint = std::str::from_utf8(field()?).ok()?.to_owned();
    if upstream_id.is_empty() || !endpoint.starts_with('/') {
        return None;
    }
    Some(Contents {
        issued,
        upstream_id,
        protocol_version,
        endpoint,
        initialize: Bytes::copy_from_slice(rest),
    })
}

/// URL-safe base64 without padding (RFC 4648 §5).
fn base64url_encode(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The inverse of [`base64url_encode`]; `None` for a character outside the alphabet, padding, a
/// length no encoding has, or set bits past the last byte (the engine refuses them: one
/// encoding per byte string, so a token has one spelling).
fn base64url_decode(text: &[u8]) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(text).ok()
}

#[cfg(test)]
mod tests;
