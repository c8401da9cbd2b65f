//! Mutual authentication by a shared secret, without sending the secret and without giving
//! anyone a way to test guesses of it offline.
//!
//! Both sides run SPAKE2 ([`Pake`]), a password-authenticated key exchange, over the secret:
//! each sends one message and both end with the same key if, and only if, both used the same
//! secret. Neither what crosses the wire nor a failed exchange with an impostor tells anything
//! that would check a guess of the secret: an impostor gets one guess per exchange, online,
//! where it is seen and counted. Each side then proves it holds the key by an HMAC-SHA256 of
//! the exchange's transcript under it ([`SharedKey::confirm`]); labels differ by direction, so
//! a proof cannot be reflected back, and every exchange is fresh, so none can be replayed.

use ring::hmac;
use spake2::{Ed25519Group, Identity, Password, Spake2};

/// Bytes in a nonce.
pub const NONCE_BYTES: usize = 32;
/// The shortest secret accepted: 16 bytes. Guessing is online only (one guess per exchange,
/// see [`Pake`]), and a secret of 16 random bytes is out of reach even of offline guessing;
/// `rackwire rack` and the examples make secrets of 32 random bytes.
pub const SECRET_BYTES_MIN: usize = 16;
/// Bytes of one side's message of the key exchange.
pub const PAKE_MSG_BYTES: usize = 33;
/// Bytes of a key confirmation.
pub const CONFIRM_BYTES: usize = 32;

/// One side of a SPAKE2 exchange over the fabric secret (see the module documentation).
pub struct Pake {
    inner: Spake2<Ed25519Group>,
}

impl std::fmt::Debug for Pake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pake")
    }
}

impl Pake {
    /// Start an exchange over `secret`, as the side that speaks `first` or the other; both
    /// sides name the exchange with the same `context` (what it is for, and between whom).
    /// Returns the state to finish with and the message to send.
    pub fn start(secret: &[u8], first: bool, context: &[u8]) -> (Pake, [u8; PAKE_MSG_BYTES]) {
        let a = Identity::new(&[b"rackwire-first\0", context].concat());
        let b = Identity::new(&[b"rackwire-second\0", context].concat());
        let pw = Password::new(secret);
        let (inner, msg) = if first { Spake2::start_a(&pw, &a, &b) } else { Spake2::start_b(&pw, &a, &b) };
        let mut out = [0u8; PAKE_MSG_BYTES];
        out.copy_from_slice(&msg);
        (Pake { inner }, out)
    }

    /// The key of the exchange, from the other side's message: the same on both sides when
    /// both used the same secret, unrelated keys otherwise (the confirmations then fail).
    /// None for a malformed message (or one from the same side).
    pub fn finish(self, theirs: &[u8]) -> Option<SharedKey> {
        let k = self.inner.finish(theirs).ok()?;
        Some(SharedKey(hmac::Key::new(hmac::HMAC_SHA256, &k)))
    }
}

/// The key both sides of a [`Pake`] exchange hold, to prove it and to derive from.
pub struct SharedKey(hmac::Key);

impl std::fmt::Debug for SharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedKey")
    }
}

impl SharedKey {
    /// This side's proof that it holds the key: HMAC-SHA256(key, label ‖ 0 ‖ transcript).
    pub fn confirm(&self, label: &str, transcript: &[u8]) -> [u8; CONFIRM_BYTES] {
        let tag = hmac::sign(&self.0, &[label.as_bytes(), &[0], transcript].concat());
        let mut out = [0u8; CONFIRM_BYTES];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Check the other side's proof, in constant time.
    pub fn check(&self, label: &str, transcript: &[u8], proof: &[u8]) -> bool {
        hmac::verify(&self.0, &[label.as_bytes(), &[0], transcript].concat(), proof).is_ok()
    }
}

/// HMAC-SHA256 under `key` of `parts` (each with its length first): an edge acceptor's retry
/// token (see `rackwire_proto`'s endpoint), which only the holder of `key` can make.
pub fn mac_parts(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let k = hmac::Key::new(hmac::HMAC_SHA256, key);
    let mut ctx = hmac::Context::with_key(&k);
    for p in parts {
        ctx.update(&(p.len() as u32).to_be_bytes());
        ctx.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

/// Lower-case hex.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parse lower- or upper-case hex; `None` on any other character or an odd length.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the key exchange: two sides with the same secret and context end with the same
    // key (each side's confirmation checks on the other); a different secret, a different
    // context, or two sides both speaking first end with keys whose confirmations fail; a
    // malformed message finishes nothing. Messages differ from run to run (fresh randomness).
    #[test]
    fn pake_agrees_only_on_the_same_secret_and_context() {
        let run = |s1: &[u8], s2: &[u8], c1: &[u8], c2: &[u8], second_first: bool| {
            let (a, ma) = Pake::start(s1, true, c1);
            let (b, mb) = Pake::start(s2, second_first, c2);
            let (ka, kb) = (a.finish(&mb), b.finish(&ma));
            match (ka, kb) {
                (Some(ka), Some(kb)) => kb.check("first", b"t", &ka.confirm("first", b"t")),
                _ => false,
            }
        };
        let s = b"0123456789abcdef-secret";
        assert!(run(s, s, b"ctx", b"ctx", false));
        assert!(!run(s, b"0123456789abcdef-wrong!", b"ctx", b"ctx", false));
        assert!(!run(s, s, b"ctx", b"other", false));
        assert!(!run(s, s, b"ctx", b"ctx", true), "two first sides never agree");
        let (a, _) = Pake::start(s, true, b"ctx");
        assert!(a.finish(&[0u8; 5]).is_none());
        let (_, m1) = Pake::start(s, true, b"ctx");
        let (_, m2) = Pake::start(s, true, b"ctx");
        assert_ne!(m1, m2);
        // A proof is bound to its label and transcript.
        let (a, ma) = Pake::start(s, true, b"ctx");
        let (b, mb) = Pake::start(s, false, b"ctx");
        let (ka, kb) = (a.finish(&mb).unwrap(), b.finish(&ma).unwrap());
        let p = ka.confirm("first", b"t");
        assert!(kb.check("first", b"t", &p));
        assert!(!kb.check("second", b"t", &p) && !kb.check("first", b"u", &p));
    }

    // Checks hex round trip and rejection of bad input.
    #[test]
    fn hex_round_trip() {
        assert_eq!(from_hex(&to_hex(&[0, 1, 254, 255])).unwrap(), vec![0, 1, 254, 255]);
        assert!(from_hex("abc").is_none());
        assert!(from_hex("zz").is_none());
        assert!(from_hex("é1").is_none());
    }
}
